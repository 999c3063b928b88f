"""Process-wide runtime state: ``init``, the control block, collective calls, errors and ``reset``.

The device side of the protocol (control block, pairing, flags, bounded waits, poisoning) is
described in :mod:`tilefuse.runtime.primitives`. This module is its host side:

- :class:`CollectiveCall` wraps the host part of every op call: one call at a time per process
  (a lock; calls from several threads are serialised), calls on different streams ordered with CUDA
  events, earlier errors reported, the begin kernel launched (:meth:`CollectiveCall.begin`), and a
  call whose argument checks fail still counted on every rank (it launches the begin kernel with
  the failure signature, then raises).
- Error records reach the host without a device sync on a GPU: a copy of two control words is
  queued into pinned memory after each call and read at the next one (a plain memory read through
  a numpy view; the full record is read only when one of the two words is set). An error found that way is
  raised at the end of that next call, after its own kernels were launched, so that the ranks' calls
  stay paired (its result is discarded). On the CPU backend and with ``TILEFUSE_SYNC_ERRORS=1``
  every call checks at its end and raises at the failing call itself.
- A wait that timed out poisons the runtime on every rank: every op raises :class:`PoisonedError`
  until :func:`reset` (collective) re-zeros the control block and drops the workspaces.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from . import _env, hostsync, plans
from . import primitives as P
from .heap import SymmetricHeap, resolve_heap_size

DEFAULT_WAIT_TIMEOUT_S = {"cuda": 30.0, "cpu": 60.0}
_FILL_BLOCK = 1024
_MAX_SIGNATURES = 4096


class WaitTimeoutError(RuntimeError):
    """A device-side wait ran out of its bound: a peer never released the flag it waited for."""


class PoisonedError(RuntimeError):
    """A wait timed out on some rank: every op raises until the collective :func:`tilefuse.reset`."""


class CallMismatchError(ValueError):
    """Ranks made different collective calls (op, variant, shapes, dtype or config differ)."""


class PeerCallError(RuntimeError):
    """A peer's copy of this collective call failed (its argument checks raised)."""


class StaleCallError(RuntimeError):
    """A call (typically a CUDA graph replay) used workspaces that were released since."""


@dataclass
class _State:
    heap: SymmetricHeap
    ctl: torch.Tensor  # int64 control block at heap offset 0 (layout: primitives)
    dummy: torch.Tensor  # float32[1]: the begin kernel's output argument when there is none
    status_host: torch.Tensor | None  # pinned int64[2]: POISON, ERRORS (GPU)
    sync_errors: bool
    gen: int = 1
    poisoned: str | None = None  # set once this host has seen the poison: the message to raise
    sigs: dict = field(default_factory=dict)  # signature key -> (hash, text)
    texts: dict = field(default_factory=dict)  # hash -> text, for error messages
    last_stream: object = None
    last_stream_raw: int | None = None  # its raw handle: calls on the same stream compare integers
    on_gpu: bool = False
    dev_index: int = -1
    ctl_status: torch.Tensor | None = None  # ctl[POISON:ERRORS + 1], copied into status_host after each call
    status_np: object = None  # numpy view of status_host (GPU): read without a torch call
    ctl_np: object = None  # numpy view of the control block (CPU backend: kernels are synchronous)


_STATE: _State | None = None
_LOCK = threading.RLock()
_TLS = threading.local()


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


def wait_timeout_s(backend: str) -> float:
    """The device wait bound: ``TILEFUSE_WAIT_TIMEOUT`` seconds, else 30 s on a GPU and 60 s on the CPU."""
    text = os.environ.get("TILEFUSE_WAIT_TIMEOUT", "").strip()
    if not text:
        return DEFAULT_WAIT_TIMEOUT_S[backend]
    try:
        value = float(text)
    except ValueError as err:
        raise ValueError(f"TILEFUSE_WAIT_TIMEOUT={text!r} is not a number of seconds") from err
    if value <= 0:
        raise ValueError(f"TILEFUSE_WAIT_TIMEOUT must be positive, got {value}")
    return value


