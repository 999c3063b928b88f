"""The plain path of each op: torch.matmul in the input dtype + a torch.distributed collective.

This is what tilefuse competes with (cuBLAS + NCCL). ``variant="auto"`` runs it where a tuned table
says no fused variant beat it. With gloo (CPU ranks, or several ranks sharing one GPU) the
collective goes through host memory: correct, not fast.

Its calls are torch's collectives: they are not paired with the peers' calls as the fused variants'
calls are, so a call that differs between ranks (shapes, dtype) or fails its checks on one rank only
fails as torch's collective does (gloo aborts the process, NCCL waits until its watchdog).
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
from .common.collectives import all_gather_cat, op_group


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
    if partial.device.type == "cuda" and dist.get_backend(group) == "nccl":
        out = torch.empty((a.shape[0] // world, b.shape[1]), dtype=a.dtype, device=a.device)
        dist.reduce_scatter_tensor(out, partial.contiguous(), group=group)
        return out
    from .common.collectives import reduce_scatter_rows

    return reduce_scatter_rows(partial, group=group).to(a.dtype)


for _op, _fn in (("gemm_all_scatter", gemm_all_scatter), ("all_gather_gemm", all_gather_gemm),
                 ("gemm_reduce_scatter", gemm_reduce_scatter)):
    registry.register(_op, "plain", _fn)


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


if "gemm_all_reduce" in registry.OPS:  # registered once the registry lists the op
    registry.register("gemm_all_reduce", "plain", gemm_all_reduce)
