"""all_gather_gemm: ``c = all_gather(a, dim=0) @ b``, A's row shards consumed as they arrive."""

from __future__ import annotations

from .. import registry
from .reference import reference

OP = "all_gather_gemm"
for _name, _fn in (("reference", reference),):
    registry.register(OP, _name, _fn)


def all_gather_gemm(a, b, *, variant: str = "auto", config=None, group=None, return_gathered=False):
    """GEMM of the row-gathered A: ``all_gather(a, dim=0) @ b``.

    Every rank of ``group`` calls it with ``a [M_loc, K]``, its row shard (e.g. its
    sequence-parallel tokens; the same M_loc on every rank), and ``b [K, N]``; all get
    ``c [W*M_loc, N]`` whose row block r is rank r's shard times ``b``. With
    ``return_gathered=True`` it returns ``(c, a_gathered)``, ``a_gathered [W*M_loc, K]`` bit-identical
    to the all-gather (the backward pass needs it). fp16, bf16 or fp32; fp32 accumulation.
    Collective: every rank must make the same calls in the same order.
    """
    from ..dispatch import choose_variant

    if variant == "auto":
        variant = choose_variant(OP, a, b, group)
    return registry.get(OP, variant)(a, b, config=config, group=group, return_gathered=return_gathered)
