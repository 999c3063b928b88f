"""gemm_reduce_scatter reference: fp32 torch.matmul, then a torch.distributed reduce-scatter over rows."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..common.checks import check_divisible, check_matrix
from ..common.collectives import op_group, reduce_scatter_rows
from ..common.scaled import fp32_operands


def reference(a: torch.Tensor, b: torch.Tensor, *, config=None, group=None, scale_a=None, scale_b=None,
              out_dtype=None) -> torch.Tensor:
    """``reduce_scatter(a @ b, dim=0)``: ``a [M, K_loc]``, ``b [K_loc, N]`` -> ``[M/W, N]`` (fp32 sum;
    float8: of the dequantized operands, in ``out_dtype``)."""
    group = op_group(group)
    check_matrix("gemm_reduce_scatter", "a", a)
    check_divisible("gemm_reduce_scatter", "M (rows of a)", a.shape[0], dist.get_world_size(group), "the world size")
    a32, b32, dtype = fp32_operands("gemm_reduce_scatter", a, b, scale_a, scale_b, out_dtype)
    return reduce_scatter_rows(a32 @ b32, group=group).to(dtype)
