"""Soak: thousands of calls of every op with the shape changing on every call; memory must stay flat.

Every rank makes the same seeded sequence of calls: call i runs op ``i mod len(ops)`` (every op of
the registry, plus ``gemm_all_reduce`` where tilefuse has it) with a variant and local shapes drawn
from one seeded generator, so the ranks agree on every call without talking. Shapes: with
probability ``--fresh`` a call draws M, N, K anew; otherwise it takes one of the op's ``--pool``
shapes (drawn once), so the op, variant or shape changes on every call while the run holds a bounded
number of distinct shapes. Every dimension is a multiple of ``--align`` in ``--min-dim .. --max-*``.
On a GPU the defaults (multiples of 64, M from 256 to 960, N and K from 256 to 2048) keep every
dimension in one Triton specialization class (divisible by 16) and every shape in one tile class of
the config heuristic (M < 1000: 128 x 128 tiles), so each kernel compiles once per variant (16 (op,
variant, config) combinations where ragged draws from 1 to 2048 make about 540, at a second or more
of compile each), while most shapes still end in a partial tile; ``--max-m 2048`` adds the
heuristic's 128 x 256 class (twice the compiles). On the CPU (no compiles) shapes are ragged, from 1
to 40. ``--pool 0``: every call fresh. Every ``--check-every``-th call is compared with the op's
reference (``tilefuse.ops.registry.get(op, "reference")``); every ``--repeat-every``-th call is made
a second time at once with the same inputs (a repeat of a warm shape: timed apart, compared with the
first result, not counted in ``calls``). After ``--warmup`` calls, at every check and at the end the
run reads ``torch.cuda.memory_allocated`` (GPU), the heap's ``bytes_used`` (and the part of it the
workspace cache holds) and the process's resident memory. "Flat after warm-up": on every rank,
torch's allocated bytes do not grow, and the heap stays within what it held outside the workspace
cache at warm-up plus the cache's byte budget (a fraction of the heap: the cache fills up to it,
then evicts its least recently used workspaces); the CSV records the readings and the bound.

Time: ``--budget-s`` bounds the calls' wall-clock time. The ranks stop together between two calls:
at agreed call counts every rank publishes its elapsed time through tilefuse's bounded host
collective (``tilefuse.runtime.hostsync``), and all of them apply one rule to the same numbers (stop
once the slowest rank is past the budget; the next check comes after about half the calls the
remaining time allows at the slower of the run's pace and the last interval's, at most 50). Rank 0
prints a progress line to stderr every 1000 calls or ``--report-s`` seconds (calls, calls/s,
distinct shapes, workspaces made, Triton compiles, memory), with or without ``--no-progress`` (that
flag is for the progress bar), and rewrites the CSV from its own record each time, so a run that is
killed still leaves one. ``--timeout`` bounds the whole run.

Cost of a call: each op call is timed on the host and split into the steps a new shape brings,
measured by wrapping them in the rank processes: tilefuse's host collectives
(``hostsync.all_gather_object``: the workspace offset check), ``gc.collect`` (the workspace cache
runs one before allocating), device barriers (``world.device_barrier``: before new buffers are
reused) and Triton compiles (the JIT's compile hooks). Calls are classed ``new`` (the first call of
its op, variant and shapes in the run), ``second`` or ``later``, and ``plain`` (torch.matmul + the
collective) or ``fused`` (the other variants). On a GPU a call is timed from its first host step to
its return (kernels run on asynchronously; their device time is small here and lands in a later
call's host steps). The summary prints the mean per class and step on rank 0.

Output: one long-format CSV (``metric, value, op, world, ...`` and the run facts) and a summary
starting with ``soak:``. The exit status is 1 when a check failed or a call raised (the run stops
at the first error: the ranks are no longer in step), or with ``--require-flat`` when memory was not
flat after warm-up (beyond ``--flat-slack`` bytes).

    python -m benchmarks.soak                       # 10,000 calls, every GPU (or 2 CPU ranks)
    python -m benchmarks.soak --world 2 --calls 10000 --budget-s 120 --csv results/soak.csv
    python -m benchmarks.soak --smoke --world 2     # ~50 small calls: the CPU CI check
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import signal
import statistics
import sys
import time

import torch

from benchmarks import common

CSV_COLUMNS = ["metric", "value", "op", "world", "calls", "seed", "device", "torch", "triton", "commit",
               "date", "note"]
MEMORY = ("torch_allocated", "heap_bytes_used", "workspace_bytes", "rss_bytes")
STEPS = ("host_collective", "gc_collect", "device_barrier", "triton_compile")
STEP_NAMES = {"host_collective": "host collectives", "gc_collect": "gc.collect", "device_barrier": "device barriers",
              "triton_compile": "Triton compiles"}
CLASSES = tuple(f"{when} {kind}" for kind in ("fused", "plain") for when in ("new", "second", "later"))
REPORT_CALLS = 1000  # a progress line at least every this many calls
MAX_CHECK_GAP = 50  # at most this many calls between two budget checks


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _memory(ctx) -> dict:
    from tilefuse.ops.common import arena

    if ctx.on_gpu:
        torch.cuda.synchronize(ctx.device)
    return {
        "torch_allocated": torch.cuda.memory_allocated(ctx.device) if ctx.on_gpu else 0,
        "heap_bytes_used": ctx.heap.bytes_used,
        "workspace_bytes": arena.workspace_bytes(),  # of the heap bytes, those the workspace cache holds
        "rss_bytes": _rss_bytes(),
    }


def soak_ops() -> list:
    import tilefuse
    from tilefuse.ops import registry

    ops = [op for op in registry.OPS if hasattr(tilefuse, op)]
    if hasattr(tilefuse, "gemm_all_reduce") and "gemm_all_reduce" not in ops:
        ops.append("gemm_all_reduce")
    return ops


def _shapes_of(op: str, m: int, n: int, k: int, world: int) -> tuple:
    """Local shapes of a and b for the op's M, N, K."""
    if op == "gemm_reduce_scatter":  # a [W*m, K_loc], b [K_loc, N]
        return (world * m, k), (k, n)
    # gemm_all_scatter: a [M, K], b [K, N_loc]; all_gather_gemm: a [M_loc, K], b [K, N];
    # gemm_all_reduce: a [M, K_loc], b [K_loc, N]
    return (m, k), (k, n)