def init(heap_size: int | None = None, group=None) -> SymmetricHeap:
    """Create this rank's symmetric heap and map every peer's (collective; idempotent).

    Needs an initialised ``torch.distributed`` process group (``group``, default the world). The
    heap size is ``heap_size`` bytes, else ``TILEFUSE_HEAP_SIZE`` (e.g. ``2G``), else 4 GiB on a
    GPU and 256 MiB on the CPU. Backend ``cuda`` when a GPU is usable (the current device; several
    processes may share one GPU), else ``cpu``: kernels then run in Triton's interpreter, which
    needs ``TRITON_INTERPRET=1`` before kernel modules are imported; ``import tilefuse`` sets it
    when no GPU is present, so import tilefuse before your own Triton kernels (or set it yourself).
    A second call returns the same heap (and rejects a different group or size). Device waits give
    up after ``TILEFUSE_WAIT_TIMEOUT`` seconds (30 on a GPU, 60 on the CPU).
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
    bound_s = wait_timeout_s(backend)
    heap = SymmetricHeap(size, group, backend, _device_for(backend, group))
    ctl = heap.zeros(P.ctl_words(heap.world_size), dtype=torch.int64)
    heap.mark_internal(ctl)  # tilefuse's own: not a user tensor left alive at shutdown
    if heap.offset_of(ctl) != 0:
        raise RuntimeError("tilefuse.init: the control block must be the heap's first allocation")
    ctl[int(P.CTL_BOUND_NS)] = int(bound_s * 1e9)
    ctl[int(P.CTL_GEN)] = 1
    dummy = torch.zeros(1, dtype=torch.float32, device=heap.device)
    on_gpu = heap.device.type == "cuda"
    status_host = torch.zeros(2, dtype=torch.int64, pin_memory=True) if on_gpu else None
    sync_errors = (not on_gpu) or os.environ.get("TILEFUSE_SYNC_ERRORS", "0") not in ("", "0")
    _STATE = _State(heap=heap, ctl=ctl, dummy=dummy, status_host=status_host, sync_errors=sync_errors,
                    on_gpu=on_gpu, dev_index=heap.device.index if on_gpu else -1,
                    ctl_status=ctl[int(P.CTL_POISON):int(P.CTL_ERRORS) + 1],
                    status_np=status_host.numpy() if on_gpu else None, ctl_np=None if on_gpu else ctl.numpy())
    if on_gpu:
        # The control block's zeroing must land before any peer can signal into it: a host-only
        # exchange (gloo) below does not wait for this device's queue.
        torch.cuda.synchronize(heap.device)
    heap.check_symmetric("tilefuse.init", ctl)
    if heap.world_size > 1:
        # One collective call now: its remote releases and acquires are what every op relies on, so
        # a GPU pair whose link does not carry them fails here, not inside the first op.
        try:
            device_barrier()
            synchronize()
        except (WaitTimeoutError, PoisonedError) as err:
            _STATE = None
            heap.close()
            raise RuntimeError(
                "tilefuse.init: the first device barrier did not complete: remote atomics between this "
                "rank's GPU and a peer's did not arrive (no peer-to-peer atomics over this link?), or a "
                "peer did not call init\n" + str(err)
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
    """The int64 control block on this rank's heap (pass it to kernels as ``ctl_ptr``)."""
    return _state().ctl


def set_wait_timeout(seconds: float) -> float:
    """Set the device wait bound (seconds, this rank; stream-ordered); returns the previous bound."""
    st = _state()
    if seconds <= 0:
        raise ValueError(f"set_wait_timeout: seconds must be positive, got {seconds}")
    old = int(st.ctl[int(P.CTL_BOUND_NS)].item()) / 1e9
    st.ctl[int(P.CTL_BOUND_NS)] = int(seconds * 1e9)
    return old


