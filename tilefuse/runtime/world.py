"""Process-wide runtime state: ``init``, the control block, collective calls, errors and ``reset``.

The device side of the protocol (control block, pairing, flags, bounded waits, poisoning) is
described in :mod:`tilefuse.runtime.primitives`. This module is its host side:

- :class:`CollectiveCall` wraps the host part of every op call: one call at a time per process
  (a lock; calls from several threads are serialised), calls on different streams ordered with CUDA
  events, earlier errors reported, the begin kernel launched (:meth:`CollectiveCall.begin`), and a
  call whose argument checks fail still counted on every rank (it launches the begin kernel with
  the failure signature, then raises).
- Error records reach the host without a device sync on a GPU: a copy of two control words is
  queued into pinned memory after each call (a call whose kernels begin it themselves writes them
  there from its last kernel: :meth:`CollectiveCall.enter_args`) and read at the next one (a plain
  memory read through a numpy view; the full record is read only when one of the two words is set).
  An error found that way is raised at the end of that next call, after its own kernels were
  launched, so that the ranks' calls stay paired (its result is discarded). On the CPU backend and
  with ``TILEFUSE_SYNC_ERRORS=1`` every call checks at its end and raises at the failing call itself.
- A wait that timed out poisons the runtime on every rank: every op raises :class:`PoisonedError`
  until :func:`reset` (collective) re-zeros the control block and drops the workspaces.
- A peer process that exits poisons this rank for good (:class:`PeerExitedError`): each call checks
  the peers' pidfds before launching anything (:func:`check_peers` makes the same check for a CUDA
  graph replay), and the host's waits for the device (:func:`synchronize`, :func:`reset`,
  :func:`shutdown`) poll an event instead of blocking, giving up once a peer has exited and the work
  is still not done after the wait bound (:func:`_wait_device`): on a GPU a kernel that stores into
  an exited process's memory stalls, it does not fault.

**Several process groups.** :func:`init` may be called for several groups (a data x tensor mesh's TP
group beside the world, two TP groups of one model). Each group gets its own :class:`_State`: heap,
control block (so its own call sequence numbers and epochs), signatures and error words; the first
group initialised is the *default* one, which ``group=None`` means. An op call runs on one group's
state: the ``@collective`` wrapper resolves the call's group once (:func:`call_state`, a dictionary
lookup) and hands the state to :class:`CollectiveCall`, which makes it this thread's *active* state
for the call; :func:`_state` (and so :func:`get_heap`, :func:`control_block` and everything a
launcher asks the runtime) returns the active state, else the default. ``group=None`` calls set
nothing. :func:`reset` and :func:`tilefuse.clear_workspaces` act on the group they are given;
:func:`shutdown` closes every group's heap, the default group's last. Calls of all groups share one
lock and one stream order (calls on different streams run one after another in the order the host
made them, whatever their group), so device scratch shared by all groups is never used by two calls
at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import select
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from . import _env, hostsync
from . import primitives as P
from .heap import SymmetricHeap, resolve_heap_size

DEFAULT_WAIT_TIMEOUT_S = {"cuda": 30.0, "cpu": 60.0}
_FILL_BLOCK = 1024
_MAX_SIGNATURES = 4096


class WaitTimeoutError(RuntimeError):
    """A device-side wait ran out of its bound: a peer never released the flag it waited for."""


class PoisonedError(RuntimeError):
    """A wait timed out on some rank: every op raises until the collective :func:`tilefuse.reset`."""


class PeerExitedError(PoisonedError):
    """A peer process of the group has exited: this rank's calls cannot complete (raised before any
    kernel of the call is launched; every later call raises too)."""


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
    status_scratch: torch.Tensor | None = None  # int64[2] (CPU backend): where call_exit writes them
    gen: int = 1
    poisoned: str | None = None  # set once this host has seen the poison: the message to raise
    poison_error: type = PoisonedError  # what raises it (PeerExitedError once a peer has exited)
    sigs: dict = field(default_factory=dict)  # signature key -> (hash, text)
    texts: dict = field(default_factory=dict)  # hash -> text, for error messages
    on_gpu: bool = False
    dev_index: int = -1
    ctl_status: torch.Tensor | None = None  # ctl[POISON:ERRORS + 1], copied into status_host after each call
    status_np: object = None  # numpy view of status_host (GPU): read without a torch call
    ctl_np: object = None  # numpy view of the control block (CPU backend: kernels are synchronous)
    group: object = None  # the process group this state serves (the heap's)
    name: str = ""  # that group's name (what the custom ops pass)
    # (rank, pid, pidfd or -1) of each peer process this rank can watch (same pid namespace)
    peers: tuple = ()
    # the device waits' bound, seconds: the host's copy of ctl[BOUND_NS] (also how long a host wait
    # outlives a peer's exit)
    wait_bound_s: float = 0.0
    done_event: object = None  # torch.cuda.Event recorded by _wait_device (made on first use)


_STATE: _State | None = None  # the default group's state: the first group initialised
_STATES: dict = {}  # process group -> its state, in the order the groups were initialised
_NAMES: dict = {}  # group name -> state
_LOCK = threading.RLock()


class _Local(threading.local):
    call = None  # the CollectiveCall this thread is inside
    state = None  # this thread's active state (None: the default group's)


_TLS = _Local()


class _StreamOrder:
    """The stream the last call was launched on (shared by every group's calls)."""

    __slots__ = ("stream", "raw")

    def __init__(self):
        self.stream = None
        self.raw: int | None = None  # its raw handle: calls on the same stream compare integers


_ORDER = _StreamOrder()


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
    return _env.wait_timeout(DEFAULT_WAIT_TIMEOUT_S[backend])


def init(heap_size: int | None = None, group=None) -> SymmetricHeap:
    """Create this rank's symmetric heap and map every peer's (collective; idempotent).

    Needs an initialised ``torch.distributed`` process group (``group``, default the world). The
    heap size is ``heap_size`` bytes, else ``TILEFUSE_HEAP_SIZE`` (e.g. ``2G``), else 4 GiB on a
    GPU and 256 MiB on the CPU. Backend ``cuda`` when a GPU is usable (the current device; several
    processes may share one GPU), else ``cpu``: kernels then run in Triton's interpreter, which
    needs ``TRITON_INTERPRET=1`` before kernel modules are imported; ``import tilefuse`` sets it
    when no GPU is present, so import tilefuse before your own Triton kernels (or set it yourself).
    Device waits give up after ``TILEFUSE_WAIT_TIMEOUT`` seconds (30 on a GPU, 60 on the CPU).

    Several groups: call it once per process group the ops will run on (collective over that
    group's ranks; a rank calls it only for groups it belongs to). Each group gets its own heap and
    protocol state; the first group initialised is the default one (``group=None`` in the ops and in
    :func:`get_heap`, :func:`reset`, ...). A second call for the same group returns the same heap
    (and rejects a different size).
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "tilefuse.init needs an initialised torch.distributed process group: call "
            "torch.distributed.init_process_group(...) first (gloo works for the cpu backend and for "
            "several processes sharing one GPU; nccl for one process per GPU)"
        )
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
    with _LOCK:
        st = find_state(group)
        if st is not None:
            heap = st.heap
            if heap_size is not None and size != heap.size:
                raise RuntimeError(f"tilefuse.init: the heap of process group {st.name!r} already exists with "
                                   f"{heap.size} bytes, asked {size}")
            return heap
        return _init_group(size, group, backend)


def _init_group(size: int, group, backend: str) -> SymmetricHeap:
    global _STATE
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
    status_scratch = None if on_gpu else torch.zeros(2, dtype=torch.int64)
    sync_errors = (not on_gpu) or _env.sync_errors()
    st = _State(heap=heap, ctl=ctl, dummy=dummy, status_host=status_host, status_scratch=status_scratch,
                sync_errors=sync_errors,
                on_gpu=on_gpu, dev_index=heap.device.index if on_gpu else -1,
                ctl_status=ctl[int(P.CTL_POISON):int(P.CTL_ERRORS) + 1],
                status_np=status_host.numpy() if on_gpu else None, ctl_np=None if on_gpu else ctl.numpy(),
                group=group, name=hostsync._group_name(group), wait_bound_s=bound_s)
    if on_gpu:
        # The control block's zeroing must land before any peer can signal into it: a host-only
        # exchange (gloo) below does not wait for this device's queue.
        torch.cuda.synchronize(heap.device)
    try:
        heap.check_symmetric("tilefuse.init", ctl)
        if heap.world_size > 1:
            st.peers = _watch_peers(group, heap.rank)
    except BaseException:  # a host step that failed or timed out: nothing of this heap stays open
        _close_peers(st)
        heap.close()
        raise
    _STATES[group] = _NAMES[st.name] = st
    if _STATE is None:
        _STATE = st
    if heap.world_size > 1:
        # One collective call now: its remote releases and acquires are what every op relies on, so
        # a GPU pair whose link does not carry them fails here, not inside the first op.
        try:
            with using(st):
                device_barrier()
                synchronize()
        except (WaitTimeoutError, PoisonedError) as err:
            _forget(st)
            heap.close()
            raise RuntimeError(
                "tilefuse.init: the first device barrier did not complete: remote atomics between this "
                "rank's GPU and a peer's did not arrive (no peer-to-peer atomics over this link?), or a "
                "peer did not call init\n" + str(err)
            ) from err
    return heap


def _watch_peers(group, rank: int) -> tuple:
    """``(rank, pid, pidfd)`` of each peer process in this rank's pid namespace (a host step over
    ``group``). The ranks of a heap share a host (CUDA IPC, /dev/shm); a peer whose namespace differs
    is not watched. ``pidfd`` is -1 where ``os.pidfd_open`` is missing (then the pid is probed)."""
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        ns = None
    seen = hostsync.all_gather_object((os.getpid(), ns), group, what="tilefuse.init (process ids)")
    peers = []
    for r, (pid, their_ns) in enumerate(seen):
        if r == rank or ns is None or their_ns != ns:
            continue
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            fd = -1
        peers.append((r, pid, fd))
    return tuple(peers)


def _exited_peer(st: _State) -> tuple | None:
    """``(rank, pid)`` of a watched peer process that has exited, else None (one ``select`` on the
    peers' pidfds: a pidfd reads ready once its process has exited)."""
    fds = [fd for _, _, fd in st.peers if fd >= 0]
    if fds:
        ready = select.select(fds, [], [], 0)[0]
        for r, pid, fd in st.peers:
            if fd in ready:
                return r, pid
    for r, pid, fd in st.peers:
        if fd < 0:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return r, pid
            except OSError:
                pass
    return None


def _check_peers(st: _State, op: str) -> None:
    """Raise :class:`PeerExitedError` (and poison this rank's state) if a peer process has exited.

    Checked on the host before a call launches anything: a kernel that stores into the memory of a
    process that has exited does not fault on a GPU, it never finishes, so neither the device waits'
    bound nor a later synchronize would report it."""
    gone = _exited_peer(st)
    if gone is not None:
        raise _peer_exited(st, gone, f"{op} and every later call on this rank raise (nothing was launched)")


def _raise_if_poisoned(st: _State) -> None:
    """Raise the error this rank's state was poisoned with (PoisonedError, or PeerExitedError), if any."""
    if st.poisoned:
        raise st.poison_error(st.poisoned)


def _peer_exited(st: _State, gone: tuple, what: str) -> PeerExitedError:
    """Poison this rank's state for the exited peer ``gone`` = (rank, pid); the error to raise."""
    rank, pid = gone
    st.poisoned = (f"tilefuse: rank {rank} (pid {pid}) of group {_describe_group(st.group)} has exited; "
                   f"{what}. A peer cannot rejoin a heap: restart the job")
    st.poison_error = PeerExitedError
    return PeerExitedError(st.poisoned)


def _wait_device(st: _State, what: str) -> None:
    """``torch.cuda.synchronize`` of the heap's device, bounded once a peer has exited.

    Every eager call of every group runs after the one before it in stream order (``_order_stream``),
    so an event recorded behind the last call's stream completes once all of tilefuse's work has
    (with no eager call since the last capture or reset: behind the current stream, where CUDA graphs
    are usually replayed).
    While it has not, the watched peers are checked between polls: once one has exited and the work
    is still not done ``wait_bound_s`` later (a kernel that stores into an exited process's memory
    never finishes), this raises :class:`PeerExitedError` instead of waiting for ever. Once the event
    has completed (at once with no peer to watch), the device-wide synchronize: other work of this
    process, not bounded here."""
    if st.peers:
        stream = _ORDER.stream
        if stream is None or stream.device != st.heap.device:  # (the event belongs to the heap's device)
            stream = torch.cuda.current_stream(st.heap.device)
        if st.done_event is None:
            st.done_event = torch.cuda.Event()
        event = st.done_event
        event.record(stream)
        t0 = time.monotonic()
        check_at, give_up = t0 + 1e-3, None
        # Spins, yielding the CPU between queries, as the CUDA runtime's own wait does by default (a
        # sleep, even of 0 s, costs the timer's slack: 50 us and more); the peers every millisecond.
        while not event.query():
            os.sched_yield()
            now = time.monotonic()
            if now < check_at:
                continue
            check_at = now + 1e-3
            gone = _exited_peer(st)
            if gone is not None:
                give_up = now + st.wait_bound_s if give_up is None else give_up
                if now >= give_up:
                    raise _peer_exited(st, gone, f"{what} gave up on this rank's unfinished device work "
                                                 f"after {now - t0:.1f} s, and every later call raises")
    torch.cuda.synchronize(st.heap.device)


def _close_peers(st: _State) -> None:
    for _, _, fd in st.peers:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
    st.peers = ()


def _forget(st: _State) -> None:
    """Drop ``st`` from the registry (its heap is closed by the caller); the default goes last."""
    global _STATE
    _close_peers(st)
    for reg, key in ((_STATES, st.group), (_NAMES, st.name)):
        if reg.get(key) is st:
            del reg[key]
    if _STATE is st:
        _STATE = next(iter(_STATES.values()), None)


def _describe_group(group) -> str:
    """``'name' (ranks [...])`` for error messages (whatever the group is)."""
    if isinstance(group, str):
        return repr(group)
    try:
        name = hostsync._group_name(group)
    except Exception:
        name = "?"
    try:
        ranks = dist.get_process_group_ranks(group)
    except Exception:
        return repr(name)
    return f"{name!r} (ranks {ranks})"


def find_state(group) -> _State | None:
    """The state serving ``group`` (a ProcessGroup or its name; None: the default), or None where
    that group was never initialised on this rank."""
    if group is None:
        return _STATE
    st = _STATES.get(group)
    if st is not None:
        return st
    if isinstance(group, str):
        return _NAMES.get(group)
    try:
        name = hostsync._group_name(group)
    except Exception:  # not a process group, or one this rank is not a member of
        return None
    return _NAMES.get(name)  # another Python object for the same group (its name resolved again)


def state_for(group, what: str = "tilefuse") -> _State:
    """The state serving ``group`` (None: the default); a clear error where it was never
    initialised on this rank."""
    st = _STATES.get(group) if group is not None else _STATE
    if st is not None:
        return st
    st = find_state(group)
    if st is not None:
        return st
    if _STATE is None or group is None:
        raise RuntimeError(f"{what}: tilefuse is not initialised on this rank: call tilefuse.init() first")
    rank = dist.get_rank() if dist.is_initialized() else -1
    known = ", ".join(_describe_group(s.group) for s in _STATES.values())
    raise RuntimeError(
        f"{what}: tilefuse is not initialised for process group {_describe_group(group)} on global rank {rank}: "
        "call tilefuse.init(group=...) with that group on every rank of it first (each process group has a "
        f"heap of its own; initialised here: {known})"
    )


def call_state(group, what: str = "tilefuse") -> _State | None:
    """The state an op call on ``group`` runs on, to hand to :class:`CollectiveCall`: ``group``'s; for
    None the default group's where this thread has another state active (inside :func:`using`), else
    None (the default, which needs nothing set). Raises where tilefuse is not initialised."""
    if group is not None:
        return state_for(group, what)
    if _STATE is None:
        raise RuntimeError(f"{what}: tilefuse is not initialised on this rank: call tilefuse.init() first")
    return _STATE if _TLS.state is not None else None


@contextlib.contextmanager
def using(target):
    """Make ``target`` (a state, or a process group: :func:`state_for`) this thread's active state
    inside the block (what :func:`get_heap`, :func:`control_block`, ... return there)."""
    st = target if isinstance(target, _State) else state_for(target)
    prev = _TLS.state
    _TLS.state = st
    try:
        yield st
    finally:
        _TLS.state = prev


def groups() -> list:
    """The process groups tilefuse is initialised on in this process, the default one first."""
    return [st.group for st in _STATES.values()]


def is_initialized(group=None) -> bool:
    """Whether tilefuse is initialised on this rank (``group``: for that process group)."""
    if group is None:
        return _STATE is not None
    return find_state(group) is not None


def _state() -> _State:
    st = _TLS.state
    if st is not None:
        return st
    if _STATE is None:
        raise RuntimeError("tilefuse is not initialised on this rank: call tilefuse.init() first")
    return _STATE


def _state_of(group) -> _State:
    """The state of ``group``; None: this thread's active state, else the default."""
    return _state() if group is None else state_for(group)


def get_heap(group=None) -> SymmetricHeap:
    """This rank's symmetric heap for ``group`` (default: the default group's; inside an op call,
    the call's group's)."""
    return _state_of(group).heap


def control_block() -> torch.Tensor:
    """The int64 control block on this rank's heap (pass it to kernels as ``ctl_ptr``)."""
    return _state().ctl


def set_wait_timeout(seconds: float, group=None) -> float:
    """Set the device wait bound (seconds, this rank; stream-ordered) of ``group``'s calls (default:
    the default group's); returns the previous bound."""
    st = _state_of(group)
    if seconds <= 0:
        raise ValueError(f"set_wait_timeout: seconds must be positive, got {seconds}")
    old, st.wait_bound_s = st.wait_bound_s, seconds  # the host's copy: no device read
    st.ctl[int(P.CTL_BOUND_NS)] = int(seconds * 1e9)
    return old


def set_sync_errors(on: bool, group=None) -> bool:
    """Raise device-recorded errors at the failing call itself (a device sync at the end of every
    call: the CPU backend's behaviour, ``TILEFUSE_SYNC_ERRORS=1`` on a GPU) or, off, at the next call or
    :func:`synchronize` (the GPU default: no sync). ``group``: whose calls (default: the default
    group's). Returns the previous setting."""
    st = _state_of(group)
    old = st.sync_errors
    st.sync_errors = bool(on) or st.heap.device.type != "cuda"
    return old


def generation() -> int:
    """The workspace generation the next call is launched for (bumped by :func:`bump_generation`)."""
    return _state().gen


def bump_generation() -> None:
    """Calls launched for an earlier generation (CUDA graph replays) abort from now on (stream-ordered)."""
    st = _state()
    st.gen += 1
    st.ctl[int(P.CTL_GEN)] = st.gen


def stand_in() -> torch.Tensor:
    """A float32[1] device tensor that kernels never read: the pointer argument of a begin or an
    output that a call does not have."""
    return _state().dummy


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
    """The error record, the error count and the poison word: one device-to-host read on a GPU."""
    names = ("kind", "seq", "rank", "peer", "addr", "target", "seen", "ns")
    lo, first = int(P.CTL_POISON), int(P.CTL_REC_KIND)
    words = st.ctl[lo:first + len(names)].tolist()
    rec = dict(zip(names, words[first - lo:]))
    rec["errors"] = int(words[int(P.CTL_ERRORS) - lo])
    rec["poison"] = int(words[0])
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


def _collect(sync: bool, st: _State | None = None) -> Exception | None:
    """The error the device recorded since the last check on ``st`` (default: :func:`_state`), if
    any (clears it); syncs when asked or when there is one to read."""
    st = st if st is not None else _state()
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
        _wait_device(st, "waiting for this rank's device")
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


def check_waits(group=None) -> None:
    """Raise the error a device wait or call check recorded since the last check (syncs)."""
    err = _collect(sync=True, st=_state_of(group))
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
    the current stream's handle), whatever their group. (Inside a CUDA graph capture the graph's
    order is the capture stream's; order it against eager work as torch asks: synchronize before
    capturing.)"""
    order = _ORDER
    if raw == order.raw:
        return
    stream = torch.cuda.current_stream(st.heap.device)
    if order.stream is not None and stream != order.stream:
        stream.wait_stream(order.stream)  # everything queued there so far, the last call included
    order.stream, order.raw = stream, raw


def _note_end(st: _State, capturing: bool, mirrored: bool = False) -> None:
    """After a call's launches: queue the copy of the status words to the host (not needed when the
    call's kernel wrote them itself, ``mirrored``)."""
    if not st.on_gpu:
        return
    if capturing:
        _ORDER.stream = _ORDER.raw = None  # the next eager call waits on nothing recorded in the graph
    if not mirrored:
        st.status_host.copy_(st.ctl_status, non_blocking=True)


