"""Host set-up shared by the gemm_reduce_scatter variants: checks, output, workspaces, launch arguments."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..common.checks import check_divisible, check_matrix
from ..common.config import WARP_SPEC_VARIANTS, check_variant_config, side_warps
from ..common.launch import Entered, GemmCall, begin, begin_call, ctl, new_output, op_heap, prepare_gemm, workspace

OP = "gemm_reduce_scatter"


@dataclass
class Call(Entered):
    """One checked call: the GEMM operands, this rank's output and the heap buffers."""

    gemm: GemmCall
    rows: int  # M / W: the rows every rank owns
    c: torch.Tensor  # [rows, N], an ordinary tensor
    stage: torch.Tensor  # [W, rows, N] in the input dtype, on the heap
    run: torch.Tensor | None  # [rows, N] fp32 running sum on the heap (flagged variants, W >= 3)
    flags: torch.Tensor | None  # [W, tiles_per_owner] int64 on the heap (flagged variants)
    enter: tuple | None = None  # the begin arguments of a kernel that begins the call itself

    @property
    def heap(self):
        return self.gemm.heap

    @property
    def config(self):
        return self.gemm.config

    @property
    def tiles_per_owner(self) -> int:
        cfg = self.gemm.config
        return -(-self.rows // cfg.BLOCK_M) * -(-self.gemm.N // cfg.BLOCK_N)

    @property
    def sub_m(self) -> int:
        """Rows per reduction block: about 32 fp32 elements per thread, a power of two <= BLOCK_M."""
        cfg = self.gemm.config
        return max(1, min(cfg.BLOCK_M, 1024 * side_warps(cfg) // cfg.BLOCK_N))

    @property
    def empty(self) -> bool:
        """Nothing to compute or move (M or N is 0 on every rank)."""
        return self.rows == 0 or self.gemm.N == 0

    @property
    def program_counts(self) -> tuple[int, int]:
        """(GEMM programs, reduction programs): the config's split. Not capped by the tiles (programs
        without one exit), so that every shape of a config launches one compiled kernel."""
        cfg = self.config
        return cfg.GEMM_SMS, cfg.COMM_SMS

    @property
    def run_arg(self) -> torch.Tensor:
        """The running-sum buffer, or the stage as a never-touched stand-in where there is none."""
        return self.stage if self.run is None else self.run

    @property
    def stage_args(self) -> tuple:
        s = self.stage
        return (s.stride(0), s.stride(1), s.stride(2))

    @property
    def dist_args(self) -> tuple:
        """heap_bases, ctl, rank, world: the distributed arguments of the reduction."""
        heap = self.heap
        return (heap.heap_bases, ctl(heap), heap.rank, heap.world_size)


def setup(variant: str, a, b, config, group, *, comm: bool, flags: bool, running_sum: bool | None = None,
          kernel_begins: bool = False) -> Call:
    """Check ``a [M, K_loc]``, ``b [K_loc, N]``; allocate c; get the stage (and flags) workspace.

    The stage has a's dtype and is shared by every variant of one (dtype, rows, N) (the entry
    barrier of each call makes that safe). The flagged variants, which sum while partials arrive,
    also get an fp32 running-sum buffer when W >= 3, shared by both per (rows, N): only the owner's
    reduction touches it, and one call's reduction ends before the next call's starts
    (``running_sum``, default ``flags``). The flags and their epoch belong to one variant and tile
    shape. ``kernel_begins``: a non-empty call's first kernel begins it itself
    (:attr:`Call.enter_args`).
    """
    heap = op_heap(OP, group)
    check_matrix(OP, "a", a)
    W = heap.world_size
    check_divisible(OP, "M (rows of a)", a.shape[0], W, "the world size")
    rows = a.shape[0] // W
    call = prepare_gemm(OP, a, b, group, config, comm=comm, tile_m=max(rows, 1),
                        specialize=variant in WARP_SPEC_VARIANTS[OP])
    check_variant_config(OP, variant, call.config)  # only bulk_sync splits K
    if running_sum is None:
        running_sum = flags
    if call.K == 0 and call.use_tma:
        # A descriptor of an empty K extent is not valid on every device; the pointer path loops 0 times.
        call = dataclasses.replace(call, use_tma=False, b_kmajor=False)
    N = call.N
    c = new_output((rows, N), a.dtype, a.device)
    # K_loc may differ between ranks (and with it BLOCK_K or the program counts of a default config):
    # the signature holds the shapes and the tile grid that the flags and slots follow.
    cfg = call.config
    key = (OP, variant, call.M, N, str(a.dtype), cfg.BLOCK_M, cfg.BLOCK_N, cfg.GROUP_M)
    if rows == 0 or N == 0:
        begin(key)
        return Call(call, rows, c, None, None, None)
    if rows * N >= 2**31:
        raise ValueError(f"{OP}: an owner's block of M/W x N = {rows} x {N} elements must stay below 2**31 "
                         "(the reduction indexes a block with 32-bit offsets); split the call")
    stage = workspace(heap, (OP, "stage", a.dtype, W, rows, N),
                      lambda h: {"stage": h.empty((W, rows, N), dtype=a.dtype)}, W * rows * N * a.element_size()).stage
    run, flag_buf = None, None
    if running_sum and W >= 3:
        # accumulate_slot indexes it with a slot's strides: both are contiguous [rows, N].
        run = workspace(heap, (OP, "run", W, rows, N),
                        lambda h: {"run": h.empty((rows, N), dtype=torch.float32)}, rows * N * 4).run
        assert run.stride() == stage.stride()[1:]
    if flags:
        cfg = call.config
        tiles = -(-rows // cfg.BLOCK_M) * -(-N // cfg.BLOCK_N)
        ws = workspace(heap, (OP, variant, rows, N, cfg.BLOCK_M, cfg.BLOCK_N),
                       lambda h: {"flags": h.zeros((W, tiles), dtype=torch.int64)}, 8 * W * tiles)
        flag_buf = ws.flags
    entry = begin_call(key, c, kernel_begins=kernel_begins and call.kernel_may_begin)
    return Call(call, rows, c, stage, run, flag_buf, entry)


def finish(call: Call) -> torch.Tensor:
    """Return c."""
    return call.c
