"""Host cost of an op call: host µs per eager call and device µs per call timed alone, for torch's
own calls, the plain path, auto and each fused variant.

    python -m benchmarks host --out DIR                        # a GPU: W = 1 on 24 random shapes; W = 2
    TILEFUSE_AUTOTUNE=0 python -m benchmarks host --world 1 --variants torch,plain,auto --out DIR
                                                               # auto->plain against torch (no tuning)
    python -m benchmarks host --tiny --world 1,2 --out DIR     # CPU ranks: 8x64 @ 64x64
    python -m benchmarks host --real-launches --shapes 1x4096x8192,16x4096x8192 --out DIR
    python -m benchmarks host --parts --ops gemm_all_reduce --variants wg_specialized --tiny

Methods per op (``--variants`` picks, default all): ``torch`` (torch.matmul and the op's tensor
collective as a user writes them: ``all_gather_into_tensor`` (gemm_all_scatter: the blocks then laid
side by side, one copy, as the op returns them), ``reduce_scatter_tensor`` or ``all_reduce``; through
host memory where gloo carries CUDA tensors), ``plain`` and ``auto`` (the public function; auto's note
says what it ran), each fused variant and named form (the public function) and ``plain_custom_op``
(``torch.ops.tilefuse.<op>``: what traced code and autograd pay); ``--layers``: at W = 1 also op
``linear``, nn.Linear against ColumnParallelLinear and RowParallelLinear (TP size 1, bias, ``x [M, K]
-> [M, N]``). Every rank calls ``op(a [M, K], b [K, N])``; gemm_reduce_scatter's M is rounded up to a
multiple of W. ``--noop-collectives`` (W > 1): torch.distributed's collectives do nothing while timed.

Shapes. ``--shapes MxNxK,...``; else at W = 1 a seeded random set (``--random 24 --seed 0``: M
log-uniform in 1-8192, N and K log-uniform in 1024-28672 in steps of 128, dtypes bf16 and fp16 in
turn) and at W > 1 ``--wide-shapes`` (ranks share one GPU through gloo there: host time only).
``--tiny``: 8x64 @ 64x64, fp32 on a CPU and fp16 on a GPU. On a CPU the kernels would run in
Triton's interpreter, so tilefuse's launches are no-ops there (``--noop-launches`` on a GPU:
:func:`tilefuse.runtime.launcher.noop_launches`).

Metrics (CSV ``op, variant, M, N, K, dtype, world, mode, metric, value, device, commit, note``,
one file per world size under ``--out``, the maximum over the ranks):

============  ================  ===========================================================
mode          metric            how
============  ================  ===========================================================
eager         host_us           ``--calls`` back-to-back calls, methods interleaved over
                                ``--rounds`` rounds, the device idle at each start: median
                                over rounds of host µs per call (``--clock``)
eager         done_us           the same calls until the device finished them (GPU)
eager         alone_host_us     one call after a device sync, host clock (median of ``--alone``;
                                the methods take turns)
eager         device_us         that call's CUDA events (GPU, W = 1): device µs timed alone
eager         rel_err, ok       real launches at W = 1: each method once more on new
                                operands, workspaces poisoned, against the op's reference
graph         host_us, wall_us  ``--graphs``: host µs per ``graph.replay()`` and µs per replay
============  ================  ===========================================================

``--clock``: ``wall`` (``time.perf_counter``; default at W = 1 on a GPU) or ``cpu`` (this thread's
CPU time, ``time.thread_time``: the default elsewhere, where other processes sharing the cores, or
a rank waiting for its peer inside a gloo collective, would inflate the wall time at random).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import statistics
import sys
import time

import torch
import torch.distributed as dist

import tilefuse
from tilefuse.runtime import set_debug_poison
from tilefuse.runtime.launcher import noop_launches
from tilefuse.tuning.shapes import OPS

from .checks import error_text, rel_error, tolerance
from .launch import launch, use_interpreter_without_gpu
from .results import commit_id, parse_dtype, write_rows
from .suite import FORMS, parse_custom_shape
from .timing import capture_graph

CSV_COLUMNS = ["op", "variant", "M", "N", "K", "dtype", "world", "mode", "metric", "value", "device", "commit",
               "note"]
GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def random_shapes(count: int, seed: int) -> list:
    """``count`` shapes ``(M, N, K, dtype name)``: M log-uniform in 1-8192, N and K in 1024-28672."""
    rng = random.Random(seed)

    def dim():
        return 128 * round(2 ** rng.uniform(10, math.log2(28672)) / 128)

    return [(max(1, round(2 ** rng.uniform(0, 13))), dim(), dim(), ("bf16", "fp16")[i % 2]) for i in range(count)]


def operands(device, M: int, N: int, K: int, dtype_name: str, seed: int) -> tuple:
    """``a [M, K]`` and ``b [K, N]``, random normal, made on ``device`` (the largest random shapes'
    operands take seconds to draw on a host and to copy over)."""
    g = torch.Generator(device).manual_seed(seed)
    dtype = parse_dtype(dtype_name)
    return (torch.randn(M, K, generator=g, device=device, dtype=dtype),
            torch.randn(K, N, generator=g, device=device, dtype=dtype))


def _via_host(fn, out, t, host: bool) -> None:
    if not host:
        fn(out, t)
        return
    staged = torch.empty(out.shape, dtype=out.dtype)
    fn(staged, t.cpu())
    out.copy_(staged)


def torch_calls(op: str, a, b, world: int, host: bool):
    """torch.matmul and the op's tensor collective, as a user writes them (``host``: gloo with CUDA
    tensors, which go through host memory)."""
    if world == 1:
        return a @ b
    if op == "all_gather_gemm":
        gathered = a.new_empty((world * a.shape[0], a.shape[1]))
        _via_host(GATHER, gathered, a, host)
        return gathered @ b
    part = a @ b
    if op == "gemm_all_scatter":  # the blocks gathered, then laid side by side: [M, W*N], as the op returns
        M, N = part.shape
        out = part.new_empty((world * M, N))
        _via_host(GATHER, out, part, host)
        return out.view(world, M, N).permute(1, 0, 2).reshape(M, world * N)
    if op == "gemm_reduce_scatter":
        out = part.new_empty((part.shape[0] // world, part.shape[1]))
        _via_host(SCATTER, out, part, host)
        return out
    if host:
        staged = part.cpu()
        dist.all_reduce(staged)
        return part.copy_(staged)
    dist.all_reduce(part)
    return part


def methods(op: str, world: int = 1, host: bool = False, names=None) -> dict:
    """``{name: fn(a, b)}`` for ``op`` (``names``: those only, in that order)."""
    public, custom = getattr(tilefuse, op), getattr(torch.ops.tilefuse, op)
    out = {"torch": lambda a, b: torch_calls(op, a, b, world, host),
           "plain": lambda a, b: public(a, b, variant="plain"),
           "auto": lambda a, b: public(a, b, variant="auto")}
    for v in tilefuse.VARIANTS + FORMS.get(op, ()):
        out[v] = (lambda a, b, v=v: public(a, b, variant=v))
    out["plain_custom_op"] = lambda a, b: custom(a, b, "plain", None, None)
    return out if names is None else {n: out[n] for n in names if n in out}


def layer_methods(N: int, K: int, dtype, device) -> dict:
    """``{name: fn(a, b)}`` of the linear layers at TP size 1, ``x [M, K] -> [M, N]`` with a bias (the
    ``b`` operand is not used): nn.Linear and tilefuse's two layers, default variant."""
    from torch import nn

    from tilefuse.nn import ColumnParallelLinear, RowParallelLinear

    layers = {"nn.Linear": nn.Linear(K, N, device=device, dtype=dtype),
              "ColumnParallelLinear": ColumnParallelLinear(K, N, bias=True, seed=0, device=device, dtype=dtype),
              "RowParallelLinear": RowParallelLinear(K, N, bias=True, seed=0, device=device, dtype=dtype)}
    return {name: (lambda a, b, layer=layer: layer(a)) for name, layer in layers.items()}