def _begin_args(st: _State, sig: int, outputs: tuple) -> tuple:
    """``sig, gen, out0, n_out0, out1, n_out1``: the begin's arguments (up to two contiguous
    floating-point outputs, filled with NaN if the call aborts; the stand-in otherwise)."""
    outs = [t for t in outputs if t is not None and t.is_contiguous() and t.dtype.is_floating_point]
    o0 = outs[0] if outs else st.dummy
    o1 = outs[1] if len(outs) > 1 else st.dummy
    return sig, st.gen, o0, o0.numel() if outs else 0, o1, o1.numel() if len(outs) > 1 else 0


def _launch_begin(st: _State, sig: int, outputs: tuple) -> None:
    heap = st.heap
    P.call_begin_kernel[(1,)](st.ctl, heap.heap_bases, heap.rank, heap.world_size, *_begin_args(st, sig, outputs),
                              BLOCK=_FILL_BLOCK, num_warps=1)


def _status_words(st: _State) -> torch.Tensor:
    """Where a kernel that ends its call (``call_exit``) writes the status words: the host's
    page-locked copy on a GPU (mapped into the device's address space), a scratch pair on the CPU
    backend (which reads the control block itself)."""
    return st.status_host if st.status_host is not None else st.status_scratch


class CollectiveCall:
    """Host part of one collective op call (a context manager; see the module docstring).

    ``st``: the state of the call's group (:func:`state_for`), made this thread's active state for
    the call; None: the default group's, which needs nothing set. Nested use in one thread (a variant
    handing a degenerate call to another) is one call. After ``__enter__``, ``capturing`` says
    whether a CUDA graph capture is under way and ``stream`` is the current stream's raw handle (None
    on the CPU backend).
    """

    __slots__ = ("op", "begun", "mirrored", "pending", "outer", "capturing", "stream", "st", "prev")

    def __init__(self, op: str, st: _State | None = None):
        self.op = op
        self.begun = False
        self.mirrored = False
        self.pending: Exception | None = None
        self.outer = None
        self.capturing = False
        self.stream = None
        self.st = st

    def __enter__(self):
        outer = _TLS.call
        if outer is not None:
            self.outer = outer
            return outer
        st = self.st
        if st is None:
            st = _STATE if _STATE is not None else _state()  # raises when not initialised
            _LOCK.acquire()
        else:
            _LOCK.acquire()
            self.prev = _TLS.state
            _TLS.state = st
        try:
            if st.on_gpu:
                if torch.cuda.current_device() != st.dev_index:
                    self._wrong_device(st)
                self.capturing = torch.cuda.is_current_stream_capturing()
                self.stream = _raw_stream(st.dev_index)
            _raise_if_poisoned(st)
            if st.peers and not self.capturing:
                _check_peers(st, self.op)
            if _status_set(st):
                err = _collect(False, st)
                if isinstance(err, (WaitTimeoutError, PoisonedError)):
                    raise err
                self.pending = err
            if st.on_gpu and not self.capturing:
                _order_stream(st, self.stream)
        except BaseException:
            if self.st is not None:
                _TLS.state = self.prev
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

    def verdict(self) -> None:
        """Wait for the device (a sync on a GPU) and raise what the call's begin recorded: a
        mismatch with the peers' calls, a peer's failed checks, a wait that ran out. For work the
        begin cannot gate, such as a torch collective launched after it."""
        err = _collect(True, self.st or _state())
        if err is not None:
            raise err

    def enter_args(self, key: tuple, outputs: tuple = ()) -> tuple:
        """Arguments of a kernel that begins the call itself (``primitives.call_enter`` and
        ``call_exit``, with ``ENTER``): ``sig, gen, out0, n_out0, out1, n_out1, status``, for the call
        with signature ``key`` and ``outputs`` as in :meth:`begin`. Launch that kernel as the call's
        only one, then call :meth:`entered`; a call that raises before that is counted as failed."""
        st = _state()
        return _begin_args(st, _signature(key)[0], outputs) + (_status_words(st),)

    def entered(self, ends: bool = True) -> None:
        """The kernel of :meth:`enter_args` is launched: it began the call, and (``ends``) it or a
        later kernel given the same arguments ends it and writes the status words (``call_exit``).
        A call of several kernels says so twice: after its first (``ends=False``) and its last."""
        self.begun = True
        self.mirrored = self.mirrored or ends

    def __exit__(self, exc_type, exc, tb):
        if self.outer is not None:
            return False
        _TLS.call = None
        try:
            st = self.st or _STATE
            if st is None:
                return False
            if exc is not None and not self.begun and not isinstance(exc, PoisonedError):
                # The peers are making this call too: count it on every rank, as failed.
                _launch_begin(st, int(P.SIG_FAILED), ())
                self.begun = True
                if st.sync_errors:
                    _collect(True, st)  # this rank's own failure record is not an error to raise
            if self.begun:
                _note_end(st, self.capturing, self.mirrored)
            if exc is not None:
                return False
            if st.sync_errors and not self.capturing and (st.on_gpu or _status_set(st)):
                err = _collect(True, st)
                if err is not None:
                    raise err
            if self.pending is not None:
                raise self.pending
            return False
        finally:
            if self.st is not None:
                _TLS.state = self.prev
            _LOCK.release()


