"""all_gather_gemm reference: torch.distributed all-gather of A's row shards, then fp32 torch.matmul."""

from __future__ import annotations

import torch

from ..common.collectives import all_gather_cat, op_group
from ..common.scaled import fp32_operands, gather_bytes


def reference(a: torch.Tensor, b: torch.Tensor, *, config=None, group=None, return_gathered=False, scale_a=None,
              scale_b=None, out_dtype=None):
    """``all_gather(a, dim=0) @ b``: ``a [M_loc, K]`` (this rank's rows), ``b [K, N]`` -> ``[W*M_loc, N]``
    (float8: of the dequantized operands, each rank's rows with its scale_a, in ``out_dtype``)."""
    group = op_group(group)
    a32, b32, dtype = fp32_operands("all_gather_gemm", a, b, scale_a, scale_b, out_dtype)
    gathered = gather_bytes(a, group)
    c = (all_gather_cat(a32, dim=0, group=group) @ b32).to(dtype)
    return (c, gathered) if return_gathered else c
