"""Timing of benchmark methods: medians of CUDA-event times, calls interleaved between methods.

:func:`bench` returns this rank's median time in ms, :func:`bench_max` the maximum of the ranks'
medians (the slowest rank sets the time of a collective op). On a GPU at world 1 it is
``triton.testing.do_bench(..., return_mode="median")`` (warm-up and repetitions given in ms; do_bench
clears L2 before every timed call). With several ranks every timed call is preceded by an L2 clear,
a device synchronize and a host barrier, and timed with CUDA events; the repetition count is agreed
between ranks so that collective calls stay matched. On the CPU (interpreter) a few calls are timed
with the host clock: correctness smoke only.

:func:`bench_interleaved` times several functions with their calls interleaved one by one (what the
suite uses: the clock of a GPU at its power cap swings, and fixed timing slots would meet fixed
phases of the swing; docs/RESULTS.md, "Method"), and :func:`settle` runs a function until the clocks
have settled before timing starts. :func:`rotating` builds enough input sets that consecutive calls
do not find their inputs in L2.
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from .launch import RankCtx

DEFAULT_L2_BYTES = 64 << 20  # when the device does not report its L2 size
FLUSH_BYTES = 256 << 20  # what do_bench writes to clear L2
# GPU clock cycles a device-side spin runs before every call timed back to back (about 250 us at an
# H200's 1.98 GHz): the host queues the call's launches meanwhile, so its events time the device's
# work alone. Without it a call whose host work outlasts the GPU's (the L2 clear and the call) drains
# the queue, and its window includes host time with the GPU mostly idle.
LEAD_CYCLES = 500_000


def l2_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return DEFAULT_L2_BYTES
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or DEFAULT_L2_BYTES)


def rotating(make, bytes_per_set: int, device: torch.device, max_sets: int = 8) -> list:
    """``make(i)`` for enough ``i`` that the sets together exceed twice the L2 size (at most ``max_sets``)."""
    if device.type != "cuda":
        return [make(0)]
    count = max(1, min(max_sets, math.ceil(2 * l2_bytes(device) / bytes_per_set)))
    return [make(i) for i in range(count)]


class Cycle:
    """Hands out the items of a list in turn (one input set per timed call)."""

    def __init__(self, items: list):
        self.items = items
        self.i = 0

    def __call__(self):
        item = self.items[self.i % len(self.items)]
        self.i += 1
        return item


_FLUSH: dict = {}


def _flush_l2(device: torch.device) -> None:
    buf = _FLUSH.get(device)
    if buf is None:
        buf = _FLUSH[device] = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device=device)
    buf.zero_()


def bench(ctx: RankCtx, fn, *, warmup_ms: float = 25.0, rep_ms: float = 100.0, cpu_reps: int = 3,
          min_reps: int = 5, max_reps: int = 1000, sync_each: bool = False, host_ms: list | None = None) -> float:
    """Median time of ``fn()`` in ms on this rank (see the module docstring for the method).

    At world 1 on a GPU the calls are queued back to back (``triton.testing.do_bench``) unless
    ``sync_each``; otherwise every timed call starts on an idle GPU after a barrier, so its time
    includes the host's work before its first kernel. ``host_ms``, if given, receives the host time
    of every timed call (from the start event's record to the return of ``fn``) on that path.
    Collective when ``ctx.world > 1``: every rank must call it with the same ``fn`` work.
    """
    if not ctx.on_gpu:
        fn()  # warm-up: the interpreter builds its kernels on the first call
        times = []
        for _ in range(cpu_reps):
            ctx.barrier()
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    if ctx.world == 1 and not sync_each:
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    return _event_medians(ctx, [fn], warmup_ms=warmup_ms, rep_ms=rep_ms, min_reps=min_reps, max_reps=max_reps,
                          per_call=True, host_ms=None if host_ms is None else [host_ms])[0]


def _event_medians(ctx: RankCtx, fns: list, *, warmup_ms: float, rep_ms: float, min_reps: int, max_reps: int,
                   per_call: bool, host_ms: list | None) -> list:
    """This rank's median ms of every ``fns[i]()``, timed call by call with CUDA events (see
    :func:`bench_interleaved`); the repetition count is agreed between ranks."""
    for fn in fns:
        fn()  # compile
    ctx.barrier()
    estimate = 0.0
    for fn in fns:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(3):
            fn()
        end.record()
        ctx.sync()
        estimate += ctx.max(start.elapsed_time(end) / 3)  # every rank must run the same count
    per_fn = max(estimate / len(fns), 1e-3)
    n_warm = max(1, int(warmup_ms / per_fn / len(fns)))
    n_rep = max(min_reps, min(max_reps, int(rep_ms / per_fn)))
    for _ in range(n_warm):
        for fn in fns:
            fn()
    k = len(fns)
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in fns]
              for _ in range(n_rep)]
    for r in range(n_rep):
        for j in range(k):
            i = (r + j) % k
            s, e = events[r][i]
            if not per_call:
                torch.cuda._sleep(LEAD_CYCLES)
            _flush_l2(ctx.device)
            if per_call:
                ctx.barrier()
            t0 = time.perf_counter()
            s.record()
            fns[i]()
            t1 = time.perf_counter()
            e.record()
            if per_call and host_ms is not None:
                host_ms[i].append((t1 - t0) * 1e3)
    ctx.sync()
    return [statistics.median(events[r][i][0].elapsed_time(events[r][i][1]) for r in range(n_rep)) for i in range(k)]


def bench_interleaved(ctx: RankCtx, fns: list, *, warmup_ms: float = 25.0, rep_ms: float = 100.0,
                      cpu_reps: int = 3, min_reps: int = 5, max_reps: int = 1000, sync_each: bool = False,
                      host_ms: list | None = None) -> list:
    """Median time in ms of every ``fns[i]()``, the calls interleaved one by one (cross-rank max).

    Repetition r calls every function once, in the order ``r, r+1, ...`` (rotated by one each
    time), each call after an L2 clear and timed with CUDA events: back to back behind a device-side
    spin (:data:`LEAD_CYCLES`) that lets the host queue it, so the time is the device's; with several
    ranks or ``sync_each`` each call instead starts on an idle GPU after a barrier (host time
    included). Drift and oscillation of the GPU's clocks (an H200 at its power cap swings ±5 % with
    a period of about a second: docs/RESULTS.md, "Method") then reach every function alike, where
    timing one function for 100 ms and then the next hands each a different phase of the swing.
    ``rep_ms`` is each function's share of the timed calls. ``host_ms``, if given, is a list of
    lists that receives each function's host time per call (on the per-call-barrier path).
    Collective when ``ctx.world > 1``.
    """
    if not ctx.on_gpu:
        return [bench(ctx, fn, cpu_reps=cpu_reps) for fn in fns]
    medians = _event_medians(ctx, fns, warmup_ms=warmup_ms, rep_ms=rep_ms, min_reps=min_reps, max_reps=max_reps,
                             per_call=ctx.world > 1 or sync_each, host_ms=host_ms)
    return [ctx.max(t) for t in medians]


def bench_max(ctx: RankCtx, fn, **kwargs) -> float:
    """Cross-rank maximum of the per-rank medians of :func:`bench`."""
    return ctx.max(bench(ctx, fn, **kwargs))


def settle(ctx: RankCtx, fn) -> int:
    """Run ``fn()`` back to back until the GPU's clocks have settled under load (collective; see
    :func:`tilefuse.tuning.tuner.settle`), before a shape's methods are timed."""
    from tilefuse.tuning.tuner import settle as _settle

    return _settle(fn, device=ctx.device, agree=ctx.max)


def sync(device: torch.device) -> None:
    """Wait for ``device``'s work (nothing on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def capture_graph(device: torch.device, fn, warmup: int):
    """A CUDA graph of ``fn()``, captured after ``warmup`` eager calls on a side stream (torch's recipe:
    the warm-up makes every lazy allocation and workspace before capture)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    sync(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    sync(device)
    return graph
