"""The call protocol on the device: the control block, the begin of a call, its pairing and
signature check, bounded waits, and the end of a call.

Every rank's heap starts with a **control block** (``ctl``, int64 words; layout below). Everything a
kernel compares a flag against lives there and advances on the device in stream order: the host
never knows an epoch, and a captured CUDA graph can be replayed freely.

*Calls pair by sequence.* A call begins with :func:`call_begin_kernel` (one program):

1. ``seq = ctl[SEQ] + 1`` (the call's *epoch*); ``ctl[STATE] = 0`` (the call is live).
2. It stores the call's *signature* (a 62-bit hash of op, variant, shapes, dtype and config) into
   slot ``seq % 2`` of its column in every rank's ``SIG`` table, then releases ``ARRIVE[cur_rank] = seq``
   on every rank.
3. It acquires every rank's ``ARRIVE`` (``seq`` or ``seq + 1``: a peer may be at the next call, never
   further) and compares signatures: a mismatch aborts the call on every rank, with an error record.
4. An aborted call sets ``ctl[STATE] = 1`` (its later kernels do nothing) and its outputs are
   filled with NaN, so no rank returns a result built from another call's data.

Every rank finished call ``seq - 1`` before arriving at ``seq``, so the begin is also a barrier.
A kernel may instead begin and end its call itself (:func:`enter`/:func:`exit`: the first program
with a ticket on ``ctl[ENTER]`` runs steps 2-4 and releases ``ctl[GO]``; the last to finish moves
``ctl[SEQ]`` and writes the host's status words), or begin it beside work that touches nothing
shared (:func:`enter_aside`, :func:`ready`). Calls of every kind mix freely.

*Flags* are int64 heap words holding the sequence number of the call that last wrote them, never
reset (comparisons are wrap-safe). A producer writes its data, then *releases* the flag with
``signal(flag, seq)`` (``atomic_xchg``, ``sem="release"``, ``scope="sys"``) into the consumer's
heap; the consumer *acquires* its local flag with ``wait(flag, seq)``: volatile polls until it
**equals** ``seq``, then one ``acquire`` atomic, and only then reads the data. Each acquire in an op
carries one comment naming the release it pairs with.

*Bounded waits and poisoning.* Every wait gives up after ``ctl[BOUND_NS]`` nanoseconds (the GPU's
global timer; the host clock in the interpreter), writes one error record (kind TIMEOUT: who
waited, for which flag, the target, the value seen, the expected writer) and *poisons* every rank
(``ctl[POISON] = origin rank + 1`` in each block): every wait gives up at once, every later call
aborts, and the host raises on each call until ``tilefuse.reset()``. The host reads the status
words after each call from pinned memory (:mod:`tilefuse.runtime.call`): no device sync.

Timeline of one call on two ranks (flags of one tile shown)::

    rank 0: | begin: SEQ=s, SIG->all, ARRIVE[0]=s->all, wait ARRIVE[*]>=s | GEMM tile -> rank 1, signal F=s |
    rank 1: | begin: SEQ=s, SIG->all, ARRIVE[1]=s->all, wait ARRIVE[*]>=s | ... wait F==s, read tile  |

``scope`` is ignored by the interpreter and x86 orders everything, so ordering bugs only show on a
GPU: keep data-then-release and acquire-then-data strictly.
"""

from __future__ import annotations

import time

import torch
import triton
import triton.language as tl

from . import _env
from .launcher import kernel
from .memory import signal, store

