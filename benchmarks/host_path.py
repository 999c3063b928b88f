"""Python host time of an op call with the kernel launches made no-ops: what the host path costs.

    python -m benchmarks host_path [--ops all] [--M 1,16,128] [--N 128] [--K 128] [--calls 300]
                                   [--rounds 7] [--csv host_path.csv] [--real-launches] [--clock cpu]

World 1, in this process. Every ``@kernel`` (:class:`tilefuse.runtime.launcher.FastKernel`) is
switched to its compiled-launch path with a stand-in binary whose launch does nothing, and the
stream lookup returns 0: what is timed is everything tilefuse's Python does around the launches
(argument checks, config, workspaces, the collective-call bookkeeping, binding each launch), plus
the torch operations of the call (output allocation, copies), which run on small tensors. On a
CPU this is the only way to see the host path (the interpreter would run the kernels); on a GPU
``--real-launches`` keeps the real kernels (host time then includes the driver's launch cost).

Methods per op: ``plain`` (public function, ``variant="plain"``), ``plain_entry`` (the registry's
plain entry point), each registered variant and named form through the public function,
``fused_sequential_entry`` (fused_sequential's entry point, without the public function's dispatch),
``auto`` (public function,
``variant="auto"``; the note says what auto resolved to) and ``<variant>_custom_op``
(``torch.ops.tilefuse.<op>``: the dispatcher's cost on top). Timing: ``--rounds`` rounds, methods
interleaved in each, every method timed over ``--calls`` back-to-back calls per round; the value is
the median over rounds of the mean time per call, in microseconds (``metric=host_us``), and
``ratio_plain`` divides it by plain's; with real launches the device is synchronized before each
method's calls (an earlier method's queued work never makes a later one wait), and ``done_us`` is
the time per call until the device finished them (above ``host_us``: the GPU, not the host, bounds
back-to-back calls). With ``--real-launches`` every method then runs once more on
new operands (other addresses) after the workspaces are poisoned, checked against the op's reference
(``rel_err``, and ``ok`` = 1 within the dtype's tolerance; a wrong one is also printed).
``--clock``: ``wall`` (``time.perf_counter``, the default on a
GPU) or ``cpu`` (this thread's CPU time, ``time.thread_time``: the default on a CPU, where other
processes sharing the cores would otherwise inflate the numbers at random). CSV columns: ``op,
variant, M, N, K, dtype, world, metric, value, device, commit, note``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import statistics
import sys
import time

import torch

from .results import parse_dtype

CSV_COLUMNS = ["op", "variant", "M", "N", "K", "dtype", "world", "metric", "value", "device", "commit", "note"]


class _NoopCompiled:
    """Stands in for a compiled Triton kernel: launching it does nothing."""

    function = None
    packed_metadata = None

    def run(self, *args):
        return None

    def launch_metadata(self, *args):
        return None


class _NoopJit:
    """Stands in for a kernel's ``JITFunction``: ``[grid](...)`` does nothing and returns the binary;
    every other attribute is the real kernel's."""

    def __init__(self, real):
        self._real = real
        self._compiled = _NoopCompiled()

    def __getattr__(self, name):
        return getattr(self._real, name)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._compiled


def _kernels() -> list:
    """Every FastKernel defined in a tilefuse module."""
    from tilefuse.runtime.launcher import FastKernel

    found = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("tilefuse.") or module is None:
            continue
        for value in vars(module).values():
            if isinstance(value, FastKernel):
                found[id(value)] = value
    return list(found.values())


@contextlib.contextmanager
def noop_launches():
    """Every tilefuse kernel launch does nothing (through the compiled-launch path) inside the block."""
    from tilefuse.runtime import launcher

    saved = []
    for k in _kernels():
        saved.append((k, k.jit_fn, k._fast, dict(k._compiled)))
        k.jit_fn = _NoopJit(k.jit_fn)
        k._fast = True
        k._compiled.clear()
    stream = launcher._current_stream
    launcher._current_stream = lambda: 0
    try:
        yield
    finally:
        launcher._current_stream = stream
        for k, jit, fast, compiled in saved:
            k.jit_fn, k._fast = jit, fast
            k._compiled.clear()
            k._compiled.update(compiled)


