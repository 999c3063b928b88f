"""gemm_all_scatter reference: fp32 torch.matmul, then a torch.distributed all-gather along N."""

from __future__ import annotations

import torch

from ..common.collectives import all_gather_cat, op_group


def reference(a: torch.Tensor, b: torch.Tensor, *, config=None, group=None, out=None) -> torch.Tensor:
    """``all_gather(a @ b, dim=1)``: ``a [M, K]`` (same on all ranks), ``b [K, N_loc]``
    -> ``[M, W*N_loc]``."""
    group = op_group(group)
    local = (a.float() @ b.float()).to(a.dtype)
    c = all_gather_cat(local, dim=1, group=group)
    if out is not None:
        out.copy_(c)
        return out
    return c
