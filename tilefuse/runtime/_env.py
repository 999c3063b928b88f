"""Process-wide facts decided before any kernel module is imported.

Triton decides at decoration time whether a ``@triton.jit`` function runs compiled or in its
interpreter, so ``TRITON_INTERPRET=1`` must be in ``os.environ`` before the first module that
defines a kernel is imported. ``import tilefuse`` calls :func:`configure` first: when no GPU is
usable (or ``TILEFUSE_BACKEND=cpu``) and the variable is unset, it sets it. A program that imports
its own kernel modules before ``tilefuse`` must set the variable itself.
"""

from __future__ import annotations

import math
import os

_BACKENDS = ("cuda", "cpu")


def requested_backend() -> str:
    """``cuda`` when a GPU is usable, ``cpu`` otherwise; ``TILEFUSE_BACKEND`` overrides."""
    forced = os.environ.get("TILEFUSE_BACKEND", "").strip().lower()
    if forced:
        if forced not in _BACKENDS:
            raise ValueError(f"TILEFUSE_BACKEND={forced!r}: expected one of {_BACKENDS}")
        return forced
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def interpreting() -> bool:
    """True when Triton kernels run in the interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


DEFAULT_HOST_TIMEOUT_S = 60.0


def host_timeout() -> float:
    """Seconds a host-side collective step of tilefuse waits for its peers: ``TILEFUSE_HOST_TIMEOUT``,
    else 60."""
    text = os.environ.get("TILEFUSE_HOST_TIMEOUT", "").strip()
    if not text:
        return DEFAULT_HOST_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"TILEFUSE_HOST_TIMEOUT={text!r} is not a number of seconds") from None
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"TILEFUSE_HOST_TIMEOUT={text!r} must be a positive, finite number of seconds")
    return value


_DEBUG_POISON = [False]


def set_debug_poison(on: bool) -> bool:
    """New workspaces and ordinary outputs start as NaN (``on``), so that a tile a variant forgets to
    write shows (the test harness turns it on); returns the previous setting. Off by default."""
    old, _DEBUG_POISON[0] = _DEBUG_POISON[0], bool(on)
    return old


def debug_poison() -> bool:
    """Whether :func:`set_debug_poison` is on."""
    return _DEBUG_POISON[0]


def configure() -> None:
    """Turn the interpreter on for the cpu backend, before kernel modules are imported."""
    if requested_backend() == "cpu" and not interpreting():
        os.environ["TRITON_INTERPRET"] = "1"
