"""First-call tuning: the collective protocol that times a few candidates on a call's own operands.

Used by :mod:`tilefuse.ops.dispatch` for an (arch, W, op, dtype, N, K, M bucket) that no table or
cache covers. Every rank runs the same steps in the same order (the candidates are collective ops,
so a rank that called a candidate one time more than its peers would hang them):

1. Warm-up and check: each candidate is called once (compiling its kernels) and its result compared
   with the plain path's; a candidate that raises or disagrees on any rank is dropped on every rank
   (one exchange of the ranks' outcomes). The warm-up time of one round of the candidates sets the
   repetition count: as many rounds as fit the budget (rank 0's ``TILEFUSE_AUTOTUNE_BUDGET``, default
   1 s), at least ``MIN_REPS`` and at most ``MAX_REPS``. Compilation is outside the budget.
2. Timing: the candidates' calls interleaved one by one (repetition r starts with candidate r mod n),
   a host barrier before each call, CUDA events on a GPU (the host clock elsewhere); each candidate's
   time is the median of its calls on this rank.
3. Decision: one exchange of the ranks' medians; each candidate's time is its maximum over the
   ranks (the slowest rank finishes a collective op); the fastest is picked, and the plain path kept
   unless the pick is at least ``MARGIN`` (2 %) faster. Every rank applies that rule, then a second
   exchange hands rank 0's answer to every rank: all ranks run rank 0's decision, whatever their
   own rule said (a rank with another margin, say).

Host exchanges and barriers use ``tilefuse.runtime.hostsync`` (bounded: ``EXCHANGE_TIMEOUT_S``, a
missing rank is named) on the op's group; without it, ``torch.distributed``'s object collectives
and barrier (bounded by the group's timeout).
Tests can replace the clock with :func:`set_timer`; the protocol stays the same.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

log = logging.getLogger("tilefuse")

MARGIN = 0.02  # a fused variant replaces plain only if at least this much faster
MIN_REPS = 3
MAX_REPS = 25
DEFAULT_BUDGET_S = 1.0
DEFAULT_MIN_PLAIN_MS = 0.2  # default mode: only calls whose plain path takes at least this long tune
EXCHANGE_TIMEOUT_S = 120.0


def mode() -> str:
    """``TILEFUSE_AUTOTUNE``: ``"0"`` never tune, ``"1"`` tune every uncovered shape, ``"auto"``
    (unset) tune on a GPU when the plain path takes at least ``TILEFUSE_AUTOTUNE_MIN_MS``."""
    raw = os.environ.get("TILEFUSE_AUTOTUNE", "").strip().lower()
    if raw in ("", "auto"):
        return "auto"
    if raw in ("0", "off", "false", "no"):
        return "0"
    if raw in ("1", "on", "true", "yes"):
        return "1"
    raise ValueError(f"TILEFUSE_AUTOTUNE={raw!r}: use 0 (off), 1 (tune every uncovered shape) or leave it unset")


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}={raw!r} must be a finite number >= 0")
    return value


def budget_s() -> float:
    return _env_float("TILEFUSE_AUTOTUNE_BUDGET", DEFAULT_BUDGET_S)


def min_plain_ms() -> float:
    return _env_float("TILEFUSE_AUTOTUNE_MIN_MS", DEFAULT_MIN_PLAIN_MS)


_TIMER: list = [None]


def set_timer(timer) -> None:
    """Replace the clock: ``timer(name) -> ms`` is asked for each timed call of the candidate
    ``name`` (``"plain"``, a variant, or ``"variant#i"`` for a second config), after the call ran.
    ``None`` restores CUDA events / the host clock."""
    _TIMER[0] = timer


def _hostsync():
    try:
        from ..runtime import hostsync
    except ImportError:
        return None
    return hostsync if hasattr(hostsync, "all_gather_object") else None


def all_gather(obj, group, *, what: str) -> list:
    """Every rank's ``obj`` in group-rank order (``[obj]`` at world 1)."""
    if dist.get_world_size(group) == 1:
        return [obj]
    hostsync = _hostsync()
    if hostsync is not None:
        return list(hostsync.all_gather_object(obj, group, what=what, timeout=EXCHANGE_TIMEOUT_S))
    out: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def _time_call(name: str, call, device: torch.device) -> float:
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
    else:
        t0 = time.perf_counter()
        call()
        ms = (time.perf_counter() - t0) * 1e3
    timer = _TIMER[0]
    return float(timer(name)) if timer is not None else ms


