"""The call protocol on the device: the control block, the begin of a call, its pairing and
signature check, bounded waits, and the end of a call.

Every rank's heap starts with a **control block** (``ctl``, int64 words, at heap offset 0 on every
rank; layout below). Everything a kernel compares a flag against lives there and advances on the
device, in stream order, so the host never knows an epoch and a captured CUDA graph can be replayed
any number of times.

*Calls pair by sequence.* Every collective call of an op starts with one small kernel,
:func:`call_begin_kernel` (one program), launched on the call's stream before the op's kernels:

1. ``seq = ctl[SEQ] + 1`` (64-bit; the call's *epoch*); ``ctl[STATE] = 0`` (the call is live).
2. It stores the call's *signature* (a 62-bit hash of op, variant, shapes, dtype and config made on
   the host) into slot ``seq % 2`` of its column in every rank's ``SIG`` table, then releases
   ``ARRIVE[cur_rank] = seq`` on every rank.
3. It acquires ``ARRIVE[src]`` of every rank (accepting ``seq`` or ``seq + 1``: a peer that already
   passed this call may have arrived at the next one, never further) and compares the peer's
   signature with its own. Every rank sees the same table, so a mismatch aborts the call on every
   rank, and the error record names both signatures.
4. An aborted call sets ``ctl[STATE] = 1``: every later kernel of that call reads it first and does
   nothing, and the begin kernel fills the call's outputs with NaN, so no rank returns a result
   built from another call's data.

Because every rank finished all its kernels of call ``seq - 1`` (stream order) before it arrives at
``seq``, passing the begin kernel is also a barrier: no rank writes call ``seq``'s data into a peer
that still reads call ``seq - 1``'s.

*One-kernel calls begin themselves.* A call made of a single kernel (every ``wg_specialized``,
gemm_all_reduce's one-shot and gemm_all_scatter's ``fused_sequential``) launches no begin kernel:
its programs start with :func:`enter` and end with :func:`exit`. Every program takes
``seq = ctl[SEQ] + 1`` (no one moves ``ctl[SEQ]`` before the kernel's end); the first program to
take a ticket on ``ctl[ENTER]`` runs steps 2-4 above and releases ``ctl[GO] = seq``; the others
acquire ``ctl[GO]`` before touching anything shared. The last program to finish (a ticket on
``ctl[EXIT]``) re-arms both counters (for gemm_all_scatter first passing the closing barrier with
the other ranks), stores ``ctl[SEQ] = seq`` and writes the status words the host reads (below) into
page-locked host memory. The sequence, the pairing and the barrier are the same as with the begin
kernel, and calls of both kinds mix freely; a call is one launch instead of two. A call of several
kernels whose first kernel is the op's own begins the same way (that kernel also ends with
:func:`exit`, which moves ``ctl[SEQ]``, so the kernels after it read the call's number as
usual), and its last kernel ends with :func:`exit` too, writing the status words: the begin
kernel and the host's status copy are gone from those calls as well (the GEMM core's ``ENTER`` and
``END``); a barrier between two such kernels is passed by the first one's last program
(:func:`exit` with ``BARRIER``). Two kernels that run at the same time on two streams
(``producer_consumer``) begin and end a call together: both take tickets on ``ctl[ENTER]`` (whichever
program of either runs first does the begin) and both count their exits over the programs of both,
so the last program of either ends the call. All of them must be resident at once, as their flags
already require.

*Beginning beside the work.* A one-kernel call whose programs start with work that touches nothing
shared (gemm_all_reduce's one-shot ``fused_sequential`` and ``wg_specialized``, gemm_all_scatter's
``fused_sequential``: K loops over the caller's ``a`` and ``b``) need not wait for the begin first:
:func:`enter_aside` gives the begin to program 0, and every other GEMM program runs its first K
loop and then calls :func:`ready` (acquire ``ctl[GO]``, read the call's state) before it stores
anything, a reducer before its first flag, so the begin's round overlaps the GEMM instead of
preceding it. An aborted call's programs skip their stores; the begin fills the outputs with NaN
as usual.

*Flags.* Data flags are int64 words on the heap that hold the sequence number of the call that last
wrote them. A producer writes its data, then *releases* the flag with ``signal(flag, seq)``
(``atomic_xchg``, ``sem="release"``, ``scope="sys"``); a consumer *acquires* with
``wait(flag, seq)``: cheap volatile polls until the flag **equals** ``seq``, then one ``acquire``
atomic, and only then reads the data. Flags are never reset: a stale flag holds an older sequence
number. Comparisons are wrap-safe (``seen - target`` in two's complement). Waits are on local flags
only: a remote producer signals into the consumer's heap. Each acquire in an op carries one comment
naming the release it pairs with. Barriers inside a call (:func:`phase_barrier_kernel`) use the
``BAR`` slots, one row per phase, with the same value ``seq``.

*Bounded waits and poisoning.* Every wait gives up after ``ctl[BOUND_NS]`` nanoseconds of the
GPU's global timer (the host clock in the interpreter). A wait that gives up writes one error
record (kind TIMEOUT: which rank waited, for which flag, the target, the value seen, the rank
expected to write it) and *poisons* the runtime on every rank (``ctl[POISON] = origin rank + 1``,
stored into each peer's block): every wait anywhere gives up at once, every later call is aborted
on every rank, and the host raises on each op call until the collective ``tilefuse.reset()``.

*The host's side* (``tilefuse.runtime.world``): a call whose argument checks fail still launches
its begin kernel, with an error signature, so the call counts on every rank and the peers' copies
abort with an error naming the failing rank. Error records reach the host without a device sync:
after each call a copy of ``ctl[ERRORS]``/``ctl[POISON]`` is queued into pinned memory (a one-kernel
call's last program writes them there itself) and read at the next call. On the CPU backend
(kernels are synchronous) and with ``TILEFUSE_SYNC_ERRORS=1`` errors raise at the failing call itself.

Timeline of one call on two ranks (flags of one tile shown)::

    rank 0: | begin: SEQ=s, SIG->all, ARRIVE[0]=s->all, wait ARRIVE[*]>=s | GEMM tile -> rank 1, signal F=s |
    rank 1: | begin: SEQ=s, SIG->all, ARRIVE[1]=s->all, wait ARRIVE[*]>=s | ... wait F==s, read tile  |

Memory model notes: ``scope`` is ignored by the interpreter and x86 orders everything, so ordering
bugs only show on a GPU: keep data-then-release and acquire-then-data strictly.
"""