def set_sync_errors(on: bool) -> bool:
    """Raise device-recorded errors at the failing call itself (a device sync at the end of every
    call: the CPU backend's behaviour, ``TILEFUSE_SYNC_ERRORS=1`` on a GPU) or, off, at the next call or
    :func:`synchronize` (the GPU default: no sync). Returns the previous setting."""
    st = _state()
    old = st.sync_errors
    st.sync_errors = bool(on) or st.heap.device.type != "cuda"
    return old


def generation() -> int:
    """The workspace generation the next call is launched for (bumped by :func:`bump_generation`)."""
    return _state().gen


def bump_generation() -> None:
    """Calls launched for an earlier generation (CUDA graph replays) abort from now on (stream-ordered).
    Launch plans carry the generation in their begin kernel's arguments: they are dropped."""
    st = _state()
    plans.clear_plans()
    st.gen += 1
    st.ctl[int(P.CTL_GEN)] = st.gen


def constant_tensors() -> tuple:
    """Runtime tensors that are not on the heap but that launch plans may keep (``heap_bases`` and
    the begin kernel's stand-in output)."""
    st = _state()
    return st.heap.heap_bases, st.dummy


# ------------------------------------------------------------------------------------ errors


def _signature(key: tuple) -> tuple[int, str]:
    """A 62-bit hash of the call's signature (the same on every rank: not Python's salted hash)."""
    st = _state()
    hit = st.sigs.get(key)
    if hit is None:
        if len(st.sigs) >= _MAX_SIGNATURES:  # a server with ever-new shapes: keep the cache bounded
            st.sigs.clear()
            st.texts.clear()
        text = ", ".join(str(k) for k in key)
        digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
        value = int.from_bytes(digest, "little") >> 2
        hit = st.sigs[key] = (value, text)
        st.texts[value] = text
    return hit


def _describe_sig(st: _State, value: int) -> str:
    if value == int(P.SIG_FAILED):
        return "a call that failed its argument checks"
    text = st.texts.get(value)
    return f"({text})" if text else f"a call with signature {value:#x} (not made on this rank)"


def _read_record(st: _State) -> dict:
    names = ("kind", "seq", "rank", "peer", "addr", "target", "seen", "ns")
    first = int(P.CTL_REC_KIND)
    vals = st.ctl[first:first + len(names)].tolist()
    rec = dict(zip(names, vals))
    rec["errors"] = int(st.ctl[int(P.CTL_ERRORS)].item())
    rec["poison"] = int(st.ctl[int(P.CTL_POISON)].item())
    return rec


def _clear_record(st: _State) -> None:
    st.ctl[int(P.CTL_ERRORS)] = 0
    st.ctl[int(P.CTL_REC_KIND):int(P.CTL_REC_NS) + 1] = 0
    if st.status_host is not None:
        st.status_host[1] = 0


def _error_from(st: _State, rec: dict) -> Exception:
    heap = st.heap
    kind, seq = rec["kind"], rec["seq"]
    if kind == int(P.ERR_TIMEOUT):
        offset = rec["addr"] - heap.base
        where = f"heap offset {offset}" if 0 <= offset < heap.size else f"address {rec['addr']:#x}"
        src = f"rank {rec['peer']}" if rec["peer"] >= 0 else "a peer"
        return WaitTimeoutError(
            f"rank {rec['rank']} gave up after {rec['ns'] / 1e9:.1f} s in call #{seq} waiting for the flag at "
            f"{where} to reach {rec['target']} (written by {src}); it still read {rec['seen']}. The writer "
            "never released it: a rank that did not make the same call, crashed, or is slower than "
            "TILEFUSE_WAIT_TIMEOUT. The runtime is now poisoned on every rank: call tilefuse.reset() on "
            "every rank to go on."
        )
    if kind == int(P.ERR_MISMATCH):
        return CallMismatchError(
            f"collective call #{seq} differs between ranks: rank {rec['rank']} made "
            f"{_describe_sig(st, rec['target'])} but rank {rec['peer']} made {_describe_sig(st, rec['seen'])}. "
            "No data moved; every rank raises for this call. Every rank must make the same calls in the "
            "same order with the same shapes, dtype, variant and config."
        )
    if kind == int(P.ERR_PEER_FAILED):
        return PeerCallError(
            f"collective call #{seq} ({_describe_sig(st, rec['target'])}) failed on rank {rec['peer']}: its "
            "argument checks raised there (see that rank's error). No data moved; the call raises on "
            "every rank, and the next calls pair as usual."
        )
    if kind == int(P.ERR_STALE):
        return StaleCallError(
            f"call #{seq} was launched for workspace generation {rec['target']}, but the workspaces were "
            f"released since (now generation {rec['seen']}): a CUDA graph captured before "
            "tilefuse.clear_workspaces()/reset() was replayed. It did nothing; capture the graph again."
        )
    return RuntimeError(f"tilefuse: unknown device error record {rec}")