def _aligned(rng: random.Random, lo: int, hi: int, align: int) -> int:
    """A multiple of ``align`` in ``[lo, hi]`` (or ``lo`` where there is none)."""
    first = -(-lo // align) * align
    if first > hi:
        return lo
    return rng.randrange(first, hi + 1, align)


class ShapeDraw:
    """The seeded draw of every call's variant and shapes (the same on every rank).

    ``pool`` shapes per op are drawn first; a call then takes a fresh shape with probability
    ``fresh`` and one of its op's pool shapes otherwise (every dimension a multiple of ``align``).
    """

    def __init__(self, seed: int, ops: list, variants: dict, world: int, dims: tuple, pool: int, fresh: float,
                 align: int):
        self.rng = random.Random(seed)
        self.variants, self.world, self.dims, self.fresh, self.align = variants, world, dims, fresh, align
        self.pools = {op: [self._mnk() for _ in range(pool)] for op in ops}

    def _mnk(self) -> tuple:
        lo, max_m, max_n, max_k = self.dims
        return tuple(_aligned(self.rng, lo, hi, self.align) for hi in (max_m, max_n, max_k))

    def __call__(self, op: str) -> tuple:
        """(variant, a shape, b shape) of the next call of ``op``."""
        if not self.pools[op] or self.rng.random() < self.fresh:
            m, n, k = self._mnk()
        else:
            m, n, k = self.rng.choice(self.pools[op])
        variant = self.rng.choice(self.variants[op])
        return (variant,) + _shapes_of(op, m, n, k, self.world)


def _inputs(op: str, a_shape, b_shape, dtype, device, seed: int, call: int, rank: int):
    shared = torch.Generator(device=device).manual_seed(seed * 1_000_003 + call)
    own = torch.Generator(device=device).manual_seed((seed * 1_000_003 + call) * 64 + rank + 1)
    a_gen = shared if op == "gemm_all_scatter" else own
    b_gen = shared if op == "all_gather_gemm" else own
    a = torch.randn(a_shape, generator=a_gen, device=device, dtype=torch.float32).to(dtype)
    b = torch.randn(b_shape, generator=b_gen, device=device, dtype=torch.float32).to(dtype)
    return a, b


class StepClock:
    """Host time of the steps a new shape brings, inside the op calls of this rank (see the module
    docstring): wraps tilefuse's host collective, ``gc.collect``, tilefuse's device barrier and the
    heap's offset check (which counts workspaces made), and hooks Triton's compiles."""

    def __init__(self, heap):
        self.heap = heap
        self.active: dict | None = None  # step -> [seconds, count] of the call being timed
        self.workspaces = 0  # workspaces made during the call being timed
        self.total_workspaces = 0
        self.total_compiles = 0
        self._compile_started: list = []
        self._undo: list = []

    def _wrap(self, owner, name: str, step: str) -> None:
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            if self.active is None:
                return original(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                entry = self.active[step] if self.active is not None else [0.0, 0]
                entry[0] += time.perf_counter() - t0
                entry[1] += 1

        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, original))

    def install(self) -> None:
        from tilefuse.runtime import hostsync
        from tilefuse.runtime import world as tf_world

        self._wrap(hostsync, "all_gather_object", "host_collective")
        self._wrap(gc, "collect", "gc_collect")
        self._wrap(tf_world, "device_barrier", "device_barrier")
        check = self.heap.check_symmetric  # the workspace cache checks each new workspace's offsets

        def counted(name, *tensors, **kwargs):
            if str(name).startswith("workspace"):
                self.workspaces += 1
                self.total_workspaces += 1
            return check(name, *tensors, **kwargs)

        self.heap.check_symmetric = counted
        self._undo.append(lambda: self.heap.__dict__.pop("check_symmetric", None))
        knobs = getattr(getattr(sys.modules.get("triton"), "knobs", None), "runtime", None)
        if knobs is not None and hasattr(knobs, "jit_cache_hook") and hasattr(knobs, "jit_post_compile_hook"):
            before, after = knobs.jit_cache_hook, knobs.jit_post_compile_hook

            def compile_starts(**kwargs):
                self._compile_started.append(time.perf_counter())
                return before(**kwargs) if before is not None else None

            def compile_ends(**kwargs):
                if self._compile_started:
                    seconds = time.perf_counter() - self._compile_started.pop()
                    self.total_compiles += 1
                    if self.active is not None:
                        self.active["triton_compile"][0] += seconds
                        self.active["triton_compile"][1] += 1
                return after(**kwargs) if after is not None else None

            knobs.jit_cache_hook, knobs.jit_post_compile_hook = compile_starts, compile_ends

            def unhook():
                knobs.jit_cache_hook, knobs.jit_post_compile_hook = before, after

            self._undo.append(unhook)

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def start(self) -> None:
        self.active = {step: [0.0, 0] for step in STEPS}
        self.workspaces = 0
        self._compile_started.clear()

    def stop(self) -> tuple:
        """(steps of the call, workspaces it made)."""
        steps, self.active = self.active, None
        return steps, self.workspaces


