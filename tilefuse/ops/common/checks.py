"""Host-side argument checks whose errors name the op (the first argument, the message's prefix) and
the argument: TypeError for types, ValueError for shapes and placement."""

from __future__ import annotations

import torch

from ...runtime import _env
from ...runtime.heap import span_bytes

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Scaled operands (``scale_a=``, ``scale_b=``: :mod:`.scaled`); one of a pair may be e5m2, not both,
# as for torch._scaled_mm.
FLOAT8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def check_matrix(op: str, name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{op}: {name} must be a 2-D matrix, got shape {tuple(t.shape)}")


def check_same_device(op: str, **tensors: torch.Tensor) -> None:
    (first_name, first), *rest = tensors.items()
    for name, t in rest:
        if t.device != first.device:
            raise ValueError(f"{op}: {name} is on {t.device} but {first_name} is on {first.device}")


def check_dtypes(op: str, **tensors: torch.Tensor) -> None:
    """All tensors share one dtype of SUPPORTED_DTYPES, or all are float8 (at most one e5m2)."""
    (first_name, first), *rest = items = list(tensors.items())
    f8_name, f8 = next(((n, t) for n, t in items if t.dtype in FLOAT8_DTYPES), (None, None))
    if f8 is not None:
        for name, t in items:
            if t.dtype not in FLOAT8_DTYPES:
                raise TypeError(f"{op}: {name} has dtype {t.dtype} next to the float8 {f8_name} ({f8.dtype}): "
                                "pass both operands as float8 (with scale_a= and scale_b=) or neither")
        if all(t.dtype == torch.float8_e5m2 for _, t in items):
            raise TypeError(f"{op}: both operands are float8_e5m2; at most one may be (the other float8_e4m3fn), "
                            "as for torch._scaled_mm")
        return
    if first.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES + FLOAT8_DTYPES)
        raise TypeError(f"{op}: {first_name} has dtype {first.dtype}; supported dtypes are {names}")
    for name, t in rest:
        if t.dtype != first.dtype:
            raise TypeError(f"{op}: {name} has dtype {t.dtype} but {first_name} has dtype {first.dtype}")


def check_operands(op: str, a, b) -> None:
    """``a [M, K]`` and ``b [K, N]``: 2-D tensors on one device, of one supported dtype, agreeing on K."""
    check_matrix(op, "a", a)
    check_matrix(op, "b", b)
    check_same_device(op, a=a, b=b)
    check_dtypes(op, a=a, b=b)
    check_inner_dim(op, a, b)


def check_kernel_dtype(op: str, dtype) -> None:
    """Refuse bfloat16 in Triton's interpreter, which computes it wrong (the plain path takes it)."""
    if dtype == torch.bfloat16 and _env.interpreting():
        raise TypeError(f"{op}: bfloat16 on the CPU backend: Triton's interpreter computes it wrong; "
                        "use float16 or float32 there, or variant='plain'")


def check_inner_dim(op: str, a: torch.Tensor, b: torch.Tensor, a_name: str = "a", b_name: str = "b") -> None:
    """a [M, K] and b [K, N] agree on K."""
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"{op}: {b_name} has {b.shape[0]} rows but {a_name} has {a.shape[1]} columns (K must match)")


def check_divisible(op: str, name: str, value: int, by: int, what: str) -> None:
    """`value` (called `name`) is a multiple of `by` (described as `what`, e.g. "the world size")."""
    if value % by != 0:
        raise ValueError(f"{op}: {name} = {value} must be divisible by {what} ({by})")


def check_out_tensor(op: str, out, shape: tuple, dtype, device, **inputs: torch.Tensor) -> None:
    """``out`` is a tensor of exactly ``shape``, ``dtype`` and ``device``, overlapping none of ``inputs``."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{op}: out must be a torch.Tensor, got {type(out).__name__}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{op}: out has shape {tuple(out.shape)}, expected {tuple(shape)}")
    if out.dtype != dtype:
        raise TypeError(f"{op}: out has dtype {out.dtype}, expected {dtype}")
    if out.device != device:
        raise ValueError(f"{op}: out is on {out.device}, expected {device} (the device of a and b)")
    n_out = span_bytes(out)
    for name, t in inputs.items():
        n = span_bytes(t)  # overlap: the byte ranges of out and t intersect on one device
        if (t.device == device and n_out > 0 and n > 0 and out.data_ptr() < t.data_ptr() + n
                and t.data_ptr() < out.data_ptr() + n_out):
            raise ValueError(f"{op}: out overlaps {name} in memory (the call reads {name} while it writes out): "
                             "pass an out of its own")
