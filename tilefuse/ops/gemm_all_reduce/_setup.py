"""Host set-up shared by the gemm_all_reduce variants: checks, output, workspaces, launch arguments."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from ...runtime import hw
from ..common.config import (
    WARP_SPEC_VARIANTS,
    check_variant_config,
    decode_split_config,
    narrow_decode,
    side_warps,
    sum_rows,
)
from ..common.gemm import UNALIGNED_PAD_MIN_M, operand_path
from ..common.launch import Entered, GemmCall, begin, begin_call, ctl, new_output, op_heap, prepare_gemm, workspace
from ..common.split_k import SPLIT_K_SCRATCH

OP = "gemm_all_reduce"


def check_bias(op: str, bias, a: torch.Tensor, b: torch.Tensor) -> None:
    """``bias`` is a 1-D tensor of ``N = b.shape[1]`` elements with a's dtype, on a's device."""
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"{op}: bias must be a torch.Tensor or None, got {type(bias).__name__}")
    if bias.dim() != 1 or bias.shape[0] != b.shape[1]:
        raise ValueError(f"{op}: bias must have shape ({b.shape[1]},) (N, the columns of b), got {tuple(bias.shape)}")
    if bias.dtype != a.dtype:
        raise TypeError(f"{op}: bias has dtype {bias.dtype} but a has dtype {a.dtype}")
    if bias.device != a.device:
        raise ValueError(f"{op}: bias is on {bias.device} but a is on {a.device}")


MIN_DEFAULT_BLOCK_N = 32


@functools.lru_cache(maxsize=4096)  # on every call without a config: the host path at decode sizes
def fill_device(cfg, M: int, N: int, *, comm: bool):
    """The default config, with BLOCK_N halved (down to 32, or the config's own if smaller) while the
    tiles would leave GEMM programs idle.

    Where the GEMM is bound by reading B, every idle program is bandwidth left unused. Only for calls
    without a caller's config, and not for the narrow decode tiles (:func:`default_tiles`).
    """
    programs = cfg.GEMM_SMS if comm else cfg.GEMM_SMS + cfg.COMM_SMS
    block_n = cfg.BLOCK_N
    while block_n > MIN_DEFAULT_BLOCK_N and -(-M // cfg.BLOCK_M) * -(-N // block_n) < programs:
        block_n //= 2
    return cfg if block_n == cfg.BLOCK_N else dataclasses.replace(cfg, BLOCK_N=block_n)


def default_tiles(cfg, M: int, N: int, dtype: torch.dtype, *, comm: bool, interpreter: bool):
    """The tiles of a call without a caller's config: the narrow decode tiles as they are (their
    BLOCK_N already fills the device; narrower tiles read B less efficiently), else
    :func:`fill_device`."""
    if narrow_decode(M, dtype, interpreter):
        return cfg
    return fill_device(cfg, M, N, comm=comm)


@dataclass
class Call(Entered):
    """One checked call: the GEMM operands, this rank's output, the bias and the heap buffers."""

    gemm: GemmCall
    c: torch.Tensor  # [M, N], an ordinary tensor
    bias: torch.Tensor | None  # [N], contiguous, or None
    stage: torch.Tensor | None  # [W, M, N] in the input dtype, on the heap (None: empty call)
    flags: torch.Tensor | None  # [W, num_tiles] int64 on the heap (every variant but bulk_sync)
    enter: tuple | None = None  # the begin arguments of a kernel that begins the call itself
    align: int = 1  # gemm_tile_range's ALIGN (operands on the pointer path: ops.common.gemm.operand_path)

    @property
    def heap(self):
        return self.gemm.heap

    @property
    def config(self):
        return self.gemm.config

    @property
    def empty(self) -> bool:
        """Nothing to compute or move (M or N is 0 on every rank)."""
        return self.stage is None

    @property
    def num_tiles(self) -> int:
        return self.gemm.num_tiles

    @property
    def sub_m(self) -> int:
        """Rows per reduction block (:func:`~..common.config.sum_rows`)."""
        return sum_rows(self.gemm.config)

    def own_sum(self, programs: int) -> bool:
        """Whether fused_sequential's kernel of ``programs`` programs sums each tile right after its
        push, its own partial from registers (``_tiles.produce_tiles`` with ``SUM_HERE``): every
        program has at most one work item (a tile, or with ``SPLIT_K`` one of its K slices) and the
        reduction's blocks are whole tiles (``sub_m``), so that the sum holds no more registers than
        the reduction pass does."""
        cfg = self.gemm.config
        return self.num_tiles * cfg.SPLIT_K <= programs and self.sub_m == cfg.BLOCK_M

    @property
    def program_counts(self) -> tuple[int, int]:
        """(GEMM programs, reduction programs): the config's split. Not capped by the tiles (programs
        without one exit), so that every shape of a config launches one compiled kernel."""
        cfg = self.config
        return cfg.GEMM_SMS, cfg.COMM_SMS

    @property
    def all_programs(self) -> int:
        """Programs of a kernel that has the whole device to itself (bulk_sync, fused_sequential)."""
        cfg = self.config
        return cfg.GEMM_SMS + cfg.COMM_SMS  # not capped by the tiles: one compiled kernel per config

    @property
    def stage_args(self) -> tuple:
        s = self.stage
        return (s.stride(0), s.stride(1), s.stride(2))

    @property
    def out_args(self) -> tuple:
        """c, bias (c as a never-read stand-in when there is none) and c's strides."""
        c = self.c
        return (c, c if self.bias is None else self.bias, c.stride(0), c.stride(1))

    @property
    def dist_args(self) -> tuple:
        """heap_bases, ctl, rank, world."""
        heap = self.heap
        return (heap.heap_bases, ctl(heap), heap.rank, heap.world_size)

    @property
    def split_args(self) -> tuple:
        """``split_k, partials, counts`` of a kernel that takes ``SPLIT`` (the stream's split-K
        scratch, :class:`~..common.split_k.SplitKScratch`; the stage as a never-read stand-in without)."""
        cfg = self.config
        if cfg.SPLIT_K == 1:
            return (1, self.stage, self.stage)
        parts, counts = SPLIT_K_SCRATCH.get(self.c.device, self.num_tiles, cfg.SPLIT_K * cfg.BLOCK_M * cfg.BLOCK_N)
        return (cfg.SPLIT_K, parts, counts)

    @property
    def split_meta(self) -> dict:
        """``SPLIT`` and ``ALIGN`` of a kernel that takes them."""
        return dict(SPLIT=self.config.SPLIT_K > 1, ALIGN=self.align)

    def reduce_meta(self, programs: int, *, pull: bool, wait: bool) -> dict:
        """Constexprs and launch options of the reduction (reduce_tiles)."""
        cfg = self.config
        return dict(BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, SUB_M=self.sub_m, GROUP_M=cfg.GROUP_M,
                    NUM_PROGRAMS=programs, PULL=pull, WAIT=wait, HAS_BIAS=self.bias is not None)


