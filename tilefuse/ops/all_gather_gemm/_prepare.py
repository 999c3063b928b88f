"""What an all_gather_gemm call prepares once per call signature (:func:`prepare`): checks, config,
heap buffers and the GEMM's operand path."""

from __future__ import annotations

import torch

from ..common.config import check_variant_config
from ..common.gemm import ensure_triton_allocator, flattened_loop, gemm_layout
from ..common.launch import op_heap, prepare_gemm
from ..common.prepare import PreparedCall, once
from ..common.scaled import UNSCALED, prepare_scaling

OP = "all_gather_gemm"


class Prepared(PreparedCall):
    """One call signature's checked sizes (``M`` = M_loc), config and heap buffers (``buffers``: gathered,
    flagged or shard; None where nothing moves): ``ag`` (a_gathered [W*M_loc, K]), ``own`` (this rank's
    rows: its block of ag, or a_shard [M_loc, K]), ``flags`` (int64 [W * num_chunks]) and its row
    ``own_flags``, ``claims`` (int32 [1]: wg_specialized's local tiles taken), a float8 call's row scales
    ``sg`` and this rank's ``own_sg``. ``comm``: the variant needs COMM_SMS >= 1."""

    def __init__(self, variant, a, b, config, group, return_gathered, scaling: tuple, buffers: str, comm: bool):
        g = prepare_gemm(OP, a, b, group, config, comm=comm, pad=False)
        cfg, heap = g.config, g.heap
        check_variant_config(OP, variant, cfg)  # only bulk_sync splits K
        out_dtype, kind = prepare_scaling(OP, a, b, *scaling)
        M, N, K, W, r = g.M, g.N, g.K, heap.world_size, heap.rank
        super().__init__(g, a, b, g.key(variant, bool(return_gathered), kind), empty=M == 0 or N == 0 or K == 0,
                         out_dtype=out_dtype)
        self.ag = self.own = self.flags = self.own_flags = self.claims = self.sg = self.own_sg = None
        self.programs = cfg.GEMM_SMS + cfg.COMM_SMS  # not capped by the tiles: one compiled kernel per config
        self.num_chunks = num_chunks = -(-M // cfg.BLOCK_M)
        self.local_direct = True  # the local shard's tiles read `a` itself (it fits the heap rows' path)
        self.first = 0  # 1: the local rows are not pushed to this rank (nothing reads them there)
        self.meta = {}  # the GEMM's constexprs and launch options
        if M == 0 or K == 0 or (N == 0 and buffers != "gathered"):
            return
        dtype, size, scaled = a.dtype, a.element_size(), kind is not None  # scaled: row scales travel too
        if buffers == "shard":
            ws = self.hold((OP, variant, M, K, dtype), lambda h: dict(
                a_shard=h.empty((M, K), dtype=dtype), **({"s_shard": h.empty(M, dtype=torch.float32)} if scaled else {})
            ), M * K * size + (4 * M if scaled else 0))
            self.own = rows = ws.a_shard
            self.sg = self.own_sg = ws.buffers.get("s_shard")
        else:
            flagged = buffers == "flagged"

            def make(h):
                made = {"a_gathered": h.empty((W * M, K), dtype=dtype)}
                if flagged:
                    made.update(flags=h.zeros(W * num_chunks, dtype=torch.int64), claims=h.zeros(1, dtype=torch.int32))
                if scaled:
                    made["s_gathered"] = h.empty(W * M, dtype=torch.float32)
                return made

            ws = self.hold((OP, variant, M, K, dtype, cfg.BLOCK_M if flagged else 0), make,
                           W * M * K * size + (8 * W * num_chunks + 4 if flagged else 0) + (4 * W * M if scaled else 0))
            self.ag = rows = ws.a_gathered
            self.own = self.ag[r * M:(r + 1) * M]
            self.flags, self.claims, self.sg = (ws.buffers.get(k) for k in ("flags", "claims", "s_gathered"))
            self.own_flags = None if self.flags is None else self.flags[r * num_chunks:]
            self.own_sg = None if self.sg is None else self.sg[r * M:(r + 1) * M]
        # The operand path of A rows read from the heap buffer, and whether `a` itself fits it too.
        self.use_tma, b_kmajor = gemm_layout(rows, b)
        self.local_direct = (not self.use_tma) or gemm_layout(a, b)[0]
        self.first = 1 if self.local_direct and not return_gathered else 0
        # Flattened tile loops (no flags in them): not where fused_sequential also copies rows out.
        flatten = flattened_loop(cfg, self.use_tma, self.out_dtype.itemsize) and not (
            buffers == "shard" and return_gathered)
        self.meta = dict(g.gemm_meta, USE_TMA=self.use_tma, B_KMAJOR=b_kmajor, FLATTEN=flatten)

    def scales(self, scale_a, scale_b) -> tuple:
        """The kernels' ``scales`` (``_tiles``): ``kernel_scales`` and ``sg`` (or a stand-in)."""
        scales = super().scales(scale_a, scale_b)
        return (*scales, scales[0] if self.sg is None else self.sg)

    def gathered_scales(self, scales: tuple) -> tuple:
        """``scales`` of the GEMM core over all of ``ag``: the gathered row scales."""
        return scales if self.sg is None else (self.sg, 1, *scales[2:4])


def prepare(variant: str, a, b, config, group, return_gathered: bool, scaling: tuple = UNSCALED, *, buffers: str,
            comm: bool = False) -> tuple:
    """``(heap, Prepared)`` of this call, made on its signature's first call."""
    heap = op_heap(OP, group)
    make = lambda: Prepared(variant, a, b, config, group, return_gathered, scaling, buffers, comm)
    p = once(heap, (OP, variant, bool(return_gathered), scaling[2]), make, config, a, b, *scaling[:2])
    if p.meta.get("USE_TMA"):
        ensure_triton_allocator()  # per call: Triton's allocator is per thread (autograd's backward has its own)
    return heap, p