from __future__ import annotations

import time

import torch
import triton
import triton.language as tl

from . import _env
from .launcher import kernel
from .memory import signal, store, translate

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
def _bar(ctl_ptr, phase, rank, world):
    return ctl_ptr + CTL_FIXED + 3 * world + phase * world + rank


# ---------------------------------------------------------------------------------------------
# Clock and bounded waits
# ---------------------------------------------------------------------------------------------


def _host_ns():
    return time.monotonic_ns()


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
        tl.atomic_xchg(translate(ctl_ptr + CTL_POISON, cur_rank, peer, heap_bases), zero + cur_rank + 1,
                       sem="release", scope="sys")


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
    whether it runs (False: aborted or poisoned; the kernel must then do nothing)."""
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


# ---------------------------------------------------------------------------------------------
# The call protocol as one kernel argument
#
#     call = (heap_bases, ctl, rank, world, sig, gen, out0, n_out0, out1, n_out1, status)
#
# built by the host once per call (``launch.call_arg``). A kernel that takes part in the
# protocol takes this one tuple and reaches the heap, its rank and the call's words through it.
# ---------------------------------------------------------------------------------------------


@triton.jit
def bases(call):
    """Every rank's heap base as mapped in this process (``heap_bases``)."""
    return call[0]


@triton.jit
def ctl(call):
    """This rank's control block."""
    return call[1]


@triton.jit
def rank(call):
    """The rank this kernel runs on."""
    return call[2]


@triton.jit
def world(call):
    """The number of ranks."""
    return call[3]


@triton.jit
def enter(call, ENTER: tl.constexpr, BLOCK: tl.constexpr = 1024):
    """``(seq, live)`` of the call, as :func:`call_epoch`; with ``ENTER`` the kernel begins the call
    itself, in place of :func:`call_begin_kernel` (the call's first kernel: one launch less).

    The call's sequence number is ``ctl[SEQ] + 1`` for every program: only the end of a call moves
    ``ctl[SEQ]`` (here :func:`exit`, run last). The first program to enter (a ticket on
    ``ctl[ENTER]``: whichever runs first, so no program waits on one that is not running) does the
    begin's pairing, signature check and barrier and then releases ``ctl[GO] = seq``; the others
    acquire it. Every program of the kernel must then call :func:`exit` with the same ``seq``
    (two kernels on two streams that begin a call together: over the programs of both).
    """
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
    the begin (pairing, signature check, barrier) and releases ``ctl[GO] = seq`` while the other
    programs go on with what touches nothing shared (a GEMM's K loop over the caller's tensors); each
    of them calls :func:`ready` before its first access to the heap or the outputs, and learns
    there whether the call runs. Program 0 runs first in the interpreter's program order, so no
    program waits on one that has not run; on a GPU all programs must be resident. The kernel ends
    with :func:`exit` (``END``), as after :func:`enter`.

    Against :func:`enter`, where every program waits for the begin before any work, the begin's
    latency (its cross-GPU round included) leaves the critical path as long as the programs' first
    K loop outlasts it; a kernel whose tiles do not fill its programs gives program 0 none (the
    caller rotates the tile numbering by one), so that no tile waits behind the begin."""
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
    aborted or the runtime is poisoned (the program must then touch nothing shared). Cheap after
    the program's first call: the flag is already there."""
    return _ready(call[1], call[0], call[2], call[3], seq)


