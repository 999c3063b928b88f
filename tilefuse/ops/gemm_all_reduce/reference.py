"""gemm_all_reduce reference: fp32 torch.matmul, then a torch.distributed all-reduce (fp32 sum)."""

from __future__ import annotations

import torch

from ..common.collectives import all_reduce_sum, op_group
from ..common.scaled import fp32_operands
from ._prepare import OP, check_bias


def reference(a: torch.Tensor, b: torch.Tensor, *, config=None, group=None, bias=None, scale_a=None, scale_b=None,
              out_dtype=None) -> torch.Tensor:
    """``all_reduce(a @ b) + bias``: ``a [M, K_loc]``, ``b [K_loc, N]``, ``bias [N]`` -> ``[M, N]``, in fp32
    and rounded once to a's dtype (float8: of the dequantized operands, to ``out_dtype``)."""
    group = op_group(group)
    if bias is not None:
        check_bias(OP, bias, a, b)
    a32, b32, dtype = fp32_operands(OP, a, b, scale_a, scale_b, out_dtype)
    total = all_reduce_sum(a32 @ b32, group=group)
    if bias is not None:
        total = total + bias.float()
    return total.to(dtype)
