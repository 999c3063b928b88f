"""gemm_reduce_scatter: ``c = reduce_scatter(a @ b, dim=0)``, partial tiles sent to their owner."""

from __future__ import annotations

from .. import registry
from .reference import reference

OP = "gemm_reduce_scatter"
for _name, _fn in (("reference", reference),):
    registry.register(OP, _name, _fn)


def gemm_reduce_scatter(a, b, *, variant: str = "auto", config=None, group=None):
    """GEMM over a K shard, summed over ranks and scattered by rows: ``reduce_scatter(a @ b, dim=0)``.

    Every rank of ``group`` calls it with ``a [M, K_loc]`` and ``b [K_loc, N]``, its K shard; rank r
    gets rows ``r*M/W ... (r+1)*M/W`` of the sum over ranks, ``c [M/W, N]``. M must be divisible by
    the world size. fp16, bf16 or fp32; accumulation and reduction in fp32, result in the input
    dtype. Collective: every rank must make the same calls in the same order.
    """
    from ..dispatch import choose_variant

    if variant == "auto":
        variant = choose_variant(OP, a, b, group)
    return registry.get(OP, variant)(a, b, config=config, group=group)
