"""What the gemm_reduce_scatter variants prepare once per call signature."""

from __future__ import annotations

import torch

from ..common.checks import check_divisible, check_matrix
from ..common.config import WARP_SPEC_VARIANTS, check_variant_config, side_warps, sum_rows
from ..common.launch import op_heap, prepare_gemm
from ..common.prepare import PreparedCall, once
from ..common.scaled import UNSCALED, prepare_scaling

OP = "gemm_reduce_scatter"


class Prepared(PreparedCall):
    """One call signature of a variant: the checked shapes, config, operand layout and heap buffers (``_tiles``;
    ``stage`` shared by the variants, each call's begin being a barrier; ``run``, ``flags``: else the stage)."""

    def __init__(self, variant: str, a, b, config, group, scaling: tuple, *, comm: bool, flags: bool):
        heap = op_heap(OP, group)
        check_matrix(OP, "a", a)
        W = heap.world_size
        check_divisible(OP, "M (rows of a)", a.shape[0], W, "the world size")
        rows = self.rows = a.shape[0] // W
        g = prepare_gemm(OP, a, b, group, config, comm=comm, tile_m=max(rows, 1),
                         specialize=variant in WARP_SPEC_VARIANTS[OP])
        cfg = g.config
        check_variant_config(OP, variant, cfg)  # only bulk_sync splits K
        out_dtype, kind = prepare_scaling(OP, a, b, *scaling)
        if g.K == 0:
            # A descriptor of an empty K extent is not valid on every device; the pointer path loops 0 times.
            g.use_tma = g.b_kmajor = False
        # K_loc may differ between ranks: the signature holds the shapes and the tile grid the flags follow.
        super().__init__(g, a, b, (OP, variant, g.M, g.N, str(a.dtype), kind, cfg.BLOCK_M, cfg.BLOCK_N, cfg.GROUP_M),
                         empty=rows == 0 or g.N == 0, pad=variant != "bulk_sync",  # the GEMM core pads itself
                         out_dtype=out_dtype)
        N = g.N
        self.out_shape = (rows, N)
        self.dims = g.gemm_args[2:]  # M, N, K and the strides of the operands as launched
        self.meta = g.gemm_meta  # constexprs and launch options of the GEMM part
        self.warp_spec = g.warp_spec
        self.side_warps = side_warps(cfg)
        self.sub_m = sum_rows(cfg)  # rows per reduction block
        self.tiles_per_owner = -(-rows // cfg.BLOCK_M) * -(-N // cfg.BLOCK_N)
        if self.empty:
            return
        if rows * N >= 2**31:
            raise ValueError(f"{OP}: an owner's block of M/W x N = {rows} x {N} elements must stay below 2**31 "
                             "(the reduction indexes a block with 32-bit offsets); split the call")
        # Float8 partials travel in fp32: the sum is rounded once, to out_dtype.
        dtype, tiles = (a.dtype if kind is None else torch.float32), self.tiles_per_owner
        self.stage = self.run = self.flags = self.hold(
            (OP, "stage", dtype, W, rows, N), lambda h: {"stage": h.empty((W, rows, N), dtype=dtype)},
            W * rows * N * dtype.itemsize).stage
        self.stage_strides = self.stage.stride()
        self.partial = self.stage.view(g.M, N)  # the stage as one [M, N] matrix: bulk_sync's GEMM writes it whole
        if flags and W >= 3:
            # accumulate_slot indexes it with a slot's strides: both are contiguous [rows, N].
            self.run = self.hold((OP, "run", W, rows, N), lambda h: {"run": h.empty((rows, N), dtype=torch.float32)},
                                 rows * N * 4).run
        if flags:
            self.flags = self.hold((OP, variant, rows, N, cfg.BLOCK_M, cfg.BLOCK_N),
                                   lambda h: {"flags": h.zeros((W, tiles), dtype=torch.int64)}, 8 * W * tiles).flags


def prepare(variant: str, a, b, config, group, scaling: tuple = UNSCALED, *, comm: bool = False,
            flags: bool = False) -> Prepared:
    """This call signature's :class:`Prepared`; ``comm``: it needs COMM_SMS >= 1, ``flags``: it sums on arrival."""
    make = lambda: Prepared(variant, a, b, config, group, scaling, comm=comm, flags=flags)
    return once(op_heap(OP, group), (OP, variant, scaling[2]), make, config, a, b, *scaling[:2])
