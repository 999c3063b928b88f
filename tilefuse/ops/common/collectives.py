"""torch.distributed collectives for the plain path and the reference paths (fp32 sums, fresh tensors),
on any backend: gloo (ranks sharing one GPU) moves CUDA tensors through host memory.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from ...runtime import get_heap, is_initialized
from ...runtime.world import on_shutdown

# torch.distributed's functions, looked up at each call (a benchmark may stand in for them); the
# ``*_single`` names where torch has them (it deprecates the older ones).
_GATHER = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
_SCATTER = "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"


def op_group(group):
    """``group``, or for None the default heap's group (torch's None, the world, differs where
    tilefuse was first initialised on a subgroup), or the world before tilefuse is initialised."""
    if group is None and is_initialized():
        return get_heap().group
    return group


class Comm(NamedTuple):
    """What a collective call needs to know about its group."""

    group: object  # the process group (never None once tilefuse is initialised)
    world: int
    rank: int
    gloo: bool  # CUDA tensors go through host memory


_COMMS: dict = {}  # the group argument (None: the default) -> Comm


def comm_of(group) -> Comm:
    """The :class:`Comm` of ``group`` (None: :func:`op_group`'s), made once, forgotten at shutdown."""
    hit = _COMMS.get(group)
    if hit is not None:
        return hit
    grp = op_group(group)
    comm = Comm(grp, dist.get_world_size(grp), dist.get_rank(grp), dist.get_backend(grp) == "gloo")
    if group is not None or is_initialized():  # None before init is the world until tilefuse is initialised
        _COMMS[group] = comm
    return comm


on_shutdown(_COMMS.clear)


def _into(collective, out: torch.Tensor, t: torch.Tensor, comm: Comm) -> None:
    """``collective(out, t)`` on the group; gloo carries a GPU tensor's collective through host memory."""
    if comm.gloo and t.is_cuda:
        host = torch.empty(out.shape, dtype=out.dtype)
        collective(host, t.cpu(), group=comm.group)
        out.copy_(host)
    else:
        collective(out, t, group=comm.group)


def all_gather_tensor(out: torch.Tensor, t: torch.Tensor, comm: Comm) -> None:
    """Every rank's ``t`` stacked by rows into ``out`` (``t`` may be this rank's block of ``out``)."""
    _into(getattr(dist, _GATHER), out, t, comm)


def reduce_scatter_tensor(out: torch.Tensor, t: torch.Tensor, comm: Comm) -> None:
    """Row block r of the sum over ranks of ``t`` (contiguous, ``[W*R, ...]``) into ``out`` ``[R, ...]``."""
    _into(getattr(dist, _SCATTER), out, t, comm)


def all_reduce(t: torch.Tensor, comm: Comm) -> None:
    """``t`` summed over ranks, in place."""
    host = t.cpu() if comm.gloo and t.is_cuda else t
    dist.all_reduce(host, group=comm.group)
    if host is not t:
        t.copy_(host)


def all_gather_cat(t: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """Concatenate every rank's ``t`` along ``dim`` in group-rank order (a fresh tensor)."""
    comm = comm_of(group)
    if comm.world == 1:
        return t
    src = t.contiguous()
    rows = torch.empty((comm.world * src.shape[0], *src.shape[1:]), dtype=src.dtype, device=src.device)
    all_gather_tensor(rows, src, comm)
    if dim == 0:
        return rows
    return torch.cat(rows.chunk(comm.world), dim=dim)


def reduce_scatter_rows(t: torch.Tensor, group=None) -> torch.Tensor:
    """Sum ``t`` [M, N] over ranks and return this rank's row block [M/W, N] (fp32 sum)."""
    rows = t.shape[0] // dist.get_world_size(group)
    rank = dist.get_rank(group)
    return all_reduce_sum(t, group)[rank * rows:(rank + 1) * rows].clone()


def all_reduce_sum(t: torch.Tensor, group=None) -> torch.Tensor:
    """Sum ``t`` over ranks in fp32; every rank gets the whole sum (fp32, on ``t``'s device)."""
    src = t.float()
    if dist.get_world_size(group) == 1:
        return src
    host = t.device.type == "cuda" and dist.get_backend(group) == "gloo"
    buf = src.cpu() if host else src.clone()
    dist.all_reduce(buf, group=group)
    return buf.to(t.device) if host else buf
