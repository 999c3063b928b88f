"""The residual-add + RMSNorm epilogue of gemm_all_reduce (``residual=``, ``norm_weight=``).

Applied to the reduced ``c [M, N]`` of any variant (the same bits on every rank, so both outputs are
too), in one Triton kernel, one program per row::

    s = c + residual               (fp32 add, rounded once to c's dtype: new_residual)
    y = s * rsqrt(mean(s^2) + eps) * norm_weight      (fp32 from the rounded s, rounded once)

The norm reads the rounded ``s``, so ``y`` is exactly the RMSNorm of the ``new_residual`` returned
(as in the composition ``s = c + residual; y = rms_norm(s)``). Without a residual, ``s`` is ``c``.
A row fits one block of at most ``MAX_BLOCK`` columns; longer rows are walked in blocks twice (the
sum of squares, then the scaled store), recomputing ``s`` rather than reading back its store.

The fused variants finish tiles of ``BLOCK_N`` columns, not rows: a row's norm needs every tile of
its row, so the norm runs after the variant's kernel instead of inside its last phase.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...runtime.primitives import kernel

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
            s = _row_sum(c_ptr, res_ptr, s_ptr, row, offs, offs < N, stride_c, stride_r, stride_s, HAS_RESIDUAL,
                         True)
            acc += s * s
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
        for i in range(CHUNKS):  # pass 2: s again from the inputs (the same bits), scaled
            offs = i * BLOCK_N + cols
            mask = offs < N
            s = _row_sum(c_ptr, res_ptr, s_ptr, row, offs, mask, stride_c, stride_r, stride_s, HAS_RESIDUAL, False)
            w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_ptr + row * stride_y + offs, (s * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def _warps(block: int) -> int:
    return max(1, min(16, block // 256))


def add_rms_norm(c: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, *,
                 out: tuple[torch.Tensor, torch.Tensor] | None = None,
                 max_block: int = MAX_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, s)`` of the module docstring for ``c [M, N]`` (the reduced result, rows contiguous),
    ``residual [M, N]`` of c's dtype (or None: ``s`` is ``c`` itself) and ``weight [N]`` (any float
    dtype). ``out``: the ``(y, s)`` tensors to write (``[M, N]``, c's dtype, rows contiguous; ``s``
    unused without a residual); ``max_block``: the most columns a program holds at once."""
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
        HAS_RESIDUAL=residual is not None, BLOCK_N=block, CHUNKS=triton.cdiv(N, block), num_warps=_warps(block))
    return y, s


def rms_norm_torch(s: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The RMSNorm of the plain path, in torch: fp32 math, one rounding to s's dtype."""
    x = s.float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(s.dtype)


def add_rms_norm_torch(c: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`add_rms_norm` as torch ops (the plain path): ``c + residual``, then the norm."""
    s = c if residual is None else c + residual
    return rms_norm_torch(s, weight, eps), s


def rms_norm_backward(s: torch.Tensor, weight: torch.Tensor, eps: float, dy: torch.Tensor | None,
                      ds: torch.Tensor | None, weight_grad: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients of ``(y, s)`` back to ``s`` (the sum before the norm) and to ``weight``, in fp32.

    With ``x = s``, ``r = rsqrt(mean(x^2) + eps)``, ``y = x r w``: ``dx = r (dy w) - x r^3 mean((dy w) x)``
    plus the gradient ``ds`` of s itself; ``dw = sum over rows of dy x r``. Returns ``(d_s in s's dtype
    or None, d_weight in weight's dtype or None)``."""
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
    """``residual [M, N]`` (a's dtype and device, or None) and ``norm_weight [N]`` (floating point, a's
    device); ``eps`` a non-negative float."""
    M, N = a.shape[0], b.shape[1]
    if not isinstance(norm_weight, torch.Tensor):
        raise TypeError(f"{op}: norm_weight must be a torch.Tensor, got {type(norm_weight).__name__}")
    if norm_weight.dim() != 1 or norm_weight.shape[0] != N:
        raise ValueError(f"{op}: norm_weight must have shape ({N},) (N, the columns of b), got "
                         f"{tuple(norm_weight.shape)}")
    if not norm_weight.dtype.is_floating_point:
        raise TypeError(f"{op}: norm_weight must be floating point, got {norm_weight.dtype}")
    if norm_weight.device != a.device:
        raise ValueError(f"{op}: norm_weight is on {norm_weight.device} but a is on {a.device}")
    if residual is not None:
        if not isinstance(residual, torch.Tensor):
            raise TypeError(f"{op}: residual must be a torch.Tensor or None, got {type(residual).__name__}")
        if tuple(residual.shape) != (M, N):
            raise ValueError(f"{op}: residual must have shape ({M}, {N}) (the output's), got {tuple(residual.shape)}")
        if residual.dtype != a.dtype:
            raise TypeError(f"{op}: residual has dtype {residual.dtype} but a has dtype {a.dtype}")
        if residual.device != a.device:
            raise ValueError(f"{op}: residual is on {residual.device} but a is on {a.device}")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise ValueError(f"{op}: eps must be a non-negative float, got {eps!r}")


def run_with_norm(entry, a, b, *, plain: bool, residual, norm_weight, eps, **kwargs):
    """``entry(a, b, **kwargs)`` (a variant's reduced ``c``), then the epilogue: torch's ops on the
    plain path, the kernel otherwise. Returns ``(y, new_residual)``."""
    check_norm_args("gemm_all_reduce", a, b, residual, norm_weight, eps)
    c = entry(a, b, **kwargs)
    if residual is not None and residual.stride(-1) != 1:
        residual = residual.contiguous()
    if plain:
        return add_rms_norm_torch(c, residual, norm_weight, eps)
    return add_rms_norm(c.contiguous(), residual, norm_weight.contiguous(), eps)
