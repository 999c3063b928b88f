"""The user's settings (``TILEFUSE_*``, the README's "Settings" table): a value out of range raises a
``ValueError`` naming the variable and what it accepts. ``import tilefuse`` calls :func:`configure`
first (Triton decides at decoration time whether a ``@triton.jit`` function is interpreted).
"""

from __future__ import annotations

import math
import os
import sys

_BACKENDS = ("cuda", "cpu")
MAX_TIMEOUT_S = 86400.0  # a day: longer bounds overflow the device's nanosecond deadline arithmetic
MIN_TIMEOUT_S = 0.01  # shorter bounds end healthy calls (a peer's launch alone can take longer)
MAX_HEAP_BYTES = 1 << 40
_ON = ("1", "on", "true", "yes")
_OFF = ("0", "off", "false", "no")
DEFAULT_HOST_TIMEOUT_S = 60.0


def _text(name: str) -> str:
    return os.environ.get(name, "").strip()


def requested_backend() -> str:
    """``cuda`` when a GPU is usable, ``cpu`` otherwise; ``TILEFUSE_BACKEND`` overrides."""
    forced = _text("TILEFUSE_BACKEND").lower()
    if forced:
        if forced not in _BACKENDS:
            raise ValueError(f"TILEFUSE_BACKEND={forced!r}: expected one of {_BACKENDS}")
        return forced
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def interpreting() -> bool:
    """True when Triton kernels run in the interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def seconds(name: str, default: float) -> float:
    """The setting ``name`` as seconds in [``MIN_TIMEOUT_S``, ``MAX_TIMEOUT_S``]; ``default`` when unset."""
    text = _text(name)
    return check_seconds(name, text) if text else default


def check_seconds(name: str, given) -> float:
    """``given`` as a bound in seconds, else a ValueError naming ``name`` and the accepted range."""
    try:
        value = float(given)
    except (TypeError, ValueError):
        value = math.nan
    if not (MIN_TIMEOUT_S <= value <= MAX_TIMEOUT_S):  # nan and inf fail here too
        raise ValueError(f"{name}={given!r}: expected a number of seconds in [{MIN_TIMEOUT_S:g}, {MAX_TIMEOUT_S:g}]")
    return value


def host_timeout() -> float:
    """Seconds a host step waits for its peers: ``TILEFUSE_HOST_TIMEOUT``, else 60."""
    return seconds("TILEFUSE_HOST_TIMEOUT", DEFAULT_HOST_TIMEOUT_S)


def wait_timeout(default: float) -> float:
    """Seconds a device wait waits: ``TILEFUSE_WAIT_TIMEOUT``, else ``default`` (the backend's)."""
    return seconds("TILEFUSE_WAIT_TIMEOUT", default)


def sync_errors() -> bool:
    """``TILEFUSE_SYNC_ERRORS`` (1/on/true/yes or 0/off/false/no): whether a GPU call syncs to check its errors."""
    text = _text("TILEFUSE_SYNC_ERRORS").lower()
    if text not in ("", *_ON, *_OFF):
        raise ValueError(f"TILEFUSE_SYNC_ERRORS={text!r}: expected 1 (on) or 0 (off)")
    return text in _ON


def heap_size() -> int | None:
    """``TILEFUSE_HEAP_SIZE`` in bytes (a byte count, or with K/M/G/T: ``512M``, ``4G``); None when unset."""
    text = _text("TILEFUSE_HEAP_SIZE")
    if not text:
        return None
    number, mult = text.lower(), 1
    if number and number[-1] in "kmgt":
        number, mult = number[:-1], 1 << (10 * ("kmgt".index(number[-1]) + 1))
    try:
        value = float(number) * mult
    except ValueError:
        value = math.nan
    if not (1 <= value <= MAX_HEAP_BYTES):
        raise ValueError(f"TILEFUSE_HEAP_SIZE={text!r} is not a size: expected a byte count or a number with K/M/G/T "
                         "(e.g. 512M, 4G), at most 1T")
    return int(value)


def autotune_mode() -> str:
    """``TILEFUSE_AUTOTUNE``: ``"0"`` never, ``"1"`` every uncovered shape, ``"auto"`` (unset) on a GPU."""
    text = _text("TILEFUSE_AUTOTUNE").lower()
    if text in ("", "auto", *_ON, *_OFF):
        return "auto" if text in ("", "auto") else "1" if text in _ON else "0"
    raise ValueError(f"TILEFUSE_AUTOTUNE={text!r}: use 0 (off), 1 (tune every uncovered shape) or leave it unset")


def env_reader(*names: str):
    """``read() -> (value, ...)``: the raw values of the variables ``names`` (cheap: no per-lookup encoding)."""
    env = os.environ
    keys, get, decode = tuple(map(env.encodekey, names)), env._data.get, env.decodevalue

    def read():
        values = tuple(map(get, keys))
        if values.count(None) == len(keys):  # the usual case: none set
            return values
        return tuple(v if v is None else decode(v) for v in values)

    return read


_DEBUG_POISON = [False]


def set_debug_poison(on: bool) -> bool:
    """New workspaces and outputs start as NaN (``on``: a tile left unwritten shows); returns the previous."""
    old, _DEBUG_POISON[0] = _DEBUG_POISON[0], bool(on)
    return old


def debug_poison() -> bool:
    """Whether :func:`set_debug_poison` is on."""
    return _DEBUG_POISON[0]


def configure() -> None:
    """Turn the interpreter on for the cpu backend, remaking Triton's own ``@triton.jit`` helpers made before."""
    if requested_backend() != "cpu" or interpreting():
        return
    os.environ["TRITON_INTERPRET"] = "1"
    if "triton.language" not in sys.modules:
        return  # Triton decorates its helpers when imported, now under the interpreter
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    for name, module in list(sys.modules.items()):
        if not name.startswith("triton.language") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                setattr(module, attr, InterpretedFunction(value.fn))