@contextlib.contextmanager
def noop_collectives():
    """Inside the block torch.distributed's tensor collectives do nothing (torch's calls and tilefuse's plain
    path alike): the host time a call adds without its wait for the peers (gloo waits on the CPU, which the
    CPU clock counts)."""
    here = sys.modules[__name__]
    names = [(here, "GATHER"), (here, "SCATTER")] + [(dist, name) for name in (
        "all_gather_single", "all_gather_into_tensor", "reduce_scatter_single", "reduce_scatter_tensor",
        "all_reduce") if hasattr(dist, name)]
    saved = [getattr(module, name) for module, name in names]
    for module, name in names:
        setattr(module, name, lambda *args, **kwargs: None)
    try:
        yield
    finally:
        for (module, name), fn in zip(names, saved):
            setattr(module, name, fn)


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
    """Host µs per call of ``calls`` back-to-back calls and, with ``sync``, µs per call until the
    device finished them; the device is idle at the start (a queue an earlier method filled never
    makes this one wait)."""
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


def alone_us(fns: dict, reps: int, on_gpu: bool) -> dict:
    """Per method of ``fns``: ``(host µs, device µs)`` of one call timed alone after a device sync, medians
    of ``reps`` calls, the methods taking turns in a rotating order (device µs from CUDA events, GPU only)."""
    names, hosts, devices = list(fns), {name: [] for name in fns}, {name: [] for name in fns}
    for i in range(reps):
        for name in names[i % len(names):] + names[:i % len(names)]:
            if on_gpu:
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            fns[name]()
            hosts[name].append((time.perf_counter() - t0) * 1e6)
            if on_gpu:
                end.record()
                end.synchronize()
                devices[name].append(start.elapsed_time(end) * 1e3)
    return {name: (statistics.median(hosts[name]), statistics.median(devices[name]) if on_gpu else None)
            for name in names}


