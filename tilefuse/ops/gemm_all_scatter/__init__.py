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

    Every rank of ``group`` (default: the group of :func:`tilefuse.init`) calls it with
    ``a [M, K]``, the same on all ranks, and ``b [K, N_loc]``, its column shard; all get
    ``c [M, W*N_loc]`` whose column block r is rank r's ``a @ b``. fp16, bf16 or fp32 (fp32 runs
    the tensor cores in tf32 on GPUs); fp32 accumulation, result in the input dtype. Any M, N_loc
    and K (ragged edges are masked).

    ``variant``: one of ``tilefuse.VARIANTS``, ``"reference"`` (torch.matmul + all_gather) or
    ``"auto"`` (a measured choice,
    else the plain path: ``tilefuse/tuning/README.md``). ``config``: a :class:`tilefuse.Config`
    overriding tile sizes and the GEMM_SMS/COMM_SMS split. ``out``: optional ``[M, W*N_loc]`` tensor of
    the result's dtype and device: a contiguous heap tensor (same offset on every rank) is written in
    place, with nothing copied. Otherwise (a fresh tensor, or ``out`` when contiguous) this rank's
    block is stored into the result directly and the peers' blocks, which land in the op's heap buffer,
    are copied into it (a strided ``out`` receives a copy of the whole result).

    Returns once every rank's tiles have landed in this rank's result (stream-ordered on a GPU:
    the data is complete for any later work on the current stream). Collective: every rank must
    make the same calls in the same order.

    Autograd: the gradient of rank r's ``a @ b`` is the sum over ranks of their ``dc``'s column
    block r (a reduce-scatter), then ``da = g @ b.t()``, ``db = a.t() @ g``; ``out=`` is not
    differentiable, like torch's ``out=`` functions. ``torch.compile(fullgraph=True)`` traces the
    call as the custom op ``torch.ops.tilefuse.gemm_all_scatter`` (:mod:`tilefuse.ops.library`).

    Float8: ``a`` and ``b`` in ``torch.float8_e4m3fn`` (one of them may be ``float8_e5m2``) with
    float32 ``scale_a`` and ``scale_b``, each tensor-wise (one element) or row-wise (``scale_a
    [rows of this rank's a, 1]``, ``scale_b [1, columns of this rank's b]``), compute
    ``(a.float() * scale_a) @ (b.float() * scale_b)`` as ``torch._scaled_mm`` does: fp32
    accumulation, the scales applied to each tile before it is stored or moved, one rounding to
    ``out_dtype`` (bfloat16, float16 or float32; default bfloat16). Forward only: a backward
    through a float8 call raises NotImplementedError.
    """
    return calls.call(OP, a, b, variant, config, group, out=out, scale_a=scale_a,
                        scale_b=scale_b, out_dtype=out_dtype)
