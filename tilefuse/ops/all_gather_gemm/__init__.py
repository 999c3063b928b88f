"""all_gather_gemm: ``c = all_gather(a, dim=0) @ b``, A's row shards consumed as they arrive."""

from __future__ import annotations

from .. import calls, registry
from .bulk_sync import bulk_sync
from .copy_engine import copy_engine
from .fused_sequential import fused_sequential
from .producer_consumer import producer_consumer
from .reference import reference
from .wg_specialized import wg_specialized

OP = "all_gather_gemm"
for _fn in (reference, bulk_sync, producer_consumer, fused_sequential, wg_specialized, copy_engine):
    registry.register(OP, _fn.__name__, _fn)


def all_gather_gemm(a, b, *, variant: str = "auto", config=None, group=None, return_gathered=False, scale_a=None,
                    scale_b=None, out_dtype=None):
    """GEMM of the row-gathered A: ``all_gather(a, dim=0) @ b``.

    Every rank of ``group`` (default: the group of :func:`tilefuse.init`) calls it with ``a [M_loc,
    K]``, its row shard (any strides), and ``b [K, N]``; all get ``c [W*M_loc, N]`` whose row block r
    is rank r's shard times ``b``. M_loc must be the same on every rank; any M_loc, N and K. fp16,
    bf16 or fp32 (tf32 tensor cores on GPUs); fp32 accumulation, result in the input dtype.

    ``variant``: one of ``tilefuse.VARIANTS``, ``"copy_engine"`` (producer_consumer's form whose rows
    the copy engines pull), ``"reference"`` or ``"auto"``. ``config``: a :class:`tilefuse.Config`.
    ``return_gathered=True`` returns ``(c, a_gathered)``, ``a_gathered [W*M_loc, K]`` bit-identical to
    the all-gather. Both are fresh tensors, complete when the call returns (stream-ordered on a GPU).
    Collective: every rank makes the same calls in the same order; ranks whose call signatures differ
    get :class:`tilefuse.CallMismatchError`. Autograd: ``da = gemm_reduce_scatter(dc, b.t())`` (plus
    ``a_gathered``'s gradient), ``db = a_gathered.t() @ dc``; ``torch.compile`` traces the custom op.

    Float8: ``a``, ``b`` in ``float8_e4m3fn`` (one may be ``float8_e5m2``) with float32 ``scale_a``,
    ``scale_b`` (tensor-wise, or row-wise ``[rows of a, 1]``, ``[1, columns of b]``) compute
    ``torch._scaled_mm``'s result, rounded once to ``out_dtype`` (default bfloat16); the rows travel
    with their row scales and ``a_gathered`` is float8. Forward only.
    """
    return calls.call(OP, a, b, variant, config, group, return_gathered=return_gathered, scale_a=scale_a,
                      scale_b=scale_b, out_dtype=out_dtype)
