"""How good ``variant="auto"`` is where no table was tuned: held-out shapes against the plain path and
torch's fused async-TP ops. (The tables themselves are made by ``python -m tilefuse.tune``.)

    python -m benchmarks tune --world 1 --n 8 --budget-s 120 --out bench_out/tune_w1.csv
    torchrun --nproc-per-node 2 -m benchmarks.tune --n 8 --budget-s 120 --out bench_out/tune_w2.csv
    python -m benchmarks tune --smoke --world 2          # tiny shapes, CPU ranks

The shapes (:func:`heldout_shapes`) are drawn at random (seeded) within model-like ranges and never in
a tuning set. Shape i of every op runs before shape i + 1 of any. Per shape every rank calls auto once
(``first_call_ms``: first-call tuning happens here, with a fresh decision cache unless
``--cache-dir``), checks its result against the fp32 reference, then times plain, auto and torch's
fused op (where one exists, with NCCL and a GPU per rank) with their calls interleaved, and records
what auto ran (``note``). Per shape: ``ms`` and ``host_ms`` per method, ``speedup_vs_plain``,
``speedup_vs_torch_fused``, ``speedup_vs_best_baseline``; then summary rows (``variant = summary``):
the worst and median of each ratio per op and over all ops, over all shapes and over those whose
plain time is at least ``--min-ms``, and ``shapes_run``. ``--budget-s``: no shape starts that would
end past it (the median shape time so far decides); ``--out`` is rewritten after every shape. On one
or two H200s: 15-25 s to start, then 10-30 s for the first shape of an op (compiling every candidate
of first-call tuning), 2-6 s for later ones.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import statistics
import sys
import tempfile
import time

import torch

from .checks import error_text, rel_error, tolerance
from .launch import is_main_process, launch, under_torchrun
from .results import parse_dtype, row, run_info, write_csv
from .timing import bench_interleaved

OPS = ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce")


# Held-out shapes: model-like ranges, drawn at random (seeded); none of them is in a tuning set.
HELDOUT_SEED = 20261130
HIDDEN = (2048, 8192)  # hidden size, a multiple of 256
MLP_RATIO = (2.5, 4.0)  # intermediate / hidden, rounded to a multiple of 256
TOKENS = (64, 16384)  # tokens per rank, log-uniform, any integer (ragged)
SMOKE_TOKENS = (8, 48)  # --smoke: tiny shapes for CPU ranks in Triton's interpreter
SMOKE_DIMS = (32, 96)


def heldout_shapes(op: str, world: int, n: int = 12, *, seed: int = HELDOUT_SEED, smoke: bool = False) -> list[dict]:
    """``n`` per-rank shapes ``{name, M, N, K}`` for ``op`` at world ``world``: a random layer of a
    random model-like size (hidden in ``HIDDEN``, an MLP of ``MLP_RATIO`` x hidden, GQA attention)
    at a random token count in ``TOKENS``. The same (op, world, n, seed) always gives the same list;
    a draw that lands on a shape of a tuning set is drawn again. ``smoke``: tiny sizes."""
    from tilefuse.tuning.shapes import COLUMN_OPS, local_shape_per_rank, local_shapes, shape_sets

    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; ops are {OPS}")
    if n < 1 or world < 1:
        raise ValueError(f"heldout_shapes: n and world must be >= 1, got n={n}, world={world}")
    rng = random.Random(f"{seed}-{op}-{world}-{smoke}")
    seen = set() if smoke else {(e["M"], e["N"], e["K"]) for e in local_shapes(op, list(shape_sets()), world)}
    out = []
    kinds = ("qkv", "gate-up") if op in COLUMN_OPS else ("o", "down")
    for _ in range(100 * n):
        if smoke:
            T = rng.randint(*SMOKE_TOKENS)
            N, K = (rng.randint(*SMOKE_DIMS) * world, rng.randint(*SMOKE_DIMS) * world)
            kind = "smoke"
        else:
            hidden = 256 * rng.randint(HIDDEN[0] // 256, HIDDEN[1] // 256)
            inter = 256 * round(hidden * rng.uniform(*MLP_RATIO) / 256)
            head_dim = 128
            q_heads = hidden // head_dim
            kv_heads = rng.choice([h for h in (1, 2, 4, 8) if q_heads % h == 0])
            T = round(2 ** rng.uniform(*(v.bit_length() - 1 for v in TOKENS)))
            kind = rng.choice(kinds)
            N, K = {"qkv": ((q_heads + 2 * kv_heads) * head_dim, hidden), "gate-up": (2 * inter, hidden),
                    "o": (hidden, hidden), "down": (hidden, inter)}[kind]
        shape = local_shape_per_rank(op, T, N, K, world)
        if shape is not None and shape not in seen:
            seen.add(shape)
            out.append({"name": f"heldout-{kind}-{shape[0]}x{shape[1]}x{shape[2]}", "M": shape[0], "N": shape[1],
                        "K": shape[2]})
            if len(out) == n:
                return out
    raise RuntimeError(f"heldout_shapes: could not draw {n} new shapes for {op} at W={world}")


def _operands(ctx, op: str, M: int, N: int, K: int, dtype, seed: int):
    """This rank's ``a [M, K]``, ``b [K, N]``, drawn on its device (a CPU draw of a 16384 x 8192
    operand takes seconds); gemm_all_scatter's ``a`` is the same on every rank."""
    a_seed = seed if op == "gemm_all_scatter" else seed + 1000 * (ctx.rank + 1)
    g = torch.Generator(device=ctx.device).manual_seed(a_seed)
    a = torch.randn(M, K, generator=g, device=ctx.device).to(dtype)
    g.manual_seed(seed + 7 + ctx.rank)
    b = (torch.randn(K, N, generator=g, device=ctx.device) / K ** 0.5).to(dtype)
    return a, b


