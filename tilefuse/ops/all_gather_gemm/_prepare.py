"""What an all_gather_gemm call prepares once per call signature: checks, config, heap buffers and the
GEMM's operand path. Every variant's host function starts with :func:`prepare`."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from ..common.config import Config, check_variant_config
from ..common.gemm import ensure_triton_allocator, flattened_loop, gemm_layout
from ..common.launch import op_heap, prepare_gemm
from ..common.prepare import hold, once

OP = "all_gather_gemm"


@dataclass(frozen=True, eq=False)
class Prepared:
    """One call signature's checked sizes, config and heap buffers."""

    key: tuple  # the call's signature, which every rank must share (the call's begin checks it)
    config: Config
    M: int  # rows per rank (M_loc)
    N: int
    K: int
    ag: torch.Tensor | None = None  # a_gathered [W*M_loc, K] on the heap; None where nothing moves
    own: torch.Tensor | None = None  # this rank's rows on the heap: its block of ag, or a_shard
    flags: torch.Tensor | None = None  # int64 [W * num_chunks], entry (source, chunk)
    own_flags: torch.Tensor | None = None  # this rank's row of flags (the ones its pushes release)
    claims: torch.Tensor | None = None  # int32 [1]: wg_specialized's local tiles taken, 0 between calls
    num_chunks: int = 0  # cdiv(M_loc, BLOCK_M)
    local_direct: bool = True  # the local shard's tiles read `a` itself (it fits the heap rows' path)
    first: int = 0  # 1: the local rows are not pushed to this rank (nothing reads them there)
    meta: dict = field(default_factory=dict)  # the GEMM's constexprs and launch options
    workspaces: list = field(default_factory=list)  # common.prepare.hold's entries

    @property
    def degenerate(self) -> bool:
        """Empty shards or an empty product: the fused variants hand these to bulk_sync."""
        return self.M == 0 or self.N == 0 or self.K == 0

    @property
    def programs(self) -> int:
        """The config's programs, not capped by the tiles: one compiled kernel per config."""
        return self.config.GEMM_SMS + self.config.COMM_SMS


def prepare(variant: str, a, b, config, group, return_gathered: bool, *, buffers: str,
            comm: bool = False) -> tuple:
    """``(heap, Prepared)`` of this call, made the first time its signature is seen on the group.

    ``buffers``: ``"gathered"`` (a_gathered), ``"flagged"`` (a_gathered, flags and the claim
    counter) or ``"shard"`` (a_shard [M_loc, K]); ``comm``: the variant needs COMM_SMS >= 1."""
    heap = op_heap(OP, group)
    make = functools.partial(_make, variant, a, b, config, group, return_gathered, buffers, comm)
    p = once(heap, (OP, variant, bool(return_gathered)), make, config, a, b)
    if p.meta.get("USE_TMA"):
        ensure_triton_allocator()  # per call: Triton's allocator is per thread (autograd's backward has its own)
    return heap, p


def _make(variant, a, b, config, group, return_gathered, buffers, comm) -> Prepared:
    # No padded copies: the variants read `a` where it is (the shard travels anyway).
    call = prepare_gemm(OP, a, b, group, config, comm=comm, pad=False)
    cfg, heap = call.config, call.heap
    check_variant_config(OP, variant, cfg)  # only bulk_sync splits K
    M, N, K, W, r = call.M, call.N, call.K, heap.world_size, heap.rank
    sizes = dict(key=call.key(variant, bool(return_gathered)), config=cfg, M=M, N=N, K=K)
    if M == 0 or K == 0 or (N == 0 and buffers != "gathered"):
        return Prepared(**sizes)
    dtype, size = a.dtype, a.element_size()
    num_chunks = -(-M // cfg.BLOCK_M)
    held = []
    if buffers == "shard":
        ws = hold(heap, held, (OP, variant, M, K, dtype), lambda h: {"a_shard": h.empty((M, K), dtype=dtype)},
                  M * K * size)
        ag, own, rows = None, ws.a_shard, ws.a_shard
    else:
        flagged = buffers == "flagged"

        def make(h):
            made = {"a_gathered": h.empty((W * M, K), dtype=dtype)}
            if flagged:
                made["flags"] = h.zeros(W * num_chunks, dtype=torch.int64)
                made["claims"] = h.zeros(1, dtype=torch.int32)
            return made

        ws = hold(heap, held, (OP, variant, M, K, dtype, cfg.BLOCK_M if flagged else 0), make,
                  W * M * K * size + (8 * W * num_chunks + 4 if flagged else 0))
        ag = rows = ws.a_gathered
        own = ag[r * M:(r + 1) * M]
    # The operand path of A rows read from the heap buffer, and whether `a` itself fits it too.
    use_tma, b_kmajor = gemm_layout(rows, b)
    local_direct = (not use_tma) or gemm_layout(a, b)[0]
    # Flattened tile loops (no flags in them): not where fused_sequential also copies rows out.
    flatten = flattened_loop(cfg, use_tma) and not (buffers == "shard" and return_gathered)
    flags = ws.buffers.get("flags")
    return Prepared(
        **sizes, ag=ag, own=own, flags=flags, own_flags=None if flags is None else flags[r * num_chunks:],
        claims=ws.buffers.get("claims"), num_chunks=num_chunks, local_direct=local_direct,
        first=1 if local_direct and not return_gathered else 0,
        meta=dict(call.gemm_meta, USE_TMA=use_tma, B_KMAJOR=b_kmajor, FLATTEN=flatten), workspaces=held,
    )
