"""Copies done by the GPU's copy engines (DMA), queued on the current stream.

torch's ``copy_`` queues a copy-engine transfer only when both sides are contiguous; a block of rows
of a wider matrix (a column block of ``c``) would be copied by a kernel, on the SMs. Here such a
block goes to the CUDA runtime's 2-D copy instead: one transfer of ``height`` rows of ``width``
bytes, each side with its own row pitch, ordered in the stream like a kernel (and captured into a
CUDA graph like one). The runtime library is the one torch loaded (:mod:`tilefuse.runtime.cudart`).
"""

from __future__ import annotations

import ctypes

import torch

from . import cudart

_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: the direction follows from the (unified) addresses


def _cudart():
    """``cudaMemcpy2DAsync`` of the runtime library torch loaded, or None."""
    vp, size = ctypes.c_void_p, ctypes.c_size_t
    return cudart.function("cudaMemcpy2DAsync", ctypes.c_int, [vp, size, vp, size, size, size, ctypes.c_int, vp])


def available() -> bool:
    """Whether :func:`copy_rows` can run in this process: without CUDA always (the heap's CPU copies
    do not use it), with CUDA when the runtime library torch loaded is found."""
    return not torch.cuda.is_available() or _cudart() is not None


def copy_rows(dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int,
              device: torch.device) -> None:
    """Copy ``height`` rows of ``width`` bytes from address ``src`` to ``dst`` (row pitches in
    bytes) on ``device``'s current stream, by a copy engine."""
    fn = _cudart()
    if fn is None:
        raise RuntimeError("copy-engine copies need the CUDA runtime library (libcudart), which this process "
                           "has not loaded")
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(index).cuda_stream
    err = fn(dst, dst_pitch, src, src_pitch, width, height, _MEMCPY_DEFAULT, stream)
    if err != 0:
        raise RuntimeError(f"cudaMemcpy2DAsync failed with CUDA error {err} ({height} rows of {width} bytes, "
                           f"pitches {src_pitch} -> {dst_pitch})")