def check_one_wave_split(call: GemmCall) -> None:
    """Raise ValueError unless fused_sequential can split ``call``'s K (``Config.SPLIT_K > 1``):
    every program at most one K slice of a tile, and tiles whose fp32 sum fits in a program's
    registers (the reduction's whole-tile blocks: :attr:`Call.sub_m`)."""
    cfg = call.config
    programs = cfg.GEMM_SMS + cfg.COMM_SMS
    if call.num_tiles * cfg.SPLIT_K > programs:
        raise ValueError(f"{OP}: fused_sequential with SPLIT_K={cfg.SPLIT_K} needs a K slice a program: "
                         f"{call.num_tiles} tiles x {cfg.SPLIT_K} slices exceed GEMM_SMS + COMM_SMS = {programs}; "
                         "use fewer slices or larger tiles")
    if sum_rows(cfg) < cfg.BLOCK_M:
        raise ValueError(f"{OP}: fused_sequential with SPLIT_K={cfg.SPLIT_K} sums a whole tile in registers: "
                         f"BLOCK_M x BLOCK_N = {cfg.BLOCK_M * cfg.BLOCK_N} must be at most 1024 x num_warps = "
                         f"{1024 * side_warps(cfg)}")


def setup(variant: str, a, b, config, group, bias, *, comm: bool, flags: bool, kernel_begins: bool = False) -> Call:
    """Check ``a [M, K_loc]``, ``b [K_loc, N]`` and ``bias [N]``; allocate c; get the workspaces.

    ``kernel_begins``: whether the call's first kernel begins the call itself
    (:attr:`Call.enter_args`, then :meth:`Call.entered`); else this begins it.

    The stage has a's dtype and is shared by every variant of one (dtype, M, N) (the begin of each
    call is a barrier: no rank writes a call's partials into a peer still summing the previous
    call's). The flags belong to one variant and tile shape.
    """
    heap = op_heap(OP, group)
    call = prepare_gemm(OP, a, b, group, config, comm=comm, specialize=variant in WARP_SPEC_VARIANTS[OP])
    check_variant_config(OP, variant, call.config)  # split K: bulk_sync, and fused_sequential within one wave
    if config is None:
        split = None
        if variant == "fused_sequential":  # the GEMM core's split decode tiles, if any
            cfg = call.config
            split = decode_split_config(call.M, call.N, call.K, a.dtype, num_sms=cfg.GEMM_SMS + cfg.COMM_SMS,
                                        interpreter=hw.interpreting())
        call = dataclasses.replace(call, config=split or default_tiles(
            call.config, call.M, call.N, a.dtype, comm=comm, interpreter=hw.interpreting()))
    align = 1
    if call.config.SPLIT_K > 1 and variant == "fused_sequential":
        check_one_wave_split(call)
        # The GEMM core's operand path for the config (its split decode tiles load through pointers).
        a_op, b_op, use_tma, b_kmajor, align = operand_path(call.a, call.b, call.config, min_m=UNALIGNED_PAD_MIN_M)
        call = dataclasses.replace(call, a=a_op, b=b_op, use_tma=use_tma, b_kmajor=b_kmajor)
    if bias is not None:
        check_bias(OP, bias, a, b)
        bias = bias.contiguous()
    if call.K == 0 and call.use_tma:
        # A descriptor of an empty K extent is not valid on every device; the pointer path loops 0 times.
        call = dataclasses.replace(call, use_tma=False, b_kmajor=False)
    M, N, W = call.M, call.N, heap.world_size
    c = new_output((M, N), a.dtype, a.device)
    # K_loc may differ between ranks, and with it the default config's BLOCK_K: the signature holds
    # the tile grid, on which the ranks' tile numbering (and so the flags) depends, and everything else.
    cfg = call.config
    key = (OP, variant, M, N, str(a.dtype), (cfg.BLOCK_M, cfg.BLOCK_N, cfg.GROUP_M), bias is not None)
    if M == 0 or N == 0:
        begin(key)
        return Call(call, c, bias, None, None, align=align)
    if M * N >= 2**31:
        raise ValueError(f"{OP}: M x N = {M} x {N} elements must stay below 2**31 (the reduction indexes a "
                         "slot with 32-bit offsets); split the call")
    stage = workspace(heap, (OP, "stage", a.dtype, W, M, N),
                      lambda h: {"stage": h.empty((W, M, N), dtype=a.dtype)}, W * M * N * a.element_size()).stage
    result = Call(call, c, bias, stage, None, align=align)
    if flags:
        tiles = call.num_tiles
        ws = workspace(heap, (OP, variant, W, M, N, cfg.BLOCK_M, cfg.BLOCK_N),
                       lambda h: {"flags": h.zeros((W, tiles), dtype=torch.int64)}, 8 * W * tiles)
        result.flags = ws.flags
    result.enter = begin_call(key, c, kernel_begins=kernel_begins and call.kernel_may_begin)
    return result
