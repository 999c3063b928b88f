"""Host set-up shared by the gemm_all_scatter variants: checks, result and heap buffers, workspace, begin."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..common.config import WARP_SPEC_VARIANTS, check_variant_config
from ..common.launch import Entered, GemmCall, begin_call, check_out, new_output, prepare_gemm, workspace
from ._tiles import launch_copy_peer_blocks

OP = "gemm_all_scatter"


@dataclass
class Call(Entered):
    """One checked, begun call: the GEMM operands, where the tiles go, and the flags."""

    gemm: GemmCall
    c: torch.Tensor  # [M, W*N_loc] on the heap, where the peers' tiles land: `out`, or the op's buffer
    c_block: torch.Tensor  # this rank's column block of c (where its tiles land on the peers)
    dest: torch.Tensor  # [M, W*N_loc] the result, strided like c: c itself, or an ordinary tensor
    own: torch.Tensor  # this rank's column block of dest (where its tiles are stored here)
    flags: torch.Tensor | None  # int64 per-tile "ready" flags (flagged variants)
    done: torch.Tensor | None  # int64 [W, COMM_SMS] completion flags (wg_specialized)
    out: torch.Tensor | None  # the caller's `out`
    enter: tuple | None = None  # the begin arguments of a kernel that begins the call itself

    @property
    def empty(self) -> bool:
        """Nothing to compute or move (M, N_loc or K is 0)."""
        g = self.gemm
        return g.M == 0 or g.N == 0 or g.K == 0

    def result(self) -> torch.Tensor:
        """The result, once the call's kernels are queued: ``dest`` after the peers' column blocks
        are copied into it from the heap by one more kernel (this rank's block is there already),
        then ``out`` if the caller's ``out`` could not be ``dest`` (strided unlike c)."""
        if self.dest is not self.c and not self.empty:
            g = self.gemm
            launch_copy_peer_blocks(self.dest, self.c, g.M, g.N, g.heap.rank, g.heap.world_size)
        if self.out is None or self.out is self.dest:
            return self.dest
        return self.out.copy_(self.dest)


def setup(variant: str, a, b, config, group, out, *, comm: bool, flags: bool = False,
          kernel_begins: bool = False) -> Call:
    """Check the operands, get the result buffer and flags, and begin the call (``kernel_begins``: a
    non-empty call's first kernel begins it itself, given :attr:`Call.enter_args`)."""
    g: GemmCall = prepare_gemm(OP, a, b, group, config, comm=comm,
                               specialize=variant in WARP_SPEC_VARIANTS[OP])
    check_variant_config(OP, variant, g.config)  # only bulk_sync splits K
    heap = g.heap
    W, r = heap.world_size, heap.rank
    shape = (g.M, W * g.N)
    empty = g.M == 0 or g.N == 0 or g.K == 0
    if out is not None and check_out(OP, heap, out, shape, a.dtype, a=a, b=b):
        c = dest = out  # a heap tensor at the same offset on every rank: written in place
    else:
        # This rank's tiles go straight into the result; only the peers' blocks are copied out of
        # the heap buffer they land in (none at world 1). The caller's `out` is the result when it is
        # strided like the heap buffer (contiguous).
        dest = out if out is not None and out.is_contiguous() else new_output(shape, a.dtype, a.device)
        if empty or W == 1:
            c = dest  # nothing lands from peers: no heap buffer
        else:
            nbytes = g.M * W * g.N * a.element_size()
            c = workspace(heap, (OP, "c", shape, a.dtype), lambda h: {"c": h.empty(shape, dtype=a.dtype)},
                          nbytes).c
    cfg = g.config
    flag_buf = done = None
    if flags and not empty:
        # Everything the flag protocol depends on is in the key: tile counts and the number of
        # communication programs that report completion.
        key = (OP, variant, g.M, g.N, cfg.BLOCK_M, cfg.BLOCK_N, cfg.COMM_SMS)
        ws = workspace(heap, key, lambda h: {
            "flags": h.zeros(max(g.num_tiles, 1), dtype=torch.int64),  # per-tile "ready" sequence numbers
            "flags_done": h.zeros((W, max(cfg.COMM_SMS, 1)), dtype=torch.int64),  # (source, program) done
        }, 8 * (g.num_tiles + W * cfg.COMM_SMS))
        flag_buf, done = ws.flags, ws.flags_done
    # Both buffers are NaN if the call aborts: the peers' blocks are copied from c into dest after it.
    entry = begin_call(g.key(variant, c is out), dest, c if c is not dest else None,
                       kernel_begins=kernel_begins and not empty and g.kernel_may_begin)
    if g.K == 0 and g.M and g.N:
        dest.zero_()  # an empty sum (every rank's block is zero: nothing needs to move)
    cols = slice(r * g.N, (r + 1) * g.N)
    return Call(g, c, c[:, cols], dest, dest[:, cols], flag_buf, done, out, entry)
