"""gemm_all_reduce: ``c = all_reduce(a @ b)``, bit-identical on every rank (partials pushed to all)."""

from __future__ import annotations

from .. import calls, registry
from .bulk_sync import bulk_sync
from .fused_sequential import fused_sequential
from .producer_consumer import producer_consumer
from .reference import reference
from .wg_specialized import wg_specialized

OP = "gemm_all_reduce"
ENTRY_POINTS = {"reference": reference, "bulk_sync": bulk_sync, "producer_consumer": producer_consumer,
                "fused_sequential": fused_sequential, "wg_specialized": wg_specialized}
for _name, _fn in ENTRY_POINTS.items():
    registry.register(OP, _name, _fn)


def gemm_all_reduce(a, b, *, variant: str = "auto", config=None, group=None, bias=None, residual=None,
                    norm_weight=None, eps: float = 1e-6, scale_a=None, scale_b=None, out_dtype=None):
    """GEMM over a K shard, summed over ranks, on every rank: ``all_reduce(a @ b) (+ bias)``.

    The row-parallel linear of inference tensor parallelism. Every rank of ``group`` (default: the
    group of :func:`tilefuse.init`) calls it with ``a [M, K_loc]`` and ``b [K_loc, N]``, its K shard
    (ordinary tensors; K_loc may differ between ranks); every rank gets ``c [M, N]``, the sum over
    ranks of ``a @ b`` (plus ``bias``), as an ordinary tensor. fp16, bf16 or fp32 (fp32 runs the
    tensor cores in tf32 on GPUs). No divisibility requirement.

    Precision and determinism: each rank's partial is accumulated in fp32 and rounded to the input
    dtype once, before it travels (as the partial ``a @ b`` handed to an NCCL all-reduce is); every
    rank sums the W partials in fp32 in the fixed order of ranks 0, 1, ..., W-1, adds the bias in
    fp32 and rounds once to the input dtype. So the W copies of ``c`` are bit-identical (replicated
    activations never drift apart), every run gives the same bits, and the four variants agree bit
    for bit. The reference and plain paths sum in another order: they agree to rounding.

    ``bias``: optional ``[N]`` tensor of a's dtype, added once after the sum (fused into the
    reduction). It must be the same on every rank, or the copies of ``c`` differ by the biases.
    It is an argument of the ``torch.library`` custom op: ``torch.compile`` traces it, and its
    gradient is the output gradient summed over rows (on every rank).

    The algorithm is one-shot: every rank pushes each partial tile into every rank's heap and sums
    all W partials itself (one exchange; (W-1)·M·N elements sent per rank).

    ``variant``: one of ``tilefuse.VARIANTS``, ``"reference"`` (fp32 torch.matmul + all-reduce),
    ``"plain"`` (torch.matmul + torch.distributed all-reduce) or ``"auto"`` (the tuned table, the
    cache, first-call tuning or the plain path). ``config``: a :class:`tilefuse.Config` overriding
    tile sizes and the GEMM_SMS/COMM_SMS split (the same on every rank). Heap workspace per rank,
    allocated on the first call of a shape: ``W*M*N*itemsize`` bytes of staging (one per dtype and
    shape, shared by the variants), plus ``8*W*tiles`` bytes of flags for producer_consumer,
    wg_specialized and fused_sequential. fused_sequential splitting K (``Config.SPLIT_K``;
    the default at decode sizes on a GPU) also keeps ``4*SPLIT_K*BLOCK_M*BLOCK_N`` bytes a tile of
    fp32 slices in ordinary device memory, one set per stream.

    ``residual``, ``norm_weight``, ``eps``: the fused residual-add + RMSNorm of a decoder layer (vLLM's
    fused add-RMSNorm after the all-reduce). Given ``norm_weight [N]`` (and optionally ``residual
    [M, N]`` of a's dtype), the call returns ``(y, new_residual)``: ``s = all_reduce(a @ b) (+ bias)
    (+ residual)`` rounded to a's dtype is ``new_residual``, and ``y = s * rsqrt(mean(s^2, -1) + eps)
    * norm_weight``, computed in fp32 from that ``s`` and rounded once (``norm.py``). Both have the same
    bits on every rank. fused_sequential runs it inside its one kernel (the program that finishes a row
    block norms it); the other variants after their reduction (one kernel, a program per row); the
    plain and reference paths in torch ops. ``norm_weight`` and ``residual`` must be the same on every
    rank; their gradients (and ``a``'s, ``b``'s, ``bias``'s) are those of the composed ops.

    Returns once every rank's partial has been summed into ``c`` (stream-ordered on a GPU: complete
    for any later work on the current stream). Collective: every rank must make the same calls in
    the same order. CUDA graphs: make one eager call of the shape first, then capture.

    Float8: ``a`` and ``b`` in ``torch.float8_e4m3fn`` (one of them may be ``float8_e5m2``) with
    float32 ``scale_a`` and ``scale_b``, each tensor-wise (one element) or row-wise (``scale_a
    [rows of this rank's a, 1]``, ``scale_b [1, columns of this rank's b]``), compute
    ``(a.float() * scale_a) @ (b.float() * scale_b)`` as ``torch._scaled_mm`` does: fp32
    accumulation, the scales applied to each tile before it is stored or moved, one rounding to
    ``out_dtype`` (bfloat16, float16 or float32; default bfloat16). Each rank's scaled partial travels
    and is summed in fp32 (with the bias, of any of those dtypes), rounded once: the same bits on
    every rank. Forward only: a backward
    through a float8 call raises NotImplementedError.
    """
    if norm_weight is not None or residual is not None:
        if scale_a is not None or scale_b is not None or out_dtype is not None:
            raise NotImplementedError("gemm_all_reduce: the residual + RMSNorm epilogue takes no float8 scaling "
                                      "(scale_a, scale_b, out_dtype); call it on float16/bfloat16/float32 operands")
        return calls.call_norm(a, b, variant=variant, config=config, group=group, bias=bias, residual=residual,
                                 norm_weight=norm_weight, eps=eps)
    return calls.call(OP, a, b, variant, config, group, bias=bias, scale_a=scale_a,
                        scale_b=scale_b, out_dtype=out_dtype)
