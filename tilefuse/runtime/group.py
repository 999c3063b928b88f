"""One process group's runtime state (:class:`Group`), and the groups of this process (:data:`REGISTRY`).

A peer process that exits poisons its group for good (a kernel storing into its memory stalls, so the
host's waits for the device give up: :meth:`Group.wait_device`). :data:`REGISTRY` holds what all
groups share: one lock (one call at a time per process), one :class:`StreamOrder`, the ops' hooks.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from . import _env, errors, hostsync
from . import primitives as P
from .errors import CallMismatchError, PeerExitedError, PoisonedError, WaitTimeoutError
from .heap import SymmetricHeap
from .scope import SCOPE_TEXTS, STATE, hash62

DEFAULT_WAIT_TIMEOUT_S = {"cuda": 30.0, "cpu": 60.0}
_FILL_BLOCK = 1024
_MAX_SIGNATURES = 4096
_ERRORS, _POISON = int(P.CTL_ERRORS), int(P.CTL_POISON)


@dataclass(slots=True)
class StreamOrder:
    """The stream the last call was launched on (shared by every group's calls)."""

    stream: object = None
    raw: int | None = None  # its raw handle: calls on the same stream compare integers


def device_for(backend: str, group) -> torch.device:
    """The heap's device: the group's bound device (``device_id=``), else the current CUDA device, else the CPU."""
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
    """Raise where another CUDA device than the heap's is current (kernels would run on the wrong GPU)."""
    if device.type == "cuda" and torch.cuda.current_device() != device.index:
        raise RuntimeError(f"{what}: this rank's heap is on {device} but the current CUDA device is cuda:"
                           f"{torch.cuda.current_device()}; call torch.cuda.set_device({device.index}) in this "
                           f"thread (or run under `with torch.cuda.device({device.index}):`)")


def watch_peers(group, rank: int) -> tuple:
    """``(rank, pid, pidfd or -1)`` of each peer process in this rank's pid namespace (a host step)."""
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


@dataclass
class Group:
    """tilefuse's state for one process group on this rank: heap, control block, status, signatures, poison."""

    heap: SymmetricHeap
    ctl: torch.Tensor  # int64 control block at heap offset 0 (layout: primitives)
    dummy: torch.Tensor  # float32[1]: the begin kernel's output argument when there is none
    status_host: torch.Tensor | None  # pinned int64[2]: POISON, ERRORS (GPU)
    sync_errors: bool
    status_scratch: torch.Tensor | None = None  # CPU: where a call's exit writes the status words
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
    peers: tuple = ()  # (rank, pid, pidfd or -1) of each peer process this rank can watch
    wait_bound_s: float = 0.0  # the host's copy of ctl[BOUND_NS], seconds
    # GPU, made at open: the host's reads and writes of the control block run on ``side``, beside the call's
    # stream (a stream made while a kernel is stuck may never come: torch makes its stream pool then);
    # ``done_event`` marks the end of the work wait_device waits for; ``watch``, the pinned words it reads.
    side: object = None
    done_event: object = None
    watch: tuple = ()  # (pinned int64 words: CTL_FIXED + ARRIVE, event of their copy)
    order: StreamOrder = field(default_factory=StreamOrder)  # the process's stream order (shared)

    @classmethod
    def open(cls, size: int, group, backend: str, order: StreamOrder) -> Group:
        """Map the heap (collective), with the control block at offset 0, and watch the peers (all or nothing)."""
        if backend == "cpu" and not _env.interpreting():
            raise RuntimeError("the cpu backend runs kernels in Triton's interpreter: set TRITON_INTERPRET=1 "
                               "before importing tilefuse or any Triton kernel")
        bound_s = _env.wait_timeout(DEFAULT_WAIT_TIMEOUT_S[backend])
        heap = SymmetricHeap(size, group, backend, device_for(backend, group))
        ctl = heap.zeros(P.ctl_words(heap.world_size), dtype=torch.int64)
        heap.mark_internal(ctl)  # the heap's first block (offset 0); tilefuse's own: not reported at shutdown
        ctl[int(P.CTL_BOUND_NS)] = int(bound_s * 1e9)
        ctl[int(P.CTL_GEN)] = 1
        on_gpu = heap.device.type == "cuda"
        status_host = torch.zeros(2, dtype=torch.int64, pin_memory=True) if on_gpu else None
        g = cls(heap=heap, ctl=ctl, dummy=torch.zeros(1, dtype=torch.float32, device=heap.device),
                status_host=status_host, status_scratch=None if on_gpu else torch.zeros(2, dtype=torch.int64),
                sync_errors=(not on_gpu) or _env.sync_errors(), on_gpu=on_gpu,
                dev_index=heap.device.index if on_gpu else -1, ctl_status=ctl[_POISON:_ERRORS + 1],
                status_np=status_host.numpy() if on_gpu else None, ctl_np=None if on_gpu else ctl.numpy(),
                group=group, name=hostsync._group_name(group), wait_bound_s=bound_s, order=order)
        if on_gpu:
            g.side, g.done_event = torch.cuda.Stream(heap.device), torch.cuda.Event()
            words = torch.zeros(int(P.CTL_FIXED) + heap.world_size, dtype=torch.int64, pin_memory=True)
            g.watch = (words, torch.cuda.Event())
            # The control block's zeroing must land before any peer can signal into it: a host-only
            # exchange (gloo) below does not wait for this device's queue.
            torch.cuda.synchronize(heap.device)
        try:
            heap.check_symmetric("tilefuse.init", ctl)
            if heap.world_size > 1:
                g.peers = watch_peers(group, heap.rank)
                hostsync.watch(group, g.check_host_step)
        except BaseException:  # a host step that failed or timed out: nothing of this heap stays open
            g.close_peers()
            heap.close()
            raise
        return g

    def exited_peer(self) -> tuple | None:
        """``(rank, pid)`` of a watched peer process that has exited (its pidfd reads ready), else None."""
        fds = [fd for _, _, fd in self.peers if fd >= 0]
        ready = select.select(fds, [], [], 0)[0] if fds else ()
        for r, pid, fd in self.peers:
            if fd in ready:
                return r, pid
            if fd < 0:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return r, pid
                except OSError:
                    pass
        return None

    def check_peers(self, op: str) -> None:
        """Raise :class:`PeerExitedError` (and poison this group) if a peer process has exited."""
        gone = self.exited_peer()
        if gone is not None:
            raise self.peer_exited(gone, f"{op} and every later call on this rank raise (nothing was launched)")

    def check_host_step(self, what: str, calls: bool = True) -> CallMismatchError | None:
        """Between a host step's polls: raise :class:`PeerExitedError` if a peer has exited; with ``calls``,
        a :class:`CallMismatchError` if a peer began a call this rank has not (``hostsync`` raises it)."""
        self.check_peers(what)
        words = self._ctl_words() if calls else None
        if words is None:
            return None
        world, fixed = self.heap.world_size, int(P.CTL_FIXED)
        seq = int(words[int(P.CTL_SEQ)])
        for r in range(world):
            arrived = int(words[fixed + r])
            if r != self.heap.rank and arrived > seq:
                theirs = int(words[fixed + world + (arrived & 1) * world + r])
                text = self.describe(theirs)
                return CallMismatchError(f"{what}: rank {r} began collective call #{arrived} ("
                                         f"{text or f'signature {theirs:#x}'}) while rank {self.heap.rank} is at "
                                         "this host step (a new shape's first call, or e.g. tilefuse.barrier()): "
                                         "the ranks made different calls. Every rank must make the same calls in "
                                         "the same order; call tilefuse.reset() on every rank to go on.")
        return None

    def _ctl_words(self):
        """The control block's fixed words, ARRIVE and SIG as the host sees them, or None while the device runs."""
        if not self.on_gpu:
            return self.ctl_np
        stream = self.order.stream  # None until an eager call (and after a capture: replays may run)
        if stream is None or not stream.query():
            return None
        n = int(P.CTL_FIXED) + 3 * self.heap.world_size
        with torch.cuda.stream(self.side):
            words = self.ctl[:n].to("cpu", non_blocking=False)
        return words.numpy()

    def raise_if_poisoned(self) -> None:
        """Raise the error this group was poisoned with, if any (PeerExitedError where a peer has exited)."""
        if self.poisoned:
            if self.poison_error is not PeerExitedError and self.peers:
                self.check_peers("this call")
            raise self.poison_error(self.poisoned)

    def peer_exited(self, gone: tuple, what: str) -> PeerExitedError:
        """Poison this group for the exited peer ``gone`` = (rank, pid); the error to raise."""
        rank, pid = gone
        self.poisoned = (f"tilefuse: rank {rank} (pid {pid}) of group {errors.describe_group(self.group)} has exited; "
                         f"{what}. A process cannot rejoin a heap, nor tilefuse.reset() bring it back: the group "
                         "must be re-created (tilefuse.shutdown(), a new process group with a live process in "
                         "its place, tilefuse.init()), or the job restarted")
        self.poison_error = PeerExitedError
        return PeerExitedError(self.poisoned)

    def poison_all(self, value: int) -> None:
        """Set every rank's poison word to ``value`` from the host, on a stream of its own (this rank's may be busy)."""
        heap = self.heap
        with torch.cuda.stream(self.side) if self.on_gpu else contextlib.nullcontext():
            for r in range(heap.world_size):
                heap.peer_view(self.ctl, r)[_POISON:_POISON + 1].fill_(value)
        if self.on_gpu:
            self.side.synchronize()

    def close_peers(self) -> None:
        if self.heap.world_size > 1:
            with contextlib.suppress(Exception):
                hostsync.watch(self.group, None)
        for _, _, fd in self.peers:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.peers = ()

    def wait_device(self, what: str) -> None:
        """``torch.cuda.synchronize`` of the heap's device, bounded where tilefuse can tell the work will not
        end: polls an event behind the last call's stream. :class:`PeerExitedError` ``wait_bound_s`` after a
        peer exited; :class:`HostTimeoutError` once it has waited ``TILEFUSE_HOST_TIMEOUT`` with this rank's
        poison word set (every tilefuse wait on the device has ended by then: a kernel there is stuck)."""
        if self.peers:
            stream = self.order.stream
            if stream is None or stream.device != self.heap.device:  # (the event belongs to the heap's device)
                stream = torch.cuda.current_stream(self.heap.device)
            event = self.done_event
            event.record(stream)
            t0 = time.monotonic()
            check_at, give_up, stuck_at, words = t0 + 1e-3, None, t0 + _env.host_timeout(), None
            # Spins, yielding the CPU, as the CUDA runtime's own wait does (a sleep costs the timer's slack).
            while not event.query():
                os.sched_yield()
                now = time.monotonic()
                if now < check_at:
                    continue
                check_at = now + 1e-3
                gone = self.exited_peer()
                if gone is not None:
                    give_up = now + self.wait_bound_s if give_up is None else give_up
                    if now >= give_up:
                        raise self.peer_exited(gone, f"{what} gave up on this rank's unfinished device work "
                                                     f"after {now - t0:.1f} s, and every later call raises")
                if now >= stuck_at:
                    if words is None:
                        words = self._read_fixed_words()
                    elif words[1].query():
                        if int(words[0][_POISON]):
                            raise self._stuck(what, now - t0, words[0].tolist())
                        words, stuck_at = None, now + 1.0  # not poisoned: long work, asked again in a second
        torch.cuda.synchronize(self.heap.device)

    def _read_fixed_words(self) -> tuple:
        """``(pinned int64 copy, event)``: this rank's fixed control words and ARRIVE row, copied on the side
        stream (the call's stream is what the caller waits for)."""
        words, done = self.watch
        with torch.cuda.stream(self.side):
            words.copy_(self.ctl[:words.numel()], non_blocking=True)
            done.record(self.side)
        return words, done

    def _stuck(self, what: str, waited: float, words: list) -> hostsync.HostTimeoutError:
        """Poison this rank for a device that does not finish (``words``: :meth:`_read_fixed_words`): the error."""
        fixed = int(P.CTL_FIXED)
        state = (f"call #{words[int(P.CTL_SEQ)]} ({'aborted' if words[int(P.CTL_STATE)] else 'live'}), begun "
                 f"through #{words[int(P.CTL_GO)]}, the running kernel's programs {words[int(P.CTL_ENTER)]} entered "
                 f"and {words[int(P.CTL_EXIT)]} finished, calls begun by rank {words[fixed:]}")
        self.poisoned = (f"tilefuse: {what}: rank {self.heap.rank}'s device work has not finished after "
                         f"{waited:.0f} s (TILEFUSE_HOST_TIMEOUT) although its control block is poisoned, so "
                         "every tilefuse wait there has ended: a kernel on this rank's device is stuck (control "
                         f"block: {state}). Every later call on this rank raises until tilefuse.reset() finds the "
                         "device idle")
        self.poison_error = hostsync.HostTimeoutError
        return hostsync.HostTimeoutError(self.poisoned)

    def status_set(self) -> bool:
        """Whether the error or poison word is set (on a GPU: as of the last call's status copy)."""
        if self.on_gpu:
            return bool(self.status_np[0] or self.status_np[1])
        return bool(self.ctl_np[_ERRORS] or self.ctl_np[_POISON])

    def collect(self, sync: bool) -> Exception | None:
        """The error the device recorded since the last check, if any (clears it); syncs when asked or needed."""
        capturing = self.on_gpu and torch.cuda.is_current_stream_capturing()
        # No device sync inside a capture: read what earlier calls left in pinned memory.
        if self.on_gpu and (capturing or not sync) and not self.status_set():
            return None
        if capturing:
            return RuntimeError("tilefuse: an error was recorded before this CUDA graph capture; "
                                "call tilefuse.synchronize() before capturing to see it")
        if self.on_gpu:
            self.wait_device("waiting for this rank's device")
        elif not self.status_set():
            return None
        rec = errors.take_record(self)
        if rec is None:
            return None
        err = errors.error_from(self, rec) if rec["errors"] else None
        if rec["poison"]:
            self.poisoned = errors.poison_message(rec)
            # A peer's reset (a negative word) raises here only where the call recorded nothing else.
            if err is None or not (isinstance(err, WaitTimeoutError) or rec["poison"] < 0):
                err = PoisonedError(self.poisoned)
            gone = self.exited_peer() if self.peers else None
            if gone is not None:  # the wait timed out because the peer is gone
                err = self.peer_exited(gone, "a device wait gave up on it, and every later call raises")
        return err

    def signature(self, key: tuple) -> int:
        """A 62-bit hash of a call's signature, the same on every rank, mixed with this thread's scope."""
        hit = self.sigs.get(key)
        if hit is None:
            if len(self.sigs) >= _MAX_SIGNATURES:  # a server with ever-new shapes: keep the cache bounded
                self.sigs.clear()
                self.texts.clear()
            text = ", ".join(str(k) for k in key)
            hit = self.sigs[key] = (hash62(text), text)
            self.texts[hit[0]] = text
        return hit[0] ^ STATE.mix

    def describe(self, value: int) -> str | None:
        """The text of the call whose signature hash is ``value`` (with its scope), if this rank made it."""
        text = self.texts.get(value)
        if text is not None:
            return text
        for mix, scope in SCOPE_TEXTS.items():
            text = self.texts.get(value ^ mix)
            if text is not None:
                return f"{text}; in {scope}"
        return None

    def begin_args(self, sig: int, outputs: tuple) -> tuple:
        """``sig, gen, out0, n_out0, out1, n_out1``: the begin's arguments (up to two contiguous floating
        outputs, NaN-filled if the call aborts; not float8: Triton 3.6 makes no float8 constant)."""
        outs = [t for t in outputs
                if t is not None and t.is_contiguous() and t.dtype.is_floating_point and t.element_size() > 1]
        o0 = outs[0] if outs else self.dummy
        o1 = outs[1] if len(outs) > 1 else self.dummy
        return sig, self.gen, o0, o0.numel() if outs else 0, o1, o1.numel() if len(outs) > 1 else 0

    def launch_begin(self, sig: int, outputs: tuple = ()) -> None:
        """The begin kernel: opens the call with signature hash ``sig`` on the device."""
        heap = self.heap
        P.call_begin_kernel[(1,)](self.ctl, heap.heap_bases, heap.rank, heap.world_size,
                                  *self.begin_args(sig, outputs), BLOCK=_FILL_BLOCK, num_warps=1)

    def note_end(self, capturing: bool, mirrored: bool = False) -> None:
        """After a call's launches: queue the status words' copy to the host (unless a kernel wrote them)."""
        if not self.on_gpu:
            return
        if capturing:
            self.order.stream = self.order.raw = None  # the next eager call waits on nothing recorded in the graph
        if not mirrored:
            self.status_host.copy_(self.ctl_status, non_blocking=True)

    def bump_generation(self) -> None:
        """Calls launched for an earlier generation (CUDA graph replays) abort from now on."""
        self.gen += 1
        self.ctl[int(P.CTL_GEN)] = self.gen


@dataclass(slots=True, eq=False)
class Registry:
    """The groups of this process."""

    by_group: dict = field(default_factory=dict)  # process group -> Group, in the order of init
    by_name: dict = field(default_factory=dict)  # group name -> Group
    default: Group | None = None
    lock: object = field(default_factory=threading.RLock)
    order: StreamOrder = field(default_factory=StreamOrder)
    reset_hooks: list = field(default_factory=list)
    shutdown_hooks: list = field(default_factory=list)

    def add(self, g: Group) -> None:
        self.by_group[g.group] = self.by_name[g.name] = g
        if self.default is None:
            self.default = g

    def forget(self, g: Group) -> None:
        """Drop ``g`` (its heap is closed by the caller); the default goes last."""
        g.close_peers()
        for reg, key in ((self.by_group, g.group), (self.by_name, g.name)):
            if reg.get(key) is g:
                del reg[key]
        if self.default is g:
            self.default = next(iter(self.by_group.values()), None)

    def find(self, group) -> Group | None:
        """The group state serving ``group`` (a ProcessGroup or its name; None: the default), or None."""
        if group is None:
            return self.default
        g = self.by_group.get(group)
        if g is not None:
            return g
        if isinstance(group, str):
            return self.by_name.get(group)
        try:
            name = hostsync._group_name(group)
        except Exception:  # not a process group, or one this rank is not a member of
            return None
        return self.by_name.get(name)  # another Python object for the same group (its name resolved again)

    def get(self, group, what: str = "tilefuse") -> Group:
        """:meth:`find`, raising where the group was never initialised on this rank."""
        g = self.find(group)
        if g is not None:
            return g
        if self.default is None or group is None:
            raise RuntimeError(f"{what}: tilefuse is not initialised on this rank: call tilefuse.init() first")
        rank = dist.get_rank() if dist.is_initialized() else -1
        known = ", ".join(errors.describe_group(s.group) for s in self.by_group.values())
        raise RuntimeError(f"{what}: tilefuse is not initialised for process group {errors.describe_group(group)} on "
                           f"global rank {rank}: call tilefuse.init(group=...) with that group on every rank of "
                           f"it first (each process group has a heap of its own; initialised here: {known})")


REGISTRY = Registry()
