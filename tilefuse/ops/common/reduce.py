"""Reduction helpers: the order in which an owner sums W staged contributions, and the sums themselves.

A reduce-scatter stages each rank's fp32 partial of an output tile in a *slot* of a
``stage [W, rows, N]`` heap buffer. Two layouts use the same buffer shape:

- push: the owner's stage holds every source's contribution, slot = source rank; the owner reads
  its own heap.
- pull (``PULL=True``): every rank's stage holds its own partial of every owner's rows,
  slot = owner rank; the owner reads slot ``cur_rank`` from each peer's heap.

Sums run over sources in a fixed order, so the result has the same bits on every run:
``cur_rank - 1, cur_rank - 2, ..., cur_rank`` (own contribution last, see :func:`source_at`). That is
also the order in which pushed tiles arrive when rank s computes the tiles of owner s + 1 first
(:func:`owner_at`).

Blocks are ``[SUB_M, BN]`` slices of a tile with int32 offsets inside one slot (the host checks that
a slot has fewer than 2**31 elements), so that the accumulator, a loaded block and its offsets fit
in registers.
"""

import triton
import triton.language as tl

from ...runtime import primitives as P


@triton.jit
def owner_at(cur_rank, step, world):
    """The owner whose tiles ``cur_rank`` computes at ``step``: cur_rank + 1, cur_rank + 2, ..., itself."""
    return (cur_rank + 1 + step) % world


@triton.jit
def source_at(cur_rank, i, world):
    """The i-th source that owner ``cur_rank`` adds: cur_rank - 1, cur_rank - 2, ..., itself (arrival order)."""
    return (cur_rank + world - 1 - i) % world


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
def sum_slots(
    stage_ptr,
    offs_m, offs_n, rows, N,
    stride_slot, stride_m, stride_n,
    heap_bases, cur_rank, world,
    SUB_M: tl.constexpr, BLOCK_N: tl.constexpr, PULL: tl.constexpr,
):
    """fp32 sum [SUB_M, BN] of the W contributions to the block at (offs_m, offs_n), in fixed order.

    Every contribution must be complete and visible (after a barrier). Elements outside
    ``rows x N`` read as zero.
    """
    offs = offs_m[:, None] * stride_m + offs_n[None, :] * stride_n  # [SUB_M, BN] int32
    mask = (offs_m[:, None] < rows) & (offs_n[None, :] < N)  # [SUB_M, BN]
    acc = tl.zeros((SUB_M, BLOCK_N), dtype=tl.float32)  # [SUB_M, BN]
    for i in range(0, world):
        src = source_at(cur_rank, i, world)
        if PULL:
            ptrs = slot_ptr(stage_ptr, cur_rank, stride_slot) + offs
            acc += P.load(ptrs, cur_rank, src, heap_bases, mask=mask, other=0.0)
        else:
            acc += tl.load(slot_ptr(stage_ptr, src, stride_slot) + offs, mask=mask, other=0.0)
    return acc


@triton.jit
def accumulate_slot(
    stage_ptr, c_ptr,
    offs_m, offs_n, rows, N,
    stride_slot, stride_m, stride_n, stride_cm, stride_cn,
    cur_rank, world, i,
):
    """Step i of a running sum in the push layout, for one [SUB_M, BN] block of the owner's rows.

    The running sum lives in the slot of the first source, ``source_at(0)``: step 0 leaves it as it
    is; step i in 1 .. W-2 adds source ``source_at(i)``'s slot to it; the last step adds the last
    source's slot and stores the sum into ``c`` in c's dtype. The caller acquired source i's flag.
    """
    offs = offs_m[:, None] * stride_m + offs_n[None, :] * stride_n  # [SUB_M, BN] int32
    mask = (offs_m[:, None] < rows) & (offs_n[None, :] < N)  # [SUB_M, BN]
    run_ptrs = slot_ptr(stage_ptr, source_at(cur_rank, 0, world), stride_slot) + offs  # [SUB_M, BN]
    if i == world - 1:
        part = tl.load(slot_ptr(stage_ptr, source_at(cur_rank, i, world), stride_slot) + offs, mask=mask)
        if i > 0:
            part = tl.load(run_ptrs, mask=mask) + part
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn  # [SUB_M, BN]
        tl.store(c_ptrs, part.to(c_ptr.dtype.element_ty), mask=mask)
    elif i > 0:
        part = tl.load(slot_ptr(stage_ptr, source_at(cur_rank, i, world), stride_slot) + offs, mask=mask)
        tl.store(run_ptrs, tl.load(run_ptrs, mask=mask) + part, mask=mask)
