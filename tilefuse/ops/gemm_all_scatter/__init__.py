"""gemm_all_scatter: ``c = all_gather(a @ b, dim=1)``, each rank's tiles pushed as they are made."""

from __future__ import annotations

from .. import calls, registry
from .bulk_sync import bulk_sync
from .fused_sequential import fused_sequential
from .producer_consumer import producer_consumer
from .reference import reference
from .wg_specialized import wg_specialized

OP = "gemm_all_scatter"
for _fn in (reference, bulk_sync, producer_consumer, fused_sequential, wg_specialized):
    registry.register(OP, _fn.__name__, _fn)


def gemm_all_scatter(a, b, *, variant: str = "auto", config=None, group=None, out=None, scale_a=None, scale_b=None,
                     out_dtype=None):
    """GEMM with the result gathered along N: ``all_gather(a @ b, dim=1)``.

    Every rank of ``group`` (default: the group of :func:`tilefuse.init`) calls it with ``a [M, K]``,
    the same on all ranks, and ``b [K, N_loc]``, its column shard; all get ``c [M, W*N_loc]`` whose
    column block r is rank r's ``a @ b``. Any M, N_loc and K. fp16, bf16 or fp32 (tf32 tensor cores
    on GPUs); fp32 accumulation, result in the input dtype.

    ``variant``: one of ``tilefuse.VARIANTS``, ``"reference"`` or ``"auto"``. ``config``: a :class:`tilefuse.Config`.
    ``out``: optional ``[M, W*N_loc]`` tensor of the result's dtype and device; a contiguous heap tensor
    (same offset on every rank) is written in place, any other receives the result.

    Returns once every rank's tiles have landed in this rank's result (stream-ordered on a GPU).
    Collective: every rank makes the same calls in the same order. Autograd: ``g`` = the sum over
    ranks of ``dc``'s column block r, ``da = g @ b.t()``, ``db = a.t() @ g``; ``out=`` is not
    differentiable. ``torch.compile`` traces the custom op.

    Float8: ``a``, ``b`` in ``float8_e4m3fn`` (one may be ``float8_e5m2``) with float32 ``scale_a``,
    ``scale_b`` (tensor-wise, or row-wise ``[rows of a, 1]``, ``[1, columns of b]``) compute
    ``torch._scaled_mm``'s result, rounded once to ``out_dtype`` (default bfloat16). Forward only.
    """
    return calls.call(OP, a, b, variant, config, group, out=out, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)
