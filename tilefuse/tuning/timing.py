"""Timing for the tuner: median of per-call times after warm-up, barrier before each timed call,
cross-rank maximum (the slowest rank decides when a collective op is done).

CUDA events on a GPU; ``time.perf_counter`` in the interpreter (where only relative order matters,
for the end-to-end tuner test).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist


def _cross_rank_max(value: float, group) -> float:
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return value
    values: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(values, value, group=group)
    return max(values)


def median_ms(fn, *, device: torch.device, warmup: int = 3, reps: int = 10, group=None) -> float:
    """Median milliseconds of ``fn()`` over ``reps`` calls, max over ranks."""
    on_gpu = device.type == "cuda"
    multi = dist.is_initialized() and dist.get_world_size(group) > 1
    for _ in range(warmup):
        fn()
    if on_gpu:
        torch.cuda.synchronize(device)
    times = []
    for _ in range(reps):
        if multi:
            dist.barrier(group=group)
        if on_gpu:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return _cross_rank_max(statistics.median(times), group)