def methods(op: str) -> dict:
    """``{name: fn(a, b)}`` for ``op``."""
    import tilefuse
    from tilefuse.ops import registry

    public = getattr(tilefuse, op)
    have = registry.variants(op)
    entry = registry.get(op, "plain")
    out = {"plain": lambda a, b: public(a, b, variant="plain"), "plain_entry": lambda a, b: entry(a, b)}
    for v in registry.tunable(op):
        if v in have:
            out[v] = (lambda a, b, v=v: public(a, b, variant=v))
    out["fused_sequential_entry"] = registry.get(op, "fused_sequential")  # without the public function's dispatch
    out["auto"] = lambda a, b: public(a, b, variant="auto")
    custom = getattr(torch.ops.tilefuse, op)
    out["plain_custom_op"] = lambda a, b: custom(a, b, "plain", None, None)
    for v in tilefuse.VARIANTS:
        if v in have:
            out[f"{v}_custom_op"] = (lambda a, b, v=v: custom(a, b, v, None, None))
    return out


def interleaved_us(fns: dict, calls: int, rounds: int, clock, sync=None, context=None) -> tuple[dict, dict]:
    """``(host, done)``: per method of ``fns`` (name -> callable), the median over ``rounds`` rounds of
    its host µs per call in ``calls`` back-to-back calls, and with ``sync`` (a GPU) of its µs per call
    until the device finished them (``done`` is empty without). Each round runs every method in turn
    (interleaved), each inside ``context(name)`` where given."""
    times: dict = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            with context(name) if context is not None else contextlib.nullcontext():
                times[name].append(_per_call_us(fn, calls, clock, sync))
    host = {name: statistics.median(t[0] for t in ts) for name, ts in times.items()}
    done = {name: statistics.median(t[1] for t in ts) for name, ts in times.items()} if sync is not None else {}
    return host, done


def _per_call_us(fn, calls: int, clock, sync=None) -> tuple[float, float | None]:
    """Host µs per call of ``calls`` back-to-back calls, and with ``sync`` (a GPU) µs per call until
    the device finished them. The device is idle at the start (``sync`` first): a method's host time
    never includes waiting on a launch queue that an earlier method filled."""
    if sync is not None:
        sync()
    t0 = clock()
    for _ in range(calls):
        fn()
    host = clock() - t0
    if sync is None:
        return host / calls * 1e6, None
    sync()
    return host / calls * 1e6, (clock() - t0) / calls * 1e6


def _auto_note(op: str, a, b) -> str:
    from tilefuse.ops import dispatch

    try:
        return f"auto runs {dispatch.choose_variant(op, a, b)}"
    except Exception as err:  # the note only describes; the timing stands
        return f"auto: {type(err).__name__}"


def _check_methods(ctx, op, M, N, K, dtype_name, names) -> list:
    """Each timed method once more on new operands (other addresses), workspaces poisoned first,
    against the op's reference: ``rel_err`` and ``ok`` rows (1 within :func:`.checks.tolerance`)."""
    from tilefuse.ops import registry

    from .checks import poison_workspaces, rel_error, tolerance

    dtype = parse_dtype(dtype_name)
    g = torch.Generator().manual_seed(2)
    a = torch.randn(M, K, generator=g).to(ctx.device, dtype)
    b = torch.randn(K, N, generator=g).to(ctx.device, dtype)
    ref = registry.get(op, "reference")(a, b)
    fns = methods(op)
    rows = []
    for name in names:
        poison_workspaces()
        got = fns[name](a, b)
        err = rel_error(got, ref)
        base = dict(op=op, variant=name, M=M, N=N, K=K, dtype=dtype_name, world=ctx.world, note="new operands")
        rows.append({**base, "metric": "rel_err", "value": err})
        rows.append({**base, "metric": "ok", "value": int(err <= tolerance(dtype, ctx.on_gpu))})
    return rows


