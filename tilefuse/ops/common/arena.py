"""The per-group workspace arena: heap buffers made once per call shape, collectively, and reused (an
LRU cache per heap), and what a variant prepares per call signature (:func:`prepared`)."""

from __future__ import annotations

import gc
from collections import OrderedDict

import torch

from ...runtime import _env, control_block, get_heap, hostsync, is_initialized
from ...runtime import call as _call
from ...runtime import world as _world
from ...runtime.world import on_reset, on_shutdown
from .checks import check_out_tensor


class Workspace:
    """Heap buffers of one (op, variant, shape) key, read as attributes."""

    def __init__(self, buffers: dict):
        self.buffers = buffers
        self.nbytes = sum(b.numel() * b.element_size() for b in buffers.values())
        self.captured = False  # used inside a CUDA graph capture: kept until shutdown

    def __getattr__(self, name):
        try:
            return self.__dict__["buffers"][name]
        except KeyError:
            raise AttributeError(name) from None


_WORKSPACES: OrderedDict = OrderedDict()  # least recently used first
_KEPT_FOR_GRAPHS: list = []  # (heap uid, workspace) of captured graphs, dropped from the cache


# The fraction of a heap that cached workspaces may hold; the rest stays free for the caller's own
# heap tensors (``out=`` buffers). Set it alike on every rank.
WORKSPACE_FRACTION = 0.75


def workspace_budget(heap) -> int:
    """Bytes of ``heap`` its cached workspaces may hold; beyond it the least recently used go."""
    return int(heap.size * WORKSPACE_FRACTION)


def workspaces(heap=None) -> list:
    """The cached :class:`Workspace` objects (``heap``: on that heap only), least recently used first."""
    return [ws for key, ws in _WORKSPACES.items() if heap is None or key[0] == heap.uid]


def workspace_bytes(heap=None) -> int:
    """Heap bytes held by cached workspaces (``heap``: on that heap only)."""
    return sum(ws.nbytes for ws in workspaces(heap))


def workspace_keys() -> list:
    """The keys of the cached workspaces, least recently used first."""
    return [key[1:] for key in _WORKSPACES]


def _capturing(heap) -> bool:
    if heap.device.type != "cuda":
        return False
    if _call.in_call():
        return _call.current_call().capturing  # checked as the call began, on the stream it launches on
    return torch.cuda.is_current_stream_capturing()


def workspace(heap, key: tuple, make, nbytes: int) -> Workspace:
    """The cached workspace for ``key``; ``make(heap) -> dict`` allocates it on first use (least
    recently used ones beyond :func:`workspace_budget` go first). Collective on first use: every rank
    must pass the same key and get the same heap offsets (where a reference cycle on some rank makes them
    differ, every rank collects and retries). Inside a CUDA graph capture a missing one is an error.
    """
    full_key = (heap.uid,) + key  # not id(heap): a later heap may reuse the address of a closed one
    if _MAKING:
        _MAKING[-1].append(full_key)
    ws = _WORKSPACES.get(full_key)
    if ws is not None:
        _WORKSPACES.move_to_end(full_key)
        if not ws.captured and _capturing(heap):
            ws.captured = True
        return ws
    if _capturing(heap):
        raise RuntimeError(f"{key[0]}: a CUDA graph capture needs this call's heap workspace {key[1:]}, which does "
                           "not exist yet (heap buffers are created collectively, outside capture): make one eager "
                           "call with the same shapes, dtype, variant and config before capturing")
    _evict(heap, nbytes)
    for retry in (True, False):
        buffers = _allocate(heap, key, make)
        failure = _check_offsets(heap, key, buffers)
        if failure is None:
            break
        buffers.clear()  # the blocks return now, on every rank alike
        gc.collect()
        # Blocks held only by reference cycles are freed at different moments on different ranks; every
        # rank compared the same gathered offsets and got this error: all have collected, all retry in step.
        if not (retry and failure[0] is RuntimeError and _DIVERGED in failure[1]):
            raise failure[0](failure[1])
    _world.device_barrier()  # no peer still reads or writes the memory these buffers reuse
    for name, buf in buffers.items():
        if name.startswith("flags"):
            buf.zero_()
    if _env.debug_poison():  # a tile that a variant forgets to write shows as NaN, not as zero
        for buf in buffers.values():
            if buf.dtype.is_floating_point:
                buf.fill_(float("nan"))
    ws = Workspace(buffers)
    _WORKSPACES[full_key] = ws
    return ws


_PREPARED: dict = {}  # (heap uid, key) -> (what a variant prepared, the workspace keys it holds)
_MAX_PREPARED = 4096
_MAKING: list = []  # the workspace keys each running `prepared` make() fetched (innermost last)


def prepared(heap, key: tuple, make):
    """``make()`` once per ``key`` on ``heap``'s group; each call marks the workspaces it fetched used."""
    full = (heap.uid, key)
    got = _PREPARED.get(full)
    if got is None:
        _MAKING.append([])
        try:
            value = make()
        finally:
            held = tuple(_MAKING.pop())
        if len(_PREPARED) >= _MAX_PREPARED:  # ever-new signatures (changing token counts): stay bounded
            _PREPARED.clear()
        _PREPARED[full] = got = (value, held)
        return value
    value, held = got
    capturing = _capturing(heap)
    for ws_key in held:
        _WORKSPACES.move_to_end(ws_key)
        if capturing:
            _WORKSPACES[ws_key].captured = True
    return value


