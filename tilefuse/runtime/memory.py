"""The device-side memory API of the symmetric heap: ``@triton.jit`` loads, stores and atomics on
any rank's copy of a symmetric address, and the release ``signal`` of a flag (waits: :mod:`.protocol`).

Pointers are *symmetric addresses*: addresses inside the **current** rank's heap. The arguments
after the pointers and values are always ``cur_rank``, then the rank(s) whose copy is touched, then
``heap_bases`` (``peer == cur_rank`` touches local memory)::

    load(ptr, cur_rank, peer, heap_bases, mask)           -> value of peer's copy of *ptr
    store(ptr, value, cur_rank, peer, heap_bases, mask)   peer's copy of *ptr = value
    get(dst, src, cur_rank, peer, heap_bases, mask)       my *dst = peer's *src
    put(dst, src, cur_rank, peer, heap_bases, mask)       peer's *dst = my *src
    copy(dst, src, cur_rank, src_rank, dst_rank, ...)     dst_rank's *dst = src_rank's *src
    atomic_<op>(ptr, value, cur_rank, peer, heap_bases, mask, SEM, SCOPE)
"""

from __future__ import annotations

import triton
import triton.language as tl


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
    """Release: set ``peer``'s copy of the int64 flag to ``value`` after all earlier writes."""
    tl.atomic_xchg(translate(flag_ptr, cur_rank, peer, heap_bases), value, sem="release", scope="sys")