def in_call() -> bool:
    """Whether this thread is inside a collective call."""
    return _TLS.call is not None


def current_call() -> CollectiveCall:
    """The collective call this thread is inside (raises outside one)."""
    call = _TLS.call
    if call is None:
        raise RuntimeError("no tilefuse collective call is active in this thread")
    return call


def synchronize(group=None) -> None:
    """Wait for this rank's device work, then report any error recorded on the device for
    ``group``'s calls (default: the default group's)."""
    st = _state_of(group)
    _raise_if_poisoned(st)
    err = _collect(True, st)
    if err is not None:
        raise err


def check_peers(group=None) -> None:
    """Raise :class:`PeerExitedError` if a peer process of ``group`` (default: the default group) has
    exited, and poison this rank so every later call raises too: the check every eager op call makes
    before launching anything, for work that does not go through a call, such as a CUDA graph replay
    (run it before ``graph.replay()``; one ``select``, about a microsecond). Also raises an earlier
    poisoning's error."""
    st = _state_of(group)
    _raise_if_poisoned(st)
    if st.peers:
        _check_peers(st, "tilefuse.check_peers")


def barrier(group=None) -> None:
    """Host barrier over ``group`` (default: the default group): this rank's device work is finished
    and every rank of the group got here."""
    st = _state_of(group)
    synchronize(st.group)
    hostsync.barrier(st.heap.group, what="tilefuse.barrier")


