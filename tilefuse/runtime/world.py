"""Process-wide runtime state: ``init``, the heap, barriers and wait-timeout reporting."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import _env
from .heap import SymmetricHeap, resolve_heap_size
from .primitives import CTL_BOUND, CTL_WORDS, barrier_kernel

# Polls before a wait gives up: about 15-30 s on either backend (an interpreted poll costs ~150 us).
DEFAULT_WAIT_POLLS = {"cuda": 1 << 25, "cpu": 100_000}


class WaitTimeoutError(RuntimeError):
    """A device-side wait ran out of its bound: a peer never released the flag it waited for."""


@dataclass
class _State:
    heap: SymmetricHeap
    ctl: torch.Tensor  # int64[CTL_WORDS] control block for bounded waits
    barrier_flags: torch.Tensor  # int32[world] on the heap
    barrier_epoch: int = 0
    status_host: torch.Tensor | None = None  # pinned copy of ctl[CTL_STATUS] (GPU), read without a sync


_STATE: _State | None = None


def _device_for(backend: str, group) -> torch.device:
    """The heap's device: the group's bound device (``init_process_group(device_id=...)``) if any,
    else the current CUDA device (``torch.cuda.set_device``, as NCCL expects), else the CPU."""
    if backend == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("TILEFUSE_BACKEND=cuda but torch sees no CUDA device")
        bound = getattr(group, "bound_device_id", None)
        if isinstance(bound, torch.device) and bound.type == "cuda" and bound.index is not None:
            torch.cuda.set_device(bound)
            return bound
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def check_current_device(what: str, device: torch.device) -> None:
    """Kernels launch on the *current* CUDA device: an op called while another device is current
    (a new thread starts on device 0, say) would run on the wrong GPU. Raise instead."""
    if device.type == "cuda" and torch.cuda.current_device() != device.index:
        raise RuntimeError(
            f"{what}: this rank's heap is on {device} but the current CUDA device is "
            f"cuda:{torch.cuda.current_device()}; call torch.cuda.set_device({device.index}) in this thread "
            f"(or run under `with torch.cuda.device({device.index}):`)"
        )


def init(heap_size: int | None = None, group=None) -> SymmetricHeap:
    """Create this rank's symmetric heap and map every peer's (collective; idempotent).

    Needs an initialised ``torch.distributed`` process group (``group``, default the world). The
    heap size is ``heap_size`` bytes, else ``TILEFUSE_HEAP_SIZE`` (e.g. ``2G``), else 4 GiB on a
    GPU and 256 MiB on the CPU. Backend ``cuda`` when a GPU is usable (the current device; several
    processes may share one GPU), else ``cpu``: kernels then run in Triton's interpreter, which
    needs ``TRITON_INTERPRET=1`` before kernel modules are imported; ``import tilefuse`` sets it
    when no GPU is present, so import tilefuse before your own Triton kernels (or set it yourself).
    A second call returns the same heap (and rejects a different group or size).
    """
    global _STATE
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "tilefuse.init needs an initialised torch.distributed process group: call "
            "torch.distributed.init_process_group(...) first (gloo works for the cpu backend and for "
            "several processes sharing one GPU; nccl for one process per GPU)"
        )
    group = group if group is not None else dist.group.WORLD
    backend = _env.requested_backend()
    size = resolve_heap_size(heap_size, backend)
    if _STATE is not None:
        heap = _STATE.heap
        if group is not heap.group:
            raise RuntimeError("tilefuse.init was already called with another process group")
        if heap_size is not None and size != heap.size:
            raise RuntimeError(f"tilefuse.init: heap already exists with {heap.size} bytes, asked {size}")
        return heap
    if backend == "cpu" and not _env.interpreting():
        raise RuntimeError(
            "the cpu backend runs kernels in Triton's interpreter: set TRITON_INTERPRET=1 before "
            "importing tilefuse or any Triton kernel"
        )
    heap = SymmetricHeap(size, group, backend, _device_for(backend, group))
    polls = int(os.environ.get("TILEFUSE_WAIT_POLLS", DEFAULT_WAIT_POLLS[backend]))
    ctl = torch.zeros(int(CTL_WORDS), dtype=torch.int64, device=heap.device)
    ctl[int(CTL_BOUND)] = polls
    flags = heap.zeros(heap.world_size, dtype=torch.int32)
    status_host = torch.zeros(1, dtype=torch.int64, pin_memory=True) if heap.device.type == "cuda" else None
    _STATE = _State(heap=heap, ctl=ctl, barrier_flags=flags, status_host=status_host)
    if heap.device.type == "cuda":
        # The flags' zeroing must land before any peer can signal into them: a host-only exchange
        # (gloo) below does not wait for this device's queue.
        torch.cuda.synchronize(heap.device)
    heap.check_symmetric("tilefuse.init", flags)
    if heap.world_size > 1:
        # One device barrier now: its remote atomic releases and acquires are what every op relies
        # on, so a GPU pair whose link does not carry them fails here, not inside the first op.
        try:
            device_barrier()
            synchronize()
        except WaitTimeoutError as err:
            raise RuntimeError(
                "tilefuse.init: the first device barrier did not complete: remote atomics between this "
                "rank's GPU and a peer's did not arrive (no peer-to-peer atomics over this link?)\n" + str(err)
            ) from err
    return heap


def is_initialized() -> bool:
    return _STATE is not None


def _state() -> _State:
    if _STATE is None:
        raise RuntimeError("tilefuse is not initialised on this rank: call tilefuse.init() first")
    return _STATE


def get_heap() -> SymmetricHeap:
    return _state().heap


def control_block() -> torch.Tensor:
    """The int64 control block that bounded waits report into (pass it to kernels as ``ctl_ptr``)."""
    return _state().ctl


def set_wait_bound(polls: int) -> int:
    """Set the number of polls after which device waits give up; returns the previous bound."""
    st = _state()
    old = int(st.ctl[int(CTL_BOUND)].item())
    st.ctl[int(CTL_BOUND)] = int(polls)
    return old


def check_waits() -> None:
    """Raise :class:`WaitTimeoutError` if a device wait gave up since the last check (syncs)."""
    st = _state()
    rec = dict(zip(("status", "rank", "src", "addr", "target", "seen", "polls"), st.ctl.tolist()))
    if rec["status"] == 0:
        return
    st.ctl[:int(CTL_BOUND)] = 0
    if st.status_host is not None:
        st.status_host.zero_()
    heap = st.heap
    offset = rec["addr"] - heap.base
    where = f"heap offset {offset}" if 0 <= offset < heap.size else f"address {rec['addr']:#x}"
    src = f"rank {rec['src']}" if rec["src"] >= 0 else "a peer"
    raise WaitTimeoutError(
        f"rank {rec['rank']} gave up after {rec['polls']} polls waiting for the flag at {where} "
        f"to reach {rec['target']} (written by {src}); it still read {rec['seen']}. The writer "
        "never released it: a rank that did not make the same call, crashed, or ran a different "
        "shape/epoch. Raise the bound with TILEFUSE_WAIT_POLLS if a rank is just slow."
    )


def note_launch() -> None:
    """After an op's launches: on the CPU report a failed wait now; on a GPU queue a copy of the status
    word into pinned memory, read by :func:`poll_waits` at the next call (no sync)."""
    st = _state()
    if st.heap.device.type == "cpu":
        check_waits()
    else:
        st.status_host.copy_(st.ctl[:1], non_blocking=True)


def poll_waits() -> None:
    """Raise :class:`WaitTimeoutError` if an earlier call's wait gave up (cheap; no sync unless so)."""
    st = _state()
    if st.status_host is not None and int(st.status_host[0]) != 0:
        check_waits()


