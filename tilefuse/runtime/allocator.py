"""The heap's sub-allocator: aligned blocks of one rank's heap, handed out and taken back.

Allocation is deterministic (first fit over a sorted free list, coalescing frees), so ranks that
make the same allocations in the same order get the same offsets: that is what makes the heap
symmetric. A block returns to the free list when the last torch view of it goes (:class:`Block`).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable

import torch

ALIGNMENT = 256


def span_bytes(t: torch.Tensor) -> int:
    """Bytes from ``t``'s address to one past its last element (0 for a tensor without elements):
    the memory a strided view can address."""
    if t.numel() == 0:
        return 0
    return (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()


class HeapFullError(MemoryError):
    """The symmetric heap has no free block large enough."""


class Allocator:
    """First-fit allocator over [0, size) with coalescing frees; offsets aligned to ALIGNMENT."""

    def __init__(self, size: int):
        self.size = size
        self._free: list[tuple[int, int]] = [(0, size)]  # sorted (offset, length)
        self._used: dict[int, int] = {}
        self._internal: set[int] = set()  # blocks of tilefuse's own (not reported by close)
        self._lock = threading.Lock()

    def alloc(self, nbytes: int) -> int:
        need = max(ALIGNMENT, -(-nbytes // ALIGNMENT) * ALIGNMENT)
        with self._lock:
            for i, (off, length) in enumerate(self._free):
                if length >= need:
                    if length == need:
                        del self._free[i]
                    else:
                        self._free[i] = (off + need, length - need)
                    self._used[off] = need
                    return off
            free = sum(length for _, length in self._free)
            largest = max((length for _, length in self._free), default=0)
        raise HeapFullError(
            f"symmetric heap full: requested {nbytes} bytes ({need} aligned), {free} bytes free "
            f"of {self.size} (largest free block {largest} bytes); raise tilefuse.init(heap_size=...) "
            "or TILEFUSE_HEAP_SIZE, or drop references to heap tensors you no longer need"
        )

    def free(self, off: int) -> None:
        with self._lock:
            length = self._used.pop(off)
            self._internal.discard(off)
            i = bisect.bisect_left(self._free, (off, 0))
            self._free.insert(i, (off, length))
            # Coalesce with the right neighbour, then the left one.
            if i + 1 < len(self._free) and off + length == self._free[i + 1][0]:
                self._free[i] = (off, length + self._free[i + 1][1])
                del self._free[i + 1]
            if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == off:
                prev_off, prev_len = self._free[i - 1]
                self._free[i - 1] = (prev_off, prev_len + self._free[i][1])
                del self._free[i]

    @property
    def bytes_used(self) -> int:
        with self._lock:
            return sum(self._used.values())

    def live(self, exclude: Iterable[int] = ()) -> tuple[int, int]:
        """(blocks, bytes) in use, leaving out internal blocks and those that start at ``exclude``."""
        skip = set(exclude)
        with self._lock:
            sizes = [n for off, n in self._used.items() if off not in skip and off not in self._internal]
        return len(sizes), sum(sizes)

    def mark_internal(self, off: int) -> None:
        with self._lock:
            if off in self._used:
                self._internal.add(off)

    def block_start(self, offset: int) -> int | None:
        """Start of the block in use that holds byte ``offset``, or None."""
        with self._lock:
            for off, n in self._used.items():
                if off <= offset < off + n:
                    return off
        return None

    @property
    def bytes_free(self) -> int:
        return self.size - self.bytes_used


class Block:
    """Owns one allocation; torch keeps it alive through the array interface of its storage.

    ``memory`` is the tensor that owns this rank's whole heap: holding it keeps the mapping (CPU)
    or the CUDA allocation alive for as long as the block, whatever happens to the heap object.
    """

    def __init__(self, allocator: Allocator, offset: int, addr: int, nbytes: int, device: torch.device,
                 memory: torch.Tensor):
        self._allocator = allocator
        self._memory = memory
        self.offset = offset
        iface = {"shape": (nbytes,), "typestr": "|u1", "data": (addr, False), "version": 3}
        if device.type == "cuda":
            iface["strides"] = None
            iface["stream"] = None  # no implicit synchronisation: heap work is stream-ordered
            self.__cuda_array_interface__ = iface
        else:
            self.__array_interface__ = iface

    def __del__(self):
        # getattr: at interpreter exit an instance may be finalised after its attributes were cleared.
        allocator = getattr(self, "_allocator", None)
        if allocator is None:
            return
        self._allocator = None
        allocator.free(self.offset)