def _poison_message(st: _State, rec: dict | None) -> str:
    origin = (rec or {}).get("poison", 0) - 1
    who = f"rank {origin}" if origin >= 0 else "a rank"
    return (f"tilefuse is poisoned: a device wait timed out on {who}, so every op raises on every rank "
            "until tilefuse.reset() is called on every rank")


def _collect(sync: bool) -> Exception | None:
    """The error the device recorded since the last check, if any (clears it); syncs when asked or
    when there is one to read."""
    st = _state()
    on_gpu = st.on_gpu
    capturing = _capturing(st)
    if capturing:
        sync = False  # no device sync inside a capture: read what earlier calls left in pinned memory
    if on_gpu and not sync:
        if not _status_set(st):
            return None
    if capturing:
        return RuntimeError("tilefuse: an error was recorded before this CUDA graph capture; "
                            "call tilefuse.synchronize() before capturing to see it")
    if on_gpu:
        torch.cuda.synchronize(st.heap.device)
    elif not _status_set(st):
        return None
    rec = _read_record(st)
    if rec["errors"] == 0 and rec["poison"] == 0:
        return None
    err = _error_from(st, rec) if rec["errors"] else None
    _clear_record(st)
    if rec["poison"]:
        st.poisoned = _poison_message(st, rec)
        if err is None or not isinstance(err, WaitTimeoutError):
            err = PoisonedError(st.poisoned)
    return err


_ERRORS, _POISON = int(P.CTL_ERRORS), int(P.CTL_POISON)


def _status_set(st: _State) -> bool:
    """Whether the error or poison word is set: on a GPU as of the last call's status copy, on the
    CPU backend now (no torch call: a numpy view)."""
    if st.on_gpu:
        words = st.status_np
        return bool(words[0] or words[1])
    words = st.ctl_np
    return bool(words[_ERRORS] or words[_POISON])


def check_waits() -> None:
    """Raise the error a device wait or call check recorded since the last check (syncs)."""
    err = _collect(sync=True)
    if err is not None:
        raise err


def poll_waits() -> None:
    """Raise an earlier call's recorded error (cheap on a GPU: no sync unless there is one)."""
    err = _collect(sync=False)
    if err is not None:
        raise err


# ------------------------------------------------------------------------------------ calls


def _capturing(st: _State) -> bool:
    return st.heap.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


try:
    from torch._C import _cuda_getCurrentRawStream as _raw_stream
except ImportError:  # a CPU-only torch
    def _raw_stream(index: int) -> int:
        return torch.cuda.current_stream(index).cuda_stream


def _order_stream(st: _State, raw: int) -> None:
    """Calls on different streams run one after another, in the order the host made them (``raw``:
    the current stream's handle). (Inside a CUDA graph capture the graph's order is the capture
    stream's; order it against eager work as torch asks: synchronize before capturing.)"""
    if raw == st.last_stream_raw:
        return
    stream = torch.cuda.current_stream(st.heap.device)
    if st.last_stream is not None and stream != st.last_stream:
        stream.wait_stream(st.last_stream)  # everything queued there so far, the last call included
    st.last_stream, st.last_stream_raw = stream, raw


