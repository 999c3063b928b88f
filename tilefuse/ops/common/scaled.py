"""Scaled float8 operands, as ``torch._scaled_mm`` takes them: the checks, the scales as the kernels
take them, and the plain path's matmul.

A float8 call computes ``(a.float() * scale_a) @ (b.float() * scale_b)`` (fp32 accumulation),
rounded once to ``out_dtype`` (default bfloat16); each scale is float32, tensor-wise or row-wise
(``scale_a [M, 1]``, ``scale_b [1, N]``); kernels take them as :func:`kernel_scales` gives them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .checks import FLOAT8_DTYPES, check_kernel_dtype
from .collectives import all_gather_cat

OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
UNSCALED = (None, None, None)  # (scale_a, scale_b, out_dtype) of a call without float8 operands


@dataclass(frozen=True)
class Scaled:
    """The checked scales of one float8 call and the dtype of its result."""

    scale_a: torch.Tensor
    scale_b: torch.Tensor
    out_dtype: torch.dtype


def is_float8(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in FLOAT8_DTYPES


def check_scales(op: str, a: torch.Tensor, b: torch.Tensor, scale_a=None, scale_b=None,
                 out_dtype=None) -> Scaled | None:
    """The checked scaling of ``op(a, b)``: both scales and an ``out_dtype`` of ``OUT_DTYPES`` (None:
    bfloat16) for float8 operands, none of them otherwise (None)."""
    if not is_float8(a):
        for name, value in (("scale_a", scale_a), ("scale_b", scale_b), ("out_dtype", out_dtype)):
            if value is not None:
                raise TypeError(f"{op}: {name} is for float8 operands (torch.float8_e4m3fn / float8_e5m2); "
                                f"a has dtype {a.dtype}")
        return None
    if scale_a is None or scale_b is None:
        missing = " and ".join(n for n, s in (("scale_a", scale_a), ("scale_b", scale_b)) if s is None)
        raise ValueError(f"{op}: float8 operands need both scale_a= and scale_b= (float32, tensor-wise or "
                         f"row-wise, as for torch._scaled_mm); {missing} missing")
    _check_scale(op, "scale_a", scale_a, a, (a.shape[0], 1))
    _check_scale(op, "scale_b", scale_b, a, (1, b.shape[1]))
    out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    if out_dtype not in OUT_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in OUT_DTYPES)
        raise TypeError(f"{op}: out_dtype must be one of {names}, got {out_dtype!r}")
    return Scaled(scale_a, scale_b, out_dtype)


def _check_scale(op: str, name: str, scale, a: torch.Tensor, rowwise: tuple) -> None:
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(scale).__name__}")
    if scale.dtype != torch.float32:
        raise TypeError(f"{op}: {name} must be float32, got {scale.dtype}")
    if scale.device != a.device:
        raise ValueError(f"{op}: {name} is on {scale.device} but a is on {a.device}")
    if scale.numel() != 1 and tuple(scale.shape) != rowwise:
        raise ValueError(f"{op}: {name} has shape {tuple(scale.shape)}; expected one element (tensor-wise) or "
                         f"{list(rowwise)} (row-wise)")


def _row_stride(scale: torch.Tensor, dim: int) -> int:
    """The stride between consecutive rows (``dim`` 0) or columns (1) of a scale: 0 for tensor-wise."""
    return 0 if scale.numel() == 1 else scale.stride(dim)


def prepare_scaling(op: str, a: torch.Tensor, b: torch.Tensor, scale_a, scale_b, out_dtype) -> tuple:
    """``(out_dtype, kind)`` of a variant's call, checked; ``kind``, what a call signature holds of the
    scaling: None unscaled, else the result's dtype, b's dtype and which scales are row-wise."""
    scaled = check_scales(op, a, b, scale_a, scale_b, out_dtype)
    if scaled is None:
        return a.dtype, None
    check_kernel_dtype(op, scaled.out_dtype)
    return scaled.out_dtype, ("scaled", scaled.out_dtype, b.dtype, _row_stride(scale_a, 0) != 0,
                              _row_stride(scale_b, 1) != 0)


_STAND_INS: dict = {}


def kernel_scales(scale_a: torch.Tensor | None, scale_b: torch.Tensor | None, device: torch.device) -> tuple:
    """The kernels' ``scales``: ``(scale_a, row stride, scale_b, column stride)`` (stride 0: tensor-wise),
    or uint8 stand-ins for an unscaled call."""
    if scale_a is None:
        stand_in = _STAND_INS.get(device)
        if stand_in is None:
            stand_in = _STAND_INS[device] = torch.zeros(16, dtype=torch.uint8, device=device)
        return (stand_in, 0, stand_in, 0)
    return (scale_a, _row_stride(scale_a, 0), scale_b, _row_stride(scale_b, 1))


def row_scales(scaled: Scaled, rows: int) -> torch.Tensor:
    """``scale_a`` as ``rows`` float32 values, one per row of ``a`` (a tensor-wise scale repeated)."""
    return scaled.scale_a.reshape(-1).expand(rows) if scaled.scale_a.numel() == 1 else scaled.scale_a.reshape(rows)


def gather_bytes(t: torch.Tensor, group) -> torch.Tensor:
    """Every rank's rows of ``t`` stacked in group-rank order, moved as bytes (gloo has no float8)."""
    if t.dtype not in FLOAT8_DTYPES:
        return all_gather_cat(t, dim=0, group=group)
    return all_gather_cat(t.contiguous().view(torch.uint8), dim=0, group=group).view(t.dtype)


