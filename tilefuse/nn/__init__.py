"""Tensor-parallel layers on tilefuse's fused ops.

* :class:`ColwiseParallel`, :class:`RowwiseParallel`: torch's ``ParallelStyle`` s for
  ``parallelize_module`` (DTensor parameters; replicated and sequence-parallel layouts).
* :class:`ColumnParallelLinear`, :class:`RowParallelLinear` and their functions: sequence-parallel
  linears (dim 0 sharded) with locally sharded weights.
* :func:`parallelize` with plan strings of torch's / HF's meaning, the ready Llama plans, and
  :func:`from_hf_plan` (a Hugging Face ``tp_plan`` as a ``parallelize_module`` plan).
* :func:`fuse_allreduce_norm`: a decoder parallelized in the replicated layout, each row-parallel
  projection fused with the residual add and RMSNorm after it.
"""

from .functional import column_parallel_linear, row_parallel_linear
from .fuse import Carried, fuse_allreduce_norm
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
    "Carried", "ColumnParallelLinear", "ColwiseParallel", "LLAMA_ATTENTION_PLAN", "LLAMA_MLP_PLAN", "LLAMA_PLAN",
    "RowParallelLinear", "RowwiseParallel", "STYLES", "column_parallel_linear", "from_hf_plan", "fuse_allreduce_norm",
    "llama_sequence_parallel_plan", "parallelize", "row_parallel_linear", "style_from_name",
]