def _drop_prepared(uid: int) -> None:
    for full in [k for k in _PREPARED if k[0] == uid]:
        del _PREPARED[full]


def _forget(uid: int) -> list:
    """Drop the heap ``uid``'s workspaces, prepared calls and verified outs; returns the workspaces."""
    _drop_prepared(uid)
    _VERIFIED_OUT.difference_update([k for k in _VERIFIED_OUT if k[0] == uid])
    return [_WORKSPACES.pop(key) for key in [k for k in _WORKSPACES if k[0] == uid]]


def _allocate(heap, key: tuple, make) -> dict:
    """``make(heap)``; when the heap is full, once more after a cyclic collection on this rank."""
    try:
        return make(heap)
    except MemoryError:
        pass  # the exception (and the frames keeping a partial allocation) goes before collecting
    gc.collect()
    try:
        return make(heap)
    except MemoryError as err:
        raise type(err)(f"{err}\n(tilefuse keeps one workspace per call shape: tilefuse.clear_workspaces() "
                        "releases them all, and at most WORKSPACE_FRACTION of the heap is kept)") from err


_DIVERGED = "heap allocations diverged"  # SymmetricHeap.check_symmetric's error for offsets that differ


def _check_offsets(heap, key: tuple, buffers: dict) -> tuple | None:
    """Collective: the same call and heap offsets on every rank; the error as (type, message) or None
    (not the exception: its frames would keep the buffers alive on the ranks that raised only)."""
    try:
        heap.check_symmetric(f"workspace {key[0]}", *buffers.values(), signature=key)
    except (ValueError, RuntimeError) as err:
        return type(err), str(err)
    return None


def _evict(heap, nbytes: int) -> None:
    budget = workspace_budget(heap)
    for full_key in [k for k in _WORKSPACES if k[0] == heap.uid]:  # least recently used first
        if workspace_bytes(heap) + nbytes <= budget:
            return
        ws = _WORKSPACES.pop(full_key)
        _drop_prepared(heap.uid)
        if ws.captured:
            _KEPT_FOR_GRAPHS.append((heap.uid, ws))


def clear_workspaces(group=None) -> None:
    """Release every cached workspace of ``group``'s heap (default: the default group's; collective).
    Waits for this rank's device work and for every rank of the group, so no queued kernel still uses
    them. CUDA graphs captured before abort when replayed (reported at the next call); their buffers
    stay allocated until shutdown. Other groups' workspaces stay."""
    if group is None and not is_initialized():
        return _drop_workspaces()
    with _world.using(_world.state_for(group, "tilefuse.clear_workspaces")) as st:
        _world.synchronize(st.group)
        hostsync.barrier(st.heap.group, what="tilefuse.clear_workspaces")
        _drop_workspaces()


def _drop_workspaces() -> None:
    """Drop the workspaces of the active group's heap (:func:`tilefuse.runtime.world.using`)."""
    if not is_initialized():
        _WORKSPACES.clear()
        _VERIFIED_OUT.clear()
        _PREPARED.clear()
        return
    uid = get_heap().uid
    dropped = _forget(uid)
    if any(ws.captured for ws in dropped):
        _world.active().bump_generation()
    _KEPT_FOR_GRAPHS.extend((uid, ws) for ws in dropped if ws.captured)
    dropped = None
    gc.collect()  # blocks held by reference cycles come back now, on every rank alike


_RETIRED: list = []  # (control block, workspaces) of closed heaps that captured CUDA graphs still name


def _drop_all() -> None:
    """At shutdown, for the active group's heap (the one that closes): drop its workspaces."""
    if not is_initialized():
        return
    heap = get_heap()
    captured = [ws for ws in _forget(heap.uid) if ws.captured]
    captured += [ws for uid, ws in _KEPT_FOR_GRAPHS if uid == heap.uid]
    if captured:
        # A graph replayed after shutdown reads the control block (its generation is now invalid, so
        # the call aborts before touching anything else): keep that memory until the process ends.
        heap.mark_internal(*(b for ws in captured for b in ws.buffers.values()))
        _RETIRED.append((control_block(), captured))
    _KEPT_FOR_GRAPHS[:] = [(uid, ws) for uid, ws in _KEPT_FOR_GRAPHS if uid != heap.uid]


on_shutdown(_drop_all)  # tilefuse.shutdown() gives every workspace back with the heap
on_reset(_drop_workspaces)


_VERIFIED_OUT: set = set()


def check_out(op: str, heap, out, shape: tuple, dtype, **inputs) -> bool:
    """Check ``out``; True when the kernels can write it in place: a contiguous heap tensor at the same
    offset on every rank (checked collectively once). Any other tensor receives a copy."""
    check_out_tensor(op, out, shape, dtype, heap.device, **inputs)
    if not (heap.is_on_heap(out) and out.is_contiguous()):
        return False
    key = (heap.uid, heap.offset_of(out), tuple(out.shape), tuple(out.stride()))
    if key not in _VERIFIED_OUT:
        heap.check_symmetric(f"{op}: out", out)
        if len(_VERIFIED_OUT) > 4096:
            _VERIFIED_OUT.clear()
        _VERIFIED_OUT.add(key)
    return True
