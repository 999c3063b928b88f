"""Split-K: a tile's K steps computed as slices by different programs, summed by the last of them in
slice order (deterministic; nobody waits), for shapes with too few tiles to fill the multiprocessors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...runtime.call import raw_stream
from ...runtime.world import on_reset
from .tiles import store_tile


@triton.jit
def split_k_work(work_id, K, split_k, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr):
    """Work item ``work_id = tile_id * split_k + slice`` -> ``(tile_id, slice, k_lo, k_hi)`` (a whole
    tile unless ``SPLIT``): programs running together finish the same tiles."""
    if SPLIT:
        tile_id = work_id // split_k
        s = work_id % split_k
        steps = tl.cdiv(K, BLOCK_K)
        return tile_id, s, s * steps // split_k, (s + 1) * steps // split_k
    else:
        return work_id, 0, 0, tl.cdiv(K, BLOCK_K)


@triton.jit
def hand_in_slice(
    acc, tile_id, s, n, slots_per_tile,
    partial_ptr, count_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Store slice ``s`` (of ``n``) of tile ``tile_id`` in its fp32 slot, then count it in (acq_rel);
    returns ``(the tile's first slot, done)``, ``done`` for the last, which finishes the tile."""
    slots = partial_ptr + tile_id.to(tl.int64) * slots_per_tile * (BLOCK_M * BLOCK_N)
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # [BM, BN]
    tl.store(slots + s * (BLOCK_M * BLOCK_N) + offs, acc)
    # Every thread's part of the slot is stored before the one thread's count below.
    tl.debug_barrier()
    # Release (this slot) and acquire (the other slots): pairs with the same atomic of the tile's
    # other slices, in this launch and on this device only (local memory, gpu scope).
    arrived = tl.atomic_add(count_ptr + tile_id, 1, sem="acq_rel", scope="gpu")
    return slots, arrived == n - 1


@triton.jit
def store_slice_sum(
    slots, n, tile_id, count_ptr,
    c_ptr, pid_m, pid_n, M, N, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUB_M: tl.constexpr,
):
    """Store tile (pid_m, pid_n) of C as ``slot 0 + ... + slot n-1`` (fp32, in order), ``SUB_M`` rows at
    a time (a whole 128x256 sum would spill), then reset the tile's count. .cg: other SMs wrote the slots."""
    sub = tl.arange(0, SUB_M)  # [SUB_M]
    cols = tl.arange(0, BLOCK_N)  # [BN]
    offs_n = pid_n.to(tl.int64) * BLOCK_N + cols  # [BN]
    for r in range(0, tl.cdiv(tl.minimum(BLOCK_M, M - pid_m * BLOCK_M), SUB_M)):
        offs = (r * SUB_M + sub)[:, None] * BLOCK_N + cols[None, :]  # [SUB_M, BN] within a slot
        total = tl.load(slots + offs, cache_modifier=".cg")  # [SUB_M, BN]
        for j in range(1, n):
            total += tl.load(slots + j * (BLOCK_M * BLOCK_N) + offs, cache_modifier=".cg")
        offs_m = pid_m.to(tl.int64) * BLOCK_M + r * SUB_M + sub  # [SUB_M]
        store_tile(c_ptr, total, offs_m, offs_n, M, N, stride_cm, stride_cn)
    tl.store(count_ptr + tile_id, 0)


@triton.jit
def slice_sum(
    slots, n, tile_id, count_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """:func:`store_slice_sum`'s fp32 sum [BM, BN], returned (small tiles); resets the tile's count."""
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # [BM, BN]
    total = tl.load(slots + offs, cache_modifier=".cg")  # [BM, BN]
    for j in range(1, n):
        total += tl.load(slots + j * (BLOCK_M * BLOCK_N) + offs, cache_modifier=".cg")
    tl.store(count_ptr + tile_id, 0)
    return total


class StreamScratch:
    """fp32 values and zeroed counts, one set per (device, stream), for kernels whose programs hand work
    to the last of them: every launch leaves the counts at zero (no memset). A CUDA graph capture gets a
    fresh set; :func:`tilefuse.reset` drops them (an aborted call may leave a count behind)."""

    def __init__(self, count_dtype: torch.dtype):
        self.count_dtype = count_dtype
        self._sets: dict = {}

    def get(self, device: torch.device, n_values: int, n_counts: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(values, counts)``: fp32 ``[n_values]`` and ``[n_counts]`` zeros of ``count_dtype``."""
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return (torch.empty(n_values, dtype=torch.float32, device=device),
                    torch.zeros(n_counts, dtype=self.count_dtype, device=device))
        key = (device, 0)
        if device.type == "cuda":
            key = (device, raw_stream(torch.cuda.current_device() if device.index is None else device.index))
        values, counts = self._sets.get(key, (None, None))
        if values is None or values.numel() < n_values:
            values = torch.empty(triton.next_power_of_2(n_values), dtype=torch.float32, device=device)
        if counts is None or counts.numel() < n_counts:
            counts = torch.zeros(triton.next_power_of_2(n_counts), dtype=self.count_dtype, device=device)
        self._sets[key] = (values, counts)
        return values, counts

    def clear(self) -> None:
        self._sets.clear()


SPLIT_K_SCRATCH = StreamScratch(torch.int32)  # partial slots, per-tile counts
on_reset(SPLIT_K_SCRATCH.clear)
