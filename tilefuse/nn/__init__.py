"""Tensor-parallel layers on tilefuse's fused ops: torch's ParallelStyles, layers, and a plan-based swap.

* :class:`ColwiseParallel`, :class:`RowwiseParallel`: torch's ``ParallelStyle`` s for
  ``torch.distributed.tensor.parallel.parallelize_module(model, mesh, plan)``, run on the fused op
  that the input and output layouts call for (replicated and sequence-parallel layouts, ``[B, S, H]``
  sharded along S included); parameters become DTensors sharded as torch's styles shard them.
* :class:`ColumnParallelLinear` (``all_gather_gemm`` forward) and :class:`RowParallelLinear`
  (``gemm_reduce_scatter`` forward): ``nn.Linear``-compatible, locally sharded weights, activations
  sequence-parallel along dim 0 (see :mod:`tilefuse.nn.functional`).
* :func:`column_parallel_linear`, :func:`row_parallel_linear`: the same as functions.
* :func:`parallelize` with plan strings of torch's / HF's meaning (``"colwise"``: replicated input,
  ``"rowwise"``: replicated output; ``"colwise_seq"`` / ``"rowwise_seq"``: sequence-parallel layers),
  the ready plans :data:`LLAMA_PLAN`, :data:`LLAMA_MLP_PLAN`, :data:`LLAMA_ATTENTION_PLAN`, and
  :func:`from_hf_plan` (a Hugging Face ``tp_plan`` as a ``parallelize_module`` plan).
"""

from .functional import column_parallel_linear, row_parallel_linear
from .layers import ColumnParallelLinear, RowParallelLinear
from .parallelize import (
    LLAMA_ATTENTION_PLAN,
    LLAMA_MLP_PLAN,
    LLAMA_PLAN,
    STYLES,
    from_hf_plan,
    llama_sequence_parallel_plan,
    parallelize,
    style_from_name,
)
from .styles import ColwiseParallel, RowwiseParallel

__all__ = [
    "ColumnParallelLinear", "ColwiseParallel", "LLAMA_ATTENTION_PLAN", "LLAMA_MLP_PLAN", "LLAMA_PLAN",
    "RowParallelLinear", "RowwiseParallel", "STYLES", "column_parallel_linear", "from_hf_plan",
    "llama_sequence_parallel_plan", "parallelize", "row_parallel_linear", "style_from_name",
]
