"""The plain path of each op: torch.matmul + one torch.distributed tensor collective, what tilefuse
competes with and what auto runs where nothing beat it. Nothing is copied after the collective.

=====================  ===========================================================================
op (rank r, W ranks)   calls (W > 1)
=====================  ===========================================================================
gemm_all_scatter       ``ct = empty(W*N, M)``; ``matmul(a, b, out=ct[r*N:(r+1)*N].t())``;
                       ``all_gather_into_tensor(ct, ct[r*N:(r+1)*N])``; returns ``ct.t()``
all_gather_gemm        ``g = empty(W*M, K)``; ``all_gather_into_tensor(g, a)``; returns ``g @ b``
gemm_reduce_scatter    ``p = a @ b``; ``c = empty(M/W, N)``; ``reduce_scatter_tensor(c, p)``
gemm_all_reduce        ``c = a @ b``; ``all_reduce(c)``; ``c += bias`` (W = 1: ``addmm(bias, a, b)``)
=====================  ===========================================================================

gemm_all_scatter's result is column-major (``c.t()`` is contiguous): rank r's column block of ``c``
is row block r of ``c.t()``, which a gather lands in place. A column-major ``out`` is that buffer; a
row-major one receives one copy. Float8 calls run :func:`.common.scaled.scaled_matmul` (``torch._scaled_mm``,
K and N padded to multiples of 16 where needed; its row-major product enters gemm_all_scatter's block by one
transposing copy before the gather); at one rank, without a bias, that matmul is the whole call.

Calls are not paired with the peers' as the fused variants' are: a call that differs between ranks
fails as torch's collective does (gloo aborts the process, NCCL waits until its watchdog).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import torch.distributed as dist

from . import registry
from .common.checks import SUPPORTED_DTYPES, check_divisible, check_operands, check_out_tensor
from .common.collectives import (
    Comm,
    all_gather_cat,
    all_gather_tensor,
    all_reduce,
    comm_of,
    op_group,
    reduce_scatter_tensor,
)
from .common.scaled import check_scales, gather_bytes, is_float8, row_scales, scaled_matmul

_Tensor = torch.Tensor


def _comm(op: str, a, b, group, scale_a, scale_b, out_dtype) -> Comm | None:
    """The call group's :class:`Comm` after the checks torch.matmul does not make (None: float8)."""
    if not (scale_a is None and scale_b is None and out_dtype is None and isinstance(a, _Tensor)
            and isinstance(b, _Tensor) and a.dim() == 2 and b.dim() == 2 and a.dtype in SUPPORTED_DTYPES):
        if scale_a is not None or scale_b is not None or out_dtype is not None or is_float8(a) or is_float8(b):
            return None
        check_operands(op, a, b)
    return comm_of(group)


def _matmul(op: str, a, b, out=None):
    """``torch.matmul(a, b, out=out)``; where torch refuses the operands, the op's own error."""
    try:
        return torch.matmul(a, b) if out is None else torch.matmul(a, b, out=out)
    except RuntimeError:
        check_operands(op, a, b)
        raise


def direct(op: str, a, group):
    """Where the plain call ``op(a, b)`` with no keyword argument is ``torch.matmul(a, b)`` alone (one
    rank, a 16- or 32-bit ``a``), that call as ``fn(a, b)`` for auto's decided path; else None."""
    if not (isinstance(a, _Tensor) and a.dtype in SUPPORTED_DTYPES and comm_of(group).world == 1):
        return None
    return functools.partial(_matmul, op)


def gemm_all_scatter(a, b, *, config=None, group=None, out=None, scale_a=None, scale_b=None, out_dtype=None):
    op = "gemm_all_scatter"
    comm, s = _comm(op, a, b, group, scale_a, scale_b, out_dtype), None
    if comm is None:  # float8
        s, comm = _float8(op, a, b, group, scale_a, scale_b, out_dtype)[0], comm_of(group)
    dtype, W = a.dtype if s is None else s.out_dtype, comm.world
    if out is not None:  # any tensor of the result's shape, dtype and device (the heap is not needed)
        check_out_tensor(op, out, (a.shape[0], W * b.shape[1]), dtype, a.device, a=a, b=b)
    if W == 1:
        if s is None:
            return _matmul(op, a, b, out)
        return scaled_matmul(a, b, s) if out is None else out.copy_(scaled_matmul(a, b, s))
    N = b.shape[1]
    column_major = out is not None and out.t().is_contiguous()
    ct = out.t() if column_major else a.new_empty((W * N, a.shape[0]), dtype=dtype)  # [W*N, M]: c transposed
    mine = ct[comm.rank * N:(comm.rank + 1) * N]  # [N, M]: this rank's block, the gather's input
    if s is None:
        _matmul(op, a, b, mine.t())
    else:  # _scaled_mm writes a row-major result: one transposing copy into this rank's block
        mine.t().copy_(scaled_matmul(a, b, s))
    all_gather_tensor(ct, mine, comm)
    if out is None or column_major:
        return ct.t()
    return out.copy_(ct.t())  # a row-major out: the one copy no collective can spare