class CostTable:
    """Per class of call (``CLASSES``): how many, their host seconds, and each step's seconds and count."""

    def __init__(self):
        self.rows = {c: {"n": 0, "seconds": 0.0, "workspaces": 0, "times": [],
                         **{s: [0.0, 0] for s in STEPS}} for c in CLASSES}

    def add(self, cls: str, seconds: float, steps: dict, workspaces: int) -> None:
        row = self.rows[cls]
        row["n"] += 1
        row["seconds"] += seconds
        row["workspaces"] += workspaces
        row["times"].append(seconds)
        for s in STEPS:
            row[s][0] += steps[s][0]
            row[s][1] += steps[s][1]

    def record(self) -> dict:
        """Picklable means per class: ms per call, median ms, each step's ms and count per call."""
        out = {}
        for cls, row in self.rows.items():
            n = row["n"]
            if not n:
                continue
            rec = {"n": n, "ms": 1e3 * row["seconds"] / n, "median_ms": 1e3 * statistics.median(row["times"]),
                   "workspaces": row["workspaces"] / n}
            for s in STEPS:
                rec[f"{s}_ms"] = 1e3 * row[s][0] / n
                rec[f"{s}_count"] = row[s][1] / n
            rec["other_ms"] = rec["ms"] - sum(rec[f"{s}_ms"] for s in STEPS)
            out[cls] = rec
        return out


class Budget:
    """The collective stop rule of ``--budget-s`` (see the module docstring)."""

    def __init__(self, ctx, budget_s: float | None, timeout_s: float):
        self.ctx, self.budget_s, self.timeout_s = ctx, budget_s, timeout_s
        self.next_check = 1
        self.checks = 0
        self.seconds = 0.0  # host time spent in the checks
        self.last = (0, 0.0)  # (calls, slowest elapsed) at the previous check

    def due(self, done: int) -> bool:
        return self.budget_s is not None and done >= self.next_check

    def check(self, done: int, elapsed: float) -> bool:
        """Collective: True on every rank alike when the run must stop."""
        from tilefuse.runtime import hostsync

        t0 = time.perf_counter()
        everyone = hostsync.all_gather_object(float(elapsed), self.ctx.heap.group, what="soak: budget check",
                                              timeout=self.timeout_s)
        self.checks += 1
        slowest = max(everyone)
        self.seconds += time.perf_counter() - t0
        if slowest >= self.budget_s:
            return True
        # The slower of the whole run's pace and the last interval's: a run that slows down (a burst of
        # new shapes or compiles) is checked more often.
        last_done, last_elapsed = self.last
        per_call = max(slowest / max(done, 1), (slowest - last_elapsed) / max(done - last_done, 1))
        self.last = (done, slowest)
        room = (self.budget_s - slowest) / per_call if per_call > 0 else MAX_CHECK_GAP
        self.next_check = done + max(1, min(MAX_CHECK_GAP, int(room / 2)))
        return False


