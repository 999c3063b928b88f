"""Shared benchmark plumbing: a rank launcher, timing (DESIGN.md §7), a long-format CSV, a table printer.

Launcher
    :func:`launch` runs ``fn(ctx, *args)`` on every rank and returns the per-rank results. Under
    ``torchrun`` (``RANK``/``WORLD_SIZE`` in the environment) it runs this process's rank only;
    otherwise it runs world 1 in this process and spawns ``world`` processes for more. Ranks use
    GPU ``rank % device_count`` (several ranks share GPU 0 on a one-GPU machine) and the NCCL
    process group when every rank has a GPU of its own, gloo otherwise; with no GPU they run on
    the cpu backend in Triton's interpreter. ``ctx`` (:class:`RankCtx`) also holds a gloo group
    for host barriers and cross-rank reductions.

Timing
    :func:`bench` returns this rank's median time in ms, :func:`bench_max` the maximum of the
    ranks' medians (the slowest rank sets the time of a collective op). On a GPU at world 1 it is
    ``triton.testing.do_bench(..., return_mode="median")`` (warm-up and repetitions given in ms;
    do_bench clears L2 before every timed call). With several ranks every timed call is preceded
    by an L2 clear, a device synchronize and a host barrier, and timed with CUDA events; the
    repetition count is agreed between ranks so that collective calls stay matched. On the CPU
    (interpreter) a few calls are timed with the host clock: correctness smoke only.
    :func:`bench_interleaved` times several functions with their calls interleaved one by one (what
    the suite uses: the clock of a GPU at its power cap swings, docs/PERF.md session 3), and
    :func:`settle` runs a function until the clocks have settled before timing starts.
    :func:`rotating` builds enough input sets that consecutive calls do not find their inputs in L2.

CSV
    One row per measurement (long format): ``op, variant, M, N, K, dtype, world, metric, value,
    device, torch, triton, commit, date`` and a free-text ``note`` (the error of a failed run).
    A benchmark may append columns of its own (``write_csv(..., columns=COLUMNS + [...])``).

Checks
    :func:`rel_error` and :func:`tolerance` (relative Frobenius error against an fp32 product),
    :func:`poison_workspaces` (NaN into the ops' heap workspaces before a checked call),
    :func:`error_text` and :func:`cuda_alive` for recording a failure and going on.

Progress
    :class:`Progress`: a tqdm bar on a terminal where tqdm is importable, else a line now and then.
"""

from __future__ import annotations

import datetime
import hashlib
import math
import os
import queue
import socket
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
COLUMNS = ["op", "variant", "M", "N", "K", "dtype", "world", "metric", "value",
           "device", "torch", "triton", "commit", "date", "note"]
DTYPE_NAMES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
               "float16": torch.float16, "half": torch.float16, "fp32": torch.float32,
               "float32": torch.float32, "float": torch.float32}
DEFAULT_L2_BYTES = 64 << 20  # when the device does not report its L2 size
FLUSH_BYTES = 256 << 20  # what do_bench writes to clear L2


# ---------------------------------------------------------------------------------------------
# Run facts
# ---------------------------------------------------------------------------------------------