def check_not_capturing(op: str) -> None:
    """Epochs are host counters baked into each launch: a captured CUDA graph would replay stale ones."""
    st = _state()
    if st.heap.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"{op}: tilefuse ops cannot be captured in a CUDA graph (their flag epochs are host-side "
            "counters that a replay would repeat, so waits would pass on stale flags)"
        )


def synchronize() -> None:
    """Wait for this rank's device work, then report any wait that gave up."""
    st = _state()
    if st.heap.device.type == "cuda":
        torch.cuda.synchronize(st.heap.device)
    check_waits()


def barrier() -> None:
    """Host barrier: this rank's device work is finished and every rank got here."""
    st = _state()
    synchronize()
    dist.barrier(group=st.heap.group)


def device_barrier() -> None:
    """Stream-ordered barrier: a one-program kernel that returns once every rank launched one.

    Work queued before it on any rank is complete and visible to work queued after it on all ranks.
    """
    st = _state()
    heap = st.heap
    check_current_device("tilefuse.device_barrier", heap.device)
    if heap.world_size == 1:
        return
    st.barrier_epoch += 1
    barrier_kernel[(1,)](st.barrier_flags, heap.heap_bases, st.ctl, heap.rank, heap.world_size,
                         st.barrier_epoch)
    note_launch()


_SHUTDOWN_HOOKS: list = []


def on_shutdown(hook) -> None:
    """Run ``hook()`` at :func:`shutdown`, before the heap closes (the ops drop their workspaces)."""
    if hook not in _SHUTDOWN_HOOKS:
        _SHUTDOWN_HOOKS.append(hook)


def shutdown() -> None:
    """Drop the ops' workspaces and the peer mappings, after a barrier (call before the process group
    is destroyed). A later :func:`init` starts from a new heap with no workspace of the old one."""
    global _STATE
    if _STATE is None:
        return
    for hook in _SHUTDOWN_HOOKS:
        hook()
    _STATE.heap.close()
    _STATE = None