def _call_label(op, variant, a_shape, b_shape) -> str:
    return f"{op}/{variant} a{list(a_shape)} b{list(b_shape)}"


def run_soak(ctx, opts: dict) -> dict:
    """This rank's record of the soak (collective: every rank runs the same calls); under torchrun
    ``"all"`` holds every rank's record (gathered; rank 0 reports them)."""
    import tilefuse
    from tilefuse.ops import registry

    ops = soak_ops()
    dims = (opts["min_dim"], opts["max_m"], opts["max_n"], opts["max_k"])
    dtype = common.parse_dtype(opts["dtype"])
    per_op = {op: {"calls": 0, "checked": 0, "failed": 0, "max_rel_error": 0.0} for op in ops}
    variants = {}
    for op in ops:
        have = registry.variants(op) if op in registry.OPS else {}
        chosen = [v for v in opts["variants"] if not have or v in have]
        if not chosen:
            raise ValueError(f"{op}: none of the variants {opts['variants']} exists; it has {sorted(have)}")
        variants[op] = chosen
    draw = ShapeDraw(opts["seed"], ops, variants, ctx.world, dims, opts["pool"], opts["fresh"], opts["align"])
    seen: dict = {}  # calls made of each (op, variant, a shape, b shape)
    warm = None
    peak = dict.fromkeys(MEMORY, 0)
    error = ""
    calls = opts["calls"]
    done = repeats = 0
    stopped_by = "calls"
    tol = common.tolerance(dtype, ctx.on_gpu)
    progress = common.Progress(calls, "soak", enabled=ctx.rank == 0 and opts["progress"])
    clock = StepClock(ctx.heap)
    costs = CostTable()
    budget = Budget(ctx, opts["budget_s"], opts["host_timeout_s"])
    reporter = Reporter(ctx, opts, calls) if ctx.rank == 0 else None
    other = {"inputs_s": 0.0, "check_s": 0.0, "report_s": 0.0}

    def timed_call(op, variant, a, b, key):
        clock.start()
        t0 = time.perf_counter()
        try:
            got = getattr(tilefuse, op)(a, b, variant=variant)
        finally:
            seconds = time.perf_counter() - t0
            steps, made = clock.stop()
        before = seen.get(key, 0)
        seen[key] = before + 1
        when = ("new", "second")[before] if before < 2 else "later"
        costs.add(f"{when} {'plain' if variant == 'plain' else 'fused'}", seconds, steps, made)
        return got

    def record(final: bool) -> dict:
        from tilefuse.ops.common import launch as oplaunch

        ws_budget = getattr(oplaunch, "workspace_budget", None)
        distinct = len({key[:1] + key[2:] for key in seen})  # (op, a shape, b shape)
        return {"calls": done, "requested": calls, "repeats": repeats, "distinct_shapes": distinct,
                "per_op": per_op, "warm": warm or _memory(ctx), "end": _memory(ctx), "peak": dict(peak),
                "seconds": time.perf_counter() - t0, "error": error, "stopped_by": stopped_by,
                "workspace_budget": ws_budget(ctx.heap) if ws_budget is not None else float("nan"),
                "heap_size": ctx.heap.size, "costs": costs.record(), "workspaces_made": clock.total_workspaces,
                "compiles": clock.total_compiles, "budget_checks": budget.checks,
                "budget_check_s": budget.seconds, "gc_objects": len(gc.get_objects()), **other, "final": final}

    clock.install()
    t0 = time.perf_counter()
    try:
        for i in range(calls):
            if budget.due(done):
                try:
                    stop = budget.check(done, time.perf_counter() - t0)
                except Exception as err:  # noqa: BLE001 - a peer is gone or out of step: recorded, stop
                    error = f"budget check after {done} calls: {common.error_text(err)}"
                    stopped_by = "error"
                    break
                if stop:
                    stopped_by = "budget"
                    break
            op = ops[i % len(ops)]
            variant, a_shape, b_shape = draw(op)
            key = (op, variant, a_shape, b_shape)
            check = (i + 1) % opts["check_every"] == 0 or i == calls - 1
            repeat = opts["repeat_every"] > 0 and (i + 1) % opts["repeat_every"] == 0
            label = _call_label(op, variant, a_shape, b_shape)
            try:
                t_in = time.perf_counter()
                a, b = _inputs(op, a_shape, b_shape, dtype, ctx.device, opts["seed"], i, ctx.rank)
                other["inputs_s"] += time.perf_counter() - t_in
                got = timed_call(op, variant, a, b, key)
                per_op[op]["calls"] += 1
                if repeat:
                    again = timed_call(op, variant, a, b, key)
                    repeats += 1
                    err = common.rel_error(again, got)
                    if not err <= tol:
                        per_op[op]["failed"] += 1
                        error = error or (f"call {i} made again: {label}: relative error {err:.3g} against its "
                                          "first result")
                    del again
                if check:
                    t_ck = time.perf_counter()
                    ref = registry.get(op, "reference")(a, b)
                    err = common.rel_error(got, ref)
                    other["check_s"] += time.perf_counter() - t_ck
                    per_op[op]["checked"] += 1
                    per_op[op]["max_rel_error"] = max(per_op[op]["max_rel_error"], err)
                    if not err <= tol:
                        per_op[op]["failed"] += 1
                        error = error or f"call {i}: {label}: relative error {err:.3g} > {tol:g}"
                    del ref  # the memory reading below must see no tensor of this call
                del got, a, b
            except Exception as err:  # noqa: BLE001 - recorded, then the run stops (ranks out of step)
                error = f"call {i}: {label}: {common.error_text(err)}"
                stopped_by = "error"
                break
            done = i + 1
            if done == opts["warmup"]:
                warm = _memory(ctx)
            elif warm is not None and check:
                peak = {k: max(peak[k], v) for k, v in _memory(ctx).items()}
            progress.update(1, op)
            if reporter is not None and reporter.due(done):
                t_rep = time.perf_counter()
                reporter.report(record(final=False))
                other["report_s"] += time.perf_counter() - t_rep
    finally:
        clock.uninstall()
        progress.close()
    end = _memory(ctx)
    peak = {k: max(peak[k], end[k]) for k in MEMORY}
    mine = record(final=True)
    mine["end"], mine["peak"] = end, peak
    out = {"mine": mine, "all": None}
    if common.under_torchrun():  # only this rank's result reaches its launcher: gather them for rank 0
        from tilefuse.runtime import hostsync

        try:
            out["all"] = hostsync.all_gather_object(mine, ctx.heap.group, what="soak: records",
                                                    timeout=opts["host_timeout_s"])
        except Exception as err:  # noqa: BLE001 - rank 0 reports its own record and the error
            mine["error"] = mine["error"] or f"gathering the ranks' records: {common.error_text(err)}"
    if reporter is not None:
        reporter.write([mine] if out["all"] is None else out["all"], final=False)
    return out


