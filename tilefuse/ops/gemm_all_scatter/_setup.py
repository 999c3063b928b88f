"""Host set-up shared by the gemm_all_scatter variants: checks, output buffer, workspace, begin."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..common.config import WARP_SPEC_VARIANTS, check_variant_config
from ..common.launch import Entered, GemmCall, begin_call, check_out, prepare_gemm, workspace

OP = "gemm_all_scatter"


@dataclass
class Call(Entered):
    """One checked, begun call: the GEMM operands, the result buffer and the flags."""

    gemm: GemmCall
    c: torch.Tensor  # [M, W*N_loc]: `out`, or the op's heap buffer
    c_block: torch.Tensor  # this rank's column block of c (where its tiles go on every rank)
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
        """``out`` (written in place if it is a heap tensor, else it receives a copy of the heap
        buffer), or a copy of the heap buffer (the next call reuses it)."""
        if self.out is None:
            return self.c.clone()
        if self.out is not self.c:
            self.out.copy_(self.c)
        return self.out


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
    if out is not None and check_out(OP, heap, out, shape, a.dtype):
        c = out  # a heap tensor at the same offset on every rank: written in place
    elif g.M == 0 or g.N == 0:
        c = torch.empty(shape, dtype=a.dtype, device=a.device)  # nothing on the heap for an empty result
    else:
        nbytes = g.M * W * g.N * a.element_size()
        c = workspace(heap, (OP, "c", shape, a.dtype), lambda h: {"c": h.empty(shape, dtype=a.dtype)}, nbytes).c
    cfg = g.config
    flag_buf = done = None
    if flags and not (g.M == 0 or g.N == 0 or g.K == 0):
        # Everything the flag protocol depends on is in the key: tile counts and the number of
        # communication programs that report completion.
        key = (OP, variant, g.M, g.N, cfg.BLOCK_M, cfg.BLOCK_N, cfg.COMM_SMS)
        ws = workspace(heap, key, lambda h: {
            "flags": h.zeros(max(g.num_tiles, 1), dtype=torch.int64),  # per-tile "ready" sequence numbers
            "flags_done": h.zeros((W, max(cfg.COMM_SMS, 1)), dtype=torch.int64),  # (source, program) done
        }, 8 * (g.num_tiles + W * cfg.COMM_SMS))
        flag_buf, done = ws.flags, ws.flags_done
    empty = g.M == 0 or g.N == 0 or g.K == 0
    entry = begin_call(g.key(variant, c is out), c, kernel_begins=kernel_begins and not empty and g.kernel_may_begin)
    if g.K == 0 and g.M and g.N:
        c.zero_()  # an empty sum (every rank's block is zero: nothing needs to move)
    return Call(g, c, c[:, r * g.N:(r + 1) * g.N], flag_buf, done, out, entry)