def _note_end(st: _State, capturing: bool) -> None:
    if not st.on_gpu:
        return
    if capturing:
        st.last_stream = st.last_stream_raw = None  # the next eager call waits on nothing recorded in the graph
    st.status_host.copy_(st.ctl_status, non_blocking=True)


def _launch_begin(st: _State, sig: int, outputs: tuple) -> None:
    heap = st.heap
    outs = [t for t in outputs if t is not None and t.is_contiguous() and t.dtype.is_floating_point]
    o0 = outs[0] if outs else st.dummy
    o1 = outs[1] if len(outs) > 1 else st.dummy
    P.call_begin_kernel[(1,)](
        st.ctl, heap.heap_bases, heap.rank, heap.world_size, sig, st.gen,
        o0, o0.numel() if outs else 0, o1, o1.numel() if len(outs) > 1 else 0,
        BLOCK=_FILL_BLOCK, num_warps=1,
    )


class CollectiveCall:
    """Host part of one collective op call (a context manager; see the module docstring).

    Nested use in one thread (a variant handing a degenerate call to another) is one call. After
    ``__enter__``, ``capturing`` says whether a CUDA graph capture is under way and ``stream`` is the
    current stream's raw handle (None on the CPU backend).
    """

    __slots__ = ("op", "begun", "pending", "outer", "capturing", "stream")

    def __init__(self, op: str):
        self.op = op
        self.begun = False
        self.pending: Exception | None = None
        self.outer = None
        self.capturing = False
        self.stream = None

    def __enter__(self):
        outer = getattr(_TLS, "call", None)
        if outer is not None:
            self.outer = outer
            return outer
        _LOCK.acquire()
        try:
            st = _STATE if _STATE is not None else _state()
            if st.on_gpu:
                if torch.cuda.current_device() != st.dev_index:
                    self._wrong_device(st)
                self.capturing = torch.cuda.is_current_stream_capturing()
                self.stream = _raw_stream(st.dev_index)
            if st.poisoned:
                raise PoisonedError(st.poisoned)
            if _status_set(st):
                err = _collect(sync=False)
                if isinstance(err, (WaitTimeoutError, PoisonedError)):
                    raise err
                self.pending = err
            if st.on_gpu and not self.capturing:
                _order_stream(st, self.stream)
        except BaseException:
            _LOCK.release()
            raise
        _TLS.call = self
        return self

    def _wrong_device(self, st: _State) -> None:
        try:
            check_current_device(self.op, st.heap.device)
        except RuntimeError:
            if not st.poisoned:  # the peers are making this call: count it on every rank, as failed
                with torch.cuda.device(st.heap.device):
                    _launch_begin(st, int(P.SIG_FAILED), ())
                    _note_end(st, torch.cuda.is_current_stream_capturing())
            raise

    def begin(self, key: tuple, outputs: tuple = ()) -> None:
        """Launch the begin kernel for the call with signature ``key``; ``outputs`` (up to two
        contiguous floating-point tensors) are filled with NaN if the call aborts."""
        if self.begun:
            return
        st = _state()
        _launch_begin(st, _signature(key)[0], outputs)
        self.begun = True
        rec = plans.recorder()
        if rec is not None:
            rec.host(_mark_begun)

    def __exit__(self, exc_type, exc, tb):
        if self.outer is not None:
            return False
        _TLS.call = None
        try:
            st = _STATE
            if st is None:
                return False
            if exc is not None and not self.begun and not isinstance(exc, PoisonedError):
                # The peers are making this call too: count it on every rank, as failed.
                _launch_begin(st, int(P.SIG_FAILED), ())
                self.begun = True
                if st.sync_errors:
                    _collect(sync=True)  # this rank's own failure record is not an error to raise
            if self.begun:
                _note_end(st, self.capturing)
            if exc is not None:
                return False
            if st.sync_errors and not self.capturing and (st.on_gpu or _status_set(st)):
                err = _collect(sync=True)
                if err is not None:
                    raise err
            if self.pending is not None:
                raise self.pending
            return False
        finally:
            _LOCK.release()