class Reporter:
    """Rank 0's progress lines on stderr and its provisional CSV (its own record)."""

    def __init__(self, ctx, opts: dict, calls: int):
        self.ctx, self.opts, self.calls = ctx, opts, calls
        self.every_s = opts["report_s"]
        self.t0 = self.last_t = time.perf_counter()
        self.last_done = 0
        self.info = common.run_info(ctx.device if ctx.on_gpu else None)

    def due(self, done: int) -> bool:
        return done - self.last_done >= REPORT_CALLS or time.perf_counter() - self.last_t >= self.every_s

    def report(self, rec: dict) -> None:
        now = time.perf_counter()
        done = rec["calls"]
        rate = done / max(now - self.t0, 1e-9)
        recent = (done - self.last_done) / max(now - self.last_t, 1e-9)
        mem = rec["end"]
        print(f"soak: [{done}/{self.calls}] calls in {now - self.t0:.0f} s, {rate:.1f} calls/s "
              f"({recent:.1f} since the last line), {rec['distinct_shapes']} distinct shapes, {rec['workspaces_made']} "
              f"workspaces made, {rec['compiles']} Triton compiles; rank 0: heap used {mem['heap_bytes_used']} B, "
              f"torch allocated {mem['torch_allocated']} B, rss {mem['rss_bytes'] >> 20} MiB, "
              f"{rec['gc_objects']} objects tracked by gc",
              file=sys.stderr, flush=True)
        self.last_t, self.last_done = now, done
        self.write([rec], final=False)

    def write(self, records: list, final: bool) -> None:
        if not self.opts.get("csv"):
            return
        try:
            rows, _, _, _ = summarize(records, self.opts, self.ctx.world, self.info, final=final)
            common.write_csv(rows, self.opts["csv"], self.info, columns=CSV_COLUMNS)
        except Exception as err:  # noqa: BLE001 - a provisional CSV must not end the run
            print(f"soak: could not write {self.opts['csv']}: {common.error_text(err)}", file=sys.stderr, flush=True)


def cost_lines(costs: dict) -> list:
    """One line per class of call: mean host ms per call and where it went."""
    lines = []
    for cls in CLASSES:
        rec = costs.get(cls)
        if rec is None:
            continue
        parts = []
        for s in STEPS:
            if rec[f"{s}_count"] > 0:
                parts.append(f"{STEP_NAMES[s]} {rec[f'{s}_ms']:.2f} ({rec[f'{s}_count']:.2f} a call)")
        parts.append(f"the rest {rec['other_ms']:.2f}")
        lines.append(f"  {cls:<12} {rec['n']:>6} calls, {rec['ms']:8.2f} ms a call (median {rec['median_ms']:.2f}): "
                     + ", ".join(parts))
    return lines


