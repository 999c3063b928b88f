"""The runtime's public functions: ``init``, ``reset``, ``shutdown``, and what an op asks of its group.

Each process group gets its own :class:`Group`; the first initialised is the default (``group=None``).
"""

from __future__ import annotations

import atexit
import sys
import warnings

import torch
import torch.distributed as dist

from . import _env, hostsync
from . import primitives as P
from .call import active, device_barrier, group_of, synchronize, using
from .errors import PeerExitedError, PoisonedError, WaitTimeoutError
from .errors import describe_group as _describe_group
from .group import REGISTRY, Group
from .heap import SymmetricHeap, resolve_heap_size


def init(heap_size: int | None = None, group=None) -> SymmetricHeap:
    """Create this rank's symmetric heap and map every peer's (collective, on the ranks of ``group``,
    an initialised torch.distributed process group, default the world; the first is the default group).
    ``heap_size`` bytes, else ``TILEFUSE_HEAP_SIZE`` (e.g. ``2G``), else 4 GiB on a GPU, 256 MiB on the
    CPU. Backend ``cuda`` on the current device when a GPU is usable, else ``cpu`` (Triton's
    interpreter). A second call for the same group returns the same heap (a different size raises)."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("tilefuse.init needs an initialised torch.distributed process group: call torch."
                           "distributed.init_process_group(...) first (gloo for the cpu backend and for "
                           "several processes sharing one GPU; nccl for one process per GPU)")
    group = group if group is not None else dist.group.WORLD
    if group is dist.GroupMember.NON_GROUP_MEMBER:  # what new_group gives a rank outside the group
        raise ValueError(f"tilefuse.init: global rank {dist.get_rank()} is not a member of this process group; "
                         "only its members call init for it")
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"tilefuse.init: group must be a torch.distributed ProcessGroup or None, got "
                        f"{type(group).__name__}")
    if dist.get_rank(group) < 0:
        raise ValueError(f"tilefuse.init: global rank {dist.get_rank()} is not a member of process group "
                         f"{_describe_group(group)}; only its members call init for it")
    backend = _env.requested_backend()
    size = resolve_heap_size(heap_size, backend)
    with REGISTRY.lock:
        g = REGISTRY.find(group)
        if g is not None:
            if heap_size is not None and size != g.heap.size:
                raise RuntimeError(f"tilefuse.init: the heap of process group {g.name!r} already exists with "
                                   f"{g.heap.size} bytes, asked {size}")
            return g.heap
        g = Group.open(size, group, backend, REGISTRY.order)
        REGISTRY.add(g)
        if not _EXIT_HOOK:
            # Registered after torch.distributed's own: exit handlers run last-registered first, so
            # the heaps close while the process group and CUDA still work.
            atexit.register(_at_exit)
            _EXIT_HOOK.append(_at_exit)
        if g.heap.world_size > 1:
            # A GPU pair whose link does not carry remote atomics fails here, not inside the first op.
            try:
                with using(g):
                    device_barrier()
                    synchronize()
            except (WaitTimeoutError, PoisonedError) as err:
                REGISTRY.forget(g)
                g.heap.close()
                raise RuntimeError(f"tilefuse.init: the first device barrier did not complete: remote atomics "
                                   "between this rank's GPU and a peer's did not arrive (no peer-to-peer atomics "
                                   f"over this link?), a peer did not call init, or the wait bound "
                                   f"({g.wait_bound_s:g} s, TILEFUSE_WAIT_TIMEOUT) is too short\n{err}") from err
        return g.heap


state_for = REGISTRY.get  # (group, what="tilefuse") -> the Group serving ``group`` (None: the default)


def groups() -> list:
    """The process groups tilefuse is initialised on in this process, the default one first."""
    return [g.group for g in REGISTRY.by_group.values()]


def is_initialized(group=None) -> bool:
    """Whether tilefuse is initialised on this rank (``group``: for that process group)."""
    return REGISTRY.find(group) is not None


def get_heap(group=None) -> SymmetricHeap:
    """This rank's symmetric heap for ``group`` (default: the active group's)."""
    return group_of(group).heap


def control_block() -> torch.Tensor:
    """The int64 control block on this rank's heap (the active group's)."""
    return active().ctl


def set_wait_timeout(seconds: float, group=None) -> float:
    """Set the device wait bound (seconds, this rank) of ``group``'s calls; returns the previous one."""
    seconds = _env.check_seconds("set_wait_timeout: seconds", seconds)
    g = group_of(group)
    old, g.wait_bound_s = g.wait_bound_s, seconds  # the host's copy: no device read
    g.ctl[int(P.CTL_BOUND_NS)] = int(seconds * 1e9)
    return old


def set_sync_errors(on: bool, group=None) -> bool:
    """Raise device-recorded errors at the failing call itself (a device sync per call, as
    ``TILEFUSE_SYNC_ERRORS=1``; always on the CPU) or, off, at the next call. Returns the previous."""
    g = group_of(group)
    old, g.sync_errors = g.sync_errors, bool(on) or g.heap.device.type != "cuda"
    return old


