"""The symmetric heap: one buffer per rank, mapped by every rank, with a freeing sub-allocator.

``heap_bases[r]`` is where rank r's heap is mapped *in this process*. The allocator (first fit,
coalescing frees) gives ranks that make the same allocations in the same order the same offsets.
"""

from __future__ import annotations

import bisect
import gc
import itertools
import math
import threading
import warnings
from collections.abc import Iterable

import numpy as np
import torch
import torch.distributed as dist

from . import _env, backends, hostsync
from .errors import CallMismatchError

ALIGNMENT = 256


def span_bytes(t: torch.Tensor) -> int:
    """Bytes from ``t``'s address to one past its last element: the memory a strided view can address."""
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
        self._internal: set[int] = set()  # blocks of tilefuse's own
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
        raise HeapFullError(f"symmetric heap full: requested {nbytes} bytes ({need} aligned), {free} bytes free of "
                            f"{self.size} (largest free block {largest} bytes); raise tilefuse.init(heap_size=...) "
                            "or TILEFUSE_HEAP_SIZE, or drop references to heap tensors you no longer need")

    def free(self, off: int) -> None:
        with self._lock:
            length = self._used.pop(off)
            self._internal.discard(off)
            i = bisect.bisect_left(self._free, (off, 0))
            self._free.insert(i, (off, length))
            # Coalesce with the right neighbour, then the left one.
            free = self._free
            if i + 1 < len(free) and off + length == free[i + 1][0]:
                free[i:i + 2] = [(off, length + free[i + 1][1])]
            if i > 0 and free[i - 1][0] + free[i - 1][1] == off:
                free[i - 1:i + 1] = [(free[i - 1][0], free[i - 1][1] + free[i][1])]

    @property
    def bytes_used(self) -> int:
        with self._lock:
            return sum(self._used.values())

    def live(self) -> tuple[int, int]:
        """(blocks, bytes) in use, leaving out internal blocks."""
        with self._lock:
            sizes = [n for off, n in self._used.items() if off not in self._internal]
        return len(sizes), sum(sizes)

    def mark_internal(self, offset: int) -> None:
        """The block in use that holds byte ``offset`` is tilefuse's own (not reported by ``live``)."""
        with self._lock:
            self._internal.update(off for off, n in self._used.items() if off <= offset < off + n)


class Block:
    """One allocation as an array interface; holds this rank's whole heap ``memory`` (it outlives the heap)."""

    def __init__(self, allocator: Allocator, offset: int, addr: int, nbytes: int, device: torch.device,
                 memory: torch.Tensor):
        self._allocator, self._memory, self.offset = allocator, memory, offset
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


DEFAULT_HEAP_BYTES = {"cuda": 4 << 30, "cpu": 256 << 20}


class LiveHeapTensorsWarning(UserWarning):
    """A heap was closed while tensors on it were still referenced (they stay valid, rank-local)."""


def resolve_heap_size(heap_size: int | None, backend: str) -> int:
    """Heap size from the argument, else ``TILEFUSE_HEAP_SIZE``, else the backend's default."""
    if heap_size is None:
        env = _env.heap_size()
        heap_size = env if env is not None else DEFAULT_HEAP_BYTES[backend]
    heap_size = int(heap_size)
    if heap_size < ALIGNMENT:
        raise ValueError(f"heap_size must be at least {ALIGNMENT} bytes, got {heap_size}")
    return heap_size - heap_size % ALIGNMENT


_HEAP_IDS = itertools.count(1)


