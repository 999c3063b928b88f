"""Device-side API of the symmetric heap: ``@triton.jit`` helpers for remote memory and flags.

Rank convention (the same in every function)
--------------------------------------------
Pointers are *symmetric addresses*: addresses inside the **current** rank's heap. The arguments
that follow the pointers and values are always ``cur_rank`` (the rank this kernel runs on), then
the rank(s) whose copy is touched, then ``heap_bases``::

    load(ptr, cur_rank, peer, heap_bases, mask)           -> value of peer's copy of *ptr
    store(ptr, value, cur_rank, peer, heap_bases, mask)   peer's copy of *ptr = value
    get(dst, src, cur_rank, peer, heap_bases, mask)       my *dst = peer's *src
    put(dst, src, cur_rank, peer, heap_bases, mask)       peer's *dst = my *src
    copy(dst, src, cur_rank, src_rank, dst_rank, ...)     dst_rank's *dst = src_rank's *src
    atomic_<op>(ptr, value, cur_rank, peer, heap_bases, mask, SEM, SCOPE)

``peer == cur_rank`` is legal everywhere and touches local memory.

Flag protocol
-------------
Flags are int32 words on the heap. They are never reset; instead every call of an op carries an
*epoch*, a host counter that grows by one per call of that workspace (the same on every rank, as all
ranks make the same calls). A producer writes its data, then *releases* a flag with
``signal(flag, epoch, ...)`` (an ``atomic_xchg`` with ``sem="release"``, ``scope="sys"``), or
``signal_add(counter, 1, ...)`` when several producers report to one counter (the consumer then
waits for ``epoch * producers``). A consumer *acquires*: :func:`wait` polls the flag in its own
heap with cheap volatile loads until it reaches the target, then takes one ``acquire`` atomic, and
only then reads the data. Waits are on local flags only: a remote producer signals into the
consumer's heap. Each acquire in an op carries one comment naming the release it pairs with.

Bounded waits
-------------
Every wait gives up after ``ctl[CTL_BOUND]`` polls. A wait that gives up records, once per control
block, which rank waited, for which flag address, the target and the value seen, and the rank
expected to write it; later waits see the record and give up at once, so a missing producer costs
one bound, not one per tile. The host turns the record into :class:`tilefuse.WaitTimeoutError` and
clears it (``tilefuse.runtime.world.check_waits``): right after each launch on the CPU; on a GPU
without a sync, at the next op call (a pinned copy of the status word is read), or at
``tilefuse.synchronize()``/``barrier()``. Results of a call whose wait gave up are garbage.

Memory model notes: ``scope`` is ignored by the interpreter and x86 orders everything, so ordering
bugs only show on a GPU: keep data-then-release and acquire-then-data strictly.
"""

from __future__ import annotations

import inspect

import triton
import triton.language as tl

# Control block (int64[CTL_WORDS], one per process, not on the heap) layout. tl.constexpr globals,
# so compiled kernels may read them.
CTL_STATUS = tl.constexpr(0)  # 0: fine; 1: a wait gave up
CTL_RANK = tl.constexpr(1)  # rank that gave up
CTL_SRC = tl.constexpr(2)  # rank expected to write the flag (-1 unknown)
CTL_ADDR = tl.constexpr(3)  # address of the flag in the waiting rank's heap
CTL_TARGET = tl.constexpr(4)
CTL_SEEN = tl.constexpr(5)
CTL_POLLS = tl.constexpr(6)
CTL_BOUND = tl.constexpr(7)  # poll bound, written by the host
CTL_WORDS = tl.constexpr(8)


# Arguments that change from call to call (or rank to rank) and must not make Triton compile a new
# binary: by default it specialises ints equal to 1 or divisible by 16, so an epoch would recompile
# the kernel at epochs 1, 16, ... and rank 1 would run a different binary from its peers.
_RUNTIME_INTS = ("epoch", "cur_rank", "done_target")


def kernel(fn):
    """``triton.jit`` for a kernel launched by tilefuse: epochs and ranks are not specialised on."""
    names = [n for n in inspect.signature(fn).parameters if n in _RUNTIME_INTS]
    return triton.jit(do_not_specialize=names)(fn)


