"""torch.distributed collectives for the reference paths, on any backend (gloo, which several ranks
sharing one GPU use, has no CUDA all-gather/reduce-scatter: the tensors go through the CPU)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def op_group(group):
    """The process group a torch-collective path (plain, reference) runs on: ``group``, or for None
    the group tilefuse's default heap serves (what the fused variants use for None; torch's own None
    is the whole world, which differs where tilefuse was first initialised on a subgroup), or the
    world when tilefuse is not initialised."""
    if group is None:
        from ...runtime import get_heap, is_initialized

        if is_initialized():
            return get_heap().group
    return group


def _needs_host(t: torch.Tensor, group) -> bool:
    return t.device.type == "cuda" and dist.get_backend(group) == "gloo"


def all_gather_cat(t: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """Concatenate every rank's ``t`` along ``dim`` in group-rank order."""
    world = dist.get_world_size(group)
    if world == 1:
        return t
    host = _needs_host(t, group)
    src = (t.cpu() if host else t).contiguous()
    if not host and dist.get_backend(group) == "nccl":  # one tensor collective, no list of parts
        out = torch.empty((world * src.shape[0],) + tuple(src.shape[1:]), dtype=src.dtype, device=src.device)
        dist.all_gather_into_tensor(out, src, group=group)
        if dim == 0:
            return out
        # [W*d0, ...] -> [W, d0, ...] -> the W blocks side by side along `dim`
        blocks = out.view((world,) + tuple(src.shape))
        return blocks.movedim(0, dim).reshape(src.shape[:dim] + (world * src.shape[dim],) + src.shape[dim + 1:])
    parts = [torch.empty_like(src) for _ in range(world)]
    dist.all_gather(parts, src, group=group)
    out = torch.cat(parts, dim=dim)
    return out.to(t.device) if host else out


def reduce_scatter_rows(t: torch.Tensor, group=None) -> torch.Tensor:
    """Sum ``t`` [M, N] over ranks and return this rank's row block [M/W, N] (fp32 sum)."""
    world = dist.get_world_size(group)
    if world == 1:
        return t.float()
    rank = dist.get_rank(group)
    host = _needs_host(t, group) or dist.get_backend(group) == "gloo"
    src = t.float()
    src = src.cpu() if host else src
    dist.all_reduce(src, group=group)
    rows = t.shape[0] // world
    out = src[rank * rows:(rank + 1) * rows].clone()
    return out.to(t.device) if host else out


def all_reduce_sum(t: torch.Tensor, group=None) -> torch.Tensor:
    """Sum ``t`` over ranks in fp32; every rank gets the whole sum (fp32, on ``t``'s device)."""
    src = t.float()
    if dist.get_world_size(group) == 1:
        return src
    host = _needs_host(t, group)
    buf = src.cpu() if host else src.clone()
    dist.all_reduce(buf, group=group)
    return buf.to(t.device) if host else buf
