"""First-call tuning: the collective protocol that times a few candidates on a call's own operands
(``tilefuse/tuning/README.md``, "First-call tuning"). Every rank runs the same steps in the same order:
a rank that called a candidate once more than its peers would hang them."""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..runtime import hostsync

log = logging.getLogger("tilefuse")

MARGIN = 0.02  # a fused variant replaces plain only if at least this much faster
MIN_REPS = 3
MAX_REPS = 25
ROUND_SHARE = 0.6  # of the budget for the round of every candidate; the rest confirms the pick
BUDGET_S = 1.0  # seconds of timed calls per first-call tuning (rank 0's value); compiling is outside it
MIN_PLAIN_MS = 0.2  # TILEFUSE_AUTOTUNE unset: only calls whose plain path takes at least this long tune
EXCHANGE_TIMEOUT_S = 120.0
BLOCK_CALLS = 3  # calls per back-to-back block on a GPU ...
LONG_CALL_S = 2e-3  # ... or 1 where a call takes this long (host work and rank skew are small beside it)
GRAPH_MARGIN = 0.05  # the device-time win a variant needs over plain to run inside CUDA graphs
_SLEEP_CYCLES_PER_MS: dict = {}
_TIMER: list = [None]  # the replacement clock, as timer(name, kind)
_DEVICE_TIMING: list = [False]  # set_timer(..., device_timing=True): step 4 runs off a GPU too (tests)


def set_timer(timer, *, device_timing: bool = False) -> None:
    """Replace the clock: ``timer(name, kind) -> ms`` gives each sample of the candidate ``name``; ``kind``
    is ``"call"`` (one call alone), ``"block"`` (per call back to back) or, with ``device_timing``,
    ``"device"`` (step 4, run wherever the calls run). ``None`` restores the clock."""
    _DEVICE_TIMING[0] = bool(device_timing) and timer is not None
    _TIMER[0] = timer


def all_gather(obj, group, *, what: str) -> list:
    """Every rank's ``obj`` in group-rank order (``[obj]`` at world 1)."""
    if dist.get_world_size(group) == 1:
        return [obj]
    return list(hostsync.all_gather_object(obj, group, what=what, timeout=EXCHANGE_TIMEOUT_S))


def _barrier(group, what: str) -> None:
    if dist.get_world_size(group) > 1:
        hostsync.barrier(group, what=what, timeout=EXCHANGE_TIMEOUT_S)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _sleep_cycles_per_ms(device: torch.device) -> float:
    """Clock cycles of ``torch.cuda._sleep`` per millisecond on ``device`` (measured once)."""
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _SLEEP_CYCLES_PER_MS:
        cycles = 2_000_000
        torch.cuda._sleep(cycles)  # the first launch pays its own setup
        _SLEEP_CYCLES_PER_MS[key] = cycles / max(cuda_ms_per_call(lambda: torch.cuda._sleep(cycles), 1), 1e-3)
    return _SLEEP_CYCLES_PER_MS[key]