def device_barrier(group=None) -> None:
    """Stream-ordered barrier over ``group`` (default: the default group; a collective call): returns
    once every rank of it launched one.

    Work queued before it on any rank is complete and visible to work queued after it on all ranks.
    Inside an op's call it is part of that call (on the call's group).
    """
    if _TLS.call is not None:  # inside an op's call: a call of its own, same host part
        st = _state()
        if st.heap.world_size > 1:
            _launch_begin(st, _signature(("device_barrier",))[0], ())
        return
    st = _state_of(group)
    if st.heap.world_size == 1:
        return
    with CollectiveCall("tilefuse.device_barrier", st) as call:
        call.begin(("device_barrier",))


def reset(group=None) -> None:
    """Collective recovery after an error on ``group`` (default: the default group): wait for this
    rank's device, re-zero the group's control block (sequence numbers, flags of the protocol,
    poison), drop the group's workspaces, then barrier. Call it on every rank of the group;
    afterwards its calls pair from scratch. Other groups' state is left as it is."""
    st = _state_of(group)
    heap = st.heap
    with _LOCK, using(st):
        if heap.device.type == "cuda":
            _wait_device(st, "tilefuse.reset")
        hostsync.reset(heap.group)
        hostsync.barrier(heap.group, what="tilefuse.reset: entry")
        for hook in _RESET_HOOKS:
            hook()
        st.ctl.zero_()
        st.gen += 1
        st.ctl[int(P.CTL_BOUND_NS)] = int(st.wait_bound_s * 1e9)
        st.ctl[int(P.CTL_GEN)] = st.gen
        if st.status_host is not None:
            st.status_host.zero_()
        _ORDER.stream = _ORDER.raw = None  # the device is idle: the next call waits on nothing
        st.poisoned, st.poison_error = None, PoisonedError
        if heap.device.type == "cuda":
            torch.cuda.synchronize(heap.device)
        hostsync.barrier(heap.group, what="tilefuse.reset: exit")


