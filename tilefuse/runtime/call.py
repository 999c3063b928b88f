"""The host part of a collective call (:class:`CollectiveCall`), and the thread's active group: the
current call's, or the one :func:`using` names, else the default group.
"""

from __future__ import annotations

import contextlib
import threading

import torch

from . import primitives as P
from .errors import PoisonedError, WaitTimeoutError
from .group import REGISTRY, Group, check_current_device

try:
    from torch._C import _cuda_getCurrentRawStream as raw_stream  # raw_stream(device index) -> cudaStream_t
except ImportError:  # a CPU-only torch
    def raw_stream(index: int) -> int:
        return torch.cuda.current_stream(index).cuda_stream


_STREAMS: dict = {}  # (device index, raw stream) -> its torch.cuda.Stream


def current_stream(index: int) -> torch.cuda.Stream:
    """The current stream of device ``index``: one ``torch.cuda.Stream`` object per raw stream, made once (a
    new object costs microseconds; one for the same raw stream names the same stream)."""
    key = (index, raw_stream(index))
    stream = _STREAMS.get(key)
    if stream is None:
        if len(_STREAMS) >= 256:  # streams made and dropped without end: stay bounded
            _STREAMS.clear()
        stream = _STREAMS[key] = torch.cuda.current_stream(index)
    return stream


class _Local(threading.local):
    call = None  # the CollectiveCall this thread is inside
    group = None  # this thread's active group (None: the default group)


_TLS = _Local()


def active() -> Group:
    """This thread's active group: the current call's, or the one :func:`using` names, else the default."""
    g = _TLS.group or REGISTRY.default
    if g is None:
        raise RuntimeError("tilefuse is not initialised on this rank: call tilefuse.init() first")
    return g


def group_of(group) -> Group:
    """The group state of ``group`` (None: the active group's)."""
    return active() if group is None else REGISTRY.get(group)


@contextlib.contextmanager
def using(target):
    """Make ``target`` (a group state, or a process group) this thread's active group inside the block."""
    g = target if isinstance(target, Group) else REGISTRY.get(target)
    prev, _TLS.group = _TLS.group, g
    try:
        yield g
    finally:
        _TLS.group = prev


def call_state(group, what: str = "tilefuse") -> Group | None:
    """The group state for :class:`CollectiveCall` (None: nothing named), or raises where not initialised."""
    if group is None and _TLS.group is None and REGISTRY.default is not None:
        return None  # the call takes the default group
    g = REGISTRY.get(group, what)
    return g if group is not None or _TLS.group is not None else None


def in_call() -> bool:
    """Whether this thread is inside a collective call."""
    return _TLS.call is not None


def current_call() -> CollectiveCall:
    """The collective call this thread is inside (raises outside one)."""
    call = _TLS.call
    if call is None:
        raise RuntimeError("no tilefuse collective call is active in this thread")
    return call