def _mark_begun(replay) -> None:
    replay.call.begun = True


def in_call() -> bool:
    """Whether this thread is inside a collective call."""
    return getattr(_TLS, "call", None) is not None


def current_call() -> CollectiveCall:
    """The collective call this thread is inside (raises outside one)."""
    call = getattr(_TLS, "call", None)
    if call is None:
        raise RuntimeError("no tilefuse collective call is active in this thread")
    return call


def synchronize() -> None:
    """Wait for this rank's device work, then report any error recorded on the device."""
    st = _state()
    if st.poisoned:
        raise PoisonedError(st.poisoned)
    check_waits()


def barrier() -> None:
    """Host barrier: this rank's device work is finished and every rank got here."""
    st = _state()
    synchronize()
    hostsync.barrier(st.heap.group, what="tilefuse.barrier")


def device_barrier() -> None:
    """Stream-ordered barrier (a collective call): returns once every rank launched one.

    Work queued before it on any rank is complete and visible to work queued after it on all ranks.
    """
    st = _state()
    if st.heap.world_size == 1:
        return
    if getattr(_TLS, "call", None) is not None:  # inside an op's call: a call of its own, same host part
        _launch_begin(st, _signature(("device_barrier",))[0], ())
        return
    with CollectiveCall("tilefuse.device_barrier") as call:
        call.begin(("device_barrier",))


def reset() -> None:
    """Collective recovery after an error: wait for this rank's device, re-zero the control block
    (sequence numbers, flags of the protocol, poison), drop every workspace, then barrier. Call it on
    every rank; afterwards calls pair from scratch."""
    st = _state()
    heap = st.heap
    with _LOCK:
        if heap.device.type == "cuda":
            torch.cuda.synchronize(heap.device)
        hostsync.reset(heap.group)
        hostsync.barrier(heap.group, what="tilefuse.reset: entry")
        plans.clear_plans()
        for hook in _RESET_HOOKS:
            hook()
        bound = int(st.ctl[int(P.CTL_BOUND_NS)].item())
        st.ctl.zero_()
        st.gen += 1
        st.ctl[int(P.CTL_BOUND_NS)] = bound
        st.ctl[int(P.CTL_GEN)] = st.gen
        if st.status_host is not None:
            st.status_host.zero_()
        st.last_stream = st.last_stream_raw = None
        st.poisoned = None
        if heap.device.type == "cuda":
            torch.cuda.synchronize(heap.device)
        hostsync.barrier(heap.group, what="tilefuse.reset: exit")


_SHUTDOWN_HOOKS: list = []
_RESET_HOOKS: list = []


def on_shutdown(hook) -> None:
    """Run ``hook()`` at :func:`shutdown`, before the heap closes (the ops drop their workspaces)."""
    if hook not in _SHUTDOWN_HOOKS:
        _SHUTDOWN_HOOKS.append(hook)


def on_reset(hook) -> None:
    """Run ``hook()`` at :func:`reset`, while every rank's device is idle (the ops drop their workspaces)."""
    if hook not in _RESET_HOOKS:
        _RESET_HOOKS.append(hook)


def shutdown() -> None:
    """Drop the ops' workspaces and the peer mappings, after a barrier (call before the process group
    is destroyed). A later :func:`init` starts from a new heap with no workspace of the old one."""
    global _STATE
    if _STATE is None:
        return
    st = _STATE
    if st.heap.device.type == "cuda":
        torch.cuda.synchronize(st.heap.device)
    st.ctl[int(P.CTL_GEN)] = -1  # a CUDA graph replayed after this aborts before touching memory
    plans.clear_plans()
    for hook in _SHUTDOWN_HOOKS:
        hook()
    st.heap.close()
    _STATE = None
