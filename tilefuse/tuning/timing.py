"""Time for the offline tuner: steady clocks before a decision, and a run's time budget (ranks agree
through exchanged values, the maximum over ranks)."""

from __future__ import annotations

import math
import statistics
import time

import torch

from . import autotune

SETTLE_S = 1.5  # a GPU at its power limit dips in clock about a second into a load, then holds steady


def settle(fn, *, device: torch.device, seconds: float = SETTLE_S, agree=None, max_calls: int = 2000) -> int:
    """Run ``fn()`` back to back for about ``seconds`` on a GPU, so the next timing starts at steady
    clocks; returns the count, ``agree(n)``'s where given (required when ``fn`` is collective)."""
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


def clock() -> float:
    """Seconds from an arbitrary start (the budget's clock; tests replace it)."""
    return time.perf_counter()


class Budget:
    """Whether the next item (a shape) still fits in ``seconds`` (rank 0's; None: no limit): collective
    :meth:`fits` says yes while the time since ``start`` plus the median cost of the items done, maximum
    over the ranks, stays within ``seconds``. The first item always runs."""

    def __init__(self, seconds: float | None, group, *, start: float | None = None,
                 what: str = "tilefuse.tune: budget"):
        if seconds is not None and not seconds > 0:
            raise ValueError(f"a time budget must be > 0 seconds, got {seconds!r}")
        self.seconds, self.group, self.what = seconds, group, what
        self.start = clock() if start is None else start
        self.marks: list = []  # agreed seconds since start at each call of fits
        self.costs: list = []  # agreed seconds of each finished item, its left-out part removed
        self.elapsed = 0.0
        self.estimate: float | None = None

    def fits(self, left_out_s: float = 0.0) -> bool:
        """``left_out_s``: seconds of the item just finished that later ones will not spend (compiling)."""
        mine = {"elapsed": clock() - self.start, "left_out": max(0.0, float(left_out_s)), "seconds": self.seconds}
        views = autotune.all_gather(mine, self.group, what=f"{self.what}: item {len(self.marks) + 1}")
        self.elapsed = max(v["elapsed"] for v in views)
        seconds = views[0]["seconds"]
        if self.marks:
            self.costs.append(max(0.0, self.elapsed - self.marks[-1] - max(v["left_out"] for v in views)))
        self.marks.append(self.elapsed)
        self.estimate = statistics.median(self.costs) if self.costs else None
        return seconds is None or self.estimate is None or self.elapsed + self.estimate <= seconds