def heap_bound_of(rec: dict) -> float:
    """The most heap a rank may use after warm-up: what it held outside the workspace cache at warm-up
    plus the cache's byte budget (or its warm-up reading, if that was higher)."""
    warm = rec["warm"]
    return max(warm["heap_bytes_used"], warm["heap_bytes_used"] - warm["workspace_bytes"] + rec["workspace_budget"])


def summarize(results: list, opts: dict, world: int, info: dict, final: bool = True) -> tuple[list, str, bool, bool]:
    """CSV rows, the summary text, whether every check passed and whether memory stayed flat.

    ``results``: every rank's record (or rank 0's alone, for a provisional CSV: ``final=False``)."""
    first = results[0]
    ops = list(first["per_op"])
    rows = []

    def add(metric, value, op="", note=""):
        rows.append({"metric": metric, "value": value, "op": op, "world": world, "calls": opts["calls"],
                     "seed": opts["seed"], "note": note})

    calls = min(r["calls"] for r in results)
    checked = sum(first["per_op"][op]["checked"] for op in ops)
    failed = max(sum(r["per_op"][op]["failed"] for op in ops) for r in results)
    errors = [f"rank {q}: {r['error']}" for q, r in enumerate(results) if r["error"]]
    seconds = max(r["seconds"] for r in results)
    stopped_by = next((r["stopped_by"] for r in results if r["stopped_by"] == "error"), first["stopped_by"])
    shown_failed = failed + (1 if errors and not failed else 0)  # a raise counts
    add("complete", 1.0 if final else 0.0,
        note="" if final else f"rank 0's record after {calls} calls; the run has not finished")
    add("calls", calls)
    add("requested", opts["calls"])
    add("stopped_by_budget", 1.0 if stopped_by == "budget" else 0.0,
        note="running" if not final and stopped_by == "calls" else stopped_by)
    add("budget_s", opts["budget_s"] if opts["budget_s"] is not None else float("nan"))
    add("repeats", first["repeats"])
    add("checked", checked)
    add("failed", shown_failed, note="; ".join(errors)[:2000])
    add("distinct_shapes", first["distinct_shapes"])
    add("seconds", seconds)
    add("calls_per_s", calls / seconds if seconds > 0 else float("nan"))
    add("workspaces_made", first["workspaces_made"])
    add("triton_compiles", first["compiles"])
    add("budget_checks", first["budget_checks"])
    add("budget_check_s", first["budget_check_s"])
    for key in ("inputs_s", "check_s", "report_s"):
        add(key, first[key])
    add("gc_objects", first["gc_objects"])
    add("heap_size", first["heap_size"])
    add("workspace_budget_bytes", first["workspace_budget"])
    for cls, rec in first["costs"].items():
        for metric in ("n", "ms", "median_ms", "workspaces", "other_ms",
                       *(f"{s}_{x}" for s in STEPS for x in ("ms", "count"))):
            add(f"call_{metric}", rec[metric], note=cls)
    for key in MEMORY:
        add(f"{key}_warm", max(r["warm"][key] for r in results))
        add(f"{key}_end", max(r["end"][key] for r in results))
        add(f"{key}_peak_after_warm", max(r["peak"][key] for r in results))
    torch_growth = max(r["peak"]["torch_allocated"] - r["warm"]["torch_allocated"] for r in results)
    heap_bound = max(heap_bound_of(r) for r in results)
    heap_excess = max(r["peak"]["heap_bytes_used"] - heap_bound_of(r) for r in results)
    add("torch_allocated_growth", torch_growth)
    add("heap_bytes_bound", heap_bound)
    add("heap_bytes_over_bound", heap_excess)
    for op in ops:
        add("calls", first["per_op"][op]["calls"], op=op)
        add("checked", first["per_op"][op]["checked"], op=op)
        add("max_rel_error", max(r["per_op"][op]["max_rel_error"] for r in results), op=op)
    ok = failed == 0 and not errors and (calls == opts["calls"] or stopped_by == "budget")
    # rss is reported, not judged: the allocator of the host process is not tilefuse's.
    warmed = calls >= opts["warmup"]
    flat = warmed and torch_growth <= opts["flat_slack"] and heap_excess <= opts["flat_slack"]
    verdict = (("flat" if flat else "GREW") if warmed
               else f"not judged: the {opts['warmup']} warm-up calls were not all made")
    add("memory_flat", float(flat) if warmed else float("nan"), note=verdict)
    mem = {f"{key}_{when}": max(r[when][key] for r in results) for key in MEMORY for when in ("warm", "end")}
    rate = calls / seconds if seconds > 0 else float("nan")
    why = {"budget": f"stopped by the {opts['budget_s'] or 0:g} s budget", "error": "stopped by an error",
           "calls": "all requested" if calls == opts["calls"] else "running"}[stopped_by]
    line = (f"soak: {calls}/{opts['calls']} calls ({why}), {rate:.1f} calls/s, {first['repeats']} repeats, "
            f"{first['distinct_shapes']} distinct shapes, {len(ops)} ops ({', '.join(ops)}), world {world} on "
            f"{info['device']}: checked {checked}, failed {shown_failed}; {first['workspaces_made']} workspaces made, "
            f"{first['compiles']} Triton compiles; "
            f"after warm-up ({opts['warmup']} calls) torch allocated "
            f"{mem['torch_allocated_warm']} -> {mem['torch_allocated_end']} B, heap used "
            f"{mem['heap_bytes_used_warm']} -> {mem['heap_bytes_used_end']} B (bound {heap_bound} B: the rest at "
            f"warm-up + the workspace budget {first['workspace_budget']:.0f} B of a {first['heap_size']} B heap): "
            f"{verdict}; {seconds:.0f} s")
    if errors:
        line += f"; first error: {errors[0]}"
    spent = sum(rec["ms"] * rec["n"] for rec in first["costs"].values()) / 1e3
    text = [line, f"  host time of the op calls on rank 0 ({spent:.1f} s of {first['seconds']:.1f} s; "
                  f"{first['gc_objects']} objects tracked by gc at the end; inputs "
                  f"{first['inputs_s']:.1f} s, checks {first['check_s']:.1f} s, budget checks "
                  f"{first['budget_check_s']:.1f} s in {first['budget_checks']}, progress {first['report_s']:.1f} s):"]
    return rows, "\n".join(text + cost_lines(first["costs"])), ok, flat


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=10_000)
    p.add_argument("--world", type=int, default=None, help="ranks (default: GPUs, at least 2; 2 on the CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check-every", type=int, default=100)
    p.add_argument("--repeat-every", type=int, default=20, help="every this many calls, make the call again at "
                   "once (a warm repeat, timed apart; 0: never)")
    p.add_argument("--warmup", type=int, default=None, help="calls before the first memory reading "
                   "(default: a tenth of the calls, at most 500)")
    p.add_argument("--variants", default="all", help="comma-separated, or 'all' (the four fused variants "
                   "and plain)")
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--min-dim", type=int, default=None, help="smallest M, N, K (default 256 on a GPU, 1 on the "
                   "CPU)")
    p.add_argument("--max-m", type=int, default=None, help="largest M (per-rank rows); default 960 on a GPU "
                   "(one tile class), 40 on the CPU or with --smoke")
    p.add_argument("--max-n", type=int, default=None, help="largest N (default 2048 on a GPU, 40 on the CPU)")
    p.add_argument("--max-k", type=int, default=None, help="largest K (default 2048 on a GPU, 40 on the CPU)")
    p.add_argument("--pool", type=int, default=None, help="shapes per op that calls come back to (default 16 "
                   "on a GPU, 6 on the CPU; 0: every call draws a fresh shape)")
    p.add_argument("--fresh", type=float, default=None, help="chance that a call draws a fresh shape instead "
                   "of a pool shape (default 0.02 on a GPU, 0.05 on the CPU)")
    p.add_argument("--align", type=int, default=None, help="every dimension is a multiple of this (default 64 "
                   "on a GPU: fewer kernels to compile; 1 on the CPU)")
    p.add_argument("--heap-size", default=None, help="heap bytes per rank, e.g. 256M (default: tilefuse's)")
    p.add_argument("--csv", default=None, help="CSV path (default results/soak.csv)")
    p.add_argument("--require-flat", action="store_true", help="exit 1 unless memory stayed flat after "
                   "warm-up (torch allocated did not grow; the heap stayed within its bound)")
    p.add_argument("--flat-slack", type=int, default=0, help="bytes of growth --require-flat accepts")
    p.add_argument("--smoke", action="store_true", help="about 50 small calls (CPU CI)")
    p.add_argument("--budget-s", type=float, default=None, help="wall-clock seconds for the calls: the ranks "
                   "stop together between two calls once it is spent (startup and the summary come on top)")
    p.add_argument("--report-s", type=float, default=15.0, help="seconds between progress lines (also every "
                   f"{REPORT_CALLS} calls)")
    p.add_argument("--timeout", type=float, default=None, help="seconds for the whole run (default: by calls, "
                   "or the budget + 300)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (the progress lines stay)")
    return p.parse_args(argv)