class SymmetricHeap:
    """One rank's view of the symmetric heap; made by :func:`tilefuse.init`."""

    def __init__(self, size: int, group, backend: str, device: torch.device):
        self.uid = next(_HEAP_IDS)  # unique in this process (caches key on it, not on id())
        self.size, self.group, self.backend, self.device = size, group, backend, device
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self._allocator = Allocator(size)
        self._closed = True  # until the rendezvous succeeds
        self._peers = (backends.map_cpu(group, self.rank, self.world_size, size) if backend == "cpu"
                       else backends.map_cuda(group, self.rank, self.world_size, size, device))
        self._memory = self._peers[self.rank]  # this rank's own heap: every block holds it
        bases = [t.data_ptr() for t in self._peers]
        self.base = bases[self.rank]
        self.heap_bases = torch.tensor(bases, dtype=torch.int64, device=device)
        self._closed = False

    def mark_internal(self, *tensors: torch.Tensor) -> None:
        """The blocks of ``tensors`` are tilefuse's own: :meth:`close` does not report them."""
        for t in tensors:
            self.check_on_heap("mark_internal", t)
            self._allocator.mark_internal(self.offset_of(t))

    def close(self, *, internal: Iterable[torch.Tensor] = (), wait: bool = True) -> None:
        """Drop the peer mappings, then a bounded barrier (collective; idempotent); warn of live heap tensors
        (not ``internal`` ones: they stay valid here). ``wait=False``: not waiting for this device's work."""
        if self._closed:
            return
        self._closed = True
        gc.collect()  # blocks held only by unreachable cycles (a traceback, say) are not the user's
        self.mark_internal(*(t for t in internal if self.is_on_heap(t)))
        blocks, nbytes = self._allocator.live()
        if blocks:
            warnings.warn(f"tilefuse heap of rank {self.rank} closed with {blocks} heap tensor block(s) ({nbytes} "
                          "bytes) still referenced: they stay valid on this rank (their memory is kept until they "
                          "are freed) but peers no longer see them; drop them before tilefuse.shutdown() to "
                          "release the heap", LiveHeapTensorsWarning, stacklevel=3)
        on_gpu = self.device.type == "cuda" and wait
        if on_gpu:
            torch.cuda.synchronize(self.device)
        self._peers = [t if r == self.rank else None for r, t in enumerate(self._peers)]
        if on_gpu:
            torch.cuda.synchronize(self.device)
        try:
            hostsync.barrier(self.group, what="tilefuse.shutdown: heap close", last=True)
        except hostsync.HostTimeoutError as err:
            warnings.warn(f"tilefuse heap of rank {self.rank} closed without its peers: {err}",
                          RuntimeWarning, stacklevel=3)
        except Exception:  # the process group is already gone (interpreter exit)
            pass
        if on_gpu:
            torch.cuda.ipc_collect()

    def empty(self, *shape, dtype=torch.float32) -> torch.Tensor:
        """An uninitialised heap tensor (contiguous, 256-byte aligned)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
            shape = tuple(shape[0])
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"negative dimension in shape {shape}")
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if self._closed:
            raise RuntimeError("this symmetric heap is closed (tilefuse.shutdown): call tilefuse.init() "
                               "and allocate from the new heap")
        off = self._allocator.alloc(nbytes)
        block = Block(self._allocator, off, self.base + off, max(nbytes, 1), self.device, self._memory)
        on_gpu = self.device.type == "cuda"
        raw = torch.as_tensor(block, device=self.device) if on_gpu else torch.from_numpy(np.asarray(block))
        return raw[:nbytes].view(dtype).view(shape)

    def zeros(self, *shape, dtype=torch.float32) -> torch.Tensor:
        return self.empty(*shape, dtype=dtype).zero_()

    def full(self, shape, fill_value, dtype=torch.float32) -> torch.Tensor:
        return self.empty(shape, dtype=dtype).fill_(fill_value)

    def arange(self, n: int, dtype=torch.int64) -> torch.Tensor:
        return self.empty(n, dtype=dtype).copy_(torch.arange(n, dtype=dtype, device=self.device))

    def randn(self, *shape, dtype=torch.float32, generator=None) -> torch.Tensor:
        return self.empty(*shape, dtype=dtype).normal_(generator=generator)

    def is_on_heap(self, t: torch.Tensor) -> bool:
        """True when every byte ``t`` can address lies in this rank's heap."""
        if not isinstance(t, torch.Tensor) or t.device != self.device:
            return False
        lo = t.data_ptr()  # an empty tensor: its address alone
        return self.base <= lo and lo + max(span_bytes(t), 1) <= self.base + self.size

    def peer_view(self, t: torch.Tensor, rank: int) -> torch.Tensor:
        """``rank``'s copy of the heap tensor ``t`` as mapped here (host access; order it with barriers)."""
        self.check_on_heap("peer_view: t", t)
        if not 0 <= rank < self.world_size:
            raise ValueError(f"peer_view: rank {rank} is not in [0, {self.world_size})")
        peer = self._peers[rank]
        if peer is None:
            raise RuntimeError("peer_view: the heap was closed")
        off = self.offset_of(t)
        raw = peer[off:off + span_bytes(t)]
        return raw.view(t.dtype).as_strided(t.shape, t.stride())

    def offset_of(self, t: torch.Tensor) -> int:
        return t.data_ptr() - self.base

    def check_on_heap(self, name: str, t: torch.Tensor) -> None:
        if not self.is_on_heap(t):
            where = f"on {t.device}" if isinstance(t, torch.Tensor) else f"a {type(t).__name__}"
            raise ValueError(f"{name} must be a tensor on the symmetric heap of rank {self.rank} (allocate it "
                             f"with tilefuse.empty/zeros/...), but it is {where} outside the heap")

    def check_symmetric(self, name: str, *tensors: torch.Tensor, signature=None) -> None:
        """Collective: every rank's ``tensors`` sit at the same heap offsets with equal layouts and ``signature``."""
        for i, t in enumerate(tensors):
            self.check_on_heap(f"{name}: buffer {i}", t)
        mine = {"offsets": [self.offset_of(t) for t in tensors],
                "layout": [(tuple(t.shape), tuple(t.stride()), str(t.dtype)) for t in tensors],
                "signature": signature}
        everyone = hostsync.all_gather_object(mine, self.group, what=f"{name}: heap offsets check")
        for r, theirs in enumerate(everyone):
            if theirs["signature"] != mine["signature"] or theirs["layout"] != mine["layout"]:
                raise CallMismatchError(f"{name}: ranks disagree on the call: rank {self.rank} has {mine['signature']} "
                                        f"with buffers {mine['layout']}, rank {r} has {theirs['signature']} with "
                                        f"{theirs['layout']}. Every rank must make the same call with the same shapes.")
            if theirs["offsets"] != mine["offsets"]:
                raise RuntimeError(f"{name}: heap allocations diverged between ranks: rank {self.rank} has offsets "
                                   f"{mine['offsets']}, rank {r} has {theirs['offsets']}. Every rank must allocate "
                                   "heap tensors in the same order and free them alike.")

    @property
    def bytes_free(self) -> int:
        return self.size - self._allocator.bytes_used

    @property
    def bytes_used(self) -> int:
        return self._allocator.bytes_used

    def __repr__(self) -> str:
        return (f"SymmetricHeap(rank={self.rank}/{self.world_size}, backend={self.backend}, size={self.size}, "
                f"used={self.bytes_used})")
