"""The plain path of each op: torch.matmul in the input dtype + a torch.distributed collective
(cuBLAS + NCCL: what tilefuse competes with, and what ``variant="auto"`` runs where nothing beat it).

Its calls are not paired with the peers' calls as the fused variants' calls are: a call that differs
between ranks, or fails its checks on one rank only, fails as torch's collective does (gloo aborts
the process, NCCL waits until its watchdog). With gloo the collective goes through host memory.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import registry
from .common.checks import (
    check_divisible,
    check_dtypes,
    check_inner_dim,
    check_matrix,
    check_out_tensor,
    check_same_device,
)
from .common.collectives import all_gather_cat, op_group, reduce_scatter_rows
from .common.scaled_plain import with_float8


def check_operands(op: str, a, b) -> None:
    """The checks every entry point of an op makes on ``a [M, K]`` and ``b [K, N]``."""
    check_matrix(op, "a", a)
    check_matrix(op, "b", b)
    check_same_device(op, a=a, b=b)
    check_dtypes(op, a=a, b=b)
    check_inner_dim(op, a, b)


def gemm_all_scatter(a, b, *, config=None, group=None, out=None):
    op = "gemm_all_scatter"
    check_operands(op, a, b)
    group = op_group(group)
    world = dist.get_world_size(group)
    if out is not None:  # any tensor of the result's shape, dtype and device (the heap is not needed)
        check_out_tensor(op, out, (a.shape[0], world * b.shape[1]), a.dtype, a.device, a=a, b=b)
    if world == 1:  # the product is the result: straight into out, no copy
        return a @ b if out is None else torch.matmul(a, b, out=out)
    c = all_gather_cat(a @ b, dim=1, group=group)
    return c if out is None else out.copy_(c)


def all_gather_gemm(a, b, *, config=None, group=None, return_gathered=False):
    op = "all_gather_gemm"
    check_operands(op, a, b)
    group = op_group(group)
    gathered = all_gather_cat(a, dim=0, group=group)
    c = gathered @ b
    return (c, gathered) if return_gathered else c


def gemm_reduce_scatter(a, b, *, config=None, group=None):
    op = "gemm_reduce_scatter"
    check_operands(op, a, b)
    group = op_group(group)
    world = dist.get_world_size(group)
    check_divisible(op, "M (rows of a)", a.shape[0], world, "the world size")
    partial = a @ b
    if world == 1:  # nothing to reduce: no collective (gloo would round-trip through the host)
        return partial
    return reduce_scatter(partial, group)


def reduce_scatter(x, group):
    """Row block r of the sum over ranks of ``x [W*R, C]``, in x's dtype (summed in fp32 off NCCL)."""
    if x.device.type == "cuda" and dist.get_backend(group) == "nccl":
        out = x.new_empty((x.shape[0] // dist.get_world_size(group), *x.shape[1:]))
        dist.reduce_scatter_tensor(out, x.contiguous(), group=group)
        return out
    return reduce_scatter_rows(x, group=group).to(x.dtype)


def gemm_all_reduce(a, b, *, config=None, group=None, bias=None):
    op = "gemm_all_reduce"
    check_operands(op, a, b)
    group = op_group(group)
    if bias is not None:
        from .gemm_all_reduce._prepare import check_bias

        check_bias(op, bias, a, b)
    c = a @ b
    if dist.get_world_size(group) > 1:  # at W = 1 the product is the sum: no collective
        if c.device.type == "cuda" and dist.get_backend(group) == "gloo":  # gloo has no CUDA all-reduce
            host = c.cpu()
            dist.all_reduce(host, group=group)
            c = host.to(c.device)
        else:
            dist.all_reduce(c, group=group)
    return c if bias is None else c.add_(bias)


# Float8 operands (scale_a=, scale_b=, out_dtype=) take torch._scaled_mm's path: common.scaled_plain.
for _fn in (gemm_all_scatter, all_gather_gemm, gemm_reduce_scatter, gemm_all_reduce):
    registry.register(_fn.__name__, "plain", with_float8(_fn))
