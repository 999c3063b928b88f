"""The symmetric heap: one buffer per rank, mapped by every rank, with a freeing sub-allocator.

Each rank allocates one heap at start-up and maps every peer's heap once (one rendezvous).
``heap_bases[r]`` is the address at which rank r's heap is mapped *in this process*; device code
moves a pointer to rank r by ``heap_bases[r] + (ptr - heap_bases[rank])`` (see ``primitives``).

Allocation is symmetric by construction: the sub-allocator is deterministic, so ranks that make the
same allocations in the same order get the same offsets. Ops allocate their workspaces once per
shape, collectively, and check that the offsets agree (:meth:`SymmetricHeap.check_symmetric`).

A tensor's block returns to the pool when the tensor and every view of it are gone: each block is
handed to torch through an object that owns it (``__array_interface__`` on the CPU,
``__cuda_array_interface__`` on the GPU), and torch keeps that object alive as long as any view of
the storage lives.

Lifetime: every block also holds this rank's own heap memory (the CPU mapping, or the CUDA
allocation), so a heap tensor stays valid after :meth:`SymmetricHeap.close` (``tilefuse.shutdown``)
for as long as it lives: the memory is never unmapped under it, and a later heap never reuses it.
``close`` warns (:class:`LiveHeapTensorsWarning`) when such tensors remain; peers no longer see them.

The rendezvous that maps the peers' heaps (``cpu``: files in /dev/shm; ``cuda``: IPC handles)
is :mod:`tilefuse.runtime.backends`.
"""

from __future__ import annotations

import gc
import itertools
import warnings
from collections.abc import Iterable

import numpy as np
import torch
import torch.distributed as dist

from . import _env, backends, hostsync
from .allocator import ALIGNMENT, Allocator, Block, HeapFullError, span_bytes