def _first(x):
    return x[0] if isinstance(x, tuple) else x


def _job(ctx, ops: list, n: int, dtype_name: str, smoke: bool, seed: int, cache_dir: str | None,
         budget_s: float | None = None, out: str | None = None):
    """Every rank's share of the run; returns (rows, notes). ``out``: rank 0 rewrites this CSV after
    every shape (without the summary), so a run killed midway keeps what it measured."""
    import tilefuse

    from .suite import auto_note, torch_fused

    if cache_dir:
        os.environ["TILEFUSE_CACHE_DIR"] = cache_dir
    dtype = parse_dtype(dtype_name)
    rows, notes = [], []
    per_op = {}
    for op in ops:
        fused, why = torch_fused(ctx, op)
        if fused is None:
            notes.append(f"{op}: no torch fused column ({why})")
        public = getattr(tilefuse, op)
        plain, reference = (functools.partial(public, variant=v) for v in ("plain", "reference"))
        per_op[op] = (public, plain, reference, fused, heldout_shapes(op, ctx.world, n, seed=seed, smoke=smoke))
    info = run_info(ctx.device if ctx.on_gpu else None) if out and ctx.rank == 0 else None
    t_start = time.perf_counter()
    durations: list = []  # seconds per shape, agreed over ranks
    ran = dict.fromkeys(per_op, 0)
    stopped = None
    for i in range(n):  # shape i of every op, then shape i + 1
        for op, (public, plain, reference, fused, drawn) in per_op.items():
            s = drawn[i]
            M, N, K = s["M"], s["N"], s["K"]
            elapsed = ctx.max(time.perf_counter() - t_start)  # the same on every rank: they stop together
            if budget_s is not None and durations and elapsed + statistics.median(durations) > budget_s:
                stopped = (f"--budget-s {budget_s:g}: stopped after {elapsed:.0f} s, before {op} shape {i + 1} "
                           f"of {n} (a shape took {statistics.median(durations):.1f} s, median)")
                break
            # Each shape starts from an empty workspace cache, as a fresh process would (first-call
            # tuning leaves every candidate's workspaces behind; a long run would fill the heap).
            tilefuse.synchronize()
            tilefuse.clear_workspaces()
            a, b = _operands(ctx, op, M, N, K, dtype, seed=1000 * i + 17)
            ctx.barrier()
            t0 = time.perf_counter()
            got = _first(public(a, b))
            ctx.sync()
            first_ms = ctx.max((time.perf_counter() - t0) * 1e3)
            ref = _first(reference(a, b))
            err = ctx.max(rel_error(got, ref))
            if not err <= tolerance(dtype, ctx.on_gpu):
                raise AssertionError(f"{op} {M}x{N}x{K}: auto ({auto_note(op, a, b)}) is wrong: relative error "
                                     f"{err:.3g}")
            methods = {"plain": functools.partial(plain, a, b), "auto": functools.partial(public, a, b)}
            if fused is not None:
                methods["torch_fused"] = functools.partial(fused, a, b)
            host: list = [[] for _ in methods]  # host ms per timed call (filled where calls sync one by one)
            try:
                times = dict(zip(methods, bench_interleaved(ctx, list(methods.values()), host_ms=host)))
            except Exception as exc:  # recorded, and the next shape goes on
                notes.append(f"{op} {M}x{N}x{K}: timing failed: {error_text(exc)}")
                durations.append(ctx.max(time.perf_counter() - t_start) - elapsed)
                continue
            note = auto_note(op, a, b).removeprefix("auto -> ")  # after the timed calls: what they ran
            for name, ms in times.items():
                rows.append(row(op, name, M, N, K, dtype, ctx.world, "ms", ms, note if name == "auto" else ""))
            if all(host):  # the same on every rank: W > 1 on GPUs
                for name, ms in zip(methods, host):
                    rows.append(row(op, name, M, N, K, dtype, ctx.world, "host_ms", ctx.max(statistics.median(ms)),
                                    note if name == "auto" else ""))
            rows.append(row(op, "auto", M, N, K, dtype, ctx.world, "speedup_vs_plain", times["plain"] / times["auto"],
                            note))
            if "torch_fused" in times:
                rows.append(row(op, "auto", M, N, K, dtype, ctx.world, "speedup_vs_torch_fused",
                                times["torch_fused"] / times["auto"], note))
                rows.append(row(op, "auto", M, N, K, dtype, ctx.world, "speedup_vs_best_baseline",
                                min(times["plain"], times["torch_fused"]) / times["auto"], note))
            rows.append(row(op, "auto", M, N, K, dtype, ctx.world, "first_call_ms", first_ms, note))
            ran[op] += 1
            if info is not None:
                write_csv(rows, out, info)
            durations.append(ctx.max(time.perf_counter() - t_start) - elapsed)
        if stopped:
            break
    if stopped:
        notes.append(stopped)
    elapsed = ctx.max(time.perf_counter() - t_start)
    notes.append(f"{sum(ran.values())} shapes in {elapsed:.1f} s after start-up")
    for op, count in ran.items():
        rows.append(row(op, "summary", "", "", "", dtype, ctx.world, "shapes_run", float(count), f"of {n} asked"))
    return rows, notes