def fp32_operands(op: str, a: torch.Tensor, b: torch.Tensor, scale_a=None, scale_b=None, out_dtype=None) -> tuple:
    """``(a, b, result dtype)`` of a reference path: fp32 operands (float8 dequantized, checked)."""
    scaled = check_scales(op, a, b, scale_a, scale_b, out_dtype)
    if scaled is None:
        return a.float(), b.float(), a.dtype
    return dequantized(a, scaled.scale_a), dequantized(b, scaled.scale_b), scaled.out_dtype


def dequantized(a: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``a.float() * scale`` (a row-wise ``scale`` broadcast over its rows or columns)."""
    return a.float() * (scale.reshape(()) if scale.numel() == 1 else scale)


def _zero_padded(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``t`` (2-D) with ``rows`` zero rows and ``cols`` zero columns appended, as one copy (``t`` itself if none)."""
    if not (rows or cols):
        return t
    src = t.view(torch.uint8) if t.element_size() == 1 else t  # F.pad has no float8 kernel
    return torch.nn.functional.pad(src, (0, cols, 0, rows)).view(t.dtype)


def scaled_mm_args(a: torch.Tensor, b: torch.Tensor, scaled: Scaled) -> tuple:
    """``(a, b, scale_a, scale_b)`` as ``torch._scaled_mm`` takes them on a GPU: a row-major, b column-major, K
    and N zero-padded to multiples of 16 (one copy per padded operand; M needs none), the scales both
    tensor-wise or both row-wise (scale_b padded alike)."""
    sa, sb = scaled.scale_a, scaled.scale_b
    (M, K), N = a.shape, b.shape[1]
    pad_k, pad_n = -K % 16, -N % 16
    if sa.numel() != 1 or sb.numel() != 1:
        sa = row_scales(scaled, M).reshape(-1, 1).contiguous()
        sb = _zero_padded(sb.reshape(1, 1).expand(1, N) if sb.numel() == 1 else sb, 0, pad_n).contiguous()
    else:
        sa, sb = sa.reshape(()), sb.reshape(())
    b_rows = _zero_padded(b.t(), pad_n, pad_k).contiguous()  # [N, K] row-major: b column-major
    return _zero_padded(a, 0, pad_k).contiguous(), b_rows.t(), sa, sb


def scaled_matmul(a: torch.Tensor, b: torch.Tensor, scaled: Scaled) -> torch.Tensor:
    """``(a.float() * scale_a) @ (b.float() * scale_b)`` in ``out_dtype``: on a GPU ``torch._scaled_mm`` as a
    user calls it (:func:`scaled_mm_args`; with N padded, the result is a view of the product's first N
    columns); where it refuses the operands or off a GPU, the fp32 matmul of the dequantized operands
    rounded once."""
    if a.is_cuda and min(*a.shape, b.shape[1]) > 0:
        x, y, sa, sb = scaled_mm_args(a, b, scaled)
        try:
            c = torch._scaled_mm(x, y, scale_a=sa, scale_b=sb, out_dtype=scaled.out_dtype)
            return c[:, :b.shape[1]] if c.shape[1] != b.shape[1] else c
        except (RuntimeError, ValueError):  # a combination this build refuses (row-wise scales with float32
            pass  # results or e5m2 on some): the fp32 path below
    return (dequantized(a, scaled.scale_a) @ dequantized(b, scaled.scale_b)).to(scaled.out_dtype)
