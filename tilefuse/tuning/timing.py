"""Timing for the tuner: median of per-call times after warm-up, barrier before each timed call,
cross-rank maximum (the slowest rank decides when a collective op is done).

CUDA events on a GPU; ``time.perf_counter`` in the interpreter (where only relative order matters,
for the end-to-end tuner test).
"""

from __future__ import annotations

import math
import os
import statistics
import time

import torch
import torch.distributed as dist


def cross_rank_max(value: float, group) -> float:
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return value
    values: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(values, value, group=group)
    return max(values)


def median_ms(fn, *, device: torch.device, warmup: int = 3, reps: int = 10, group=None) -> float:
    """Median milliseconds of ``fn()`` over ``reps`` calls, max over ranks."""
    return medians_interleaved([fn], device=device, warmup=warmup, reps=reps, group=group)[0]


def medians_interleaved(fns: list, *, device: torch.device, warmup: int = 3, reps: int = 10, group=None) -> list:
    """Median milliseconds of each ``fns[i]()`` over ``reps`` calls, max over ranks, the functions'
    calls interleaved one by one (repetition r starts with function r mod n): a GPU clock that drifts
    or swings under its power cap then reaches every function alike (docs/PERF.md, "Method")."""
    on_gpu = device.type == "cuda"
    multi = dist.is_initialized() and dist.get_world_size(group) > 1
    for _ in range(warmup):
        for fn in fns:
            fn()
    if on_gpu:
        torch.cuda.synchronize(device)
    times: list = [[] for _ in fns]
    n = len(fns)
    for r in range(reps):
        for j in range(n):
            i = (r + j) % n
            if multi:
                dist.barrier(group=group)
            if on_gpu:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fns[i]()
                end.record()
                end.synchronize()
                times[i].append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fns[i]()
                times[i].append((time.perf_counter() - t0) * 1e3)
    return [cross_rank_max(statistics.median(t), group) for t in times]


# A GPU held at its power limit (an H200 at 700 W under large GEMMs) dips to ~1200 MHz about 0.8 s after
# a load starts, when its power reading reaches the cap, then holds 1400-1700 MHz (docs/PERF.md, session
# 3): a method timed in that dip looks 10-15 % slower than in steady use.
SETTLE_S = float(os.environ.get("TILEFUSE_SETTLE_S", "1.5"))


def settle(fn, *, device: torch.device, seconds: float = SETTLE_S, agree=None, max_calls: int = 2000) -> int:
    """Run ``fn()`` back to back for about ``seconds``, so that the next timing starts at steady clocks.

    ``agree(n)`` returns the call count every rank uses (e.g. the maximum over ranks; required when
    ``fn`` is collective). Nothing happens off the GPU or with ``seconds <= 0``. Returns the count.
    """
    if device.type != "cuda" or seconds <= 0:
        return 0
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize(device)
    n = min(max_calls, math.ceil(seconds / max(time.perf_counter() - t0, 1e-6)))
    n = int(agree(n)) if agree is not None else n
    for _ in range(n):
        fn()
    torch.cuda.synchronize(device)
    return n