def check_peers(group=None) -> None:
    """Raise :class:`PeerExitedError` if a peer process of ``group`` has exited, or an earlier poisoning's
    error: the check every eager op call makes first, for a CUDA graph replay (before ``replay()``)."""
    g = group_of(group)
    g.raise_if_poisoned()
    g.check_peers("tilefuse.check_peers")


def barrier(group=None) -> None:
    """Host barrier over ``group``: this rank's device work is finished and every rank got here."""
    g = group_of(group)
    synchronize(g.group)
    hostsync.barrier(g.heap.group, what="tilefuse.barrier")


def on_shutdown(hook) -> None:
    """Run ``hook()`` at :func:`shutdown` before each group's heap closes, with that group active."""
    if hook not in REGISTRY.shutdown_hooks:
        REGISTRY.shutdown_hooks.append(hook)


def on_reset(hook) -> None:
    """Run ``hook()`` at :func:`reset`, while every rank's device is idle, with the reset group active."""
    if hook not in REGISTRY.reset_hooks:
        REGISTRY.reset_hooks.append(hook)


RESET_POISON_AFTER_S = 2.0  # how long a reset waits for every rank before it poisons them


def reset(group=None) -> None:
    """Collective recovery after an error on ``group`` (every rank calls it): its calls then pair from
    scratch. A rendezvous (bounded by ``TILEFUSE_HOST_TIMEOUT``: :class:`HostTimeoutError` naming the
    ranks that did not come; after ``RESET_POISON_AFTER_S`` every control block is poisoned, so calls
    still waiting end), then the workspaces go, the control block is re-zeroed, and a barrier.
    :class:`PeerExitedError` at once after a peer process exited."""
    g = group_of(group)
    heap = g.heap
    with REGISTRY.lock, using(g):
        if g.poison_error is PeerExitedError:
            g.raise_if_poisoned()
        g.check_peers("tilefuse.reset")
        late = ((min(RESET_POISON_AFTER_S, 0.5 * _env.host_timeout()), lambda: g.poison_all(-(heap.rank + 1)))
                if heap.world_size > 1 else None)
        if heap.device.type == "cuda":
            g.wait_device("tilefuse.reset")
        hostsync.reset(heap.group, what="tilefuse.reset", late=late)
        for hook in REGISTRY.reset_hooks:
            hook()
        g.ctl.zero_()
        g.ctl[int(P.CTL_BOUND_NS)] = int(g.wait_bound_s * 1e9)
        g.bump_generation()
        if g.status_host is not None:
            g.status_host.zero_()
        g.order.stream = g.order.raw = None  # the device is idle: the next call waits on nothing
        g.poisoned, g.poison_error = None, PoisonedError
        if heap.device.type == "cuda":
            torch.cuda.synchronize(heap.device)
        try:
            # No rank begins a call before every rank has zeroed its block (a begin writes into peers').
            hostsync.barrier(heap.group, what="tilefuse.reset: exit")
        except BaseException:
            g.poisoned = "tilefuse.reset did not complete on every rank: call tilefuse.reset() on every rank again"
            raise


def shutdown(group=None) -> None:
    """Drop the ops' workspaces and the peer mappings (before the process group is destroyed): every
    group's, in reverse :func:`init` order, or ``group``'s (the default's only when it is the last)."""
    if group is None:
        targets = list(reversed(REGISTRY.by_group.values()))
    else:
        g = REGISTRY.find(group)
        if g is None:
            return
        if g is REGISTRY.default and len(REGISTRY.by_group) > 1:
            others = ", ".join(_describe_group(s.group) for s in REGISTRY.by_group.values() if s is not g)
            raise ValueError(f"tilefuse.shutdown: {_describe_group(group)} is the default group; shut the "
                             f"other groups down first ({others}), or call tilefuse.shutdown() for all")
        targets = [g]
    failure = None
    for g in targets:
        try:
            _shutdown_one(g)
        except BaseException as err:  # the other groups still close (their peers are closing them)
            failure = failure or err
    if failure is not None:
        raise failure


_EXIT_HOOK: list = []
EXIT_HOST_TIMEOUT_S = 10.0


def _at_exit() -> None:
    """:func:`shutdown` at exit (bounded by ``EXIT_HOST_TIMEOUT_S``); never raises: a line on stderr."""
    if not REGISTRY.by_group:
        return
    try:
        hostsync.cap_timeouts(EXIT_HOST_TIMEOUT_S)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # heap tensors the program still holds: it is ending
            shutdown()
    except BaseException as err:  # noqa: BLE001 - exiting: report, never raise
        print(f"tilefuse: closing the heaps at exit: {type(err).__name__}: {err}", file=sys.stderr)
    finally:
        hostsync.cap_timeouts(None)


def _shutdown_one(g: Group) -> None:
    stuck = False  # this rank's device work will not finish (a peer exited under it): do not wait for it
    try:
        with using(g):
            if g.heap.device.type == "cuda":
                try:
                    g.wait_device("tilefuse.shutdown")
                except PeerExitedError:
                    stuck = True
                    raise
            g.ctl[int(P.CTL_GEN)] = -1  # a CUDA graph replayed after this aborts before touching memory
            for hook in REGISTRY.shutdown_hooks:
                hook()
    finally:
        REGISTRY.forget(g)
        g.heap.close(wait=not stuck)
