"""Copies by the GPU's copy engines (DMA), queued on the current stream.

torch's ``copy_`` uses a copy engine only when both sides are contiguous; a block of rows of a wider
matrix (a column block of ``c``) would be copied by a kernel, on the SMs. Here such a block goes to
the CUDA runtime's 2-D copy, called through ctypes in the runtime library torch loaded (so its
handles are torch's): one transfer of ``height`` rows of ``width`` bytes, each side with its own row
pitch, ordered in the stream like a kernel (and captured into a CUDA graph like one).
"""

from __future__ import annotations

import ctypes
import functools

import torch

_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: the direction follows from the (unified) addresses


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


@functools.cache
def _memcpy_2d():
    lib = library()
    if lib is None:
        return None
    fn, vp, size = lib.cudaMemcpy2DAsync, ctypes.c_void_p, ctypes.c_size_t
    fn.restype, fn.argtypes = ctypes.c_int, [vp, size, vp, size, size, size, ctypes.c_int, vp]
    return fn


def copy_rows(dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int,
              device: torch.device) -> None:
    """Copy ``height`` rows of ``width`` bytes from address ``src`` to ``dst`` (row pitches in
    bytes) on ``device``'s current stream, by a copy engine."""
    fn = _memcpy_2d()
    if fn is None:
        raise RuntimeError("copy-engine copies need the CUDA runtime library (libcudart), which this process "
                           "has not loaded")
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(index).cuda_stream
    err = fn(dst, dst_pitch, src, src_pitch, width, height, _MEMCPY_DEFAULT, stream)
    if err != 0:
        raise RuntimeError(f"cudaMemcpy2DAsync failed with CUDA error {err} ({height} rows of {width} bytes, "
                           f"pitches {src_pitch} -> {dst_pitch})")
