"""gemm_all_scatter reference: fp32 torch.matmul, then a torch.distributed all-gather along N."""

from __future__ import annotations

import torch

from ..common.collectives import all_gather_cat, op_group
from ..common.scaled import fp32_operands


def reference(a: torch.Tensor, b: torch.Tensor, *, config=None, group=None, out=None, scale_a=None, scale_b=None,
              out_dtype=None) -> torch.Tensor:
    """``all_gather(a @ b, dim=1)``: ``a [M, K]`` (same on all ranks), ``b [K, N_loc]``
    -> ``[M, W*N_loc]`` (float8: of the dequantized operands, in ``out_dtype``)."""
    group = op_group(group)
    a32, b32, dtype = fp32_operands("gemm_all_scatter", a, b, scale_a, scale_b, out_dtype)
    c = all_gather_cat((a32 @ b32).to(dtype), dim=1, group=group)
    return c if out is None else out.copy_(c)
