"""The plain path of each op: torch.matmul in the input dtype + a torch.distributed collective.

This is what tilefuse competes with (cuBLAS + NCCL). ``variant="auto"`` runs it where a tuned table
says no fused variant beat it. With gloo (CPU ranks, or several ranks sharing one GPU) the
collective goes through host memory: correct, not fast.

Its calls are torch's collectives: they are not paired with the peers' calls, so a call that differs
between ranks (shapes, dtype) or fails its checks on one rank only fails as torch's collective does
(gloo aborts the process, NCCL waits until its watchdog). ``TILEFUSE_PAIR_PLAIN=1`` pairs them as the
fused variants' calls are: the call's checks and a begin (signature, sequence number, the peers'
arrival within the wait bound) come before the collective, which on a GPU waits for the begin's
verdict (a device sync per call; not inside a CUDA graph capture, where nothing can wait); a mismatch
then raises ``CallMismatchError`` on every rank, a failed check ``PeerCallError`` on the peers, and no
collective runs.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from ..runtime import world as _world
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
from .common.launch import env_reader

_pair_env = env_reader("TILEFUSE_PAIR_PLAIN")


def _checks(op, a, b):
    check_matrix(op, "a", a)
    check_matrix(op, "b", b)
    check_same_device(op, a=a, b=b)
    check_dtypes(op, a=a, b=b)
    check_inner_dim(op, a, b)


def _pairable(op: str):
    """Decorator of a plain entry point ``fn(call, a, b, ...)``: ``call`` is None, or with
    ``TILEFUSE_PAIR_PLAIN=1`` (tilefuse initialised for the call's group, world > 1) the collective
    call of tilefuse's protocol the body runs in, whose checks raising count the call as failed on
    every rank. Off, the switch costs one environment read per call."""

    def wrap(fn):
        @functools.wraps(fn)
        def run(a, b, *, group=None, **kwargs):
            group = op_group(group)
            if _pair_env()[0] in (None, "", "0") or dist.get_world_size(group) == 1:
                return fn(None, a, b, group=group, **kwargs)
            st = _world.find_state(group) if group is not None else None
            if st is None:
                return fn(None, a, b, group=group, **kwargs)
            with _world.CollectiveCall(op, st) as call:
                return fn(call, a, b, group=group, **kwargs)

        return run

    return wrap


def _begin(call, op: str, *key) -> None:
    """Pair the call with the peers' before its collective (a paired call; else nothing)."""
    if call is not None:
        call.begin((op, "plain") + key)
        call.verdict()


def _key(a, b) -> tuple:
    return tuple(a.shape), tuple(b.shape), a.dtype


@_pairable("gemm_all_scatter")
def gemm_all_scatter(call, a, b, *, config=None, group=None, out=None):
    op = "gemm_all_scatter"
    _checks(op, a, b)
    world = dist.get_world_size(group)
    if out is not None:  # any tensor of the result's shape, dtype and device (the heap is not needed)
        check_out_tensor(op, out, (a.shape[0], world * b.shape[1]), a.dtype, a.device, a=a, b=b)
    if world == 1:  # the product is the result: straight into out, no copy
        return a @ b if out is None else torch.matmul(a, b, out=out)
    _begin(call, op, *_key(a, b))
    c = all_gather_cat(a @ b, dim=1, group=group)
    return c if out is None else out.copy_(c)


@_pairable("all_gather_gemm")
def all_gather_gemm(call, a, b, *, config=None, group=None, return_gathered=False):
    op = "all_gather_gemm"
    _checks(op, a, b)
    _begin(call, op, *_key(a, b))
    gathered = all_gather_cat(a, dim=0, group=group)
    c = gathered @ b
    return (c, gathered) if return_gathered else c


@_pairable("gemm_reduce_scatter")
def gemm_reduce_scatter(call, a, b, *, config=None, group=None):
    op = "gemm_reduce_scatter"
    _checks(op, a, b)
    world = dist.get_world_size(group)
    check_divisible(op, "M (rows of a)", a.shape[0], world, "the world size")
    partial = a @ b
    if world == 1:  # nothing to reduce: no collective (gloo would round-trip through the host)
        return partial
    _begin(call, op, *_key(a, b))
    if partial.device.type == "cuda" and dist.get_backend(group) == "nccl":
        out = torch.empty((a.shape[0] // world, b.shape[1]), dtype=a.dtype, device=a.device)
        dist.reduce_scatter_tensor(out, partial.contiguous(), group=group)
        return out
    from .common.collectives import reduce_scatter_rows

    return reduce_scatter_rows(partial, group=group).to(a.dtype)


for _op, _fn in (("gemm_all_scatter", gemm_all_scatter), ("all_gather_gemm", all_gather_gemm),
                 ("gemm_reduce_scatter", gemm_reduce_scatter)):
    registry.register(_op, "plain", _fn)


@_pairable("gemm_all_reduce")
def gemm_all_reduce(call, a, b, *, config=None, group=None, bias=None):
    op = "gemm_all_reduce"
    _checks(op, a, b)
    if bias is not None:
        from .gemm_all_reduce._setup import check_bias

        check_bias(op, bias, a, b)
    c = a @ b
    if dist.get_world_size(group) > 1:  # at W = 1 the product is the sum: no collective
        _begin(call, op, *_key(a, b), bias is not None)
        if c.device.type == "cuda" and dist.get_backend(group) == "gloo":  # gloo has no CUDA all-reduce
            host = c.cpu()
            dist.all_reduce(host, group=group)
            c = host.to(c.device)
        else:
            dist.all_reduce(c, group=group)
    return c if bias is None else c.add_(bias)


if "gemm_all_reduce" in registry.OPS:  # registered once the registry lists the op
    registry.register("gemm_all_reduce", "plain", gemm_all_reduce)
