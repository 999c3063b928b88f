"""Tensor-parallel layers on tilefuse's fused ops, and a plan-based swap into existing models.

* :class:`ColumnParallelLinear` (``all_gather_gemm`` forward) and :class:`RowParallelLinear`
  (``gemm_reduce_scatter`` forward): ``nn.Linear``-compatible, sharded weights, autograd-aware.
* :func:`column_parallel_linear`, :func:`row_parallel_linear`: the same as functions.
* :func:`parallelize` with :data:`LLAMA_MLP_PLAN` / :data:`LLAMA_ATTENTION_PLAN`.

Activations are sequence-parallel along dim 0 (see :mod:`tilefuse.nn.functional`).
"""

from .functional import column_parallel_linear, row_parallel_linear
from .layers import ColumnParallelLinear, RowParallelLinear
from .parallelize import LLAMA_ATTENTION_PLAN, LLAMA_MLP_PLAN, STYLES, parallelize

__all__ = [
    "ColumnParallelLinear", "LLAMA_ATTENTION_PLAN", "LLAMA_MLP_PLAN", "RowParallelLinear", "STYLES",
    "column_parallel_linear", "parallelize", "row_parallel_linear",
]