def _check_methods(ctx, op, M, N, K, dtype_name, names) -> list:
    """At W = 1 each method once more on new operands (other addresses), in workspaces made anew
    that start as NaN, against the fp32 product: ``rel_err`` and ``ok`` rows (1 within
    :func:`.checks.tolerance`)."""
    a, b = operands(ctx.device, M, N, K, dtype_name, seed=2)
    dtype = a.dtype
    ref = a.float() @ b.float()  # every op at W = 1
    fns = methods(op, ctx.world)
    rows = []
    for name in names:
        tilefuse.clear_workspaces()
        old = set_debug_poison(True)
        try:
            err = rel_error(fns[name](a, b), ref)
        finally:
            set_debug_poison(old)
        base = dict(op=op, variant=name, M=M, N=N, K=K, dtype=dtype_name, world=ctx.world, mode="eager",
                    note="new operands")
        rows += [{**base, "metric": "rel_err", "value": err},
                 {**base, "metric": "ok", "value": int(err <= tolerance(dtype, ctx.on_gpu))}]
    return rows


def _job(ctx, ops, shapes, names, opts) -> list:
    W, rows = ctx.world, []
    host = ctx.on_gpu and ctx.pg_backend == "gloo"
    clock = time.perf_counter if opts["clock"] == "wall" else time.thread_time
    real = ctx.on_gpu and not opts["noop"]
    sync = torch.cuda.synchronize if real else None
    if not ctx.on_gpu:
        torch.set_num_threads(1)  # a CPU matmul of this size waits on its worker threads otherwise
        # No-op collectives leave their outputs uninitialised: denormals there would slow a CPU matmul.
        torch.set_flush_denormal(opts["noop_collectives"])
    with contextlib.nullcontext() if real else noop_launches(), torch.no_grad():
        for op in ops + (["linear"] if opts["layers"] and W == 1 else []):
            for M0, N, K, dname in shapes:
                M = -(-M0 // W) * W if op == "gemm_reduce_scatter" else M0
                a, b = operands(ctx.device, M, N, K, dname, seed=1 + ctx.rank)
                base = dict(op=op, M=M, N=N, K=K, dtype=dname, world=W)
                fns, failed = {}, {}
                table = layer_methods(N, K, a.dtype, ctx.device) if op == "linear" else methods(op, W, host, names)
                for name, f in table.items():
                    fn = (lambda f=f, a=a, b=b: f(a, b))
                    err = None
                    try:
                        for _ in range(opts["warmup"]):  # first calls: workspaces, decisions, compiles
                            fn()
                        if sync:
                            sync()
                    except Exception as e:  # recorded; the run goes on, on every rank alike
                        err = e
                    if ctx.all_true(err is None):
                        fns[name] = fn
                    else:
                        failed[name] = error_text(err) if err else "failed on another rank"
                for name, why in failed.items():
                    rows.append({**base, "variant": name, "mode": "eager", "metric": "error", "value": float("nan"),
                                 "note": why})
                ctx.barrier()
                with noop_collectives() if opts["noop_collectives"] else contextlib.nullcontext():
                    med, done = interleaved_us(fns, opts["calls"], opts["rounds"], clock, sync)
                note = f"auto runs {tilefuse.auto_choice(op, a, b)[0]}" if "auto" in fns else ""
                alone = alone_us(fns, opts["alone"], real) if W == 1 else {}  # ranks sharing a GPU time each other
                for name in fns:
                    r = {**base, "variant": name, "mode": "eager", "note": note if name == "auto" else ""}
                    rows.append({**r, "metric": "host_us", "value": med[name]})
                    if done:
                        rows.append({**r, "metric": "done_us", "value": done[name]})
                    if name in alone:
                        h, d = alone[name]
                        rows.append({**r, "metric": "alone_host_us", "value": h})
                        if d is not None:
                            rows.append({**r, "metric": "device_us", "value": d})
                if real and W == 1 and opts["check"] and op != "linear":
                    rows += _check_methods(ctx, op, M, N, K, dname, fns)
                if real and opts["graphs"]:
                    for name, fn in fns.items():
                        rows += _graph_rows(ctx, fn, opts, {**base, "variant": name})
                del fns
                ctx.barrier()
                tilefuse.clear_workspaces()  # collective: this shape's heap buffers go back before the next
    return rows


def _graph_rows(ctx, fn, opts, base) -> list:
    """A method captured in a CUDA graph (after warm-up on a side stream): host µs per replay and µs
    per replay; an ``error`` row where a rank could not capture it."""
    graph, err = None, None
    try:
        graph = capture_graph(ctx.device, fn, opts["warmup"])
    except Exception as e:
        err = e
        torch.cuda.synchronize()
    if not ctx.all_true(err is None):
        return [{**base, "mode": "graph", "metric": "error", "value": float("nan"),
                 "note": error_text(err) if err else "capture failed on another rank"}]
    graph.replay()
    ctx.barrier()
    hosts = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(opts["calls"]):
        t0 = time.perf_counter()
        graph.replay()
        hosts.append((time.perf_counter() - t0) * 1e6)
    end.record()
    torch.cuda.synchronize()
    return [{**base, "mode": "graph", "metric": "host_us", "value": statistics.median(hosts), "note": ""},
            {**base, "mode": "graph", "metric": "wall_us", "value": start.elapsed_time(end) * 1e3 / opts["calls"],
             "note": ""}]


def merge(per_rank: list) -> list:
    """One row per measurement: the maximum over the ranks (an error on any rank is the error)."""
    merged: dict = {}
    for rows in per_rank:
        for r in rows:
            key = tuple(r[c] for c in ("op", "variant", "M", "N", "K", "dtype", "mode", "metric"))
            hit = merged.get(key)
            if hit is None:
                merged[key] = dict(r)
            elif r["metric"] != "error" and r["value"] > hit["value"]:
                hit["value"] = r["value"]
    return list(merged.values())


def summary(rows: list) -> list:
    """Lines: per op and shape, each method's eager host µs (and device µs), plain and auto against torch."""
    get = {(r["op"], r["M"], r["N"], r["K"], r["dtype"], r["variant"], r["metric"]): r["value"] for r in rows
           if r["mode"] == "eager"}
    lines = []
    for shape in dict.fromkeys(k[:5] for k in get):
        torch_us = get.get((*shape, "torch", "host_us"))
        parts = []
        for name in dict.fromkeys(k[5] for k in get if k[:5] == shape):
            us = get.get((*shape, name, "host_us"))
            if us is None:
                continue
            dev = get.get((*shape, name, "device_us"))
            extra = f" +{us - torch_us:.1f}" if torch_us is not None and name in ("plain", "auto") else ""
            parts.append(f"{name} {us:.1f}{extra}" + (f" (dev {dev:.1f})" if dev is not None else ""))
        op, M, N, K, dtype = shape
        lines.append(f"{op:20s} {M}x{N}x{K} {dtype}: " + ", ".join(parts))
    return lines


def _parts_job(ctx, op, variant, shape, calls) -> list:
    M, N, K, dname = shape
    a = torch.randn(M, K, device=ctx.device).to(parse_dtype(dname))
    b = torch.randn(K, N, device=ctx.device).to(parse_dtype(dname))
    public, custom = getattr(tilefuse, op), getattr(torch.ops.tilefuse, op)
    parts = {f"public tilefuse.{op}(a, b, variant={variant!r})": lambda: public(a, b, variant=variant),
             f"custom op torch.ops.tilefuse.{op}(a, b, {variant!r})": lambda: custom(a, b, variant, None, None),
             "torch.matmul(a, b)": lambda: torch.matmul(a, b),
             "torch.empty(M, N)": lambda: torch.empty(M, N, dtype=a.dtype, device=a.device),
             "a.device": lambda: a.device}
    if a.is_cuda:
        parts["torch.cuda.is_current_stream_capturing()"] = torch.cuda.is_current_stream_capturing
    lines = [f"{op} {variant} {M}x{N}x{K} {dname}", "parts of a call, each alone:"]
    for name, f in parts.items():
        for _ in range(5):
            f()
        reps = calls if "(a, b" in name else 20 * calls
        t0 = time.perf_counter_ns()
        for _ in range(reps):
            f()
        lines.append(f"  {(time.perf_counter_ns() - t0) / reps / 1e3:7.2f} us  {name}")
        tilefuse.synchronize()
    return lines


def _shape_list(args) -> list:
    if args.tiny:  # fp32 on a CPU: its fp16 matmul is slow and noisy
        return [(8, 64, 64, args.dtype or ("fp16" if torch.cuda.is_available() else "fp32"))]
    if args.shapes:
        return [(*parse_custom_shape(s), args.dtype or "bf16") for s in args.shapes.split(",")]
    return [(M, N, K, args.dtype or d) for M, N, K, d in random_shapes(args.random, args.seed)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", default="1,2", help="world sizes, comma-separated")
    p.add_argument("--ops", default="all", help="comma-separated ops, or all")
    p.add_argument("--variants", default=None, help="comma-separated methods (default: all)")
    p.add_argument("--shapes", default=None, help="MxNxK,... at W = 1 (default: --random shapes)")
    p.add_argument("--random", type=int, default=24, help="how many random shapes at W = 1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--wide-shapes", default="1x4096x8192,16x4096x8192,128x4096x8192", help="MxNxK,... at W > 1")
    p.add_argument("--dtype", default=None, choices=("bf16", "fp16", "fp32"), help="every shape's dtype")
    p.add_argument("--tiny", action="store_true", help="8x64 @ 64x64 at every world size (CPU ranks)")
    p.add_argument("--calls", type=int, default=20, help="back-to-back calls per method and round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--alone", type=int, default=21, help="calls timed alone per method, in turns (W = 1)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--real-launches", action="store_true", help="launch the kernels (the default on a GPU)")
    p.add_argument("--noop-launches", action="store_true", help="make tilefuse's launches no-ops on a GPU too")
    p.add_argument("--noop-collectives", action="store_true",
                   help="W > 1: torch's and the plain path's collectives do nothing while timed (host time alone)")
    p.add_argument("--no-check", action="store_true", help="skip the check of every method on new operands")
    p.add_argument("--graphs", action="store_true", help="also time each method replayed in a CUDA graph")
    p.add_argument("--layers", action="store_true", help="at W = 1 also nn.Linear against tilefuse's layers "
                   "(op 'linear', x [M, K] -> [M, N])")
    p.add_argument("--clock", choices=("wall", "cpu"), default=None)
    p.add_argument("--heap", type=int, default=None, help="heap bytes per rank (default: the launcher's)")
    p.add_argument("--parts", action="store_true", help="the parts of one call of --ops/--variants, timed alone")
    p.add_argument("--out", default="bench_out/host", help="folder of the CSVs (host_w<W>.csv)")
    args = p.parse_args(argv)
    on_cpu = use_interpreter_without_gpu()
    if on_cpu and args.real_launches:
        p.error("--real-launches needs a GPU (the interpreter would run the kernels)")
    if args.parts:  # the pieces a call is made of, each timed alone (W = 1, this process)
        op = "all_gather_gemm" if args.ops == "all" else args.ops.split(",")[0]
        [lines] = launch(_parts_job, 1, op, (args.variants or "plain").split(",")[0], _shape_list(args)[0], args.calls)
        print("\n".join(lines))
        return 0
    ops = list(OPS) if args.ops == "all" else args.ops.split(",")
    if sorted(set(ops) - set(OPS)):
        p.error(f"unknown op(s) {sorted(set(ops) - set(OPS))}; ops are {list(OPS)}")
    names = args.variants.split(",") if args.variants else None
    device = "cpu" if on_cpu else torch.cuda.get_device_name()
    commit = commit_id()
    os.makedirs(args.out, exist_ok=True)
    for W in (int(w) for w in args.world.split(",")):
        shapes = _shape_list(args) if W == 1 or args.tiny else [
            (*parse_custom_shape(s), args.dtype or "bf16") for s in args.wide_shapes.split(",")]
        opts = dict(calls=args.calls, rounds=args.rounds, alone=args.alone, warmup=args.warmup,
                    noop=args.noop_launches or on_cpu, noop_collectives=args.noop_collectives,
                    check=not args.no_check, graphs=args.graphs, layers=args.layers,
                    clock=args.clock or ("wall" if W == 1 and not on_cpu else "cpu"))
        rows = merge(launch(_job, W, ops, shapes, names, opts, heap_size=args.heap))
        print(f"host: world {W}, {device}, {'no-op' if opts['noop'] else 'real'} launches, {opts['clock']} clock, "
              f"commit {commit}; host us per eager call (+ over torch)")
        print("\n".join(summary(rows)))
        for r in rows:
            if r["metric"] == "error" or (r["metric"] == "ok" and not r["value"]):
                print(f"{r['op']} {r['M']}x{r['N']}x{r['K']} {r['variant']}: {r['metric'].upper()} {r['note']}",
                      file=sys.stderr)
        write_rows(os.path.join(args.out, f"host_w{W}.csv"), rows, CSV_COLUMNS, device=device, commit=commit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