# Control block: int64 words at heap offset 0 of every rank. tl.constexpr globals, so compiled kernels
# may read them. Words 0..CTL_FIXED-1 are fixed; then per-rank tables of `world` words each.
CTL_SEQ = tl.constexpr(0)  # calls begun on this rank: the current call's epoch
CTL_STATE = tl.constexpr(1)  # 0: the current call is live; 1: aborted (its kernels do nothing)
CTL_POISON = tl.constexpr(2)  # 0; 1 + the rank whose wait timed out; -(1 + a rank in reset()): calls abort
CTL_ERRORS = tl.constexpr(3)  # error records written since the host last cleared them
CTL_BOUND_NS = tl.constexpr(4)  # wait bound in nanoseconds (written by the host)
CTL_GEN = tl.constexpr(5)  # workspace generation: a call launched for another generation aborts
# The first error record since the host cleared: what happened and where.
CTL_REC_KIND = tl.constexpr(6)  # one of ERR_*
CTL_REC_SEQ = tl.constexpr(7)  # the call's sequence number
CTL_REC_RANK = tl.constexpr(8)  # the rank that wrote the record
CTL_REC_PEER = tl.constexpr(9)  # the other rank involved (-1 unknown)
CTL_REC_ADDR = tl.constexpr(10)  # TIMEOUT: address of the flag in the waiting rank's heap
CTL_REC_TARGET = tl.constexpr(11)  # TIMEOUT: value waited for; MISMATCH: this rank's signature
CTL_REC_SEEN = tl.constexpr(12)  # TIMEOUT: value seen; MISMATCH/PEER_FAILED: the peer's signature
CTL_REC_NS = tl.constexpr(13)  # TIMEOUT: nanoseconds waited
# Calls whose one kernel begins them itself (enter / exit):
CTL_GO = tl.constexpr(14)  # the sequence number of the last such call whose begin is done
CTL_ENTER = tl.constexpr(15)  # programs of the running kernel that entered it (0 between kernels)
CTL_EXIT = tl.constexpr(16)  # programs of the running kernel that finished (0 between kernels)
CTL_FIXED = tl.constexpr(24)
CTL_PHASES = tl.constexpr(2)  # barriers inside one call (phase_barrier_kernel)

# Error record kinds.
ERR_TIMEOUT = tl.constexpr(1)
ERR_MISMATCH = tl.constexpr(2)  # ranks made different calls (signatures differ)
ERR_PEER_FAILED = tl.constexpr(3)  # a peer's call failed its argument checks
ERR_STALE = tl.constexpr(4)  # a call (e.g. a graph replay) of workspaces that were released

# Signatures are 62-bit hashes; a call that failed its checks sends SIG_FAILED instead.
SIG_FAILED = tl.constexpr(-1)


def ctl_words(world: int) -> int:
    """Words of the control block for ``world`` ranks: fixed part, ARRIVE, SIG[2], BAR[CTL_PHASES]."""
    return int(CTL_FIXED) + (3 + int(CTL_PHASES)) * world


@triton.jit
def _arrive(ctl_ptr, rank):
    return ctl_ptr + CTL_FIXED + rank


@triton.jit
def _sig(ctl_ptr, slot, rank, world):
    return ctl_ptr + CTL_FIXED + world + slot * world + rank


@triton.jit
def _barrier(ctl_ptr, phase, seq, cur_rank, world, heap_bases):
    """Barrier of the ranks on the ``BAR`` row ``phase``, with the value ``seq``."""
    bar = ctl_ptr + CTL_FIXED + 3 * world + phase * world
    for i in range(0, world):
        peer = (cur_rank + i) % world
        # Release: pairs with the acquire below on rank `peer`.
        signal(bar + cur_rank, seq, cur_rank, peer, heap_bases)
    for i in range(0, world):
        src = (cur_rank + i) % world
        # Acquire: pairs with the release above on rank `src`.
        wait(bar + src, seq, cur_rank, src, ctl_ptr, heap_bases, world)


_host_ns = time.monotonic_ns  # the interpreter's clock (a host function the interpreted kernel calls)


if _env.interpreting():

    @triton.jit
    def now_ns():
        """Nanoseconds of a monotonic clock (the host's: the interpreter runs kernels on the CPU)."""
        return tl.cast(_host_ns(), tl.int64)

elif torch.version.hip is not None:  # pragma: no cover - AMD GPUs

    @triton.jit
    def now_ns():
        """Nanoseconds of the GPU's constant 100 MHz real-time counter."""
        ticks = tl.inline_asm_elementwise("s_memrealtime $0\ns_waitcnt lgkmcnt(0)", "=s", [], dtype=tl.int64,
                                          is_pure=False, pack=1)
        return ticks * 10

else:
    from triton.language.extra import cuda as _cuda

    @triton.jit
    def now_ns():
        """Nanoseconds of the GPU's global timer."""
        return _cuda.globaltimer()


@triton.jit
def _write_record(ctl_ptr, kind, seq, cur_rank, peer, addr, target, seen, waited):
    """Write the error record if it is the first since the host cleared them (later ones are counted)."""
    zero = tl.zeros([], dtype=tl.int64)
    if tl.atomic_add(ctl_ptr + CTL_ERRORS, zero + 1) == 0:
        tl.store(ctl_ptr + CTL_REC_KIND, zero + kind)
        tl.store(ctl_ptr + CTL_REC_SEQ, zero + seq)
        tl.store(ctl_ptr + CTL_REC_RANK, zero + cur_rank)
        tl.store(ctl_ptr + CTL_REC_PEER, zero + peer)
        tl.store(ctl_ptr + CTL_REC_ADDR, zero + addr)
        tl.store(ctl_ptr + CTL_REC_TARGET, zero + target)
        tl.store(ctl_ptr + CTL_REC_SEEN, zero + seen)
        tl.store(ctl_ptr + CTL_REC_NS, zero + waited)


