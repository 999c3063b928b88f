"""The plain path of each op: what a torch user writes, torch.matmul + one torch.distributed tensor
collective (what tilefuse competes with, and what ``variant="auto"`` runs where nothing beat it).
The matmul writes into the result or the collective's buffer, the collective lands in the result,
nothing is copied after it; at W = 1 the matmul is the call.

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
row-major one receives one copy. Float8 operands take :mod:`.common.scaled_plain`'s path.

The checks are torch's own plus the op's shape rules. Calls are not paired with the peers' as the
fused variants' are: a call that differs between ranks, or fails its checks on one rank only, fails
as torch's collective does (gloo aborts the process, NCCL waits until its watchdog).
"""

from __future__ import annotations

import torch

from . import registry
from .common import scaled_plain
from .common.checks import SUPPORTED_DTYPES, check_divisible, check_operands, check_out_tensor
from .common.collectives import Comm, all_gather_tensor, all_reduce, comm_of, reduce_scatter_tensor
from .common.scaled import is_float8

_Tensor = torch.Tensor


def _comm(op: str, a, b, group, scale_a, scale_b, out_dtype) -> Comm | None:
    """The :class:`Comm` of the call's group, after the checks torch.matmul does not make itself (two
    matrices of a supported dtype; :func:`_matmul` names the op where torch's fail). None for a
    float8 call, which :mod:`.common.scaled_plain` runs."""
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


def gemm_all_scatter(a, b, *, config=None, group=None, out=None, scale_a=None, scale_b=None, out_dtype=None):
    op = "gemm_all_scatter"
    comm = _comm(op, a, b, group, scale_a, scale_b, out_dtype)
    if comm is None:  # float8
        return scaled_plain.run(op, a, b, group, scale_a, scale_b, out_dtype, out=out)
    W = comm.world
    if out is not None:  # any tensor of the result's shape, dtype and device (the heap is not needed)
        check_out_tensor(op, out, (a.shape[0], W * b.shape[1]), a.dtype, a.device, a=a, b=b)
    if W == 1:
        return _matmul(op, a, b, out)
    N = b.shape[1]
    column_major = out is not None and out.t().is_contiguous()
    ct = out.t() if column_major else a.new_empty((W * N, a.shape[0]))  # [W*N, M]: c transposed
    mine = ct[comm.rank * N:(comm.rank + 1) * N]  # [N, M]: this rank's block, the gather's input
    _matmul(op, a, b, mine.t())
    all_gather_tensor(ct, mine, comm)
    if out is None or column_major:
        return ct.t()
    return out.copy_(ct.t())  # a row-major out: the one copy no collective can spare


def all_gather_gemm(a, b, *, config=None, group=None, return_gathered=False, scale_a=None, scale_b=None,
                    out_dtype=None):
    op = "all_gather_gemm"
    comm = _comm(op, a, b, group, scale_a, scale_b, out_dtype)
    if comm is None:  # float8
        return scaled_plain.run(op, a, b, group, scale_a, scale_b, out_dtype, return_gathered=return_gathered)
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
    if comm is None:  # float8
        return scaled_plain.run(op, a, b, group, scale_a, scale_b, out_dtype)
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
    if comm is None:  # float8
        return scaled_plain.run(op, a, b, group, scale_a, scale_b, out_dtype, bias=bias)
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


for _fn in (gemm_all_scatter, all_gather_gemm, gemm_reduce_scatter, gemm_all_reduce):
    registry.register(_fn.__name__, "plain", _fn)
