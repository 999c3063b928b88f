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

    Every rank of ``group`` (default: the group of :func:`tilefuse.init`) calls it with
    ``a [M_loc, K]``, its row shard (e.g. its sequence-parallel tokens; an ordinary tensor, any
    strides), and ``b [K, N]`` (row- or column-major, e.g. ``w.t()`` of a Linear weight); all get
    ``c [W*M_loc, N]`` whose row block r is rank r's shard times ``b``. M_loc must be the same on
    every rank (pad the shards otherwise); any M_loc, N and K (ragged edges are masked). fp16, bf16
    or fp32 (fp32 runs the tensor cores in tf32 on GPUs); fp32 accumulation, result in the input
    dtype.

    ``variant``: one of ``tilefuse.VARIANTS``, ``"copy_engine"`` (producer_consumer's form whose
    rows are pulled by the copy engines), ``"reference"`` (all_gather + torch.matmul) or
    ``"auto"``. ``config``: a :class:`tilefuse.Config` overriding tile sizes and the
    GEMM_SMS/COMM_SMS split. With ``return_gathered=True`` it returns ``(c, a_gathered)``,
    ``a_gathered [W*M_loc, K]`` bit-identical to the all-gather (the backward pass needs it).

    ``c`` and ``a_gathered`` are fresh ordinary tensors that the caller owns (not heap buffers; the
    variants that gather into a heap buffer copy it out, one extra read and write of the gathered A).
    Both are complete when the call returns (stream-ordered on a GPU: complete for any later work
    on the current stream). Collective: every rank must make the same calls in the same order.

    Shape check: the call's begin compares every rank's call signature (variant, shapes, dtype,
    config) on the device before any row moves, and a mismatch raises
    :class:`tilefuse.CallMismatchError` (a ``ValueError``) on every rank.

    Autograd: ``da = gemm_reduce_scatter(dc, b.t())``, ``db = a_gathered.t() @ dc`` (the gathered
    A is kept when ``b`` needs a gradient), and a gradient of ``a_gathered`` is reduce-scattered
    into ``da``. ``torch.compile(fullgraph=True)`` traces the call as the custom op
    ``torch.ops.tilefuse.all_gather_gemm`` (:mod:`tilefuse.ops.library`).

    Float8: ``a`` and ``b`` in ``torch.float8_e4m3fn`` (one of them may be ``float8_e5m2``) with
    float32 ``scale_a`` and ``scale_b``, each tensor-wise (one element) or row-wise (``scale_a
    [rows of this rank's a, 1]``, ``scale_b [1, columns of this rank's b]``), compute
    ``(a.float() * scale_a) @ (b.float() * scale_b)`` as ``torch._scaled_mm`` does: fp32
    accumulation, the scales applied to each tile before it is stored or moved, one rounding to
    ``out_dtype`` (bfloat16, float16 or float32; default bfloat16). The float8 rows travel (half the
    bytes of bf16) together with their row scales (a tensor-wise ``scale_a`` may differ between
    ranks); ``a_gathered`` is float8. Forward only: a backward
    through a float8 call raises NotImplementedError.
    """
    return calls.call(OP, a, b, variant, config, group, return_gathered=return_gathered,
                        scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)