__all__ = ["ALIGNMENT", "HeapFullError", "LiveHeapTensorsWarning", "SymmetricHeap", "resolve_heap_size",
           "span_bytes"]

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
        self.size = size
        self.group = group
        self.backend = backend
        self.device = device
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self._allocator = Allocator(size)
        self._closed = True  # until the rendezvous succeeds
        if backend == "cpu":
            self._peers = backends.map_cpu(group, self.rank, self.world_size, size)
        else:
            self._peers = backends.map_cuda(group, self.rank, self.world_size, size, device)
        self._memory = self._peers[self.rank]  # this rank's own heap: every block holds it
        bases = [t.data_ptr() for t in self._peers]
        self.base = bases[self.rank]
        self.heap_bases = torch.tensor(bases, dtype=torch.int64, device=device)
        self._closed = False

    def mark_internal(self, *tensors: torch.Tensor) -> None:
        """Mark the blocks of heap tensors that tilefuse itself keeps (control block, workspaces a
        captured CUDA graph still names): :meth:`close` does not report them as user tensors."""
        for t in tensors:
            self.check_on_heap("mark_internal", t)
            start = self._allocator.block_start(self.offset_of(t))
            if start is not None:
                self._allocator.mark_internal(start)

    def close(self, *, internal: Iterable[torch.Tensor] = (), wait: bool = True) -> None:
        """Drop the peer mappings, then a bounded barrier (collective; idempotent).

        Every rank drops its mappings of its peers' heaps before the barrier, so no rank's memory
        is still mapped elsewhere once the barrier passes (on a GPU, torch's IPC reference counts
        are then back to zero before any process exits). This rank's own heap memory stays alive
        while any heap tensor does; those tensors stay valid here but peers no longer see them,
        and a :class:`LiveHeapTensorsWarning` says how many there are. Not counted: blocks marked
        with :meth:`mark_internal`, and ``internal``, tilefuse's own heap tensors that the caller
        drops right after. ``wait=False``: do not wait for this device's queued work first (it will
        not finish: a peer exited under it).
        """
        if self._closed:
            return
        self._closed = True
        gc.collect()  # blocks held only by unreachable cycles (a traceback, say) are not the user's
        skip = []
        for t in internal:
            start = self._allocator.block_start(self.offset_of(t)) if self.is_on_heap(t) else None
            if start is not None:
                skip.append(start)
        blocks, nbytes = self._allocator.live(exclude=skip)
        if blocks:
            warnings.warn(
                f"tilefuse heap of rank {self.rank} closed with {blocks} heap tensor block(s) ({nbytes} bytes) "
                "still referenced: they stay valid on this rank (their memory is kept until they are "
                "freed) but peers no longer see them; drop them before tilefuse.shutdown() to release "
                "the heap",
                LiveHeapTensorsWarning, stacklevel=3,
            )
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

    @property
    def closed(self) -> bool:
        return self._closed

    # ---------------------------------------------------------------- allocation
    def _alloc_bytes(self, nbytes: int) -> torch.Tensor:
        if self._closed:
            raise RuntimeError("this symmetric heap is closed (tilefuse.shutdown): call tilefuse.init() "
                               "and allocate from the new heap")
        off = self._allocator.alloc(nbytes)
        block = Block(self._allocator, off, self.base + off, max(nbytes, 1), self.device, self._memory)
        if self.device.type == "cuda":
            raw = torch.as_tensor(block, device=self.device)
        else:
            raw = torch.from_numpy(np.asarray(block))
        return raw[:nbytes]

    def empty(self, *shape, dtype=torch.float32) -> torch.Tensor:
        """An uninitialised heap tensor (contiguous, 256-byte aligned)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
            shape = tuple(shape[0])
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"negative dimension in shape {shape}")
        numel = 1
        for s in shape:
            numel *= s
        elem = torch.empty((), dtype=dtype).element_size()
        return self._alloc_bytes(numel * elem).view(dtype).view(shape)

    def zeros(self, *shape, dtype=torch.float32) -> torch.Tensor:
        return self.empty(*shape, dtype=dtype).zero_()

    def full(self, shape, fill_value, dtype=torch.float32) -> torch.Tensor:
        return self.empty(shape, dtype=dtype).fill_(fill_value)

    def arange(self, n: int, dtype=torch.int64) -> torch.Tensor:
        out = self.empty(n, dtype=dtype)
        out.copy_(torch.arange(n, dtype=dtype, device=self.device))
        return out

    def randn(self, *shape, dtype=torch.float32, generator=None) -> torch.Tensor:
        out = self.empty(*shape, dtype=dtype)
        return out.normal_(generator=generator)

    def like(self, t: torch.Tensor) -> torch.Tensor:
        """A heap copy of an ordinary tensor."""
        return self.empty(t.shape, dtype=t.dtype).copy_(t)

    # ---------------------------------------------------------------- queries
    def is_on_heap(self, t: torch.Tensor) -> bool:
        """True when every byte ``t`` can address lies in this rank's heap."""
        if not isinstance(t, torch.Tensor) or t.device != self.device:
            return False
        if t.numel() == 0:
            return self.base <= t.data_ptr() < self.base + self.size
        lo = t.data_ptr()
        return self.base <= lo and lo + span_bytes(t) <= self.base + self.size

    def peer_view(self, t: torch.Tensor, rank: int) -> torch.Tensor:
        """``rank``'s copy of the heap tensor ``t``, as mapped in this process (host-side access,
        e.g. ``torch`` copies between heaps; order it against kernels with barriers)."""
        self.check_on_heap("peer_view: t", t)
        if not 0 <= rank < self.world_size:
            raise ValueError(f"peer_view: rank {rank} is not in [0, {self.world_size})")
        peer = self._peers[rank]
        if peer is None:
            raise RuntimeError("peer_view: the heap was closed")
        off = self.offset_of(t)
        raw = peer[off:off + span_bytes(t)]
        return raw.view(t.dtype).as_strided(t.shape, t.stride())

    def copy_to_peer(self, t: torch.Tensor, rank: int, src: torch.Tensor | None = None) -> None:
        """Copy the 2-D heap view ``t`` (unit column stride) into the same place of ``rank``'s heap,
        queued on the current stream: on the GPU one copy-engine transfer (no SM), on the CPU a torch
        copy. ``src``: copy this tensor of ``t``'s shape and dtype (unit column stride, any memory of
        this device) there instead of ``t``'s own data. Ordered like a kernel on that stream; a peer
        sees the rows once a barrier or flag after the copy in stream order says so."""
        self.check_on_heap("copy_to_peer: t", t)
        src = t if src is None else src
        for name, x in (("t", t), ("src", src)):
            if x.dim() != 2 or (x.stride(1) != 1 and x.shape[1] > 1):
                raise ValueError(f"copy_to_peer: {name} must be 2-D with unit column stride, got shape "
                                 f"{tuple(x.shape)} strides {x.stride()}")
        if src.shape != t.shape or src.dtype != t.dtype or src.device != t.device:
            raise ValueError(f"copy_to_peer: src ({tuple(src.shape)}, {src.dtype}, {src.device}) must match t "
                             f"({tuple(t.shape)}, {t.dtype}, {t.device})")
        if not 0 <= rank < self.world_size:
            raise ValueError(f"copy_to_peer: rank {rank} is not in [0, {self.world_size})")
        if t.numel() == 0:
            return
        if self.device.type != "cuda":
            self.peer_view(t, rank).copy_(src)
            return
        from . import dma

        peer = self._peers[rank]
        if peer is None:
            raise RuntimeError("copy_to_peer: the heap was closed")
        es = t.element_size()
        dma.copy_rows(peer.data_ptr() + (t.data_ptr() - self.base), t.stride(0) * es, src.data_ptr(),
                      src.stride(0) * es, t.shape[1] * es, t.shape[0], self.device)

    def offset_of(self, t: torch.Tensor) -> int:
        return t.data_ptr() - self.base

    def check_on_heap(self, name: str, t: torch.Tensor) -> None:
        if not self.is_on_heap(t):
            where = f"on {t.device}" if isinstance(t, torch.Tensor) else f"a {type(t).__name__}"
            raise ValueError(
                f"{name} must be a tensor on the symmetric heap of rank {self.rank} "
                f"(allocate it with tilefuse.empty/zeros/...), but it is {where} outside the heap"
            )

    def check_symmetric(self, name: str, *tensors: torch.Tensor, signature=None) -> None:
        """Collective: every rank's ``tensors`` must sit at the same heap offsets with the same shapes
        and strides, and every rank must pass an equal ``signature`` (e.g. the call's shapes)."""
        for i, t in enumerate(tensors):
            self.check_on_heap(f"{name}: buffer {i}", t)
        mine = {"offsets": [self.offset_of(t) for t in tensors],
                "layout": [(tuple(t.shape), tuple(t.stride()), str(t.dtype)) for t in tensors],
                "signature": signature}
        everyone = hostsync.all_gather_object(mine, self.group, what=f"{name}: heap offsets check")
        for r, theirs in enumerate(everyone):
            if theirs["signature"] != mine["signature"] or theirs["layout"] != mine["layout"]:
                raise ValueError(
                    f"{name}: ranks disagree on the call: rank {self.rank} has {mine['signature']} with "
                    f"buffers {mine['layout']}, rank {r} has {theirs['signature']} with {theirs['layout']}. "
                    "Every rank must make the same call with the same shapes."
                )
            if theirs["offsets"] != mine["offsets"]:
                raise RuntimeError(
                    f"{name}: heap allocations diverged between ranks: rank {self.rank} has offsets "
                    f"{mine['offsets']}, rank {r} has {theirs['offsets']}. Every rank must allocate heap "
                    "tensors in the same order and free them alike."
                )

    @property
    def bytes_free(self) -> int:
        return self._allocator.bytes_free

    @property
    def bytes_used(self) -> int:
        return self._allocator.bytes_used

    def __repr__(self) -> str:
        return (
            f"SymmetricHeap(rank={self.rank}/{self.world_size}, backend={self.backend}, "
            f"size={self.size}, used={self.bytes_used})"
        )
