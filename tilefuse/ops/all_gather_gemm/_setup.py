"""Host set-up shared by the all_gather_gemm variants: checks, the cross-rank shape check, workspaces,
operand layout and outputs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..common.config import check_variant_config
from ..common.gemm import ensure_triton_allocator, flattened_loop, gemm_layout
from ..common.launch import Entered, GemmCall, begin_call, new_output, prepare_gemm, workspace

OP = "all_gather_gemm"

def setup(variant: str, a, b, config, group, *, comm: bool) -> GemmCall:
    """Local checks and config (per-shard M for the heuristic). Every rank's shapes are compared by
    the call's begin kernel (its signature holds them), before any data moves."""
    # No padded copies: the variants read `a` where it is (the shard travels anyway) and decide its
    # operand path themselves (`layout`).
    call = prepare_gemm(OP, a, b, group, config, comm=comm, pad=False)
    check_variant_config(OP, variant, call.config)  # only bulk_sync splits K
    return call


def start(call: GemmCall, variant: str, return_gathered: bool, *outputs, kernel_begins: bool = False) -> tuple | None:
    """Begin the call (pairing, signature check, barrier); ``outputs`` are NaN if it aborts. With
    ``kernel_begins`` the call's first kernel begins it: returns its begin arguments (``launch.begin_call``)."""
    return begin_call(call.key(variant, bool(return_gathered)), *outputs, kernel_begins=kernel_begins)


def is_degenerate(call: GemmCall) -> bool:
    """Empty shards or an empty product: the fused variants hand these to bulk_sync."""
    return call.M == 0 or call.N == 0 or call.K == 0


def gathered_workspace(call: GemmCall, variant: str, *, flags: bool):
    """Heap buffers of a push variant: ``a_gathered [W*M_loc, K]`` and, with ``flags``, the int64
    per-(source, chunk) arrival flags ``flags [W * cdiv(M_loc, BLOCK_M)]`` (sequence numbers)."""
    heap, cfg = call.heap, call.config
    W = heap.world_size
    num_chunks = -(-call.M // cfg.BLOCK_M)
    dtype = call.a.dtype
    key = (OP, variant, call.M, call.K, dtype, cfg.BLOCK_M if flags else 0)

    def make(h):
        buffers = {"a_gathered": h.empty((W * call.M, call.K), dtype=dtype)}
        if flags:
            buffers["flags"] = h.zeros(W * num_chunks, dtype=torch.int64)
            # wg_specialized's count of local tiles taken (zero between calls: _tiles.claim_local_tiles)
            buffers["claims"] = h.zeros(1, dtype=torch.int32)
        return buffers

    nbytes = W * call.M * call.K * call.a.element_size() + (8 * W * num_chunks + 4 if flags else 0)
    return workspace(heap, key, make, nbytes)


@dataclass(frozen=True)
class Layout:
    """How the GEMM reads A: ``use_tma``/``b_kmajor`` for the heap copy of A (and b), and whether the
    local shard's tiles may read ``a`` itself on the same path (``local_direct``)."""

    use_tma: bool
    b_kmajor: bool
    local_direct: bool


def layout(call: GemmCall, heap_a: torch.Tensor) -> Layout:
    """The operand path for A rows read from ``heap_a`` (a contiguous heap buffer) and for ``b``."""
    use_tma, b_kmajor = gemm_layout(heap_a, call.b)
    if use_tma:
        ensure_triton_allocator()
    local_direct = (not use_tma) or gemm_layout(call.a, call.b)[0]
    return Layout(use_tma, b_kmajor, local_direct)


def gemm_meta(call: GemmCall, lay: Layout, *, flatten: bool = True) -> dict:
    """Constexprs and launch options of the GEMM part, on the layout decided by :func:`layout`.
    ``FLATTEN``: the tile loops without flags (fused_sequential's, without ``flatten=False`` where it
    also copies rows; producer_consumer's local shard read from ``a``) run flattened where the GEMM
    core's would (:func:`~..common.gemm.flattened_loop`), and so do wg_specialized's GEMM programs'
    dealt shares of the local tiles (``_tiles.claim_local_tiles``)."""
    return dict(call.gemm_meta, USE_TMA=lay.use_tma, B_KMAJOR=lay.b_kmajor,
                FLATTEN=flatten and flattened_loop(call.config, lay.use_tma))


@dataclass(frozen=True)
class PushPlan(Entered):
    """Everything a flagged push variant (producer_consumer, wg_specialized) launches with."""

    ag: torch.Tensor  # a_gathered [W*M_loc, K] on the heap
    flags: torch.Tensor  # int64 [W * num_chunks], entry (source, chunk)
    claims: torch.Tensor  # int32 [1]: local tiles taken in this call (wg_specialized), zero between calls
    own: torch.Tensor  # this rank's row block of ag
    c: torch.Tensor  # the output [W*M_loc, N]
    lay: Layout
    num_chunks: int
    first: int  # 1: the local rows are not pushed to this rank itself (read from `a` directly)
    enter: tuple | None = None  # the begin arguments of a kernel that begins the call itself


def plan_push(call: GemmCall, variant: str, return_gathered: bool, *, kernel_begins: bool = False) -> PushPlan:
    """Workspace, layout and output of one call of a flagged push variant; begins the call (or, with
    ``kernel_begins``, hands its first kernel the begin: :attr:`PushPlan.enter_args`)."""
    heap, cfg = call.heap, call.config
    r, M_loc = heap.rank, call.M
    ws = gathered_workspace(call, variant, flags=True)
    ag = ws.a_gathered
    lay = layout(call, ag)
    # The local rows go to this rank's own a_gathered only when something reads them there.
    first = 1 if lay.local_direct and not return_gathered else 0
    c = new_output((heap.world_size * M_loc, call.N), call.a.dtype, call.a.device)
    entry = start(call, variant, return_gathered, c, kernel_begins=kernel_begins)
    return PushPlan(ag=ag, flags=ws.flags, claims=ws.claims, own=ag[r * M_loc:(r + 1) * M_loc], c=c, lay=lay,
                    num_chunks=-(-M_loc // cfg.BLOCK_M), first=first, enter=entry)


def finish(call: GemmCall, c: torch.Tensor, gathered, return_gathered: bool):
    """Return ``c`` or ``(c, gathered)``."""
    return (c, gathered) if return_gathered else c
