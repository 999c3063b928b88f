"""Hardware facts, from one place: multiprocessor count and architecture name."""

from __future__ import annotations

import functools
import re

import torch

from . import _env

# The interpreter's "multiprocessors" (its programs run one after another): few keep CPU tests quick.
INTERPRETER_SMS = 8
interpreting = _env.interpreting


@functools.cache
def _cuda_props(index: int):
    return torch.cuda.get_device_properties(index)


def _cuda_index(device: torch.device | None) -> int | None:
    if device is not None and not isinstance(device, torch.device):
        device = torch.device(device)
    if device is None or device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


def num_sms(device: torch.device | None = None) -> int:
    """Programs that can be resident at once at one program per multiprocessor."""
    index = _cuda_index(device)
    return INTERPRETER_SMS if index is None else _cuda_props(index).multi_processor_count


def arch_name(device: torch.device | None = None) -> str:
    """Name used for per-device config tables, e.g. ``nvidia-h200``; ``cpu`` for the interpreter."""
    index = _cuda_index(device)
    return "cpu" if index is None else _arch_of(index)


@functools.cache
def _arch_of(index: int) -> str:
    name = re.sub(r"^(nvidia|amd)\s+", "", _cuda_props(index).name.lower())
    name = re.sub(r"[^a-z0-9]+", "-", name).strip("-")
    # "H200", "H100 80GB HBM3" -> "h200", "h100": the family token.
    token = name.split("-")[0] if name else "unknown"
    return f"{'amd' if torch.version.hip else 'nvidia'}-{token}"