@triton.jit
def _poison_all(ctl_ptr, cur_rank, world, heap_bases):
    """Poison every rank's control block (this rank's first): all their waits give up at once."""
    zero = tl.zeros([], dtype=tl.int64)
    for i in range(0, world):
        peer = (cur_rank + i) % world
        signal(ctl_ptr + CTL_POISON, zero + cur_rank + 1, cur_rank, peer, heap_bases)


@triton.jit
def _reached(seen, target, AHEAD: tl.constexpr):
    d = seen - target  # two's complement: wrap-safe
    return (d >= 0) & (d <= AHEAD)


@triton.jit
def wait(flag_ptr, target, cur_rank, src_rank, ctl_ptr, heap_bases, world, AHEAD: tl.constexpr = 0):
    """Acquire: wait until the local int64 flag equals ``target`` (or is at most ``AHEAD`` past it).

    Returns False if the runtime is poisoned or the bound ran out; the latter writes a TIMEOUT
    record and poisons every rank. ``src_rank`` is the rank expected to write the flag (-1 unknown).
    """
    bound = tl.load(ctl_ptr + CTL_BOUND_NS)
    start = now_ns()
    seen = tl.load(flag_ptr, volatile=True)
    poisoned = tl.load(ctl_ptr + CTL_POISON, volatile=True)
    elapsed = start - start
    polls = 0
    while (not _reached(seen, target, AHEAD)) & (poisoned == 0) & (elapsed < bound):
        seen = tl.load(flag_ptr, volatile=True)
        polls += 1
        if polls % 64 == 0:
            poisoned = tl.load(ctl_ptr + CTL_POISON, volatile=True)
            elapsed = now_ns() - start
    # One acquire after the cheap polls: later reads see the data written before the release. A
    # scalar atomic's result is the same for every thread of the program, so all threads take the
    # same branch below even if their polls ended differently.
    seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
    ok = _reached(seen, target, AHEAD)
    if not ok:
        if tl.atomic_add(ctl_ptr + CTL_POISON, 0, sem="acquire", scope="sys") == 0:
            # Every wait of the protocol waits for its call's sequence number: the record names
            # the call by it (ctl[SEQ] is one behind during a one-kernel call).
            _write_record(ctl_ptr, ERR_TIMEOUT, target, cur_rank, src_rank,
                          tl.cast(flag_ptr, tl.int64), target, seen, now_ns() - start)
            _poison_all(ctl_ptr, cur_rank, world, heap_bases)
    return ok


@triton.jit
def _live(ctl_ptr):
    """Whether the current call runs: not aborted (``ctl[STATE]``) and the runtime not poisoned."""
    return (tl.load(ctl_ptr + CTL_STATE, volatile=True) == 0) & (tl.load(ctl_ptr + CTL_POISON, volatile=True) == 0)


@triton.jit
def call_epoch(ctl_ptr):
    """``(seq, live)`` of the current call: its sequence number (the value its flags carry) and
    whether it runs (False: aborted or poisoned; the kernel then does nothing)."""
    return tl.load(ctl_ptr + CTL_SEQ), _live(ctl_ptr)


@triton.jit
def _fill_nan(ptr, n, BLOCK: tl.constexpr):
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(ptr + offs, tl.full([BLOCK], float("nan"), ptr.dtype.element_ty), mask=offs < n)