def _source_hash() -> str:
    """Hash of the package and benchmark sources: identifies the code where git is not available."""
    h = hashlib.sha1()
    for sub in ("tilefuse", "benchmarks"):
        for path in sorted((REPO / sub).rglob("*.py")):
            h.update(str(path.relative_to(REPO)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:10]


def commit_id() -> str:
    """``TILEFUSE_COMMIT``, else the git commit (``-dirty`` with local changes), else a source hash."""
    env = os.environ.get("TILEFUSE_COMMIT", "").strip()
    if env:
        return env
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "src-" + _source_hash()


def run_info(device: torch.device | None = None) -> dict:
    """device, torch, triton, commit, date (UTC) for every CSV row of this run."""
    import triton

    if device is not None and device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = "cpu-interpreter"
    return {
        "device": name,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "commit": commit_id(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def l2_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return DEFAULT_L2_BYTES
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or DEFAULT_L2_BYTES)


# ---------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------


@dataclass
class RankCtx:
    """What a benchmark function gets on each rank."""

    rank: int
    world: int
    device: torch.device
    heap: object  # tilefuse SymmetricHeap
    pg_backend: str  # "nccl" or "gloo": the process group tilefuse was initialised with
    host_group: object  # gloo group for host barriers and reductions

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def sync(self) -> None:
        if self.on_gpu:
            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        """This rank's device work is done and every rank got here."""
        self.sync()
        if self.world > 1:
            dist.barrier(group=self.host_group)

    def max(self, value: float) -> float:
        """Maximum of ``value`` over ranks (NaN if any rank has NaN)."""
        if self.world == 1:
            return float(value)
        nan = math.isnan(value)
        t = torch.tensor([0.0 if nan else float(value), 1.0 if nan else 0.0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.host_group)
        return float("nan") if t[1] > 0 else float(t[0])

    def all_true(self, flag: bool) -> bool:
        if self.world == 1:
            return bool(flag)
        t = torch.tensor([0 if flag else 1], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.host_group)
        return int(t[0]) == 0

    def all_gather_object(self, obj) -> list:
        """Every rank's ``obj`` (picklable), in rank order (a host round trip on the gloo group)."""
        if self.world == 1:
            return [obj]
        out: list = [None] * self.world
        dist.all_gather_object(out, obj, group=self.host_group)
        return out


class LaunchError(RuntimeError):
    """One or more ranks raised; the message holds their tracebacks."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def is_main_process() -> bool:
    """The process that prints and writes files: the launcher, or rank 0 under torchrun."""
    return not under_torchrun() or int(os.environ["RANK"]) == 0


def _pg_backend(world: int) -> str:
    forced = os.environ.get("BENCH_PG_BACKEND", "").strip().lower()
    if forced:
        return forced
    from tilefuse.runtime import _env

    if _env.requested_backend() == "cuda" and torch.cuda.device_count() >= world:
        return "nccl"
    return "gloo"


def _run_rank(rank: int, world: int, init_method: str, local_rank: int, fn, args, kwargs, heap_size):
    import tilefuse
    from tilefuse.runtime import _env

    if _env.requested_backend() == "cuda":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    pg = _pg_backend(world)
    dist.init_process_group(pg, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    try:
        host_group = dist.new_group(backend="gloo") if pg != "gloo" else dist.group.WORLD
        heap = tilefuse.init(heap_size=heap_size)
        ctx = RankCtx(rank=rank, world=world, device=heap.device, heap=heap, pg_backend=pg,
                      host_group=host_group)
        try:
            return fn(ctx, *args, **kwargs)
        finally:
            tilefuse.shutdown()
    finally:
        dist.destroy_process_group()


def _worker(rank, world, port, fn, args, kwargs, heap_size, results) -> None:
    try:
        value = _run_rank(rank, world, f"tcp://127.0.0.1:{port}", rank, fn, args, kwargs, heap_size)
        results.put((rank, "ok", value))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))


def launch(fn, world: int, *args, heap_size: int | None = None, timeout: float = 1800.0, **kwargs):
    """Run ``fn(ctx, *args, **kwargs)`` on ``world`` ranks; return the list of per-rank results.

    Under torchrun ``world`` is ignored (``WORLD_SIZE`` rules) and the list holds only this rank's
    result. Raises :class:`LaunchError` with every failing rank's traceback.
    """
    if under_torchrun():
        env_world = int(os.environ["WORLD_SIZE"])
        rank = int(os.environ["RANK"])
        local = int(os.environ.get("LOCAL_RANK", rank))
        return [_run_rank(rank, env_world, "env://", local, fn, args, kwargs, heap_size)]
    if not torch.cuda.is_available() or os.environ.get("TILEFUSE_BACKEND", "").lower() == "cpu":
        # Children must interpret kernels: set it before they import any Triton kernel module.
        os.environ["TILEFUSE_BACKEND"] = "cpu"
        os.environ["TRITON_INTERPRET"] = "1"
    if world == 1:
        return [_run_rank(0, 1, f"tcp://127.0.0.1:{_free_port()}", 0, fn, args, kwargs, heap_size)]
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, fn, args, kwargs, heap_size, results),
                         daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    got: dict = {}
    deadline = time.monotonic() + timeout
    try:
        while len(got) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                rank, status, value = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                if any(not p.is_alive() and r not in got for r, p in enumerate(procs)):
                    time.sleep(1.0)  # a rank may have died right after putting its result
                    while not results.empty():
                        rank, status, value = results.get()
                        got[rank] = (status, value)
                    dead = {r: p.exitcode for r, p in enumerate(procs) if not p.is_alive() and r not in got}
                    if dead:
                        got.update({r: ("error", f"process died, exit code {c}") for r, c in dead.items()})
                        break
                continue
            got[rank] = (status, value)
            if status == "error":
                deadline = min(deadline, time.monotonic() + 30.0)  # the others may be stuck on it
    finally:
        for p in procs:
            p.join(timeout=max(0.0, 10.0 if len(got) == world else 1.0))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    errors = {r: v for r, (s, v) in got.items() if s == "error"}
    missing = sorted(set(range(world)) - set(got))
    if errors or missing:
        parts = [f"{len(errors)} rank(s) failed" + (f"; ranks {missing} did not finish" if missing else "")]
        parts += [f"--- rank {r} ---\n{errors[r]}" for r in sorted(errors)]
        raise LaunchError("\n".join(parts))
    return [got[r][1] for r in range(world)]


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


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
    time), each call after an L2 clear and timed with CUDA events; with several ranks or
    ``sync_each`` each call also starts on an idle GPU after a barrier. Drift and oscillation of the
    GPU's clocks (an H200 at its power cap swings ±5 % with a period of about a second:
    docs/PERF.md, session 3) then reach every function alike, where timing one function for 100 ms
    and then the next hands each a different phase of the swing. ``rep_ms`` is each function's
    share of the timed calls. ``host_ms``, if given, is a list of lists that receives each
    function's host time per call (on the per-call-barrier path). Collective when ``ctx.world > 1``.
    """
    if not ctx.on_gpu:
        return [bench(ctx, fn, cpu_reps=cpu_reps) for fn in fns]
    medians = _event_medians(ctx, fns, warmup_ms=warmup_ms, rep_ms=rep_ms, min_reps=min_reps, max_reps=max_reps,
                             per_call=ctx.world > 1 or sync_each, host_ms=host_ms)
    return [ctx.max(t) for t in medians]


def round_order(items: list, round_index: int) -> list:
    """The order to time ``items`` in, round ``round_index``: forward in even rounds, reversed in odd.

    A GPU that runs GEMMs back to back for seconds warms up and may lower its clocks, so a method
    always timed late in a round is penalised against one timed early; alternating the order gives
    every method the same average position over an even number of rounds.
    """
    return list(items) if round_index % 2 == 0 else list(reversed(items))


def bench_max(ctx: RankCtx, fn, **kwargs) -> float:
    """Cross-rank maximum of the per-rank medians of :func:`bench`."""
    return ctx.max(bench(ctx, fn, **kwargs))


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """‖got − ref‖ / ‖ref‖ in float64 (NaN if the shapes differ or ``got`` has NaN/inf)."""
    g, r = got.double(), ref.double()
    if g.shape != r.shape or not torch.isfinite(g).all():
        return float("nan")
    denom = torch.linalg.vector_norm(r).item()
    return torch.linalg.vector_norm(g - r).item() / (denom if denom > 0 else 1.0)


def tolerance(dtype: torch.dtype, on_gpu: bool) -> float:
    """Largest accepted :func:`rel_error` against the fp32 product, per dtype."""
    if dtype == torch.float32:
        return 5e-3 if on_gpu else 1e-5  # tf32 tensor cores on a GPU
    return 1e-2


def parse_dtype(name: str) -> torch.dtype:
    """``bf16``/``bfloat16``, ``fp16``/``float16``, ``fp32``/``float32``."""
    try:
        return DTYPE_NAMES[name.strip().lower().removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use one of {sorted(DTYPE_NAMES)}") from None


def error_text(err: BaseException) -> str:
    """One line for the CSV ``note``: the exception's type and the first line of its message."""
    return f"{type(err).__name__}: {err}".splitlines()[0][:300]


def cuda_alive(ctx: RankCtx) -> bool:
    """False when this rank's GPU context is broken (e.g. after an illegal memory access)."""
    try:
        ctx.sync()
        return True
    except Exception:
        return False


def poison_workspaces(*extra: torch.Tensor) -> None:
    """NaN into every floating-point heap workspace of the ops and into the tensors ``extra``
    (e.g. an ``out=`` heap buffer peers write into), between two barriers (collective).

    A checked call after this fails its check if it reads a workspace element that it did not
    write in this call. Flags and counters are left alone (their protocol is the tests' business).
    """
    import tilefuse
    from tilefuse.ops.common import launch as oplaunch

    tilefuse.barrier()
    buffers = [b for ws in oplaunch._WORKSPACES.values() for b in ws.buffers.values()] + list(extra)
    for buf in buffers:
        if buf.dtype.is_floating_point:
            buf.fill_(float("nan"))
    tilefuse.barrier()


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def row(op: str, variant: str, M, N, K, dtype, world: int, metric: str, value, note: str = "") -> dict:
    """One long-format measurement (run facts are added by :func:`write_csv`)."""
    return {"op": op, "variant": variant, "M": M, "N": N, "K": K,
            "dtype": str(dtype).replace("torch.", ""), "world": world, "metric": metric,
            "value": value, "note": note}


def read_csv(path):
    """A results CSV as a DataFrame, with text columns kept as text (a commit like ``3436e23`` is not a
    number)."""
    import pandas as pd

    return pd.read_csv(path, dtype={"commit": str, "note": str, "device": str, "torch": str, "triton": str})


def write_csv(rows: list, path: str | os.PathLike, info: dict, append: bool = False,
              columns: list | None = None) -> None:
    """Write ``rows`` (dicts from :func:`row`) with the run facts ``info`` to ``path``.

    ``columns`` (default :data:`COLUMNS`) names the CSV columns in order; keys of a row that are
    not among them are dropped, missing ones are left empty.
    """
    import pandas as pd

    frame = pd.DataFrame([{**info, **r} for r in rows], columns=columns or COLUMNS)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    exists = append and path.exists() and path.stat().st_size > 0
    frame.to_csv(path, mode="a" if exists else "w", header=not exists, index=False)


def _cell(value) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return f"{value:.0f}"
        if abs(value) >= 1e-2:
            return f"{value:.3g}" if abs(value) < 100 else f"{value:.1f}"
        return f"{value:.2e}"
    return str(value)


def format_table(records: list, columns: list, title: str | None = None) -> str:
    """A fixed-width text table of ``records`` (dicts) with ``columns`` in order."""
    cells = [[_cell(r.get(c, "")) for c in columns] for r in records]
    widths = [max([len(c)] + [len(row_[i]) for row_ in cells]) for i, c in enumerate(columns)]
    lines = [] if title is None else [title]
    lines.append("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    lines.append("  ".join("-" * w for w in widths))
    for row_ in cells:
        lines.append("  ".join(v.rjust(w) if _numeric(v) else v.ljust(w) for v, w in zip(row_, widths)))
    return "\n".join(lines)


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def print_table(records: list, columns: list, title: str | None = None) -> None:
    print(format_table(records, columns, title), flush=True)


def parse_bytes(text: str) -> int:
    """``4K``, ``1M``, ``1G`` or a plain byte count."""
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def human_bytes(n: int) -> str:
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


class Progress:
    """Progress of a long run on stderr: a tqdm bar where tqdm is importable and stderr is a
    terminal, else a plain ``[done/total]`` line at most every ``every_s`` seconds (a log file
    then gets a few readable lines instead of a stream of carriage returns). ``enabled=False``
    prints nothing (pass it on every rank but the one that reports)."""

    def __init__(self, total: int, desc: str = "", enabled: bool = True, every_s: float = 30.0):
        self.total, self.desc, self.enabled, self.every_s = total, desc, enabled, every_s
        self.done = 0
        self._last = time.monotonic()
        self._file = sys.stderr
        self._bar = None
        if enabled and self._file.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total, desc=desc, file=self._file, dynamic_ncols=True, leave=True)

    def update(self, n: int = 1, what: str = "") -> None:
        self.done += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
            if what:
                self._bar.set_postfix_str(what, refresh=False)
            return
        now = time.monotonic()
        if now - self._last >= self.every_s or self.done >= self.total:
            self._last = now
            print(f"{self.desc} [{self.done}/{self.total}] {what}".strip(), file=self._file, flush=True)

    def write(self, text: str) -> None:
        """Print a line without breaking the bar (nothing when disabled)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text, file=sys.stdout)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def settle(ctx: RankCtx, fn) -> int:
    """Run ``fn()`` back to back until the GPU's clocks have settled under load (collective; see
    :func:`tilefuse.tuning.timing.settle`), before a shape's methods are timed."""
    from tilefuse.tuning.timing import settle as _settle

    return _settle(fn, device=ctx.device, agree=ctx.max)
