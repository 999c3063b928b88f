"""Soak: thousands of calls of every op with the shape changing on every call; memory must stay flat.

Every rank makes the same seeded sequence of calls: call i runs op ``i mod len(ops)`` (every op of
the registry, plus ``gemm_all_reduce`` where tilefuse has it) with a variant and local shapes drawn
from one seeded generator, so the ranks agree on every call without talking. Every
``--check-every``-th call (and the last) is compared with the op's reference
(``tilefuse.ops.registry.get(op, "reference")``). After ``--warmup`` calls and at the end the run
records ``torch.cuda.memory_allocated`` (GPU), the heap's ``bytes_used`` and the process's resident
memory, the maximum over ranks; the differences are what "flat after warm-up" means. The ops'
workspace cache grows up to its byte budget (a fraction of the heap) and then evicts: for a flat
heap after warm-up, let the warm-up reach the budget (a smaller ``--heap-size``, or more ``--warmup``
calls); the CSV records the budget beside the readings.

Output: one long-format CSV (``metric, value, op, world, ...`` and the run facts) and a one-line
summary starting with ``soak:``. The exit status is 1 when a check failed or a call raised (the run
stops at the first error: the ranks are no longer in step), or with ``--require-flat`` when memory
grew after warm-up by more than ``--flat-slack`` bytes.

    python -m benchmarks.soak                       # 10,000 calls, every GPU (or 2 CPU ranks)
    python -m benchmarks.soak --world 2 --calls 10000 --csv results/soak.csv
    python -m benchmarks.soak --smoke --world 2     # ~50 small calls: the CPU CI check
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import torch

from benchmarks import common

CSV_COLUMNS = ["metric", "value", "op", "world", "calls", "seed", "device", "torch", "triton", "commit",
               "date", "note"]
MEMORY = ("torch_allocated", "heap_bytes_used", "rss_bytes")


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _memory(ctx) -> dict:
    if ctx.on_gpu:
        torch.cuda.synchronize(ctx.device)
    return {
        "torch_allocated": torch.cuda.memory_allocated(ctx.device) if ctx.on_gpu else 0,
        "heap_bytes_used": ctx.heap.bytes_used,
        "rss_bytes": _rss_bytes(),
    }


def soak_ops() -> list:
    import tilefuse
    from tilefuse.ops import registry

    ops = [op for op in registry.OPS if hasattr(tilefuse, op)]
    if hasattr(tilefuse, "gemm_all_reduce") and "gemm_all_reduce" not in ops:
        ops.append("gemm_all_reduce")
    return ops


def draw_call(rng: random.Random, op: str, variants: list, world: int, dims: tuple) -> tuple:
    """(variant, local shapes of a and b) of one call; the same on every rank for the same ``rng``."""
    lo, max_m, max_n, max_k = dims
    m, n, k = rng.randint(lo, max_m), rng.randint(lo, max_n), rng.randint(lo, max_k)
    variant = rng.choice(variants)
    if op == "gemm_all_scatter":  # a [M, K] (same on all ranks), b [K, N_loc]
        return variant, (m, k), (k, n)
    if op == "all_gather_gemm":  # a [M_loc, K], b [K, N]
        return variant, (m, k), (k, n)
    if op == "gemm_reduce_scatter":  # a [W*m, K_loc], b [K_loc, N]
        return variant, (world * m, k), (k, n)
    return variant, (m, k), (k, n)  # gemm_all_reduce: a [M, K_loc], b [K_loc, N]


def _inputs(op: str, a_shape, b_shape, dtype, device, seed: int, call: int, rank: int):
    shared = torch.Generator(device=device).manual_seed(seed * 1_000_003 + call)
    own = torch.Generator(device=device).manual_seed((seed * 1_000_003 + call) * 64 + rank + 1)
    a_gen = shared if op == "gemm_all_scatter" else own
    b_gen = shared if op == "all_gather_gemm" else own
    a = torch.randn(a_shape, generator=a_gen, device=device, dtype=torch.float32).to(dtype)
    b = torch.randn(b_shape, generator=b_gen, device=device, dtype=torch.float32).to(dtype)
    return a, b


def run_soak(ctx, opts: dict) -> dict:
    """Every rank's record of the soak (collective: every rank runs the same calls)."""
    import tilefuse
    from tilefuse.ops import registry

    ops = soak_ops()
    rng = random.Random(opts["seed"])
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
    shapes = set()
    warm = None
    peak = dict.fromkeys(MEMORY, 0)
    error = ""
    calls = opts["calls"]
    done = 0
    tol = common.tolerance(dtype, ctx.on_gpu)
    progress = common.Progress(calls, "soak", enabled=ctx.rank == 0 and opts["progress"])
    t0 = time.perf_counter()
    for i in range(calls):
        op = ops[i % len(ops)]
        variant, a_shape, b_shape = draw_call(rng, op, variants[op], ctx.world, dims)
        shapes.add((op, a_shape, b_shape))
        check = (i + 1) % opts["check_every"] == 0 or i == calls - 1
        try:
            a, b = _inputs(op, a_shape, b_shape, dtype, ctx.device, opts["seed"], i, ctx.rank)
            got = getattr(tilefuse, op)(a, b, variant=variant)
            per_op[op]["calls"] += 1
            if check:
                ref = registry.get(op, "reference")(a, b)
                err = common.rel_error(got, ref)
                per_op[op]["checked"] += 1
                per_op[op]["max_rel_error"] = max(per_op[op]["max_rel_error"], err)
                if not err <= tol:
                    per_op[op]["failed"] += 1
                    error = error or (f"call {i}: {op}/{variant} a{list(a_shape)} b{list(b_shape)}: relative "
                                      f"error {err:.3g} > {tol:g}")
            del got, a, b
        except Exception as err:  # noqa: BLE001 - recorded, then the run stops (ranks out of step)
            error = f"call {i}: {op}/{variant} a{list(a_shape)} b{list(b_shape)}: {common.error_text(err)}"
            break
        done = i + 1
        if done == opts["warmup"]:
            warm = _memory(ctx)
        elif warm is not None and check:
            peak = {k: max(peak[k], v) for k, v in _memory(ctx).items()}
        progress.update(1, op)
    progress.close()
    seconds = time.perf_counter() - t0
    end = _memory(ctx)
    warm = warm or end
    peak = {k: max(peak[k], end[k]) for k in MEMORY}
    from tilefuse.ops.common import launch as oplaunch

    budget = getattr(oplaunch, "workspace_budget", None)  # the workspace cache's byte budget, where it has one
    mine = {"calls": done, "requested": calls, "distinct_shapes": len(shapes), "per_op": per_op,
            "warm": warm, "end": end, "peak": peak, "seconds": seconds, "error": error,
            "workspace_budget": budget(ctx.heap) if budget is not None else float("nan"),
            "heap_size": ctx.heap.size}
    return ctx.all_gather_object(mine)  # every rank's record, so rank 0 reports them under torchrun too


