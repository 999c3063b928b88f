"""Host cost per call of every op x variant, eagerly and inside a CUDA graph, next to torch.

    python -m benchmarks.host_overhead [--world 1,2] [--M 1,16,128,1024] [--N 4096] [--K 8192]
                                       [--calls 200] [--replays 100] [--csv host_overhead.csv]
    python -m benchmarks.host_overhead --smoke --world 2      # CPU ranks: tiny shapes, no graphs

Every rank calls ``op(a [M, K], b [K, N])`` (per-rank operands; gemm_reduce_scatter's M is rounded
up to a multiple of the world size) with, per op, each registered variant, ``plain`` and ``auto``
through the public function (eager and without gradients, it calls the entry point straight away:
see :func:`tilefuse.ops.library.call`; auto's rows' note says what it ran),
``plain_custom_op`` (``torch.ops.tilefuse.<op>``, what traced
code and autograd run: the dispatcher's cost on top), ``plain_entry`` (the plain path's registry
entry called directly, no public-function checks) and ``torch`` (torch.matmul
and the op's collective called straight from torch.distributed: ``all_gather_into_tensor``,
``reduce_scatter_tensor`` or ``all_reduce`` on NCCL; gemm_all_scatter's gather lands row-blocked,
without the transpose to column blocks). Measured, per mode:

========  ==========  ==========================================================================
mode      metric      how
========  ==========  ==========================================================================
eager     host_us     ``time.perf_counter`` around each call, no sync; median of ``--calls``
eager     wall_us     ``--calls`` back-to-back calls between two device syncs (after a barrier),
                      divided by the number of calls
graph     host_us     the call captured once in a ``torch.cuda.CUDAGraph`` (after warm-up on a
                      side stream); median host time of ``graph.replay()``
graph     wall_us     CUDA events around ``--replays`` replays, divided by the number of replays
========  ==========  ==========================================================================

Host time does not depend on how many GPUs there are: at W = 2 the ranks may share one GPU (gloo
then carries the collectives, and the ``torch`` baseline and the plain path are not capturable).
A method that raises (a capture the variant does not support yet, a collective gloo lacks) gets
an ``error`` row whose note is the error, and the run goes on; ranks agree on every failure before
timing, so no rank is left in a collective. The CSV is long format: ``op, variant, M, N, K, dtype,
world, mode, metric, value, device, commit, note``; a value is the maximum over the ranks.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import tilefuse
from tilefuse.ops import registry

from .common import commit_id, error_text, launch, parse_dtype
from .results import write_rows
from .timing import capture_graph, sync

CSV_COLUMNS = ["op", "variant", "M", "N", "K", "dtype", "world", "mode", "metric", "value", "device", "commit",
               "note"]


def _worst(ctx, code: int) -> int:
    """The largest ``code`` over the ranks (a host all-reduce on the gloo group)."""
    if ctx.world == 1:
        return code
    box = torch.tensor([code], dtype=torch.int32)
    dist.all_reduce(box, op=dist.ReduceOp.MAX, group=ctx.host_group)
    return int(box.item())


def _agree(ctx, ok: bool) -> bool:
    """True when every rank is ``ok``."""
    return _worst(ctx, 0 if ok else 1) == 0


def _barrier(ctx) -> None:
    if ctx.world > 1:
        dist.barrier(group=ctx.host_group)


def torch_baseline(op: str, a: torch.Tensor, b: torch.Tensor, world: int):
    """torch.matmul and the op's collective, straight from torch.distributed (tensor collectives)."""
    if op == "gemm_all_scatter":
        part = a @ b
        out = part.new_empty((world * part.shape[0], part.shape[1]))
        dist.all_gather_into_tensor(out, part)
        return out
    if op == "all_gather_gemm":
        gathered = a.new_empty((world * a.shape[0], a.shape[1]))
        dist.all_gather_into_tensor(gathered, a)
        return gathered @ b
    if op == "gemm_reduce_scatter":
        part = a @ b
        out = part.new_empty((part.shape[0] // world, part.shape[1]))
        dist.reduce_scatter_tensor(out, part)
        return out
    if op == "gemm_all_reduce":
        part = a @ b
        dist.all_reduce(part)
        return part
    raise ValueError(f"no torch baseline for {op}")


def methods(op: str, world: int) -> dict:
    """``{name: fn(a, b)}`` timed for ``op``: the variants and plain (public function), the plain
    path's registry entry and the torch baseline."""
    public = getattr(tilefuse, op)
    have = registry.variants(op)
    out = {v: (lambda a, b, v=v: public(a, b, variant=v)) for v in (*tilefuse.VARIANTS, "plain") if v in have}
    out["auto"] = lambda a, b: public(a, b, variant="auto")
    if "plain" in have:
        entry = registry.get(op, "plain")
        out["plain_entry"] = lambda a, b: entry(a, b)
        custom = getattr(torch.ops.tilefuse, op)
        out["plain_custom_op"] = lambda a, b: custom(a, b, "plain", None, None)
    out["torch"] = lambda a, b: torch_baseline(op, a, b, world)
    return out


def _eager(ctx, fn, calls: int, warmup: int) -> dict:
    for _ in range(warmup):
        fn()
    sync(ctx.device)
    _barrier(ctx)
    host = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        host.append(time.perf_counter() - t0)
    sync(ctx.device)
    _barrier(ctx)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync(ctx.device)
    wall = time.perf_counter() - t0
    return {"host_us": statistics.median(host) * 1e6, "wall_us": wall / calls * 1e6}


def _replay(ctx, graph, replays: int) -> dict:
    graph.replay()
    sync(ctx.device)
    _barrier(ctx)
    host = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        t0 = time.perf_counter()
        graph.replay()
        host.append(time.perf_counter() - t0)
    end.record()
    sync(ctx.device)
    return {"host_us": statistics.median(host) * 1e6, "wall_us": start.elapsed_time(end) / replays * 1e3}


def _job(ctx, ops, Ms, N, K, dtype_name, calls, replays, warmup, graphs) -> list:
    dtype = parse_dtype(dtype_name)
    W = ctx.world
    rows = []
    graphs_ok = graphs and ctx.device.type == "cuda"

    def record(op, name, M, mode, values, note=""):
        for metric, value in values.items():
            rows.append(dict(op=op, variant=name, M=M, N=N, K=K, dtype=dtype_name, world=W, mode=mode,
                             metric=metric, value=value, note=note))

    for op in ops:
        for M0 in Ms:
            M = -(-M0 // W) * W if op == "gemm_reduce_scatter" else M0
            g = torch.Generator().manual_seed(1 + ctx.rank)
            a = torch.randn(M, K, generator=g).to(ctx.device, dtype)
            b = torch.randn(K, N, generator=g).to(ctx.device, dtype)
            for name, fn in methods(op, W).items():
                graphs_ok = _measure(ctx, record, op, name, M, fn, a, b, calls, replays, warmup, graphs_ok)
        sync(ctx.device)
        tilefuse.barrier()
        tilefuse.clear_workspaces()  # collective: this op's heap buffers go back before the next op
    return rows


def _measure(ctx, record, op, name, M, fn, a, b, calls, replays, warmup, graphs_ok) -> bool:
    """Time one method eagerly and (``graphs_ok``) in a graph; returns whether later captures may run."""
    call = (lambda: fn(a, b))
    err = None
    try:
        call()  # first call: shape exchange, workspaces, table lookup
        sync(ctx.device)
    except Exception as e:  # recorded, and the run goes on
        err = e
    if not _agree(ctx, err is None):
        record(op, name, M, "eager", {"error": float("nan")}, error_text(err) if err else "failed on another rank")
        return graphs_ok
    note = ""
    if name == "auto":
        from tilefuse.ops import dispatch

        note = f"auto runs {dispatch.choose_variant(op, a, b)}"
    record(op, name, M, "eager", _eager(ctx, call, calls, warmup), note)
    if not graphs_ok:
        return graphs_ok
    graph, err, code = None, None, 0
    try:
        graph = capture_graph(ctx.device, call, warmup)
    except Exception as e:
        err, code = e, 1
        try:
            sync(ctx.device)
        except Exception:
            code = 2  # the context is broken: no more captures
    worst = _worst(ctx, code)
    if worst:
        record(op, name, M, "graph", {"error": float("nan")},
               error_text(err) if err else "capture failed on another rank")
        return worst < 2  # the same on every rank, so their calls stay matched
    record(op, name, M, "graph", _replay(ctx, graph, replays), note)
    del graph
    return graphs_ok


def merge(per_rank: list) -> list:
    """One row per measurement: the maximum over the ranks (an error on any rank is the error)."""
    merged: dict = {}
    for rows in per_rank:
        for r in rows:
            key = tuple(r[c] for c in ("op", "variant", "M", "mode", "metric"))
            hit = merged.get(key)
            if hit is None:
                merged[key] = dict(r)
            elif r["metric"] != "error" and r["value"] > hit["value"]:
                hit["value"] = r["value"]
    return list(merged.values())


def _print(rows: list) -> None:
    eager = {(r["op"], r["M"], r["variant"]): r["value"] for r in rows
             if r["mode"] == "eager" and r["metric"] == "host_us"}
    wall = {(r["op"], r["M"], r["variant"]): r["value"] for r in rows
            if r["mode"] == "eager" and r["metric"] == "wall_us"}
    notes = {(r["op"], r["M"], r["variant"]): r["note"] for r in rows if r["note"] and r["metric"] != "error"}
    for (op, M, name), us in sorted(eager.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        plain = eager.get((op, M, "plain"))
        ratio = f"{us / plain:5.2f}x plain" if plain else ""
        w = wall.get((op, M, name), float("nan"))
        print(f"{op:22s} M={M:<5d} {name:18s} host {us:9.1f} us  {ratio}  wall {w:9.1f} us  "
              f"{notes.get((op, M, name), '')}".rstrip())
    for r in rows:
        if r["metric"] == "error":
            print(f"{r['op']:22s} M={r['M']:<5d} {r['variant']:18s} {r['mode']}: ERROR {r['note'][:160]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", default="1,2", help="world sizes, comma-separated")
    p.add_argument("--M", default="1,16,128,1024", help="rows of a, comma-separated")
    p.add_argument("--N", type=int, default=4096)
    p.add_argument("--K", type=int, default=8192)
    p.add_argument("--dtype", default=None, choices=("bf16", "fp16", "fp32"), help="default bf16 on GPUs, fp16 on CPUs")
    p.add_argument("--ops", default="all", help="comma-separated ops, or all")
    p.add_argument("--calls", type=int, default=200, help="timed eager calls per method")
    p.add_argument("--replays", type=int, default=100, help="timed graph replays per method")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--no-graphs", action="store_true", help="eager only")
    p.add_argument("--smoke", action="store_true", help="CPU check of the plumbing: N=32, K=64, M 1,16, "
                   "2 calls, no graphs (timings mean nothing)")
    p.add_argument("--heap", type=int, default=None, help="heap bytes per rank (default: the launcher's)")
    p.add_argument("--csv", default="host_overhead.csv")
    args = p.parse_args(argv)
    if args.smoke:
        args.N, args.K, args.calls, args.replays, args.warmup, args.no_graphs = 32, 64, 2, 2, 0, True
        if args.M == p.get_default("M"):
            args.M = "1,16"
    ops = list(registry.OPS) if args.ops == "all" else args.ops.split(",")
    unknown = sorted(set(ops) - set(registry.OPS))
    if unknown:
        p.error(f"unknown op(s) {unknown}; ops are {list(registry.OPS)}")
    Ms = [int(m) for m in args.M.split(",")]
    dtype = args.dtype or ("bf16" if torch.cuda.is_available() else "fp16")
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    commit = commit_id()
    rows = []
    for world in (int(w) for w in args.world.split(",")):
        per_rank = launch(_job, world, ops, Ms, args.N, args.K, dtype, args.calls, args.replays, args.warmup,
                          not args.no_graphs, heap_size=args.heap)
        got = merge(per_rank)
        print(f"host_overhead: world {world}, N={args.N}, K={args.K}, {dtype}, {device}")
        _print(got)
        rows += got
    write_rows(args.csv, rows, CSV_COLUMNS, device=device, commit=commit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