def _job(ctx, ops, Ms, N, K, dtype_name, calls, rounds, real, clock_name) -> list:
    import tilefuse
    from tilefuse.ops import dispatch

    dtype = parse_dtype(dtype_name)
    rows = []
    clock = time.thread_time if clock_name == "cpu" else time.perf_counter
    if not ctx.on_gpu:
        torch.set_num_threads(1)  # a CPU matmul of this size waits on its worker threads otherwise
    noop = contextlib.nullcontext() if real else noop_launches()
    with noop, torch.no_grad():
        for op in ops:
            for M in Ms:
                g = torch.Generator().manual_seed(1)
                a = torch.randn(M, K, generator=g).to(ctx.device, dtype)
                b = torch.randn(K, N, generator=g).to(ctx.device, dtype)
                fns = {name: (lambda f=f, a=a, b=b: f(a, b)) for name, f in methods(op).items()}
                for fn in fns.values():  # first calls: workspaces, decisions
                    for _ in range(3):
                        fn()
                sync = torch.cuda.synchronize if ctx.on_gpu and real else None
                med, device = interleaved_us(fns, calls, rounds, clock, sync)
                if real:
                    rows += _check_methods(ctx, op, M, N, K, dtype_name, fns.keys())
                note = _auto_note(op, a, b)
                for name, us in med.items():
                    base = dict(op=op, variant=name, M=M, N=N, K=K, dtype=dtype_name, world=ctx.world,
                                note=note if name == "auto" else "")
                    rows.append({**base, "metric": "host_us", "value": us})
                    rows.append({**base, "metric": "ratio_plain", "value": us / med["plain"]})
                    if device:  # µs per call until the GPU finished: above host_us, the GPU was the bound
                        rows.append({**base, "metric": "done_us", "value": device[name]})
            tilefuse.synchronize()
            tilefuse.clear_workspaces()
            dispatch.clear()
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default="all", help="comma-separated ops, or all")
    p.add_argument("--M", default="1,16,128", help="rows of a, comma-separated")
    p.add_argument("--N", type=int, default=128)
    p.add_argument("--K", type=int, default=128)
    p.add_argument("--dtype", default=None, choices=("fp16", "bf16", "fp32"),
                   help="default fp32 on a CPU (torch.matmul in fp16 is slow there), bf16 on a GPU")
    p.add_argument("--calls", type=int, default=300, help="back-to-back calls per method and round")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--real-launches", action="store_true", help="launch the kernels (GPU only)")
    p.add_argument("--clock", choices=("wall", "cpu"), default=None,
                   help="wall: time.perf_counter (default on a GPU); cpu: time.thread_time (default on a CPU)")
    p.add_argument("--csv", default="host_path.csv")
    args = p.parse_args(argv)

    from .launch import launch, use_interpreter_without_gpu
    from .results import commit_id

    on_cpu = use_interpreter_without_gpu()
    if on_cpu and args.real_launches:
        p.error("--real-launches needs a GPU (the interpreter would run the kernels)")
    from tilefuse.ops import registry

    ops = list(registry.OPS) if args.ops == "all" else args.ops.split(",")
    unknown = sorted(set(ops) - set(registry.OPS))
    if unknown:
        p.error(f"unknown op(s) {unknown}; ops are {list(registry.OPS)}")
    Ms = [int(m) for m in args.M.split(",")]
    args.dtype = args.dtype or ("fp32" if on_cpu else "bf16")
    args.clock = args.clock or ("cpu" if on_cpu else "wall")
    [rows] = launch(_job, 1, ops, Ms, args.N, args.K, args.dtype, args.calls, args.rounds, args.real_launches,
                    args.clock)
    device = "cpu" if on_cpu else torch.cuda.get_device_name()
    commit = commit_id()
    us = {(r["op"], r["M"], r["variant"]): r["value"] for r in rows if r["metric"] == "host_us"}
    done = {(r["op"], r["M"], r["variant"]): r["value"] for r in rows if r["metric"] == "done_us"}
    notes = {(r["op"], r["M"]): r["note"] for r in rows if r["variant"] == "auto" and r["metric"] == "host_us"}
    print(f"host_path: world 1, N={args.N}, K={args.K}, {args.dtype}, {device}, "
          f"{'real' if args.real_launches else 'no-op'} launches, {args.clock} clock, commit {commit}")
    for (op, M, name), t in us.items():
        print(f"{op:20s} M={M:<5d} {name:28s} {t:8.1f} us  {t / us[(op, M, 'plain')]:5.2f}x plain"
              + (f"  done {done[(op, M, name)]:8.1f} us" if (op, M, name) in done else ""))
    for (op, M), note in notes.items():
        print(f"{op:20s} M={M:<5d} {note}")
    bad = [r for r in rows if r["metric"] == "ok" and not r["value"]]
    for r in bad:
        print(f"{r['op']:20s} M={r['M']:<5d} {r['variant']:28s} WRONG on new operands", file=sys.stderr)
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({**r, "device": device, "commit": commit, "note": f"{args.clock} clock {r['note']}".strip()})
    print(f"wrote {len(rows)} rows to {args.csv}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