@triton.jit
def _begin(ctl_ptr, heap_bases, cur_rank, world, sig, gen, seq, out0_ptr, n_out0, out1_ptr, n_out1,
           BLOCK: tl.constexpr):
    """Steps 2-4 of a call's begin for sequence number ``seq`` (one program): signatures, arrival
    barrier, ``ctl[STATE]``, and the outputs filled with NaN if the call aborts."""
    zero = tl.zeros([], dtype=tl.int64)
    live = (tl.load(ctl_ptr + CTL_POISON, volatile=True) == 0).to(tl.int32)  # 1: the call runs
    cur_gen = tl.load(ctl_ptr + CTL_GEN)
    if (live != 0) & (cur_gen != gen):
        _write_record(ctl_ptr, ERR_STALE, seq, cur_rank, -1, 0, gen, cur_gen, 0)
        live = live * 0
    if live != 0:
        slot = seq & 1
        for i in range(0, world):
            peer = (cur_rank + i) % world
            store(_sig(ctl_ptr, slot, cur_rank, world), zero + sig, cur_rank, peer, heap_bases)
            # Release: pairs with the acquire of ARRIVE[cur_rank] below, on rank `peer`.
            signal(_arrive(ctl_ptr, cur_rank), seq, cur_rank, peer, heap_bases)
        for i in range(0, world):
            src = (cur_rank + i) % world
            # Acquire: pairs with the release of ARRIVE[src] above, on rank `src`. A peer may be one
            # call ahead (it passed this call and arrived at the next), never more.
            arrived = wait(_arrive(ctl_ptr, src), seq, cur_rank, src, ctl_ptr, heap_bases, world, AHEAD=1)
            theirs = tl.load(_sig(ctl_ptr, slot, src, world))
            if arrived & (theirs != sig) & (live != 0) & (sig != SIG_FAILED):
                # A rank that failed its own checks raises on its host: only the others record it.
                kind = tl.where(theirs == SIG_FAILED, ERR_PEER_FAILED, ERR_MISMATCH)
                _write_record(ctl_ptr, kind, seq, cur_rank, src, 0, sig, theirs, 0)
            live = live * (arrived & (theirs == sig)).to(tl.int32)
        live = live * (sig != SIG_FAILED).to(tl.int32)
    tl.store(ctl_ptr + CTL_STATE, (1 - live).to(tl.int64))
    if live == 0:
        _fill_nan(out0_ptr, n_out0, BLOCK)
        _fill_nan(out1_ptr, n_out1, BLOCK)


@kernel
def call_begin_kernel(
    ctl_ptr, heap_bases, cur_rank, world, sig, gen,
    # outputs filled with NaN if the call aborts (contiguous; n_out = 0 for none)
    out0_ptr, n_out0, out1_ptr, n_out1,
    BLOCK: tl.constexpr,
):
    """The first kernel of every collective call (one program): pairing, signature check, barrier."""
    seq = tl.load(ctl_ptr + CTL_SEQ) + 1
    tl.store(ctl_ptr + CTL_SEQ, seq)
    _begin(ctl_ptr, heap_bases, cur_rank, world, sig, gen, seq, out0_ptr, n_out0, out1_ptr, n_out1, BLOCK)


# The call protocol as one kernel argument, built by the host once per call (``launch.call_arg``):
#     call = (heap_bases, ctl, rank, world, sig, gen, out0, n_out0, out1, n_out1, status)


@triton.jit
def bases(call):
    return call[0]


@triton.jit
def ctl(call):
    return call[1]


@triton.jit
def rank(call):
    return call[2]


@triton.jit
def world(call):
    return call[3]


@triton.jit
def enter(call, ENTER: tl.constexpr, BLOCK: tl.constexpr = 1024):
    """``(seq, live)`` of the call, as :func:`call_epoch`; with ``ENTER`` the kernel begins the call
    itself in place of :func:`call_begin_kernel` (module docstring). The first program to take a
    ticket (whichever runs first, so none waits on one not running) does the begin; every program
    must then call :func:`exit` with the same ``seq``. Two kernels on two streams may begin a call
    together: they share the tickets and count exits over the programs of both (all resident)."""
    ctl_ptr, heap_bases, cur_rank, n_ranks = call[1], call[0], call[2], call[3]
    if ENTER:
        seq = tl.load(ctl_ptr + CTL_SEQ) + 1
        if tl.atomic_add(ctl_ptr + CTL_ENTER, 1, sem="relaxed", scope="gpu") == 0:
            _begin(ctl_ptr, heap_bases, cur_rank, n_ranks, call[4], call[5], seq, call[6], call[7], call[8], call[9],
                   BLOCK)
            # Release: pairs with the acquire below, in this kernel's other programs.
            tl.atomic_xchg(ctl_ptr + CTL_GO, seq, sem="release", scope="gpu")
        else:
            # Acquire: pairs with the release above, in the program that entered first.
            wait(ctl_ptr + CTL_GO, seq, cur_rank, cur_rank, ctl_ptr, heap_bases, n_ranks)
        live = _live(ctl_ptr)
    else:
        seq, live = call_epoch(ctl_ptr)
    return seq, live


