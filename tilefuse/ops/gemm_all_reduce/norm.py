"""The residual-add + RMSNorm epilogue of gemm_all_reduce (``residual=``, ``norm_weight=``).

After the reduction of bulk_sync, producer_consumer and wg_specialized, :func:`add_rms_norm`'s
kernel, one program per row (``s`` is ``c`` without a residual; longer rows than ``MAX_BLOCK`` are
walked twice, ``s`` recomputed)::

    s = c + residual               (fp32 add, rounded once to c's dtype: new_residual)
    y = s * rsqrt(mean(s^2) + eps) * norm_weight      (fp32 from the rounded s, rounded once)

In fused_sequential's kernel (``NORM``) the program that stores a tile of ``s`` also stores its rows'
sums of squares (:func:`store_sum`) and takes a ticket on its row block (:func:`tile_done`); the
ticket that completes the row block norms it. Every sum is a pairwise tree fixed by ``BLOCK_M`` and
``BLOCK_N`` (:func:`pair_sum`): every rank gets the same bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...runtime import hw
from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ...runtime.world import on_reset
from ..common.split_k import StreamScratch

MAX_BLOCK = 8192  # columns a program holds at once (fp32 in registers: 16 a thread at 16 warps)


@triton.jit
def _row_sum(c_ptr, res_ptr, s_ptr, row, offs, mask, stride_c, stride_r, stride_s, HAS_RESIDUAL: tl.constexpr,
             STORE: tl.constexpr):
    """``s = c (+ residual)`` at ``offs`` of ``row`` in fp32, rounded once to the output dtype (stored
    when ``STORE``): the same bits however often it is computed."""
    s = tl.load(c_ptr + row * stride_c + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
        s_low = (s + r).to(s_ptr.dtype.element_ty)
        if STORE:
            tl.store(s_ptr + row * stride_s + offs, s_low, mask=mask)
        s = s_low.to(tl.float32)
    return s


@kernel
def _add_rms_norm_kernel(
    c_ptr, res_ptr, w_ptr, y_ptr, s_ptr,
    N, stride_c, stride_r, stride_y, stride_s, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)  # [BLOCK_N]
    if CHUNKS == 1:  # the whole row in registers
        mask = cols < N
        s = _row_sum(c_ptr, res_ptr, s_ptr, row, cols, mask, stride_c, stride_r, stride_s, HAS_RESIDUAL, True)
        rstd = 1.0 / tl.sqrt(tl.sum(s * s, axis=0) / N + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * stride_y + cols, (s * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for i in range(CHUNKS):  # pass 1: s (stored) and its sum of squares
            offs = i * BLOCK_N + cols
            s = _row_sum(c_ptr, res_ptr, s_ptr, row, offs, offs < N, stride_c, stride_r, stride_s, HAS_RESIDUAL, True)
            acc += s * s
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
        for i in range(CHUNKS):  # pass 2: s again from the inputs (the same bits), scaled
            offs = i * BLOCK_N + cols
            mask = offs < N
            s = _row_sum(c_ptr, res_ptr, s_ptr, row, offs, mask, stride_c, stride_r, stride_s, HAS_RESIDUAL, False)
            w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_ptr + row * stride_y + offs, (s * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


# The epilogue in fused_sequential's kernel (``NORM``: 0 none, 1 the norm, 2 residual add, then the norm):
# ``norm = (y_ptr, res_ptr, w_ptr, count_ptr, part_ptr, eps, stride_r, stride_y)``: y, residual [M, N] (rows
# contiguous), weight [N], this stream's NORM_SCRATCH: count [row blocks] int64 (0 between launches), part
# [M, tiles_n] fp32 (rows' sums of squares per tile), then rstd [M] fp32.


@triton.jit
def pair_sum(x, ROWS: tl.constexpr):
    """``x [ROWS, C]`` (C a power of two) summed over its columns by halving (column j plus column j +
    C/2, ...): each addition adds two numbers, so the bits do not depend on the threads' layout."""
    for _ in tl.static_range(16):
        if x.shape[1] > 1:
            x = tl.sum(tl.reshape(x, [ROWS, 2, x.shape[1] // 2]), axis=1)
    return tl.reshape(x, [ROWS])


@triton.jit
def store_sum(total, c_ptr, stride_c, offs_m, offs_n, M, N, pid_n, num_pid_n, norm, NORM: tl.constexpr):
    """Store the fp32 sum ``total`` [R, BN] (column block ``pid_n``) into c, rounded once; ``NORM == 2``:
    plus the residual first (as :func:`_row_sum`); ``NORM``: then each row's sum of squares into
    ``part[row, pid_n]``. Returns what was stored, in fp32 (0 outside c)."""
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)  # [R, BN]
    s = total.to(c_ptr.dtype.element_ty)
    if NORM == 2:
        res_ptr, stride_r = norm[1], norm[6]
        r = tl.load(res_ptr + offs_m[:, None] * stride_r + offs_n[None, :], mask=mask, other=0.0)
        s = (s.to(tl.float32) + r.to(tl.float32)).to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + offs_m[:, None] * stride_c[0] + offs_n[None, :] * stride_c[1], s, mask=mask)
    x = tl.where(mask, s.to(tl.float32), 0.0)
    if NORM > 0:
        part_ptr = norm[4]
        tl.store(part_ptr + offs_m * num_pid_n + pid_n, pair_sum(x * x, total.shape[0]), mask=offs_m < M)
    return x


OWN_TAIL = tl.constexpr(not hw.interpreting())  # tile_done's split tail where programs may wait on each other


@triton.jit
def tile_done(x, offs_m, offs_n, c_ptr, stride_c, pid_m, num_pid_n, M, N, norm, call, BLOCK_M: tl.constexpr,
              SPLIT_TAIL: tl.constexpr = False):
    """A ticket on row block ``pid_m``'s count once this program stored its tile ``x``; the completing ticket
    computes the rows' ``rstd`` and, with ``SPLIT_TAIL`` (one tile a program, all resident: a GPU), publishes
    it for each program to scale its own tile, else writes the row block's ``y``. The count ends at 0."""
    count_ptr = norm[3]
    # Every thread's stores of the tile are done before the one ticket below.
    tl.debug_barrier()
    # Release (this tile of s and its parts) and acquire (the row block's other tiles): pairs with the
    # same atomic in the programs that stored them, in this launch and on this device (gpu scope).
    ticket = tl.atomic_add(count_ptr + pid_m, 1, sem="acq_rel", scope="gpu")
    if SPLIT_TAIL:
        rstd_ptr = norm[4] + M * num_pid_n  # [M] fp32 after the parts
        if ticket == num_pid_n - 1:
            rstd = row_rstd(pid_m, num_pid_n, M, N, norm, BLOCK_M)
            tl.store(rstd_ptr + offs_m, rstd, mask=offs_m < M)
            tl.debug_barrier()
            # Release (rstd): pairs with the acquire in P.wait below, in the row block's other programs.
            tl.atomic_xchg(count_ptr + pid_m, 0, sem="release", scope="gpu")
            scale_tile(x, rstd, offs_m, offs_n, M, N, norm)
        else:
            # Acquire: pairs with the release above, in the program whose ticket completed the row block
            # (bounded as every wait; a timeout record names "call 0", the value waited for).
            if P.wait(count_ptr + pid_m, 0, P.rank(call), P.rank(call), P.ctl(call), P.bases(call), P.world(call)):
                rstd = tl.load(rstd_ptr + offs_m, mask=offs_m < M, other=0.0, cache_modifier=".cg")
                scale_tile(x, rstd, offs_m, offs_n, M, N, norm)
    else:
        if ticket == num_pid_n - 1:
            norm_row_block(c_ptr, stride_c, pid_m, num_pid_n, M, N, norm, BLOCK_M)
            tl.store(count_ptr + pid_m, 0)


@triton.jit
def row_rstd(pid_m, num_pid_n, M, N, norm, BLOCK_M: tl.constexpr):
    """``rstd`` [BLOCK_M] of row block ``pid_m``'s rows from the tiles' parts (chunks of ``COLS`` added
    in order, then :func:`pair_sum`; the loads bypass L1: other programs wrote them)."""
    part_ptr, eps = norm[4], norm[5]
    COLS: tl.constexpr = 8192 // BLOCK_M  # fp32 values of a [BLOCK_M, COLS] block: 64 a thread at 4 warps
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    cols = tl.arange(0, COLS)  # [COLS]
    acc = tl.zeros([BLOCK_M, COLS], dtype=tl.float32)
    for j in range(0, tl.cdiv(num_pid_n, COLS)):
        offs = j * COLS + cols
        mask = (rows < M)[:, None] & (offs < num_pid_n)[None, :]
        acc += tl.load(part_ptr + rows[:, None] * num_pid_n + offs[None, :], mask=mask, other=0.0, cache_modifier=".cg")
    return 1.0 / tl.sqrt(pair_sum(acc, BLOCK_M) / N + eps)


@triton.jit
def scale_tile(x, rstd, offs_m, offs_n, M, N, norm):
    """Store ``y = x * rstd * w`` (rounded once) at rows ``offs_m`` [R], columns ``offs_n`` [C]."""
    y_ptr, w_ptr, stride_y = norm[0], norm[2], norm[7]
    w = tl.load(w_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)  # [C]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(y_ptr + offs_m[:, None] * stride_y + offs_n[None, :], (x * rstd[:, None] * w[None, :]).to(
        y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def norm_row_block(s_ptr, stride_s, pid_m, num_pid_n, M, N, norm, BLOCK_M: tl.constexpr):
    """``y`` of row block ``pid_m``'s rows, ``s`` read back from c (visible after the ticket; bypassing L1)."""
    COLS: tl.constexpr = 8192 // BLOCK_M
    rstd = row_rstd(pid_m, num_pid_n, M, N, norm, BLOCK_M)  # [BM]
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    for j in range(0, tl.cdiv(N, COLS)):
        offs_n = j * COLS + tl.arange(0, COLS)
        mask = (rows < M)[:, None] & (offs_n < N)[None, :]
        x = tl.load(s_ptr + rows[:, None] * stride_s[0] + offs_n[None, :] * stride_s[1], mask=mask, other=0.0,
                    cache_modifier=".cg").to(tl.float32)
        scale_tile(x, rstd, rows, offs_n, M, N, norm)


NORM_SCRATCH = StreamScratch(torch.int64)
on_reset(NORM_SCRATCH.clear)


def add_rms_norm(c: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, *,
                 out: tuple[torch.Tensor, torch.Tensor] | None = None,
                 max_block: int = MAX_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, s)`` of the module docstring for ``c [M, N]``, ``residual [M, N]`` (or None) and ``weight [N]``
    (rows contiguous); ``out``: the ``(y, s)`` to write; ``max_block``: the most columns a program holds."""
    M, N = c.shape
    y, s = out if out is not None else (torch.empty_like(c), None if residual is None else torch.empty_like(c))
    if residual is None:
        s = c
    if M == 0 or N == 0:
        return y, s
    block = min(triton.next_power_of_2(N), max_block)
    res = c if residual is None else residual
    _add_rms_norm_kernel[(M,)](
        c, res, weight, y, s, N, c.stride(0), res.stride(0), y.stride(0), s.stride(0), float(eps),
        HAS_RESIDUAL=residual is not None, BLOCK_N=block, CHUNKS=triton.cdiv(N, block),
        num_warps=max(1, min(16, block // 256)))
    return y, s


def add_rms_norm_torch(c: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`add_rms_norm` as torch ops (the plain path): fp32 math, one rounding to s's dtype."""
    s = c if residual is None else c + residual
    x = s.float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(s.dtype), s


def rms_norm_backward(s: torch.Tensor, weight: torch.Tensor, eps: float, dy: torch.Tensor | None,
                      ds: torch.Tensor | None, weight_grad: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(d_s, d_weight)`` (None where nothing flows) from ``dy``, ``ds`` in fp32, ``r = rsqrt(mean(s^2) + eps)``:
    ``d_s = r (dy w) - s r^3 mean((dy w) s) + ds``, ``d_weight = sum over rows of dy s r``."""
    x = s.float()
    grad = None if ds is None else ds.float()
    dw = None
    if dy is not None:
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        g = dy.float() * weight.float()
        dx = r * g - x * r.pow(3) * (g * x).mean(-1, keepdim=True)
        grad = dx if grad is None else grad + dx
        if weight_grad:
            dw = (dy.float() * x * r).sum(0).to(weight.dtype)
    return (None if grad is None else grad.to(s.dtype)), dw


def check_norm_args(op: str, a: torch.Tensor, b: torch.Tensor, residual, norm_weight, eps) -> None:
    """``residual [M, N]`` (a's dtype and device, or None), ``norm_weight [N]`` (float, a's device), ``eps >= 0``."""
    M, N = a.shape[0], b.shape[1]
    for name, t, shape, what in (("norm_weight", norm_weight, (N,), "N, the columns of b"),
                                 ("residual", residual, (M, N), "the output's")):
        if t is None and name == "residual":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != shape:
            raise ValueError(f"{op}: {name} must have shape {shape} ({what}), got {tuple(t.shape)}")
        if name == "norm_weight" and not t.dtype.is_floating_point:
            raise TypeError(f"{op}: norm_weight must be floating point, got {t.dtype}")
        if name == "residual" and t.dtype != a.dtype:
            raise TypeError(f"{op}: residual has dtype {t.dtype} but a has dtype {a.dtype}")
        if t.device != a.device:
            raise ValueError(f"{op}: {name} is on {t.device} but a is on {a.device}")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise ValueError(f"{op}: eps must be a non-negative float, got {eps!r}")


def run_with_norm(entry, a, b, *, variant: str, residual, norm_weight, eps, **kwargs):
    """``(y, new_residual)`` of ``variant``'s call ``entry(a, b, **kwargs)`` with the epilogue: in
    fused_sequential's kernel (``norm=``), torch ops after plain and reference, else :func:`add_rms_norm`."""
    check_norm_args("gemm_all_reduce", a, b, residual, norm_weight, eps)
    if residual is not None and residual.stride(-1) != 1:
        residual = residual.contiguous()
    if variant == "fused_sequential":
        return entry(a, b, norm=(residual, norm_weight.contiguous(), float(eps)), **kwargs)
    c = entry(a, b, **kwargs)
    if variant in ("plain", "reference"):
        return add_rms_norm_torch(c, residual, norm_weight, eps)
    return add_rms_norm(c.contiguous(), residual, norm_weight.contiguous(), eps)
