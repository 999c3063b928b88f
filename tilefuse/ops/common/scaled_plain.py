"""The plain path of float8 calls (:mod:`.scaled`): :func:`.scaled.scaled_matmul` and the
torch.distributed collective. all_gather_gemm gathers the float8 rows (as bytes) and their row
scales; the reducing ops reduce the fp32 product and round once to ``out_dtype``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .checks import check_divisible, check_operands, check_out_tensor
from .collectives import all_gather_cat, all_reduce_sum, op_group, reduce_scatter_rows
from .scaled import Scaled, check_scales, gather_bytes, row_scales, scaled_matmul


def _fp32(s: Scaled) -> Scaled:
    return Scaled(s.scale_a, s.scale_b, torch.float32, s.b_dtype)


def gemm_all_scatter(a, b, s: Scaled, group, *, out=None):
    world = dist.get_world_size(group)
    c = all_gather_cat(scaled_matmul(a, b, s), dim=1, group=group)
    if out is None:
        return c
    check_out_tensor("gemm_all_scatter", out, (a.shape[0], world * b.shape[1]), s.out_dtype, a.device, a=a, b=b)
    return out.copy_(c)


def all_gather_gemm(a, b, s: Scaled, group, *, return_gathered=False):
    gathered = gather_bytes(a, group)
    scales = all_gather_cat(row_scales(s, a.shape[0]).reshape(-1, 1).contiguous(), dim=0, group=group)
    c = scaled_matmul(gathered, b, Scaled(scales, s.scale_b, s.out_dtype, s.b_dtype))
    return (c, gathered) if return_gathered else c


def gemm_reduce_scatter(a, b, s: Scaled, group):
    world = dist.get_world_size(group)
    check_divisible("gemm_reduce_scatter", "M (rows of a)", a.shape[0], world, "the world size")
    partial = scaled_matmul(a, b, _fp32(s))
    if world == 1:
        return partial.to(s.out_dtype)
    if partial.device.type == "cuda" and dist.get_backend(group) == "nccl":
        out = partial.new_empty((partial.shape[0] // world, partial.shape[1]))
        dist.reduce_scatter_tensor(out, partial, group=group)
        return out.to(s.out_dtype)
    return reduce_scatter_rows(partial, group=group).to(s.out_dtype)


def gemm_all_reduce(a, b, s: Scaled, group, *, bias=None):
    if bias is not None:
        from ..gemm_all_reduce._prepare import check_bias

        check_bias("gemm_all_reduce", bias, a, b)
    total = all_reduce_sum(scaled_matmul(a, b, _fp32(s)), group=group)
    if bias is not None:
        total = total + bias.float()
    return total.to(s.out_dtype)


_PLAIN = {fn.__name__: fn for fn in (gemm_all_scatter, all_gather_gemm, gemm_reduce_scatter, gemm_all_reduce)}


def run(op: str, a, b, group, scale_a, scale_b, out_dtype, **kwargs):
    """The plain path of a float8 call ``op(a, b, scale_a=, scale_b=, out_dtype=, **kwargs)``, checked
    (scales or ``out_dtype`` without float8 operands raise, and so does a float8 operand next to
    another dtype)."""
    check_operands(op, a, b)
    return _PLAIN[op](a, b, check_scales(op, a, b, scale_a, scale_b, out_dtype), op_group(group), **kwargs)
