"""The CUDA runtime library torch has loaded, called through ctypes.

For the calls torch has no wrapper for: 2-D copies by a copy engine (:mod:`tilefuse.runtime.dma`).
Streams are plain integers, as torch gives them (``Stream.cuda_stream``). The library is the one in
this process's memory map, so its handles are torch's.
"""

from __future__ import annotations

import ctypes
import functools

import torch


@functools.cache
def library():
    """The CUDA runtime torch has loaded (found in this process's memory map), or None (also
    without a usable GPU)."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.init()
    paths = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1]
                if "libcudart.so" in path and path not in paths:
                    paths.append(path)
    except OSError:
        pass
    for name in paths + ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]:
        try:
            lib = ctypes.CDLL(name)
            lib.cudaMemcpy2DAsync  # noqa: B018 - present in every runtime this works with
        except (OSError, AttributeError):
            continue
        return lib
    return None


def function(name: str, restype, argtypes: list):
    """``name`` of the runtime library with its C signature, or None without the library."""
    return _function(name, restype, tuple(argtypes))


@functools.cache
def _function(name: str, restype, argtypes: tuple):
    lib = library()
    if lib is None:
        return None
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = restype, list(argtypes)
    return fn


def check(err: int, what: str) -> None:
    if err != 0:
        raise RuntimeError(f"{what} failed with CUDA error {err}")
