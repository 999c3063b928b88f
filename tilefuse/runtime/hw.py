"""Hardware facts, from one place: backend, multiprocessor count, architecture name.

Nothing else in tilefuse reads device properties or guesses hardware from numbers.
"""

from __future__ import annotations

import functools
import re

import torch

from . import _env

# Programs the interpreter treats as "multiprocessors": any positive number works (programs run one
# after another); a small one keeps CPU tests quick.
INTERPRETER_SMS = 8


@functools.cache
def _cuda_props(index: int):
    return torch.cuda.get_device_properties(index)


def num_sms(device: torch.device | None = None) -> int:
    """Programs that can be resident at once at one program per multiprocessor."""
    device = torch.device(device) if device is not None else None
    if device is None or device.type != "cuda":
        return INTERPRETER_SMS
    return _cuda_props(device.index if device.index is not None else torch.cuda.current_device())\
        .multi_processor_count


def arch_name(device: torch.device | None = None) -> str:
    """Name used for per-device config tables, e.g. ``nvidia-h200``; ``cpu`` for the interpreter."""
    device = torch.device(device) if device is not None else None
    if device is None or device.type != "cuda":
        return "cpu"
    return _arch_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _arch_of(index: int) -> str:
    props = _cuda_props(index)
    name = props.name.lower()
    vendor = "amd" if torch.version.hip else "nvidia"
    name = re.sub(r"^(nvidia|amd)\s+", "", name)
    name = re.sub(r"[^a-z0-9]+", "-", name).strip("-")
    # "H200", "H100 80GB HBM3" -> "h200", "h100"; keep the family token.
    token = name.split("-")[0] if name else "unknown"
    return f"{vendor}-{token}"


def interpreting() -> bool:
    return _env.interpreting()
