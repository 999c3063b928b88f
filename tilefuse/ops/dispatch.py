"""``variant="auto"``: the tuned table's choice for the call's shape, else a heuristic.

Tables (``tilefuse.tuning.tables``) are keyed by the op, the device's arch name and the world size,
and by the call's operand shapes ``a [M, K] @ b [K, N]`` and dtype. Where the tuner found that no
fused variant beat the plain path (torch.matmul + torch.distributed), the table says ``plain`` and
auto runs it.

Every rank must reach the same choice, so auto assumes all ranks pass the same shapes (the usual
even sharding). A gemm_reduce_scatter whose K shards differ between ranks should name its variant.
"""

from __future__ import annotations

import os

from ..runtime import get_heap, hw, is_initialized
from ..tuning import tables
from . import registry

_DTYPE_NAMES = {"torch.float16": "float16", "torch.bfloat16": "bfloat16", "torch.float32": "float32"}


# Untuned shapes at W > 1: each op's variant that won most often on two H200s over NVLink
# (docs/PERF.md, run 4). gemm_reduce_scatter's variants did not beat NCCL there, so it stays plain.
UNTUNED_CHOICE = {"gemm_all_scatter": "fused_sequential", "all_gather_gemm": "wg_specialized",
                  "gemm_reduce_scatter": "plain"}


def heuristic(op: str, M: int, N: int, K: int, world: int) -> str:
    """Untuned shapes: at world 1 the plain path (nothing to overlap, and torch.matmul is the GEMM to
    beat); otherwise :data:`UNTUNED_CHOICE` (the variant that measured best most often), if registered."""
    available = registry.variants(op)
    first = "plain" if world == 1 else UNTUNED_CHOICE.get(op, "plain")
    for name in (first, "plain", "bulk_sync"):
        if name in available:
            return name
    raise ValueError(f"{op}: no variant registered")


def choose(op: str, a, b, group=None) -> tables.Choice:
    """What ``variant="auto"`` runs for ``op(a, b)`` on this rank's heap (device, world size)."""
    if not is_initialized():
        raise RuntimeError(f"{op}: tilefuse is not initialised on this rank: call tilefuse.init() first")
    heap = get_heap()
    M, K = a.shape
    N = b.shape[1]
    dtype = _DTYPE_NAMES.get(str(a.dtype), str(a.dtype))
    choice = tables.lookup(op, hw.arch_name(heap.device), heap.world_size, M, N, K, dtype)
    if choice is not None and choice.variant in registry.variants(op):
        return choice
    return tables.Choice(heuristic(op, M, N, K, heap.world_size), None, "heuristic")


def choose_variant(op: str, a, b, group=None) -> str:
    return choose(op, a, b, group).variant


_RESOLVED: dict = {}


def resolve(op: str, a, b, group=None) -> tuple:
    """``(variant, entry point, table config)`` that auto runs for this call, remembered per call
    signature (op, shapes, dtype, device, group, heap, user table directory) until
    :func:`tilefuse.tuning.tables.clear_cache`: a small call pays a dictionary lookup, not a table
    lookup (at decode sizes a call's host time is comparable to its kernel: docs/PERF.md)."""
    key = (op, a.shape, b.shape, a.dtype, a.device, group, get_heap().uid,
           os.environ.get("TILEFUSE_CONFIG_DIR", ""), tables.generation())
    hit = _RESOLVED.get(key)
    if hit is None:
        choice = choose(op, a, b, group)
        hit = _RESOLVED[key] = (choice.variant, registry.get(op, choice.variant), choice.config)
    return hit


def run_auto(op: str, a, b, config, group, **kwargs):
    """Run ``op`` with the chosen variant; a caller's ``config`` overrides the table's."""
    variant, fn, table_config = resolve(op, a, b, group)
    if variant == tables.PLAIN:
        return fn(a, b, group=group, **kwargs)
    return fn(a, b, config=config if config is not None else table_config, group=group, **kwargs)
