"""Reduction helpers: the order in which an owner sums W staged contributions, and the sums themselves.

Each rank's partial of an output tile sits in a *slot* of a ``stage [W, rows, N]`` heap buffer. Push:
the owner's stage holds every source's contribution, slot = source; pull (``PULL``): every rank's
stage holds its partial of every owner's rows, slot = owner. Sums are fp32 in the fixed order
``((s0 + s1) + s2) + ...`` over ``source_at(i)`` (the order pushed tiles arrive in): the same bits on
every run. Blocks are ``[SUB_M, BN]`` with int32 offsets inside one slot (< 2**31 elements, checked).
"""

import triton
import triton.language as tl

from ...runtime import primitives as P
from .flags import tile_release


@triton.jit
def owner_at(cur_rank, step, world):
    """The owner whose tiles ``cur_rank`` computes at ``step``: cur_rank + 1, cur_rank + 2, ..., itself."""
    return (cur_rank + 1 + step) % world


@triton.jit
def source_at(cur_rank, i, world):
    """The i-th source that owner ``cur_rank`` adds: cur_rank - 1, cur_rank - 2, ..., itself (arrival order)."""
    return (cur_rank + world - 1 - i) % world


@triton.jit
def push_partial(
    block_ptr, part, offs_m, offs_n, rows, N, stride_m, stride_n,
    flag_ptr, epoch, cur_rank, dst, heap_bases,
    RELEASE: tl.constexpr,
):
    """Store the partial tile ``part`` into ``dst``'s copy of the block at ``block_ptr``; with
    ``RELEASE`` then release ``dst``'s flag to ``epoch`` (the caller names the acquire it pairs with)."""
    ptrs = block_ptr + offs_m[:, None] * stride_m + offs_n[None, :] * stride_n  # [BM, BN]
    mask = (offs_m[:, None] < rows) & (offs_n[None, :] < N)  # [BM, BN]
    P.store(ptrs, part, cur_rank, dst, heap_bases, mask=mask)
    if RELEASE:
        tile_release(flag_ptr, epoch, cur_rank, dst, heap_bases)


@triton.jit
def block_offsets(pid_m, pid_n, sub, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUB_M: tl.constexpr):
    """Row [SUB_M] and column [BN] indices (int32) of block ``sub`` of tile (pid_m, pid_n)."""
    offs_m = pid_m * BLOCK_M + sub * SUB_M + tl.arange(0, SUB_M)  # [SUB_M]
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    return offs_m, offs_n


@triton.jit
def slot_ptr(stage_ptr, slot, stride_slot):
    """Base address of slot ``slot`` (64-bit arithmetic: a stage may exceed 2**31 elements)."""
    return stage_ptr + tl.cast(slot, tl.int64) * stride_slot


@triton.jit
def _load_source(stage_ptr, offs, mask, i, heap_bases, cur_rank, world, stride_slot, PULL: tl.constexpr):
    """Source ``source_at(i)``'s contribution to a block, converted to fp32 (zero outside ``mask``)."""
    src = source_at(cur_rank, i, world)
    if PULL:
        part = P.load(slot_ptr(stage_ptr, cur_rank, stride_slot) + offs, cur_rank, src, heap_bases,
                      mask=mask, other=0.0)
    else:
        part = tl.load(slot_ptr(stage_ptr, src, stride_slot) + offs, mask=mask, other=0.0)
    return part.to(tl.float32)


@triton.jit
def sum_slots(
    stage_ptr,
    offs_m, offs_n, rows, N,
    stride_slot, stride_m, stride_n,
    heap_bases, cur_rank, world,
    PULL: tl.constexpr,
):
    """fp32 sum [SUB_M, BN] of the W contributions to a block, in the fixed order, all visible."""
    offs = offs_m[:, None] * stride_m + offs_n[None, :] * stride_n  # [SUB_M, BN] int32
    mask = (offs_m[:, None] < rows) & (offs_n[None, :] < N)  # [SUB_M, BN]
    # Start from s0 itself, not from 0 + s0: the running sum starts there too (and 0.0 + -0.0 is +0.0).
    acc = _load_source(stage_ptr, offs, mask, 0, heap_bases, cur_rank, world, stride_slot, PULL)
    for i in range(1, world):
        acc += _load_source(stage_ptr, offs, mask, i, heap_bases, cur_rank, world, stride_slot, PULL)
    return acc  # [SUB_M, BN] fp32


@triton.jit
def accumulate_slot(
    stage_ptr, run_ptr, c_ptr,
    offs_m, offs_n, rows, N,
    stride_slot, stride_m, stride_n, stride_cm, stride_cn,
    cur_rank, world, i,
):
    """Step i of the push layout's running sum for one block, source i's flag acquired: step 1 adds
    ``s0 + s1``, later ones ``run + s_i`` (fp32 ``run``, W >= 3); the last (or W = 1's step 0) stores ``c``."""
    offs = offs_m[:, None] * stride_m + offs_n[None, :] * stride_n  # [SUB_M, BN] int32
    mask = (offs_m[:, None] < rows) & (offs_n[None, :] < N)  # [SUB_M, BN]
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn  # [SUB_M, BN]
    if i == 0:
        if world == 1:
            own = tl.load(slot_ptr(stage_ptr, source_at(cur_rank, 0, world), stride_slot) + offs, mask=mask)
            tl.store(c_ptrs, own.to(tl.float32).to(c_ptr.dtype.element_ty), mask=mask)
    else:
        part = tl.load(slot_ptr(stage_ptr, source_at(cur_rank, i, world), stride_slot) + offs, mask=mask)
        if i == 1:
            prev = tl.load(slot_ptr(stage_ptr, source_at(cur_rank, 0, world), stride_slot) + offs, mask=mask)
            prev = prev.to(tl.float32)
        else:
            prev = tl.load(run_ptr + offs, mask=mask).to(tl.float32)
        total = prev + part.to(tl.float32)  # [SUB_M, BN] fp32
        if i == world - 1:
            tl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=mask)
        else:
            tl.store(run_ptr + offs, total, mask=mask)
