"""Host steps of every gemm_all_scatter variant: :func:`prepare` once per call signature; :func:`begin`
and :func:`finish` every call."""

from __future__ import annotations

import torch

from ..common.arena import check_out
from ..common.config import WARP_SPEC_VARIANTS, check_variant_config
from ..common.launch import new_output, op_heap, prepare_gemm
from ..common.prepare import PreparedCall, once
from ..common.scaled import UNSCALED, prepare_scaling
from ._tiles import launch_copy_peer_blocks

OP = "gemm_all_scatter"


class Prepared(PreparedCall):
    """One call signature of a variant, checked and resolved (``N`` = N_loc)."""

    def __init__(self, variant: str, a, b, config, group, out, scaling: tuple, *, comm: bool, flags: bool):
        g = prepare_gemm(OP, a, b, group, config, comm=comm, specialize=variant in WARP_SPEC_VARIANTS[OP])
        cfg, heap = g.config, g.heap
        out_dtype, kind = prepare_scaling(OP, a, b, *scaling)
        check_variant_config(OP, variant, cfg)  # only bulk_sync splits K
        W, M, N = heap.world_size, g.M, g.N
        self.out_shape = shape = (M, W * N)
        # inplace: `out` is a heap tensor at the same offset on every rank, which the kernels write.
        self.inplace = out is not None and check_out(OP, heap, out, shape, out_dtype, a=a, b=b)
        super().__init__(g, a, b, g.key(variant, self.inplace, kind), empty=M == 0 or N == 0 or g.K == 0,
                         pad=variant != "bulk_sync", out_dtype=out_dtype)  # bulk_sync's GEMM core pads itself
        self.meta = g.gemm_meta_ws if g.specialize else g.gemm_meta
        self.c = None  # [M, W*N] heap buffer where the peers' blocks land; None: the result itself
        self.flags = self.done = None  # int64 per-tile "ready" flags; [W, COMM_SMS] completion flags
        if not (self.inplace or self.empty or W == 1):
            self.c = self.hold((OP, "c", shape, out_dtype), lambda h: {"c": h.empty(shape, dtype=out_dtype)},
                               M * W * N * out_dtype.itemsize).c
        if flags and not self.empty:
            ws = self.hold((OP, variant, M, N, cfg.BLOCK_M, cfg.BLOCK_N, cfg.COMM_SMS), lambda h: {
                "flags": h.zeros(max(g.num_tiles, 1), dtype=torch.int64),  # per-tile "ready" sequence numbers
                "flags_done": h.zeros((W, max(cfg.COMM_SMS, 1)), dtype=torch.int64),  # (source, program) done
            }, 8 * (g.num_tiles + W * cfg.COMM_SMS))
            self.flags, self.done = ws.flags, ws.flags_done


def prepare(variant: str, a, b, config, group, out, scaling: tuple = UNSCALED, *, comm: bool,
            flags: bool = False) -> Prepared:
    """The variant's :class:`Prepared` for this call signature; ``comm``: it needs COMM_SMS >= 1, ``flags``: flags."""
    heap = op_heap(OP, group)
    on_heap = isinstance(out, torch.Tensor) and heap.is_on_heap(out)
    make = lambda: Prepared(variant, a, b, config, group, out, scaling, comm=comm, flags=flags)
    p = once(heap, (OP, variant, on_heap, scaling[2]), make, config, a, b, out, *scaling[:2])
    if out is not None:  # its address: no overlap with a or b, a heap offset checked across ranks
        check_out(OP, heap, out, p.out_shape, p.out_dtype, a=a, b=b)
    return p


def begin(p: Prepared, a, b, out) -> tuple:
    """``(a, b, dest, c, entry)``: the operands, the result (``out`` unless strided), where the peers'
    blocks land (strided alike; the result itself where none land) and ``Prepared.begin``'s result."""
    a, b = p.operands(a, b)
    if p.inplace:
        dest = c = out
    else:
        fresh = out is None or not out.is_contiguous()
        dest = new_output(p.out_shape, p.out_dtype, a.device) if fresh else out
        c = dest if p.c is None else p.c
    entry = p.begin(dest, c if c is not dest else None)
    if p.K == 0 and p.M and p.N:
        dest.zero_()  # an empty sum (every rank's block is zero: nothing needs to move)
    return a, b, dest, c, entry


def finish(p: Prepared, dest: torch.Tensor, c: torch.Tensor, out) -> torch.Tensor:
    """The result: ``dest`` after the peers' blocks are copied into it from ``c``, or ``out`` (strided)."""
    if c is not dest and not p.empty:
        launch_copy_peer_blocks(dest, c, p.M, p.N, p.heap.rank, p.heap.world_size)
    return dest if out is None or out is dest else out.copy_(dest)
