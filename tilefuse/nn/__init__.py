"""Tensor-parallel layers on tilefuse's fused ops: torch's styles, sequence-parallel linears, plans by
name and the all-reduce + RMSNorm epilogue fusion (``tilefuse/nn/README.md``)."""

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