_SHUTDOWN_HOOKS: list = []
_RESET_HOOKS: list = []


def on_shutdown(hook) -> None:
    """Run ``hook()`` at :func:`shutdown`, before a heap closes (the ops drop their workspaces), once
    per group, with that group's state active (:func:`get_heap` is the heap that closes)."""
    if hook not in _SHUTDOWN_HOOKS:
        _SHUTDOWN_HOOKS.append(hook)


def on_reset(hook) -> None:
    """Run ``hook()`` at :func:`reset`, while every rank's device is idle (the ops drop their
    workspaces), with the reset group's state active (:func:`get_heap` is its heap)."""
    if hook not in _RESET_HOOKS:
        _RESET_HOOKS.append(hook)


def shutdown(group=None) -> None:
    """Drop the ops' workspaces and the peer mappings, after a barrier (call before the process group
    is destroyed). A later :func:`init` starts from a new heap with no workspace of the old one.

    Without ``group``: every group's heap, in the reverse order of their :func:`init` calls (so the
    default group's last; each close is collective over its group). With ``group``: that group's
    heap only (not the default group's while other groups are initialised: it names what
    ``group=None`` means)."""
    if group is None:
        targets = list(reversed(_STATES.values()))
    else:
        st = find_state(group)
        if st is None:
            return
        if st is _STATE and len(_STATES) > 1:
            others = ", ".join(_describe_group(s.group) for s in _STATES.values() if s is not st)
            raise ValueError(f"tilefuse.shutdown: {_describe_group(group)} is the default group; shut the other "
                             f"groups down first ({others}), or call tilefuse.shutdown() for all")
        targets = [st]
    failure = None
    for st in targets:
        try:
            _shutdown_one(st)
        except BaseException as err:  # the other groups still close (their peers are closing them)
            failure = failure or err
    if failure is not None:
        raise failure


def _shutdown_one(st: _State) -> None:
    stuck = False  # this rank's device work will not finish (a peer exited under it): do not wait for it
    try:
        with using(st):
            if st.heap.device.type == "cuda":
                try:
                    _wait_device(st, "tilefuse.shutdown")
                except PeerExitedError:
                    stuck = True
                    raise
            st.ctl[int(P.CTL_GEN)] = -1  # a CUDA graph replayed after this aborts before touching memory
            for hook in _SHUTDOWN_HOOKS:
                hook()
    finally:
        _forget(st)
        st.heap.close(wait=not stuck)
