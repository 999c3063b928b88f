"""gemm_reduce_scatter: ``c = reduce_scatter(a @ b, dim=0)``, partial tiles sent to their owner."""

from __future__ import annotations

from .. import calls, registry
from .bulk_sync import bulk_sync
from .fused_sequential import fused_sequential
from .producer_consumer import producer_consumer
from .reference import reference
from .wg_specialized import wg_specialized

OP = "gemm_reduce_scatter"
for _fn in (reference, bulk_sync, producer_consumer, fused_sequential, wg_specialized):
    registry.register(OP, _fn.__name__, _fn)


def gemm_reduce_scatter(a, b, *, variant: str = "auto", config=None, group=None, scale_a=None, scale_b=None,
                        out_dtype=None):
    """GEMM over a K shard, summed over ranks and scattered by rows: ``reduce_scatter(a @ b, dim=0)``.

    Every rank of ``group`` (default: the group of :func:`tilefuse.init`) calls it with ``a [M,
    K_loc]`` and ``b [K_loc, N]``, its K shard (K_loc may differ between ranks); rank r gets ``c [M/W,
    N]``, rows ``r*M/W ... (r+1)*M/W`` of the sum over ranks of ``a @ b``. M must be divisible by the
    world size (ValueError otherwise, on every rank). fp16, bf16 or fp32 (tf32 tensor cores on GPUs).
    Each partial is rounded to the input dtype before it travels; the owner sums the W partials in
    fp32 in a fixed order (the same bits on every run and from each variant) and rounds once.

    ``variant``: one of ``tilefuse.VARIANTS``, ``"reference"``, ``"plain"`` or ``"auto"``. ``config``:
    a :class:`tilefuse.Config` (the same on every rank). Workspaces: ``README.md``.

    Returns once every rank's partial of this rank's rows has been summed into ``c`` (stream-ordered on a
    GPU). Collective: every rank makes the same calls in the same order. Autograd: ``da, dc_gathered =
    all_gather_gemm(dc, b.t(), return_gathered=True)``, ``db = a.t() @ dc_gathered``; compile: custom op.

    Float8: ``a``, ``b`` in ``float8_e4m3fn`` (one may be ``float8_e5m2``) with float32 ``scale_a``,
    ``scale_b`` (tensor-wise, or row-wise ``[rows of a, 1]``, ``[1, columns of b]``) compute
    ``torch._scaled_mm``'s result, rounded once to ``out_dtype`` (default bfloat16); the partials
    travel and are reduced in fp32. Forward only.
    """
    return calls.call(OP, a, b, variant, config, group, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)