class CollectiveCall:
    """Host part of one collective op call (a context manager; nested use in one thread is one call).
    One call at a time per process; a poisoned group raises before anything is launched; an earlier
    call's recorded error is raised after this call's launches (the ranks' calls stay paired); a call
    whose checks fail still launches the begin (failed): the peers raise :class:`PeerCallError`.
    ``st``: the call's group state (:func:`call_state`; None: the default group's)."""

    __slots__ = ("op", "begun", "mirrored", "pending", "outer", "capturing", "stream", "st", "group", "prev")

    def __init__(self, op: str, st: Group | None = None):
        self.op, self.st = op, st
        self.begun = self.mirrored = self.capturing = False
        self.pending = self.outer = self.stream = self.group = None  # after __enter__: group, capturing, stream

    def __enter__(self):
        outer = _TLS.call
        if outer is not None:
            self.outer = outer
            return outer
        st = self.st or REGISTRY.default or active()  # (active() raises when not initialised)
        REGISTRY.lock.acquire()
        if self.st is not None:
            self.prev, _TLS.group = _TLS.group, st
        try:
            if st.on_gpu:
                if torch.cuda.current_device() != st.dev_index:
                    self._wrong_device(st)
                self.capturing = torch.cuda.is_current_stream_capturing()
                self.stream = raw_stream(st.dev_index)
            if st.poisoned:
                st.raise_if_poisoned()
            if st.peers and not self.capturing:
                st.check_peers(self.op)
            if st.status_set():
                err = st.collect(False)
                if isinstance(err, (WaitTimeoutError, PoisonedError)):
                    raise err
                self.pending = err
            if st.on_gpu and not self.capturing and self.stream != st.order.raw:
                # Calls on different streams run in the order the host made them.
                order, stream = st.order, current_stream(st.dev_index)
                if order.stream is not None and stream != order.stream:
                    stream.wait_stream(order.stream)  # everything queued there so far, the last call included
                order.stream, order.raw = stream, self.stream
        except BaseException:
            if self.st is not None:
                _TLS.group = self.prev
            REGISTRY.lock.release()
            raise
        self.group = st
        _TLS.call = self
        return self

    def _wrong_device(self, st: Group) -> None:
        if not st.poisoned:  # the peers are making this call: count it on every rank, as failed
            with torch.cuda.device(st.heap.device):
                st.launch_begin(int(P.SIG_FAILED))
                st.note_end(torch.cuda.is_current_stream_capturing())
        check_current_device(self.op, st.heap.device)  # raises: another device than the heap's is current

    def begin(self, key: tuple, outputs: tuple = ()) -> None:
        """Launch the begin kernel for the call with signature ``key``; ``outputs`` are NaN if it aborts."""
        if not self.begun:
            g = self.group
            g.launch_begin(g.signature(key), outputs)
            self.begun = True

    def enter_args(self, key: tuple, outputs: tuple = ()) -> tuple:
        """The arguments of a kernel that begins the call itself (``P.enter``); then :meth:`entered`."""
        g = self.group
        status = g.status_host if g.status_host is not None else g.status_scratch
        return g.begin_args(g.signature(key), outputs) + (status,)

    def entered(self, ends: bool = True) -> None:
        """The kernel of :meth:`enter_args` began the call; ``ends``: it or a later kernel ends it and writes the
        status words (a call of several kernels: ``False`` after its first)."""
        self.begun = True
        self.mirrored = self.mirrored or ends

    def __exit__(self, exc_type, exc, tb):
        if self.outer is not None:
            return False
        _TLS.call = None
        try:
            st = self.group
            if exc is not None and not self.begun and not isinstance(exc, PoisonedError):
                # The peers are making this call too: count it on every rank, as failed.
                st.launch_begin(int(P.SIG_FAILED))
                self.begun = True
                if st.sync_errors:
                    st.collect(True)  # this rank's own failure record is not an error to raise
            if self.begun:
                st.note_end(self.capturing, self.mirrored)
            if exc is not None:
                return False
            if st.sync_errors and not self.capturing and (st.on_gpu or st.status_set()):
                err = st.collect(True)
                if err is not None:
                    raise err
            if self.pending is not None:
                raise self.pending
            return False
        finally:
            if self.st is not None:
                _TLS.group = self.prev
            REGISTRY.lock.release()


def synchronize(group=None) -> None:
    """Wait for this rank's device work, then raise any error recorded for ``group``'s calls."""
    g = group_of(group)
    g.raise_if_poisoned()
    err = g.collect(True)
    if err is not None:
        raise err


def device_barrier(group=None) -> None:
    """Stream-ordered barrier over ``group`` (a collective call, or part of the op's call it is in): work
    queued before it on any rank is complete and visible to work queued after it on all ranks."""
    if _TLS.call is not None:  # inside an op's call: a call of its own, same host part
        g = _TLS.call.group
        if g.heap.world_size > 1:
            g.launch_begin(g.signature(("device_barrier",)))
        return
    g = group_of(group)
    if g.heap.world_size == 1:
        return
    with CollectiveCall("tilefuse.device_barrier", g) as call:
        call.begin(("device_barrier",))
