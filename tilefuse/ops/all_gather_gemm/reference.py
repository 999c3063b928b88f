"""all_gather_gemm reference: torch.distributed all-gather of A's row shards, then fp32 torch.matmul."""

from __future__ import annotations

import torch

from ..common.collectives import all_gather_cat, op_group


def reference(a: torch.Tensor, b: torch.Tensor, *, config=None, group=None, return_gathered=False):
    """``all_gather(a, dim=0) @ b``: ``a [M_loc, K]`` (this rank's rows), ``b [K, N]`` -> ``[W*M_loc, N]``."""
    group = op_group(group)
    gathered = all_gather_cat(a, dim=0, group=group)
    c = (gathered.float() @ b.float()).to(a.dtype)
    return (c, gathered) if return_gathered else c
