"""gemm_all_reduce: ``c = all_reduce(a @ b)``, bit-identical on every rank (partials pushed to all)."""

from __future__ import annotations

from .. import calls, registry
from .bulk_sync import bulk_sync
from .fused_sequential import fused_sequential
from .producer_consumer import producer_consumer
from .reference import reference
from .wg_specialized import wg_specialized

OP = "gemm_all_reduce"
for _fn in (reference, bulk_sync, producer_consumer, fused_sequential, wg_specialized):
    registry.register(OP, _fn.__name__, _fn)


def gemm_all_reduce(a, b, *, variant: str = "auto", config=None, group=None, bias=None, residual=None,
                    norm_weight=None, eps: float = 1e-6, scale_a=None, scale_b=None, out_dtype=None):
    """GEMM over a K shard, summed over ranks, on every rank: ``all_reduce(a @ b) (+ bias)``.

    Every rank of ``group`` (default: the group of :func:`tilefuse.init`) calls it with ``a [M, K_loc]``
    and ``b [K_loc, N]``, its K shard (K_loc may differ between ranks); every rank gets ``c [M, N]``,
    the sum over ranks of ``a @ b`` plus ``bias`` (optional ``[N]`` of a's dtype, the same on every
    rank). fp16, bf16 or fp32 (tf32 tensor cores on GPUs); no divisibility requirement. Each partial is
    rounded to the input dtype once before it travels; every rank sums the W partials in fp32 in the
    order 0, 1, ..., W-1, adds the bias and rounds once: the W copies of ``c`` are bit-identical, and
    the four variants agree bit for bit (reference and plain: to rounding).

    ``variant``: one of ``tilefuse.VARIANTS``, ``"reference"``, ``"plain"`` (torch.matmul + torch all-reduce)
    or ``"auto"``. ``config``: a :class:`tilefuse.Config` (the same on every rank). Workspaces: ``README.md``.

    ``residual``, ``norm_weight``, ``eps``: vLLM's fused add-RMSNorm after the all-reduce. Given
    ``norm_weight [N]`` (and optionally ``residual [M, N]`` of a's dtype), both the same on every rank,
    the call returns ``(y, new_residual)``: ``s = all_reduce(a @ b) (+ bias) (+ residual)`` rounded to
    a's dtype is ``new_residual``, ``y = s * rsqrt(mean(s^2, -1) + eps) * norm_weight`` in fp32,
    rounded once (``norm.py``).

    Returns once every rank's partial has been summed into ``c`` (stream-ordered on a GPU). Collective:
    every rank makes the same calls in the same order. CUDA graphs: make one eager call of the shape
    first, then capture. Autograd flows to every tensor argument; ``torch.compile`` traces the custom op.

    Float8: ``a``, ``b`` in ``float8_e4m3fn`` (one may be ``float8_e5m2``) with float32 ``scale_a``,
    ``scale_b`` (tensor-wise, or row-wise ``[rows of a, 1]``, ``[1, columns of b]``) compute
    ``torch._scaled_mm``'s result, rounded once to ``out_dtype`` (default bfloat16); the partials
    travel and are summed in fp32 (a bias of any float dtype). Forward only.
    """
    if norm_weight is not None or residual is not None:
        if scale_a is not None or scale_b is not None or out_dtype is not None:
            raise NotImplementedError("gemm_all_reduce: the residual + RMSNorm epilogue takes no float8 scaling "
                                      "(scale_a, scale_b, out_dtype); call it on float16/bfloat16/float32 operands")
        return calls.call_norm(a, b, variant=variant, config=config, group=group, bias=bias, residual=residual,
                               norm_weight=norm_weight, eps=eps)
    return calls.call(OP, a, b, variant, config, group, bias=bias, scale_a=scale_a, scale_b=scale_b,
                      out_dtype=out_dtype)