@triton.jit
def translate(ptr, cur_rank, peer, heap_bases):
    """Address of ``ptr`` (a symmetric address of ``cur_rank``) in ``peer``'s heap."""
    # Plain pointer arithmetic by a scalar keeps the compiler's contiguity facts about ``ptr`` (so
    # remote accesses stay vectorised); heap bases are 256-byte aligned, so the element delta is a
    # multiple of 16 elements for every dtype up to 16 bytes.
    ELEM_BYTES: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth // 8
    delta = tl.load(heap_bases + peer) - tl.load(heap_bases + cur_rank)  # bytes
    delta = tl.multiple_of(delta // ELEM_BYTES, 16)
    return ptr + delta


@triton.jit
def load(ptr, cur_rank, peer, heap_bases, mask=None, other=None):
    """Read ``peer``'s copy of ``ptr``."""
    return tl.load(translate(ptr, cur_rank, peer, heap_bases), mask=mask, other=other)


@triton.jit
def store(ptr, value, cur_rank, peer, heap_bases, mask=None):
    """Write ``value`` into ``peer``'s copy of ``ptr``."""
    tl.store(translate(ptr, cur_rank, peer, heap_bases), value, mask=mask)


@triton.jit
def get(dst_ptr, src_ptr, cur_rank, peer, heap_bases, mask=None):
    """Local ``dst`` <- ``peer``'s ``src``."""
    tl.store(dst_ptr, load(src_ptr, cur_rank, peer, heap_bases, mask=mask), mask=mask)


@triton.jit
def put(dst_ptr, src_ptr, cur_rank, peer, heap_bases, mask=None):
    """``peer``'s ``dst`` <- local ``src``."""
    store(dst_ptr, tl.load(src_ptr, mask=mask), cur_rank, peer, heap_bases, mask=mask)


@triton.jit
def copy(dst_ptr, src_ptr, cur_rank, src_rank, dst_rank, heap_bases, mask=None):
    """``dst_rank``'s ``dst`` <- ``src_rank``'s ``src`` (either may be ``cur_rank``)."""
    value = load(src_ptr, cur_rank, src_rank, heap_bases, mask=mask)
    store(dst_ptr, value, cur_rank, dst_rank, heap_bases, mask=mask)


@triton.jit
def atomic_add(ptr, value, cur_rank, peer, heap_bases, mask=None, SEM: tl.constexpr = "acq_rel",
               SCOPE: tl.constexpr = "sys"):
    return tl.atomic_add(translate(ptr, cur_rank, peer, heap_bases), value, mask=mask, sem=SEM, scope=SCOPE)


@triton.jit
def atomic_sub(ptr, value, cur_rank, peer, heap_bases, mask=None, SEM: tl.constexpr = "acq_rel",
               SCOPE: tl.constexpr = "sys"):
    return tl.atomic_add(translate(ptr, cur_rank, peer, heap_bases), -value, mask=mask, sem=SEM, scope=SCOPE)


@triton.jit
def atomic_xchg(ptr, value, cur_rank, peer, heap_bases, mask=None, SEM: tl.constexpr = "acq_rel",
                SCOPE: tl.constexpr = "sys"):
    return tl.atomic_xchg(translate(ptr, cur_rank, peer, heap_bases), value, mask=mask, sem=SEM, scope=SCOPE)


@triton.jit
def atomic_cas(ptr, cmp, value, cur_rank, peer, heap_bases, SEM: tl.constexpr = "acq_rel",
               SCOPE: tl.constexpr = "sys"):
    """Compare-and-swap on ``peer``'s copy; give it int32/int64 operands of the pointer's type."""
    return tl.atomic_cas(translate(ptr, cur_rank, peer, heap_bases), cmp, value, sem=SEM, scope=SCOPE)


@triton.jit
def atomic_and(ptr, value, cur_rank, peer, heap_bases, mask=None, SEM: tl.constexpr = "acq_rel",
               SCOPE: tl.constexpr = "sys"):
    return tl.atomic_and(translate(ptr, cur_rank, peer, heap_bases), value, mask=mask, sem=SEM, scope=SCOPE)


@triton.jit
def atomic_or(ptr, value, cur_rank, peer, heap_bases, mask=None, SEM: tl.constexpr = "acq_rel",
              SCOPE: tl.constexpr = "sys"):
    return tl.atomic_or(translate(ptr, cur_rank, peer, heap_bases), value, mask=mask, sem=SEM, scope=SCOPE)


@triton.jit
def atomic_xor(ptr, value, cur_rank, peer, heap_bases, mask=None, SEM: tl.constexpr = "acq_rel",
               SCOPE: tl.constexpr = "sys"):
    return tl.atomic_xor(translate(ptr, cur_rank, peer, heap_bases), value, mask=mask, sem=SEM, scope=SCOPE)


@triton.jit
def atomic_min(ptr, value, cur_rank, peer, heap_bases, mask=None, SEM: tl.constexpr = "acq_rel",
               SCOPE: tl.constexpr = "sys"):
    return tl.atomic_min(translate(ptr, cur_rank, peer, heap_bases), value, mask=mask, sem=SEM, scope=SCOPE)


@triton.jit
def atomic_max(ptr, value, cur_rank, peer, heap_bases, mask=None, SEM: tl.constexpr = "acq_rel",
               SCOPE: tl.constexpr = "sys"):
    return tl.atomic_max(translate(ptr, cur_rank, peer, heap_bases), value, mask=mask, sem=SEM, scope=SCOPE)


@triton.jit
def signal(flag_ptr, value, cur_rank, peer, heap_bases):
    """Release: set ``peer``'s copy of the int32 flag to ``value`` after all earlier writes."""
    tl.atomic_xchg(translate(flag_ptr, cur_rank, peer, heap_bases), value, sem="release", scope="sys")


@triton.jit
def signal_add(flag_ptr, value, cur_rank, peer, heap_bases):
    """Release: add ``value`` to ``peer``'s copy of the int32 counter after all earlier writes."""
    tl.atomic_add(translate(flag_ptr, cur_rank, peer, heap_bases), value, sem="release", scope="sys")


@triton.jit
def wait(flag_ptr, target, cur_rank, src_rank, ctl_ptr):
    """Acquire: wait until the local int32 flag is >= ``target``; False if the bound ran out.

    ``src_rank`` is the rank expected to write the flag (for the error record; -1 if unknown).
    """
    bound = tl.load(ctl_ptr + CTL_BOUND)
    failed = tl.load(ctl_ptr + CTL_STATUS, volatile=True)
    seen = tl.load(flag_ptr, volatile=True)
    polls = 0
    while (seen < target) & (polls < bound) & (failed == 0):
        seen = tl.load(flag_ptr, volatile=True)
        polls += 1
    # One acquire after the cheap polls: later reads see the data written before the release. A
    # scalar atomic's result is the same for every thread of the program, so all threads take the
    # same branch below even if their polls ended differently.
    seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
    ok = seen >= target
    if not ok:
        zero = tl.zeros([], dtype=tl.int64)
        first = tl.atomic_cas(ctl_ptr + CTL_STATUS, zero, zero + 1)
        if first == 0:
            tl.store(ctl_ptr + CTL_RANK, zero + cur_rank)
            tl.store(ctl_ptr + CTL_SRC, zero + src_rank)
            tl.store(ctl_ptr + CTL_ADDR, tl.cast(flag_ptr, tl.int64))
            tl.store(ctl_ptr + CTL_TARGET, zero + target)
            tl.store(ctl_ptr + CTL_SEEN, zero + seen)
            tl.store(ctl_ptr + CTL_POLLS, zero + polls)
    return ok


@kernel
def barrier_kernel(flags_ptr, heap_bases, ctl_ptr, cur_rank, world, epoch):
    """Device-side barrier over all ranks (one program); ``flags_ptr`` is an int32[world] on the heap.

    Rank r releases slot r on every rank, then waits for every slot of its own to reach ``epoch``.
    Stream order puts every earlier kernel's writes before the release.
    """
    for peer in range(0, world):
        # Release: pairs with the wait below on rank `peer`.
        signal(flags_ptr + cur_rank, epoch, cur_rank, peer, heap_bases)
    for src in range(0, world):
        # Acquire: pairs with the signal above on rank `src`.
        wait(flags_ptr + src, epoch, cur_rank, src, ctl_ptr)
