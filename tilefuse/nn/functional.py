"""Autograd-aware sequence-parallel linears on the fused ops: dim 0 of the input is sharded across ranks.

* column: ``y = all_gather_gemm(x, w.t())``; ``dx = gemm_reduce_scatter(dy, w)``, ``dw = (x_full.t() @ dy).t()``.
* row: ``y = gemm_reduce_scatter(x, w.t()) + b``; ``dx, dy_full = all_gather_gemm(dy, w,
  return_gathered=True)``, ``dw = dy_full.t() @ x``, ``db = dy_full.sum(0)``.

Every call is collective over ``group``; at TP size 1 with ``variant`` "auto" or "plain" both are ``F.linear``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..ops import calls
from ..ops.all_gather_gemm import all_gather_gemm
from ..ops.library import group_name
from ..runtime.scope import in_backward, saved_scope

LOCAL_VARIANTS = ("auto", "plain")  # the variants that run nn.Linear's own call at TP size 1
_SIZES: dict = {}  # process group -> its size (a group's size never changes)


def world_size(group, who: str) -> int:
    """The size of ``group`` (default: the world), cached per group (not while tracing: the graph's guards)."""
    if torch.compiler.is_compiling():
        return world_of(group, who)[0]
    pg = group if group is not None else dist.group.WORLD
    if pg not in _SIZES:
        _SIZES[pg] = world_of(pg, who)[0]  # raises before init (pg None)
    return _SIZES[pg]


def world_of(group, who: str) -> tuple[int, int]:
    """``(world_size, rank)`` of ``group`` (default: the world), with a clear error before init."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{who}: torch.distributed is not initialised; call "
                           "torch.distributed.init_process_group(...) (and tilefuse.init()) first")
    return dist.get_world_size(group), dist.get_rank(group)


def check_input(who: str, x, weight: torch.Tensor, bias, features: int, what: str) -> None:
    """The checks of a linear's input ``x [..., features]`` against its local ``weight`` and ``bias``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{who}: input must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 2:
        raise ValueError(f"{who}: input must have a token dimension and a feature dimension "
                         f"([..., features], at least 2-D), got shape {tuple(x.shape)}")
    if x.shape[-1] != features:
        raise ValueError(f"{who}: input has {x.shape[-1]} features in its last dimension, "
                         f"expected {features} ({what})")
    if x.dtype != weight.dtype:
        raise TypeError(f"{who}: input has dtype {x.dtype} but the weight has dtype {weight.dtype}")
    if x.device != weight.device:
        raise ValueError(f"{who}: input is on {x.device} but the weight is on {weight.device}")
    if bias is not None and bias.dtype != weight.dtype:
        raise TypeError(f"{who}: bias has dtype {bias.dtype} but the weight has dtype {weight.dtype}")


class _RowParallel(torch.autograd.Function):
    """2-D core of :func:`row_parallel_linear`: ``x [T, in/W]`` -> ``[T/W, out]``. Not the op's own
    autograd: the bias gradient needs every rank's ``dy``, which the backward gathers anyway."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, variant):
        y = calls.call("gemm_reduce_scatter", x, weight.t(), variant=variant, config=None, group=group)
        if bias is not None:
            y = y + bias  # once, after the reduction: each rank adds it to its own rows
        ctx.save_for_backward(x, weight)
        ctx.has_bias, ctx.group, ctx.variant, ctx.scope = bias is not None, group, variant, saved_scope()
        return y

    @staticmethod
    def backward(ctx, dy):
        return in_backward(ctx.scope, _RowParallel.grads, ctx, dy)

    @staticmethod
    def grads(ctx, dy):
        x, weight = ctx.saved_tensors
        # dy [T/W, out] -> dx [T, in/W], dy_full [T, out]
        dx, dy_full = calls.call("all_gather_gemm", dy.contiguous(), weight, variant=ctx.variant, config=None,
                                 group=ctx.group, return_gathered=True)
        dw = dy_full.t() @ x if ctx.needs_input_grad[1] else None  # [out, in/W]
        # [out]: the sum over every rank's tokens, so the replicated bias needs no all-reduce
        db = dy_full.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return (dx if ctx.needs_input_grad[0] else None), dw, db, None, None


def column_parallel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                           group=None, variant: str = "auto") -> torch.Tensor:
    """``all_gather(x, dim=0) @ weight.t() + bias``: ``x [d0, ..., in]`` this rank's tokens (the same
    shape on every rank), ``weight [out/W, in]`` and ``bias [out/W]`` (or None) this rank's rows.
    Returns ``[W*d0, ..., out/W]``: every rank's tokens, this rank's output features."""
    who = "ColumnParallelLinear"
    world = world_size(group, who)
    if world == 1 and variant in LOCAL_VARIANTS:
        return F.linear(x, weight, bias)
    check_input(who, x, weight, bias, weight.shape[1], "in_features")
    lead = x.shape[:-1]
    # The weight gradient needs every rank's tokens: the op keeps its gathered input for it.
    keep = torch.is_grad_enabled() and weight.requires_grad
    y = all_gather_gemm(x.reshape(-1, x.shape[-1]).contiguous(), weight.t(), variant=variant, group=group,
                        return_gathered=keep)
    y = y[0] if keep else y
    if bias is not None:
        y = y + bias
    return y.reshape(world * lead[0], *lead[1:], y.shape[-1])


def row_parallel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                        group=None, variant: str = "auto") -> torch.Tensor:
    """``reduce_scatter(x @ weight.t(), dim=0) + bias``: ``x [d0, ..., in/W]`` (``d0`` divisible by W),
    ``weight [out, in/W]`` this rank's columns, ``bias [out]`` whole (or None), added after the sum.
    Returns ``[d0/W, ..., out]``: block r of dim 0 of the sum over ranks."""
    who = "RowParallelLinear"
    world = world_size(group, who)
    if world == 1 and variant in LOCAL_VARIANTS:
        return F.linear(x, weight, bias)
    if not isinstance(variant, str):
        raise TypeError(f"{who}: variant must be a string, got {type(variant).__name__}")
    check_input(who, x, weight, bias, weight.shape[1], "in_features / world size")
    if x.shape[0] % world != 0:
        raise ValueError(f"{who}: the token dimension (dim 0 of the input, size {x.shape[0]}) must be divisible "
                         f"by the world size ({world}): the forward reduce-scatters the tokens across ranks")
    lead = x.shape[:-1]
    y = _RowParallel.apply(x.reshape(-1, x.shape[-1]).contiguous(), weight, bias, group_name(group), variant)
    return y.reshape(lead[0] // world, *lead[1:], y.shape[-1])