def all_gather_gemm(a, b, *, config=None, group=None, return_gathered=False, scale_a=None, scale_b=None,
                    out_dtype=None):
    op = "all_gather_gemm"
    comm = _comm(op, a, b, group, scale_a, scale_b, out_dtype)
    if comm is None:  # float8: the rows travel as bytes with their row scales
        s, grp = _float8(op, a, b, group, scale_a, scale_b, out_dtype)
        if dist.get_world_size(grp) == 1:  # nothing to gather: the matmul alone
            c = scaled_matmul(a, b, s)
            return (c, a) if return_gathered else c
        gathered = gather_bytes(a, grp)
        scales = all_gather_cat(row_scales(s, a.shape[0]).reshape(-1, 1).contiguous(), dim=0, group=grp)
        c = scaled_matmul(gathered, b, dataclasses.replace(s, scale_a=scales))
        return (c, gathered) if return_gathered else c
    if comm.world == 1:
        c = _matmul(op, a, b)
        return (c, a) if return_gathered else c
    gathered = a.new_empty((comm.world * a.shape[0], a.shape[1]))
    all_gather_tensor(gathered, a, comm)
    c = _matmul(op, gathered, b)
    return (c, gathered) if return_gathered else c


def gemm_reduce_scatter(a, b, *, config=None, group=None, scale_a=None, scale_b=None, out_dtype=None):
    op = "gemm_reduce_scatter"
    comm = _comm(op, a, b, group, scale_a, scale_b, out_dtype)
    if comm is None:  # float8: the fp32 products summed, rounded once
        s, grp = _float8(op, a, b, group, scale_a, scale_b, out_dtype)
        W = dist.get_world_size(grp)
        check_divisible(op, "M (rows of a)", a.shape[0], W, "the world size")
        if W == 1:  # the sum of one product: the matmul alone, rounded once
            return scaled_matmul(a, b, s)
        partial = scaled_matmul(a, b, dataclasses.replace(s, out_dtype=torch.float32))
        return reduce_scatter(partial, grp).to(s.out_dtype)
    W = comm.world
    if W == 1:
        return _matmul(op, a, b)
    M = a.shape[0]
    if M % W:
        check_divisible(op, "M (rows of a)", M, W, "the world size")
    partial = _matmul(op, a, b)
    c = partial.new_empty((M // W, b.shape[1]))
    reduce_scatter_tensor(c, partial, comm)
    return c


def reduce_scatter(x, group):
    """Row block r of the sum over the ranks of ``group`` of ``x [W*R, C]``, in x's dtype."""
    comm = comm_of(group)
    if comm.world == 1:
        return x
    out = x.new_empty((x.shape[0] // comm.world, *x.shape[1:]))
    reduce_scatter_tensor(out, x.contiguous(), comm)
    return out


def gemm_all_reduce(a, b, *, config=None, group=None, bias=None, scale_a=None, scale_b=None, out_dtype=None):
    op = "gemm_all_reduce"
    comm = _comm(op, a, b, group, scale_a, scale_b, out_dtype)
    if comm is None:  # float8: the fp32 products summed (plus the bias), rounded once
        s, grp = _float8(op, a, b, group, scale_a, scale_b, out_dtype)
        if bias is not None:
            from .gemm_all_reduce._prepare import check_bias

            check_bias(op, bias, a, b)
        elif dist.get_world_size(grp) == 1:  # the sum of one product: the matmul alone, rounded once
            return scaled_matmul(a, b, s)
        total = scaled_matmul(a, b, dataclasses.replace(s, out_dtype=torch.float32)).contiguous()
        all_reduce(total, comm_of(grp))  # in place: the fp32 product is this call's own
        return (total if bias is None else total.add_(bias)).to(s.out_dtype)
    if bias is not None:
        from .gemm_all_reduce._prepare import check_bias

        check_bias(op, bias, a, b)
        if comm.world == 1:  # the product is the sum: nn.Linear's one call
            try:
                return torch.addmm(bias, a, b)
            except RuntimeError:
                check_operands(op, a, b)
                raise
    c = _matmul(op, a, b)
    if comm.world > 1:
        all_reduce(c, comm)
    return c if bias is None else c.add_(bias)


def _float8(op: str, a, b, group, scale_a, scale_b, out_dtype) -> tuple:
    """``(checked scaling, group)`` of a float8 call."""
    check_operands(op, a, b)
    return check_scales(op, a, b, scale_a, scale_b, out_dtype), op_group(group)


for _fn in (gemm_all_scatter, all_gather_gemm, gemm_reduce_scatter, gemm_all_reduce):
    registry.register(_fn.__name__, "plain", _fn)