def summarize(results: list, opts: dict, world: int, info: dict) -> tuple[list, str, bool, bool]:
    """CSV rows, the summary line, whether every check passed and whether memory stayed flat."""
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
    add("calls", calls)
    add("checked", checked)
    add("failed", failed + (1 if errors and not failed else 0), note="; ".join(errors)[:2000])  # a raise counts
    add("distinct_shapes", first["distinct_shapes"])
    add("seconds", seconds)
    add("calls_per_s", calls / seconds if seconds > 0 else float("nan"))
    add("heap_size", first["heap_size"])
    add("workspace_budget_bytes", first["workspace_budget"])
    growth = {}
    for key in MEMORY:
        warm = max(r["warm"][key] for r in results)
        end = max(r["end"][key] for r in results)
        peak = max(r["peak"][key] for r in results)
        add(f"{key}_warm", warm)
        add(f"{key}_end", end)
        add(f"{key}_peak_after_warm", peak)
        growth[key] = peak - warm
    for op in ops:
        add("calls", first["per_op"][op]["calls"], op=op)
        add("checked", first["per_op"][op]["checked"], op=op)
        add("max_rel_error", max(r["per_op"][op]["max_rel_error"] for r in results), op=op)
    ok = failed == 0 and not errors and calls == opts["calls"]
    # rss is reported, not judged: the allocator of the host process is not tilefuse's.
    flat = all(growth[k] <= opts["flat_slack"] for k in ("torch_allocated", "heap_bytes_used"))
    mem = {f"{key}_{when}": max(r[when][key] for r in results) for key in MEMORY for when in ("warm", "end")}
    shown_failed = failed + (1 if errors and not failed else 0)
    line = (f"soak: {calls}/{opts['calls']} calls, {first['distinct_shapes']} distinct shapes, {len(ops)} ops "
            f"({', '.join(ops)}), world {world} on {info['device']}: checked {checked}, failed {shown_failed}; "
            f"after warm-up ({opts['warmup']} calls) torch allocated {mem['torch_allocated_warm']} -> "
            f"{mem['torch_allocated_end']} B, heap used {mem['heap_bytes_used_warm']} -> "
            f"{mem['heap_bytes_used_end']} B ({'flat' if flat else 'GREW'}; workspace budget "
            f"{first['workspace_budget']:.0f} B of a {first['heap_size']} B heap); {seconds:.0f} s")
    if errors:
        line += f"; first error: {errors[0]}"
    return rows, line, ok, flat


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=10_000)
    p.add_argument("--world", type=int, default=None, help="ranks (default: GPUs, at least 2; 2 on the CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check-every", type=int, default=100)
    p.add_argument("--warmup", type=int, default=None, help="calls before the first memory reading "
                   "(default: a tenth of the calls, at most 500)")
    p.add_argument("--variants", default="all", help="comma-separated, or 'all' (the four fused variants "
                   "and plain)")
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--min-dim", type=int, default=1)
    p.add_argument("--max-m", type=int, default=None, help="largest M (per-rank rows); default 2048 on a GPU, "
                   "40 on the CPU or with --smoke")
    p.add_argument("--max-n", type=int, default=None)
    p.add_argument("--max-k", type=int, default=None)
    p.add_argument("--heap-size", default=None, help="heap bytes per rank, e.g. 256M (default: tilefuse's)")
    p.add_argument("--csv", default=None, help="CSV path (default results/soak.csv)")
    p.add_argument("--require-flat", action="store_true", help="exit 1 if torch or heap memory grew after warm-up")
    p.add_argument("--flat-slack", type=int, default=0, help="bytes of growth --require-flat accepts")
    p.add_argument("--smoke", action="store_true", help="about 50 small calls (CPU CI)")
    p.add_argument("--timeout", type=float, default=None, help="seconds for the whole run (default: by calls)")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from tilefuse.ops import registry

    on_gpu = torch.cuda.is_available() and os.environ.get("TILEFUSE_BACKEND", "").lower() != "cpu"
    if args.smoke:
        args.calls = min(args.calls, 50)
        args.check_every = min(args.check_every, 10)
    small = args.smoke or not on_gpu
    default_dim = 40 if small else 2048
    variants = (list(registry.VARIANTS) + ["plain"] if args.variants == "all"
                else [v.strip() for v in args.variants.split(",") if v.strip()])
    if args.calls < 1 or args.check_every < 1:
        raise SystemExit("--calls and --check-every must be positive")
    world = args.world or (max(2, torch.cuda.device_count()) if on_gpu else 2)
    warmup = args.warmup if args.warmup is not None else max(1, min(500, args.calls // 10))
    opts = {"calls": args.calls, "seed": args.seed, "check_every": args.check_every, "warmup": min(warmup, args.calls),
            "variants": variants, "dtype": args.dtype, "min_dim": args.min_dim,
            "max_m": args.max_m or default_dim, "max_n": args.max_n or default_dim, "max_k": args.max_k or default_dim,
            "flat_slack": args.flat_slack, "progress": not args.no_progress}
    if opts["min_dim"] < 0 or min(opts["max_m"], opts["max_n"], opts["max_k"]) < opts["min_dim"]:
        raise SystemExit("dimensions: need 0 <= --min-dim <= every --max-*")
    heap_size = common.parse_bytes(args.heap_size) if args.heap_size else None
    timeout = args.timeout or (600.0 + args.calls * (2.0 if small else 0.5))
    results = common.launch(run_soak, world, opts, heap_size=heap_size, timeout=timeout)
    if not common.is_main_process():
        return 0
    results = results[0]
    world = len(results)
    info = common.run_info(torch.device("cuda") if on_gpu else None)
    rows, line, ok, flat = summarize(results, opts, world, info)
    path = args.csv or str(common.REPO / "results" / "soak.csv")
    common.write_csv(rows, path, info, columns=CSV_COLUMNS)
    print(line, flush=True)
    print(f"soak: CSV written to {path}", file=sys.stderr)
    if not ok:
        return 1
    return 1 if args.require_flat and not flat else 0


if __name__ == "__main__":
    sys.exit(main())
