"""The CUDA runtime library torch has loaded, called through ctypes.

For the few calls whose torch wrappers cost more host time than the work they queue: 2-D copies by a
copy engine (:mod:`tilefuse.runtime.dma`) and the event record / stream wait pairs that fork a
second stream off the current one and join it back (a replayed producer-consumer call,
:mod:`tilefuse.ops.common.launch`). Handles are plain integers: streams as torch gives them
(``Stream.cuda_stream``, ``torch._C._cuda_getCurrentRawStream``), events made here. The library is
the one in this process's memory map, so its handles are torch's.
"""

from __future__ import annotations

import ctypes
import functools

import torch

_EVENT_DISABLE_TIMING = 2  # cudaEventDisableTiming: ordering only, the cheapest record


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


@functools.cache
def _event_calls():
    vp = ctypes.c_void_p
    create = function("cudaEventCreateWithFlags", ctypes.c_int, [ctypes.POINTER(vp), ctypes.c_uint])
    record = function("cudaEventRecord", ctypes.c_int, [vp, vp])
    wait = function("cudaStreamWaitEvent", ctypes.c_int, [vp, vp, ctypes.c_uint])
    return None if create is None else (create, record, wait)


def events_available() -> bool:
    """Whether :func:`new_event`, :func:`record` and :func:`wait` can run in this process."""
    return torch.cuda.is_available() and _event_calls() is not None


def new_event(device_index: int) -> int:
    """A new event of ``device_index`` (timing disabled), kept for the life of the process."""
    create = _event_calls()[0]
    handle = ctypes.c_void_p()
    with torch.cuda.device(device_index):
        check(create(ctypes.byref(handle), _EVENT_DISABLE_TIMING), "cudaEventCreateWithFlags")
    return handle.value


def record(event: int, stream: int) -> None:
    """Record ``event`` on ``stream`` (both raw handles)."""
    err = _event_calls()[1](event, stream)
    if err:
        check(err, "cudaEventRecord")


def wait(stream: int, event: int) -> None:
    """Make ``stream`` wait for ``event``'s last record (both raw handles)."""
    err = _event_calls()[2](stream, event, 0)
    if err:
        check(err, "cudaStreamWaitEvent")