@triton.jit
def enter_aside(call, BLOCK: tl.constexpr = 1024):
    """The call's sequence number, for a kernel that begins the call beside its work: program 0 does
    the begin and releases ``ctl[GO] = seq``; every other program calls :func:`ready` before its
    first access to the heap or the outputs. Program 0 runs first in the interpreter; on a GPU all
    programs must be resident. A kernel whose tiles do not fill its programs gives program 0 none
    (the caller rotates the tile numbering), so no tile waits behind the begin. Ends with
    :func:`exit` (``END``)."""
    ctl_ptr = call[1]
    seq = tl.load(ctl_ptr + CTL_SEQ) + 1
    if tl.program_id(0) == 0:
        _begin(ctl_ptr, call[0], call[2], call[3], call[4], call[5], seq, call[6], call[7], call[8], call[9], BLOCK)
        # Release: pairs with the acquire in _ready, in this kernel's other programs.
        tl.atomic_xchg(ctl_ptr + CTL_GO, seq, sem="release", scope="gpu")
    return seq


@triton.jit
def _ready(ctl_ptr, heap_bases, cur_rank, world, seq):
    # Acquire: pairs with the release in enter_aside, in program 0.
    ok = wait(ctl_ptr + CTL_GO, seq, cur_rank, cur_rank, ctl_ptr, heap_bases, world)
    return ok & _live(ctl_ptr)


@triton.jit
def ready(call, seq):
    """Whether call ``seq`` runs, once its begin is done (:func:`enter_aside`): False if it was
    aborted or the runtime is poisoned (the program must then touch nothing shared)."""
    return _ready(call[1], call[0], call[2], call[3], seq)


@triton.jit
def gate_start(seq, GATE: tl.constexpr):
    """The ``live`` a gated loop starts from: True, a tensor with ``GATE`` (:func:`gate` reassigns
    it), else a constant (the loop's ``if live`` then costs no branch)."""
    if GATE:
        return seq == seq
    else:
        return True


@triton.jit
def gate(live, ctl_ptr, heap_bases, cur_rank, world, seq, GATE: tl.constexpr):
    """``GATE``: :func:`ready` (in a kernel begun with :func:`enter_aside`); else ``live``."""
    if GATE:
        return _ready(ctl_ptr, heap_bases, cur_rank, world, seq)
    else:
        return live


@triton.jit
def exit(call, seq, live, NUM_PROGRAMS, END: tl.constexpr, BARRIER: tl.constexpr = False):
    """The end of a kernel that ends its call (``END``; nothing without). The last of
    ``NUM_PROGRAMS`` programs to finish re-arms the entry counters, moves ``ctl[SEQ]`` to ``seq``
    and copies ``ctl[POISON]``, ``ctl[ERRORS]`` into the host's status words (``call[10]``).
    ``BARRIER`` (a live call): that program first passes a barrier with the other ranks (``BAR``
    phase 0), so what every rank stored into this rank's heap is complete and visible."""
    ctl_ptr, status_ptr = call[1], call[10]
    if END:
        # Acquire-release: the last program sees every other program's writes (error records, and
        # with BARRIER their stores into peers, released again by the barrier's signal: system scope).
        if BARRIER:
            done = tl.atomic_add(ctl_ptr + CTL_EXIT, 1, sem="acq_rel", scope="sys")
        else:
            done = tl.atomic_add(ctl_ptr + CTL_EXIT, 1, sem="acq_rel", scope="gpu")
        if done == NUM_PROGRAMS - 1:
            if BARRIER:
                if live:
                    _barrier(ctl_ptr, 0, seq, call[2], call[3], call[0])
            tl.store(ctl_ptr + CTL_ENTER, 0)
            tl.store(ctl_ptr + CTL_EXIT, 0)
            tl.store(ctl_ptr + CTL_SEQ, seq)
            tl.store(status_ptr, tl.load(ctl_ptr + CTL_POISON, volatile=True))
            tl.store(status_ptr + 1, tl.load(ctl_ptr + CTL_ERRORS, volatile=True))


@kernel
def phase_barrier_kernel(ctl_ptr, heap_bases, cur_rank, world, PHASE: tl.constexpr):
    """A barrier inside a call (one program); does nothing in an aborted call."""
    seq, live = call_epoch(ctl_ptr)
    if live:
        _barrier(ctl_ptr, PHASE, seq, cur_rank, world, heap_bases)