@triton.jit
def gate_start(seq, GATE: tl.constexpr):
    """The ``live`` a gated loop starts from: True, as a tensor with ``GATE`` (the loop reassigns it
    from :func:`gate`), else as a constant (the loop's ``if live`` then costs no branch)."""
    if GATE:
        return seq == seq
    else:
        return True


@triton.jit
def gate(live, ctl_ptr, heap_bases, cur_rank, world, seq, GATE: tl.constexpr):
    """``GATE``: :func:`ready` (before a program's store into anything shared, in a kernel begun
    with :func:`enter_aside`); else ``live`` as it was."""
    if GATE:
        return _ready(ctl_ptr, heap_bases, cur_rank, world, seq)
    else:
        return live


@triton.jit
def exit(call, seq, live, NUM_PROGRAMS, END: tl.constexpr, BARRIER: tl.constexpr = False):
    """The end of a kernel that ends its call (``END``; nothing without): a kernel that began the
    call with :func:`enter` (``ENTER``), or the last kernel of a call whose first kernel did.
    The last of ``NUM_PROGRAMS`` programs to finish (this kernel's, or those of two kernels that
    began the call together) re-arms the entry counters, moves
    ``ctl[SEQ]`` to ``seq`` (for a kernel after the first, the value it already holds) and copies
    ``ctl[POISON]``, ``ctl[ERRORS]`` into ``status_ptr[0:2]`` (the host's status words: page-locked
    host memory on a GPU, read at the next call).

    ``BARRIER`` (a live call): that last program first passes a barrier with the other ranks
    (``BAR`` phase 0), so that the kernel ends only once every rank's programs are done: what they
    stored into this rank's heap is complete and visible (the barrier kernel a call would otherwise
    launch after this one)."""
    ctl_ptr, heap_bases, cur_rank, n_ranks, status_ptr = call[1], call[0], call[2], call[3], call[10]
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
                    for i in range(0, n_ranks):
                        peer = (cur_rank + i) % n_ranks
                        # Release: pairs with the acquire below on rank `peer`.
                        signal(_bar(ctl_ptr, 0, cur_rank, n_ranks), seq, cur_rank, peer, heap_bases)
                    for i in range(0, n_ranks):
                        src = (cur_rank + i) % n_ranks
                        # Acquire: pairs with the release above on rank `src`.
                        wait(_bar(ctl_ptr, 0, src, n_ranks), seq, cur_rank, src, ctl_ptr, heap_bases, n_ranks)
            tl.store(ctl_ptr + CTL_ENTER, 0)
            tl.store(ctl_ptr + CTL_EXIT, 0)
            tl.store(ctl_ptr + CTL_SEQ, seq)
            tl.store(status_ptr, tl.load(ctl_ptr + CTL_POISON, volatile=True))
            tl.store(status_ptr + 1, tl.load(ctl_ptr + CTL_ERRORS, volatile=True))


@kernel
def phase_barrier_kernel(ctl_ptr, heap_bases, cur_rank, world, PHASE: tl.constexpr):
    """A barrier inside a call (one program): work queued before it on any rank is complete and
    visible to work queued after it on every rank. Does nothing in an aborted call."""
    seq, live = call_epoch(ctl_ptr)
    if live:
        for i in range(0, world):
            peer = (cur_rank + i) % world
            # Release: pairs with the acquire below on rank `peer`.
            signal(_bar(ctl_ptr, PHASE, cur_rank, world), seq, cur_rank, peer, heap_bases)
        for i in range(0, world):
            src = (cur_rank + i) % world
            # Acquire: pairs with the release above on rank `src`.
            wait(_bar(ctl_ptr, PHASE, src, world), seq, cur_rank, src, ctl_ptr, heap_bases, world)