def _options(args, on_gpu: bool) -> dict:
    from tilefuse.ops import registry

    if args.smoke:
        args.calls = min(args.calls, 50)
        args.check_every = min(args.check_every, 10)
    small = args.smoke or not on_gpu
    default_dim = 40 if small else 2048
    variants = (list(registry.VARIANTS) + ["plain"] if args.variants == "all"
                else [v.strip() for v in args.variants.split(",") if v.strip()])
    if args.calls < 1 or args.check_every < 1:
        raise SystemExit("--calls and --check-every must be positive")
    if args.repeat_every < 0 or (args.pool is not None and args.pool < 0):
        raise SystemExit("--repeat-every and --pool must be >= 0")
    fresh = (0.05 if small else 0.02) if args.fresh is None else args.fresh
    if not 0.0 <= fresh <= 1.0:
        raise SystemExit("--fresh must be between 0 and 1")
    align = args.align if args.align is not None else (1 if small else 64)
    if align < 1:
        raise SystemExit("--align must be >= 1")
    if args.budget_s is not None and not args.budget_s > 0:
        raise SystemExit("--budget-s must be positive")
    if not args.report_s > 0:
        raise SystemExit("--report-s must be positive")
    warmup = args.warmup if args.warmup is not None else max(1, min(500, args.calls // 10))
    opts = {"calls": args.calls, "seed": args.seed, "check_every": args.check_every, "warmup": min(warmup, args.calls),
            "repeat_every": args.repeat_every, "variants": variants, "dtype": args.dtype,
            "min_dim": args.min_dim if args.min_dim is not None else (1 if small else 256),
            "max_m": args.max_m or (40 if small else 960), "max_n": args.max_n or default_dim,
            "max_k": args.max_k or default_dim,
            "pool": args.pool if args.pool is not None else (6 if small else 16), "fresh": fresh, "align": align,
            "flat_slack": args.flat_slack, "progress": not args.no_progress, "budget_s": args.budget_s,
            "report_s": args.report_s, "csv": args.csv or str(common.REPO / "results" / "soak.csv"),
            "host_timeout_s": 120.0}
    if opts["min_dim"] < 0 or min(opts["max_m"], opts["max_n"], opts["max_k"]) < opts["min_dim"]:
        raise SystemExit("dimensions: need 0 <= --min-dim <= every --max-*")
    return opts


def _write_failure(path: str, opts: dict, world: int, info: dict, why: str) -> None:
    """The run ended without its records: keep rank 0's provisional CSV (if any) and add why."""
    rows = [{"metric": "complete", "value": 0.0, "op": "", "world": world, "calls": opts["calls"],
             "seed": opts["seed"], "note": why[:2000]}]
    common.write_csv(rows, path, info, append=os.path.exists(path), columns=CSV_COLUMNS)


class _Terminated(BaseException):
    """SIGTERM reached the launcher (e.g. from ``timeout``)."""


def main(argv=None) -> int:
    args = parse_args(argv)
    on_gpu = torch.cuda.is_available() and os.environ.get("TILEFUSE_BACKEND", "").lower() != "cpu"
    opts = _options(args, on_gpu)
    world = args.world or (max(2, torch.cuda.device_count()) if on_gpu else 2)
    heap_size = common.parse_bytes(args.heap_size) if args.heap_size else None
    small = args.smoke or not on_gpu
    if args.timeout:
        timeout = args.timeout
    elif args.budget_s is not None:
        timeout = args.budget_s + 300.0
    else:
        timeout = 600.0 + args.calls * (2.0 if small else 0.5)
    path = opts["csv"]
    main_process = common.is_main_process()

    def terminated(signum, frame):
        raise _Terminated(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, terminated) if main_process else None
    started = time.perf_counter()
    try:
        results = common.launch(run_soak, world, opts, heap_size=heap_size, timeout=timeout)
    except (common.LaunchError, _Terminated) as err:
        if not main_process:
            raise
        what = "killed by SIGTERM" if isinstance(err, _Terminated) else "a rank failed or did not finish"
        text = str(err).strip().splitlines()
        info = common.run_info(torch.device("cuda") if on_gpu else None)
        _write_failure(path, opts, world, info, f"{what}: {' | '.join(text[-6:])}")
        print(f"soak: stopped after {time.perf_counter() - started:.0f} s, {what}; the CSV holds rank 0's record "
              f"from its last progress line: {path}", flush=True)
        print(str(err)[-4000:], file=sys.stderr, flush=True)
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if not main_process:
        return 0
    if len(results) > 1:  # spawned ranks: each returned its own record
        records = [r["mine"] for r in results]
    else:
        records = results[0]["all"] or [results[0]["mine"]]
    world = len(records)
    info = common.run_info(torch.device("cuda") if on_gpu else None)
    rows, text, ok, flat = summarize(records, opts, world, info)
    common.write_csv(rows, path, info, columns=CSV_COLUMNS)
    print(text, flush=True)
    print(f"soak: CSV written to {path}", file=sys.stderr)
    if not ok:
        return 1
    return 1 if args.require_flat and not flat else 0


if __name__ == "__main__":
    sys.exit(main())