def cuda_ms_per_call(call, calls: int) -> float:
    """Milliseconds per call of ``calls`` calls queued on the current stream (CUDA events; waits for them)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def _measure(name: str, call, device: torch.device, block_calls: int = BLOCK_CALLS,
             queue_ms: float | None = None) -> tuple[float, float, float]:
    """One sample ``(call_ms, block_ms, device_ms)``: one call alone (host work included), per call of
    ``block_calls`` back to back and, given ``queue_ms`` (host ms to queue them), per call queued behind a
    longer device sleep as a CUDA graph replays them. Off a GPU one host-timed call stands for all three."""
    if device.type == "cuda":
        # A collective lead-in call and a device synchronize align the ranks: a host barrier alone
        # releases them up to its polling interval apart, a wait the events would count.
        call()
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        block = dev = cuda_ms_per_call(call, block_calls)  # queued right behind it; waits for both
        one = start.elapsed_time(end)
        if queue_ms is not None:  # the device sleeps while the host queues the calls: the events see device work only
            torch.cuda._sleep(int(_sleep_cycles_per_ms(device) * min(20.0, 1.5 * queue_ms + 0.05)))
            dev = cuda_ms_per_call(call, block_calls)
    else:
        t0 = time.perf_counter()
        call()
        one = block = dev = (time.perf_counter() - t0) * 1e3
        if queue_ms is not None:  # device timing asked for off a GPU (tests): the calls are made as on one
            for _ in range(block_calls):
                call()
    if (timer := _TIMER[0]) is not None:
        one, block = float(timer(name, "call")), float(timer(name, "block"))
        dev = dev if queue_ms is None else float(timer(name, "device"))
    return one, block, (block if queue_ms is None else dev)


def time_plain(call, device: torch.device, group) -> float:
    """One warm-up call, then the ms of one call alone (:func:`_measure`), the maximum over the ranks."""
    call()
    _sync(device)
    _barrier(group, "autotune: plain time")
    return max(all_gather(_measure("plain", call, device, block_calls=1)[0], group, what="autotune: plain time"))


@dataclass(frozen=True)
class Candidate:
    name: str  # unique in the set: the variant, or "variant#i" for a second config of it
    variant: str
    config: object  # Config or None (the variant's own default)
    call: object  # () -> result


@dataclass(frozen=True)
class Result:
    variant: str
    config: object
    times: dict  # candidate name -> ms per call timed alone (max over ranks); dropped candidates absent
    dropped: dict  # candidate name -> why
    reps: int
    block: dict = field(default_factory=dict)  # candidate name -> ms per call back to back (max over ranks)
    spread: dict = field(default_factory=dict)  # candidate name -> relative uncertainty of its medians
    confirmed: dict | None = None  # the confirmation round's {"times", "block", "spread"}, if one ran
    graph_confirmed: dict | None = None  # the graph pick's confirmation round {"device", "spread", "reps"}
    device: dict = field(default_factory=dict)  # candidate name -> device ms per call (GPU, short calls)
    graph_variant: str | None = None  # what to run inside CUDA graphs (decided on device time)
    graph_config: object = None
    warm_up_s: float = 0.0  # seconds the warm-up took (compiling, checking), max over ranks (screen only)


def _first(result):
    return result[0] if isinstance(result, tuple) else result


def decide(times: dict, margin: float = MARGIN, *, block: dict | None = None, spread: dict | None = None) -> str:
    """The candidate to run, or ``"plain"``: of those faster than plain by ``margin`` (or twice the
    combined relative uncertainty ``spread`` of the two medians, where larger) both alone (``times``)
    and, where given, back to back (``block``), the one whose worse ratio to plain is smallest (ties by name)."""
    if "plain" not in times or (block is not None and "plain" not in block):
        return "plain"
    best, best_ratio = "plain", 1.0
    for name in sorted(times):
        if name == "plain" or (block is not None and name not in block):
            continue
        noise = math.hypot(spread.get(name, 0.0), spread.get("plain", 0.0)) if spread else 0.0
        ratio = max(t[name] / t["plain"] if t["plain"] > 0 else math.inf for t in (times, block) if t is not None)
        if ratio <= 1.0 - max(margin, 2.0 * noise) and ratio < best_ratio:
            best, best_ratio = name, ratio
    return best


def _rel_uncertainty(samples: list) -> float:
    """Relative standard error of the median of ``samples``, from their interquartile range (normal
    samples: IQR = 1.349 sigma, and the median's error is 1.2533 sigma / sqrt(n))."""
    if len(samples) < 2:
        return 0.0
    q1, med, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return 1.2533 / 1.349 * (q3 - q1) / med / math.sqrt(len(samples)) if med > 0 else 0.0


def _timed_round(cands: list, reps: int, device: torch.device, group, what: str,
                 block_calls: int = BLOCK_CALLS, queue_ms: dict | None = None) -> tuple[dict, ...]:
    """``reps`` interleaved samples of every candidate, one host barrier each: per candidate, maximum over
    the ranks, ``(call ms, block ms, relative uncertainty, device ms, its relative uncertainty)``."""
    samples: dict = {c.name: ([], [], []) for c in cands}
    for r in range(reps):
        _barrier(group, f"autotune {what}: timing")
        for j in range(len(cands)):
            c = cands[(r + j) % len(cands)]
            got = _measure(c.name, c.call, device, block_calls, None if queue_ms is None else queue_ms[c.name])
            for kept, value in zip(samples[c.name], got):
                kept.append(value)
    med, unc = statistics.median, _rel_uncertainty
    mine = {name: (med(one), med(block), max(unc(one), unc(block)), med(dev), unc(dev))
            for name, (one, block, dev) in samples.items()}
    views = all_gather(mine, group, what=f"autotune {what}: times")
    return tuple({c.name: max(v[c.name][i] for v in views) for c in cands} for i in range(5))


def _reps(budget: float, cost_s: float) -> int:
    return int(min(MAX_REPS, max(MIN_REPS, budget // max(cost_s, 1e-9))))


def _warm_up(candidates: list[Candidate], device: torch.device, group, what: str, budget: float | None):
    """Step 1: every candidate called once, checked against plain, timed for one call; one exchange.
    Returns ``(kept, dropped, one_s, block_calls, budget, warm_up_s)``: maximum over ranks, rank 0's budget."""
    if not candidates or candidates[0].name != "plain":
        raise ValueError("autotune: the candidates must start with the plain path")
    t0 = time.perf_counter()
    ref = _first(candidates[0].call()).detach().clone()  # a candidate writing the same out= must not change it
    tolerance = 1e-4 if ref.dtype == torch.float32 and device.type != "cuda" else 2e-2
    failed = {}
    for c in candidates[1:]:
        try:
            got = _first(c.call()).float()
            _sync(device)
            err = float((got - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))
            if not err < tolerance:
                raise AssertionError(f"relative error {err:.3g} against the plain path")
        except Exception as exc:  # a candidate that fails on any rank is dropped on every rank
            failed[c.name] = f"{type(exc).__name__}: {exc}"[:200]
    _sync(device)
    call_s = {}
    for c in candidates:
        if c.name not in failed:
            t1 = time.perf_counter()
            c.call()
            _sync(device)
            call_s[c.name] = time.perf_counter() - t1
    mine = {"failed": failed, "call_s": call_s, "budget_s": BUDGET_S if budget is None else float(budget),
            "warm_up_s": time.perf_counter() - t0}
    views = all_gather(mine, group, what=f"autotune {what}: warm-up")
    dropped = {}
    for r, v in enumerate(views):
        for name, why in v["failed"].items():
            dropped.setdefault(name, f"rank {r}: {why}")
    kept = [c for c in candidates if c.name not in dropped]
    one_s = {c.name: max(v["call_s"].get(c.name, 0.0) for v in views) for c in kept}
    block_calls = BLOCK_CALLS if max(one_s.values()) < LONG_CALL_S else 1
    return kept, dropped, one_s, block_calls, views[0]["budget_s"], max(v["warm_up_s"] for v in views)


def screen(candidates: list[Candidate], *, device: torch.device, group, what: str, reps: int) -> Result:
    """Steps 1 and 2 of :func:`tune` and no decision (``variant`` plain): the offline tuner's shortlist;
    collective over ``group``."""
    kept, dropped, _, block_calls, _, warm_up_s = _warm_up(candidates, device, group, what, 0.0)
    reps = max(1, int(reps))
    times, block, spread, _, _ = _timed_round(kept, reps, device, group, what, block_calls)
    return Result("plain", None, times, dropped, reps, block, spread, warm_up_s=warm_up_s)


def _agreed(kept: list, rounds: tuple, rule, cost: dict, budget: float, device: torch.device, group, what: str,
            block_calls: int, queue_ms: dict | None) -> tuple:
    """Rank 0's pick by ``rule(*rounds)``, which must win again over plain in fresh samples (the rest of the
    budget). Returns ``(pick or plain, the confirmation round's five dicts and its reps, or None)``."""
    pick = all_gather(rule(*rounds), group, what=f"autotune {what}: decision")[0]
    if pick == "plain":
        return pick, None
    pair = [kept[0], next(c for c in kept if c.name == pick)]
    reps = _reps((1.0 - ROUND_SHARE) * budget, sum(cost[c.name] for c in pair))
    again = _timed_round(pair, reps, device, group, f"{what} confirm", block_calls, queue_ms)
    final = all_gather(rule(*again), group, what=f"autotune {what} confirm: decision")[0]
    if final != pick:
        log.info("tilefuse: autotune %s: %s did not hold its win in the confirmation round (ms per call alone/"
                 "back to back/device: %s): plain", what, pick,
                 ", ".join(f"{n} {again[0][n]:.4g}/{again[1][n]:.4g}/{again[3][n]:.4g}" for n in again[0]))
    return final, (*again, reps)


def tune(candidates: list[Candidate], *, device: torch.device, group, what: str, budget: float | None = None,
         margin: float = MARGIN) -> Result:
    """Run first-call tuning's protocol over ``candidates`` (plain first); collective over ``group``.
    ``budget``: seconds of timed calls (rank 0's; default ``BUDGET_S``); ``margin``: see :func:`decide`."""
    # 1. warm-up (compiles), check against plain, each candidate's time for one call
    kept, dropped, one_s, block_calls, budget, _ = _warm_up(candidates, device, group, what, budget)
    per_sample = 2 + 2 * block_calls if device.type == "cuda" else 1  # calls per sample (_measure)
    cost = {name: s * per_sample for name, s in one_s.items()}
    reps = _reps(ROUND_SHARE * budget, sum(cost.values()))
    # 2. interleaved timing, cross-rank max; 3. rank 0's decision, confirmed
    queue_ms = _queue_ms(one_s, device, block_calls)
    rounds = _timed_round(kept, reps, device, group, what, block_calls, queue_ms)
    times, block, spread, dev, _ = rounds
    pick, again = _agreed(kept, rounds, lambda t, b, sp, _d, _ds: decide(t, margin=margin, block=b, spread=sp),
                          cost, budget, device, group, what, block_calls, None)
    confirmed = None if again is None else {"times": again[0], "block": again[1], "spread": again[2], "reps": again[5]}
    log.debug("tilefuse: autotune %s: ms per call alone / back to back (x%d), max over ranks: %s; confirmation: %s"
              " -> %s", what, block_calls, ", ".join(f"{n} {times[n]:.4g}/{block[n]:.4g} (+-{spread[n]:.1%})"
                                                     for n in times), confirmed and confirmed["times"], pick)
    chosen = graph = next(c for c in kept if c.name == pick)
    # 4. inside CUDA graphs the host's work is gone: the pick there is decided on device time alone
    # (where a call is long, device time is the back-to-back time and the pick stays).
    graph_confirmed = None
    if queue_ms is not None:
        graph_margin = max(margin, GRAPH_MARGIN)
        graph_pick, again = _agreed(kept, rounds, lambda _t, _b, _sp, d, ds: decide(d, margin=graph_margin, spread=ds),
                                    cost, budget, device, group, f"{what} graph", block_calls, queue_ms)
        graph_confirmed = again and {"device": again[3], "spread": again[4], "reps": again[5]}
        graph = next(c for c in kept if c.name == graph_pick)
        if graph_pick != pick:
            log.info("tilefuse: autotune %s: inside CUDA graphs %s (device ms per call: %s), eagerly %s", what,
                     graph_pick, ", ".join(f"{n} {dev[n]:.4g}" for n in dev), pick)
    return Result(chosen.variant, chosen.config, times, dropped, reps, block, spread, confirmed, graph_confirmed,
                  dev if queue_ms is not None else {}, graph_variant=graph.variant, graph_config=graph.config)


def _queue_ms(one_s: dict, device: torch.device, block_calls: int) -> dict | None:
    """Per candidate, the most host ms to queue ``block_calls`` calls where device time is worth its own
    measurement (a GPU, plain's call under ``LONG_CALL_S``); else None."""
    if _DEVICE_TIMING[0]:
        return {name: 0.0 for name in one_s}
    if device.type != "cuda" or one_s.get("plain", 0.0) >= LONG_CALL_S:
        return None
    return {name: block_calls * s * 1e3 for name, s in one_s.items()}
