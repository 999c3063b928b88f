"""Every op variant at world 1 against torch.matmul on the same shapes, in the same run.

    python -m benchmarks.ops_world1 [--ops gemm_all_scatter,...] [--shapes full|first|small|MxNxK,...]
                                    [--variants bulk_sync,...] [--reps 2] [--dtype bf16] [--csv PATH]

At world 1 every op is a GEMM plus its (trivial) communication machinery, so the time over
torch.matmul's is the cost of the variant's schedule, flags and copies. Methods timed per shape:

- ``torch.matmul``: cuBLAS into a preallocated output (the baseline);
- ``tilefuse.matmul``: the shared persistent GEMM core alone (``ops/common/gemm.matmul``);
- every registered variant of the op except ``reference`` (name it in ``--variants`` to add it;
  ``auto`` there adds the public op with ``variant="auto"``, i.e. the dispatcher's choice).
  For ``gemm_all_scatter`` a variant writes into a heap ``out=`` (no result copy), and
  ``<variant>[out=None]`` times the default path, which copies the result out of the heap.

Shapes are ``M x N x K`` of the GEMM at world 1: gemm_all_scatter ``a [M, K] @ b [K, N]``;
all_gather_gemm ``a [M, K]`` (the whole gathered A) ``@ b [K, N]``; gemm_reduce_scatter
``a [M, K] @ b [K, N]``. Each method is checked once on fresh random inputs against an fp32
product (relative Frobenius error, output poisoned first where the benchmark owns it), then timed
(:func:`benchmarks.common.bench_interleaved` after 1.5 s of torch.matmul: the methods' calls
interleaved one by one, inputs rotated past L2) in ``--reps`` rounds; ``ms`` is the median over
rounds and ``spread_pct`` the range of the rounds over that median. ``vs_torch`` = torch.matmul
time / method time (1.0 = as fast).
A method that fails is recorded (metric ``error``, the message in ``note``) and the run goes on.
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import sys
import traceback
import zlib

import torch

import tilefuse
from tilefuse.ops import registry
from tilefuse.ops.common import launch as oplaunch
from tilefuse.ops.common.config import default_config
from tilefuse.ops.common.gemm import matmul as tf_matmul
from tilefuse.runtime import hw

from .common import (
    Cycle,
    bench,
    bench_interleaved,
    cuda_alive,
    error_text,
    is_main_process,
    launch,
    parse_bytes,
    print_table,
    rel_error,
    rotating,
    row,
    run_info,
    settle,
    tolerance,
    write_csv,
)

OPS = ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter")
SHAPES = {
    "full": {
        "gemm_all_scatter": [(8192, 8192, 8192), (8192, 4096, 12288), (8192, 3584, 14336),
                             (8192, 4608, 36864), (8192, 8192, 28672)],
        "all_gather_gemm": [(8192, 7168, 8192), (8192, 3584, 4096), (8192, 8192, 8192)],
        "gemm_reduce_scatter": [(8192, 8192, 3584), (8192, 4096, 1792), (8192, 8192, 8192)],
    },
    "small": {op: [(96, 80, 72)] for op in OPS},  # CPU smoke: ragged against 64-wide blocks
}
SHAPES["first"] = {op: shapes[:1] for op, shapes in SHAPES["full"].items()}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
BASELINES = ("torch.matmul", "tilefuse.matmul")


def _methods(op: str, variants: list | None) -> list:
    """(label, variant, uses_out) in timing order."""
    registered = registry.variants(op)
    if variants is None:
        names = [v for v in registered if v != "reference"]
    else:
        names = [v for v in variants if v in registered or v == "auto"]
        missing = [v for v in variants if v not in registered and v != "auto"]
        if missing:
            print(f"{op}: not registered, skipped: {missing}", flush=True)
    methods = [(b, None, False) for b in BASELINES]
    for v in names:
        if op == "gemm_all_scatter":
            methods.append((v, v, True))
            methods.append((f"{v}[out=None]", v, False))
        else:
            methods.append((v, v, False))
    return methods


def _call(op: str, label: str, variant: str | None, a, b, c_plain, out, cfg):
    """One call of a method; returns its result tensor."""
    if label == "torch.matmul":
        return torch.matmul(a, b, out=c_plain)
    if label == "tilefuse.matmul":
        return tf_matmul(a, b, c_plain, cfg)
    if variant == "auto":  # the public op: dispatch by the tuned table, else the heuristic
        fn = functools.partial(getattr(tilefuse, op), variant="auto")
    else:
        fn = registry.get(op, variant)
    if out is not None:
        return fn(a, b, out=out)
    return fn(a, b)


def run_shape(ctx, op, M, N, K, dtype, methods, args) -> list:
    """Check and time every method on one shape; returns CSV rows."""
    rows = []
    dev = ctx.device
    itemsize = torch.empty((), dtype=dtype).element_size()
    gen = torch.Generator(device=dev).manual_seed(zlib.crc32(f"{op} {M} {N} {K}".encode()))

    def make(_):
        a = torch.randn(M, K, generator=gen, device=dev, dtype=torch.float32).to(dtype)
        b = torch.randn(K, N, generator=gen, device=dev, dtype=torch.float32).to(dtype)
        return a, b

    sets = rotating(make, (M * K + K * N) * itemsize, dev)
    c_plain = torch.empty(M, N, dtype=dtype, device=dev)
    out = tilefuse.empty(M, N, dtype=dtype) if any(m[2] for m in methods) else None
    cfg = default_config(M, N, K, dtype, num_sms=hw.num_sms(dev), interpreter=hw.interpreting(), comm=False)
    tol = tolerance(dtype, ctx.on_gpu)
    status: dict = {}
    times: dict = {label: [] for label, _, _ in methods}

    def note(label, err):
        text = error_text(err)
        status[label] = "ERROR " + text
        rows.append(row(op, label, M, N, K, dtype, 1, "error", float("nan"), text))
        print(f"[{op} {M}x{N}x{K} {label}] {traceback.format_exc()}", file=sys.stderr, flush=True)

    # Check: fresh inputs, poisoned outputs, fp32 product.
    a, b = make(None)
    ref = a.float() @ b.float()
    got = None
    for label, variant, uses_out in methods:
        try:
            c_plain.fill_(float("nan"))
            if out is not None:
                out.fill_(float("nan"))
            got = _call(op, label, variant, a, b, c_plain, out if uses_out else None, cfg)
            tilefuse.synchronize()
            err = rel_error(got, ref)
            ok = err <= tol  # NaN fails
            status[label] = "ok" if ok else f"FAIL rel_err {err:.3g} > {tol:g}"
            rows.append(row(op, label, M, N, K, dtype, 1, "rel_err", err))
            rows.append(row(op, label, M, N, K, dtype, 1, "ok", float(ok)))
        except Exception as err:
            note(label, err)
            if ctx.on_gpu and not cuda_alive(ctx):
                raise
    del a, b, ref, got

    # Time: the methods' calls interleaved one by one after the clocks settle (docs/PERF.md,
    # session 3); a round in which a method raises is timed again one method at a time.
    cycle = Cycle(sets)
    settle(ctx, lambda: torch.matmul(*cycle(), out=c_plain))

    def fn_of(label, variant, uses_out):
        def fn():
            a, b = cycle()
            _call(op, label, variant, a, b, c_plain, out if uses_out else None, cfg)
        return fn

    kw = dict(warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, cpu_reps=1)
    for _ in range(args.reps):
        live = [m for m in methods if not status[m[0]].startswith("ERROR")]
        try:
            for (label, _, _), t in zip(live, bench_interleaved(ctx, [fn_of(*m) for m in live], **kw)):
                times[label].append(t)
            continue
        except Exception:
            if ctx.on_gpu and not cuda_alive(ctx):
                raise
        for label, variant, uses_out in live:
            try:
                times[label].append(bench(ctx, fn_of(label, variant, uses_out), **kw))
            except Exception as err:
                note(label, err)
                if ctx.on_gpu and not cuda_alive(ctx):
                    raise
    flops = 2.0 * M * N * K
    t_torch = statistics.median(times["torch.matmul"]) if times["torch.matmul"] else float("nan")
    for label, _, _ in methods:
        if not times[label]:
            continue
        ms = statistics.median(times[label])
        spread = 100.0 * (max(times[label]) - min(times[label])) / ms
        for metric, value in (("ms", ms), ("TFLOP/s", flops / (ms * 1e-3) / 1e12),
                              ("vs_torch", t_torch / ms), ("spread_pct", spread)):
            rows.append(row(op, label, M, N, K, dtype, 1, metric, value, status[label]))
    return rows


def run_rank(ctx, ops: list, shapes: dict, variants: list | None, dtype: torch.dtype, args) -> dict:
    """Every op and shape; the CSV grows after each shape, so a run cut short keeps what it measured."""
    rows = []
    info = run_info(ctx.device)
    append = args.append
    for op in ops:
        methods = _methods(op, variants)
        print(f"{op}: methods {[m[0] for m in methods]}", flush=True)
        for M, N, K in shapes[op]:
            aborted = False
            try:
                shape_rows = run_shape(ctx, op, M, N, K, dtype, methods, args)
            except Exception as err:  # the device is unusable (or a set-up step failed)
                shape_rows = [row(op, "*", M, N, K, dtype, 1, "error", float("nan"), error_text(err))]
                print(traceback.format_exc(), file=sys.stderr, flush=True)
                aborted = ctx.on_gpu and not cuda_alive(ctx)
            rows += shape_rows
            if is_main_process():
                write_csv(shape_rows, args.csv, info, append=append)
                append = True
            if aborted:
                return {"rows": rows, "info": info, "aborted": True}
            oplaunch.clear_workspaces()  # every shape's heap buffers go back to the pool
            gc.collect()
            print(f"  {op} {M}x{N}x{K} done", flush=True)
    return {"rows": rows, "info": info, "aborted": False}


def summarize(rows: list) -> list:
    """One record per (op, shape, method) for the terminal."""
    recs: dict = {}
    for r in rows:
        key = (r["op"], r["M"], r["N"], r["K"], r["variant"])
        rec = recs.setdefault(key, {"op": r["op"], "shape": f"{r['M']}x{r['N']}x{r['K']}",
                                    "method": r["variant"], "status": ""})
        if r["metric"] in ("ms", "TFLOP/s", "vs_torch", "spread_pct", "rel_err"):
            rec[r["metric"]] = r["value"]
        if r["metric"] == "ok":
            rec["status"] = "ok" if r["value"] == 1.0 else "FAIL"
        if r["metric"] == "error":
            rec["status"] = ("ERROR " + r["note"])[:60]
    return list(recs.values())


def _parse_shapes(text: str, ops: list) -> dict:
    if text in SHAPES:
        return {op: SHAPES[text][op] for op in ops}
    shapes = [tuple(int(x) for x in s.lower().split("x")) for s in text.split(",") if s.strip()]
    if any(len(s) != 3 for s in shapes):
        raise ValueError(f"--shapes {text!r}: expected {sorted(SHAPES)} or MxNxK[,MxNxK...]")
    return {op: shapes for op in ops}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated ops")
    parser.add_argument("--shapes", default="full", help=f"one of {sorted(SHAPES)} or MxNxK[,MxNxK...]")
    parser.add_argument("--variants", default=None,
                        help="comma-separated variants (default: every registered one but reference)")
    parser.add_argument("--reps", type=int, default=None,
                        help="timing rounds per method, interleaved (default 2 on a GPU, 1 on the CPU)")
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                        help="default bf16 on a GPU, fp16 in the interpreter (its bf16 is wrong)")
    parser.add_argument("--warmup-ms", type=float, default=25.0)
    parser.add_argument("--rep-ms", type=float, default=100.0)
    parser.add_argument("--heap", default=None, help="symmetric heap size (default 8G on a GPU, 256M on CPU)")
    parser.add_argument("--csv", default="bench_out/ops_world1.csv")
    parser.add_argument("--append", action="store_true", help="append to the CSV instead of replacing it")
    args = parser.parse_args(argv)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        parser.error(f"unknown op(s) {unknown}; ops are {list(OPS)}")
    try:
        shapes = _parse_shapes(args.shapes, ops)
    except ValueError as err:
        parser.error(str(err))
    on_gpu = torch.cuda.is_available() and not hw.interpreting()
    args.reps = args.reps or (2 if on_gpu else 1)
    dtype = DTYPES[args.dtype or ("bf16" if on_gpu else "fp16")]
    variants = [v.strip() for v in args.variants.split(",")] if args.variants else None
    heap = parse_bytes(args.heap) if args.heap else ((8 << 30) if on_gpu else (256 << 20))
    result = launch(run_rank, 1, ops, shapes, variants, dtype, args, heap_size=heap)[0]
    if not is_main_process():
        return 0
    rows, info = result["rows"], result["info"]
    columns = ["op", "shape", "method", "ms", "TFLOP/s", "vs_torch", "spread_pct", "rel_err", "status"]
    print_table(summarize(rows), columns,
                title=f"ops at world 1, {str(dtype).replace('torch.', '')}, {info['device']}, "
                      f"torch {info['torch']}, triton {info['triton']}, commit {info['commit']}")
    print(f"csv: {args.csv}")
    bad = [r for r in rows if (r["metric"] == "ok" and r["value"] != 1.0) or r["metric"] == "error"]
    if result["aborted"]:
        print("ABORTED: the device became unusable; later shapes were skipped")
    return 1 if bad or result["aborted"] else 0


if __name__ == "__main__":
    sys.exit(main())
