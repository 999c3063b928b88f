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

    Every rank of ``group`` (default: the group of :func:`tilefuse.init`) calls it with
    ``a [M, K_loc]`` and ``b [K_loc, N]``, its K shard (ordinary tensors; K_loc may differ between
    ranks); rank r gets ``c [M/W, N]``, rows ``r*M/W ... (r+1)*M/W`` of the sum over ranks of
    ``a @ b``, as an ordinary tensor. M must be divisible by the world size (ValueError otherwise,
    on every rank). fp16, bf16 or fp32 (fp32 runs the tensor cores in tf32 on GPUs). Each rank's
    partial is accumulated in fp32 and rounded to the input dtype before it travels (as the partial
    ``a @ b`` handed to an NCCL reduce-scatter is); the owner sums the W partials in fp32, in a fixed
    order (the same bits on every run, and from each of the four variants), and rounds the sum to the
    input dtype.

    ``variant``: one of ``tilefuse.VARIANTS``, ``"reference"`` (torch.matmul + reduce-scatter),
    ``"plain"`` or ``"auto"`` (a measured choice,
    else the plain path: ``tilefuse/tuning/README.md``). ``config``: a
    :class:`tilefuse.Config` overriding tile sizes and the GEMM_SMS/COMM_SMS split (the same on
    every rank). Heap workspace per rank, allocated on the first call of a shape: ``M*N*itemsize``
    bytes for the staging buffer (one per dtype), plus ``(M/W)*N*4`` bytes for the fp32 running sum
    of producer_consumer and wg_specialized when W >= 3.

    Returns once every rank's partial of this rank's rows has been summed into ``c`` (stream-ordered
    on a GPU: complete for any later work on the current stream). Collective: every rank must make
    the same calls in the same order.

    Autograd: ``da, dc_gathered = all_gather_gemm(dc, b.t(), return_gathered=True)``,
    ``db = a.t() @ dc_gathered``. ``torch.compile(fullgraph=True)`` traces the call as the custom
    op ``torch.ops.tilefuse.gemm_reduce_scatter`` (:mod:`tilefuse.ops.library`).

    Float8: ``a`` and ``b`` in ``torch.float8_e4m3fn`` (one of them may be ``float8_e5m2``) with
    float32 ``scale_a`` and ``scale_b``, each tensor-wise (one element) or row-wise (``scale_a
    [rows of this rank's a, 1]``, ``scale_b [1, columns of this rank's b]``), compute
    ``(a.float() * scale_a) @ (b.float() * scale_b)`` as ``torch._scaled_mm`` does: fp32
    accumulation, the scales applied to each tile before it is stored or moved, one rounding to
    ``out_dtype`` (bfloat16, float16 or float32; default bfloat16). Each rank's scaled partial is reduced
    in fp32 (it travels in fp32) and the sum is rounded once. Forward only: a backward
    through a float8 call raises NotImplementedError.
    """
    return calls.call(OP, a, b, variant, config, group, scale_a=scale_a, scale_b=scale_b,
                        out_dtype=out_dtype)