def _barrier(group, what: str) -> None:
    if dist.get_world_size(group) == 1:
        return
    hostsync = _hostsync()
    if hostsync is not None and hasattr(hostsync, "barrier"):
        hostsync.barrier(group, what=what, timeout=EXCHANGE_TIMEOUT_S)
    else:
        dist.barrier(group=group)


def time_plain(call, device: torch.device, group) -> float:
    """One warm-up call, then one timed call after a barrier: the maximum over the ranks (ms)."""
    call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    _barrier(group, "autotune: plain time")
    ms = _time_call("plain", call, device)
    return max(all_gather(ms, group, what="autotune: plain time"))


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
    times: dict  # candidate name -> ms (max over ranks); dropped candidates absent
    dropped: dict  # candidate name -> why
    reps: int


def _first(result):
    return result[0] if isinstance(result, tuple) else result


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))


def _tolerance(dtype: torch.dtype, device: torch.device) -> float:
    return 1e-4 if dtype == torch.float32 and device.type != "cuda" else 2e-2


def decide(times: dict, plain: str = "plain", margin: float = MARGIN) -> str:
    """The candidate to run: the fastest, if at least ``margin`` faster than ``plain``; else plain."""
    fused = {n: t for n, t in times.items() if n != plain}
    if not fused or plain not in times:
        return plain
    best = min(fused, key=lambda n: (fused[n], n))
    return best if fused[best] <= times[plain] * (1.0 - margin) else plain


def tune(candidates: list[Candidate], *, device: torch.device, group, what: str) -> Result:
    """Run the protocol above over ``candidates`` (plain first); collective over ``group``."""
    if not candidates or candidates[0].name != "plain":
        raise ValueError("autotune: the candidates must start with the plain path")
    rank = dist.get_rank(group)
    # 1. warm-up (compiles), check against plain, one round's time
    ref = _first(candidates[0].call())
    ref = ref.detach().clone()  # a candidate writing the same out= must not change the reference
    outcome = {}
    for c in candidates[1:]:
        try:
            got = _first(c.call())
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            err = _rel_err(got, ref)
            if not err < _tolerance(ref.dtype, device):
                raise AssertionError(f"relative error {err:.3g} against the plain path")
            outcome[c.name] = None
        except Exception as exc:  # a candidate that fails on any rank is dropped on every rank
            outcome[c.name] = f"{type(exc).__name__}: {exc}"[:200]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for c in candidates:
        if outcome.get(c.name) is None:
            c.call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    round_s = time.perf_counter() - t0
    views = all_gather({"outcome": outcome, "round_s": round_s, "budget_s": budget_s()}, group,
                       what=f"autotune {what}: warm-up")
    dropped = {}
    for v in views:
        for name, why in v["outcome"].items():
            if why is not None and name not in dropped:
                dropped[name] = why
    kept = [c for c in candidates if c.name not in dropped]
    round_s = max(v["round_s"] for v in views)
    reps = int(min(MAX_REPS, max(MIN_REPS, views[0]["budget_s"] // max(round_s, 1e-9))))
    # 2. interleaved timing
    samples: dict = {c.name: [] for c in kept}
    n = len(kept)
    for r in range(reps):
        for j in range(n):
            c = kept[(r + j) % n]
            _barrier(group, f"autotune {what}: timing")
            samples[c.name].append(_time_call(c.name, c.call, device))
    mine = {name: statistics.median(ts) for name, ts in samples.items()}
    # 3. cross-rank max; rank 0 decides and hands its decision to every rank
    medians = all_gather(mine, group, what=f"autotune {what}: times")
    times = {c.name: max(m[c.name] for m in medians) for c in kept}
    mine = decide(times)
    winner = all_gather(mine, group, what=f"autotune {what}: decision")[0]
    if mine != winner:
        log.debug("tilefuse: autotune %s: rank %d would pick %s; rank 0's %s wins", what, rank, mine, winner)
    chosen = next(c for c in kept if c.name == winner)
    return Result(chosen.variant, chosen.config, times, dropped, reps)