RATIOS = ("speedup_vs_plain", "speedup_vs_torch_fused", "speedup_vs_best_baseline")


def summarize(rows: list, min_ms: float) -> list:
    """Summary rows: worst and median of auto's ratios, per op and over every op, over all shapes and
    over those whose plain time is at least ``min_ms``."""
    plain_ms = {(r["op"], r["M"], r["N"], r["K"]): r["value"] for r in rows
                if r["variant"] == "plain" and r["metric"] == "ms"}
    out = []
    for metric in RATIOS:
        ratios = [r for r in rows if r["metric"] == metric]
        if not ratios:
            continue
        dtype, world = ratios[0]["dtype"], ratios[0]["world"]
        for op in sorted({r["op"] for r in ratios}) + ["all"]:
            mine = [r for r in ratios if op in ("all", r["op"])]
            large = [r for r in mine if plain_ms[(r["op"], r["M"], r["N"], r["K"])] >= min_ms]
            for subset, label in ((mine, ""), (large, f"_plain_ge_{min_ms:g}ms")):
                values = [r["value"] for r in subset]
                if not values:
                    continue
                for stat, v in (("worst", min(values)), ("median", statistics.median(values))):
                    out.append(row(op, "summary", "", "", "", dtype, world, f"{stat}_{metric}{label}", v,
                                   f"{len(values)} shapes"))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=None, help="ranks to start (default: 1; torchrun: its world)")
    p.add_argument("--ops", default="all", help=f"'all' or comma-separated ops of {list(OPS)}")
    p.add_argument("--n", type=int, default=12, help="held-out shapes per op")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--seed", type=int, default=None, help="another draw of shapes (default: the fixed seed)")
    p.add_argument("--min-ms", type=float, default=0.2, help="the summary's size threshold on plain's time")
    p.add_argument("--cache-dir", default=None, help="decision cache directory (default: a fresh temporary one)")
    p.add_argument("--out", default=None, help="CSV path (default: print only)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no shape that would end past this many seconds after the ranks came up "
                        "(rank 0's clock; start-up itself is extra)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, float16: CPU ranks in Triton's interpreter")
    args = p.parse_args(argv)

    ops = list(OPS) if args.ops.strip() == "all" else [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        p.error(f"unknown op(s) {unknown}; ops are {list(OPS)}")
    if args.n < 1:
        p.error("--n must be >= 1")
    if args.budget_s is not None and not args.budget_s > 0:
        p.error("--budget-s must be > 0")
    dtype = "float16" if args.smoke else args.dtype
    parse_dtype(dtype)
    seed = HELDOUT_SEED if args.seed is None else args.seed
    world = args.world or 1
    with tempfile.TemporaryDirectory(prefix="tilefuse-tune-") as tmp:
        cache_dir = args.cache_dir or tmp
        results = launch(_job, world, ops, args.n, dtype, args.smoke, seed, cache_dir, args.budget_s, args.out)
    rows, notes = results[0]
    if under_torchrun() and not is_main_process():
        return 0
    for line in notes:
        print(line, file=sys.stderr)
    summary = summarize(rows, args.min_ms)
    if args.out:
        device = torch.device("cuda", 0) if torch.cuda.is_available() and not args.smoke else None
        write_csv(rows + summary, args.out, run_info(device))
        print(f"wrote {args.out} ({len(rows)} measurements)")
    for r in summary:
        print(f"{r['op']:>20} {r['metric']:<48} {r['value']:.3f}  ({r['note']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
