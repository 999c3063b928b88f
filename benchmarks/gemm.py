"""tilefuse's GEMM core (``tilefuse.matmul``) against torch.matmul at world 1, on a grid of shapes.

    python -m benchmarks gemm --grid parity --dtypes bf16,fp16 --csv bench_out/gemm.csv
    python -m benchmarks gemm --grid small --set SPLIT_K=1           # one config field changed
    python -m benchmarks gemm --shapes 333x6144x4096,16x4096x4096
    python -m benchmarks gemm --grid parity --fp8 tensorwise,rowwise --csv bench_out/gemm_fp8.csv

Every variant runs this K loop, so the core's speed against cuBLAS bounds what any variant can reach.
Per shape and dtype the two are timed in the same rounds, their calls interleaved one by one, each
after an L2 clear, with CUDA events (:func:`benchmarks.timing.bench_interleaved`); inputs rotate past
L2. ``b`` is a Linear weight (``w.t()``, column-major) as in the tensor-parallel layers. The core runs
``Config.for_shape(M, N, K, dtype, comm=False, core=True)``, tilefuse.matmul's default (the config a variant
takes where no table covers the shape, but few-tile shapes split K), with the ``--set`` fields changed.
Each result is checked against an fp32 product first.

CSV (long format, written shape by shape): per shape ``ms`` of the core, ``torch_ms`` and ``ratio`` =
torch_ms / ms (above 1: faster than torch.matmul), ``rel_err``; per dtype ``ratio_median`` and
``ratio_worst`` over the grid (shape ``all``); the config in ``note``.

``--fp8 tensorwise,rowwise``: instead of ``--dtypes``, the core in float8 (``tilefuse.matmul`` with
``scale_a``, ``scale_b``; a float8_e4m3fn, b a float8 Linear weight's transpose, bfloat16 results)
against ``torch._scaled_mm``, per scaling (the rows' ``variant``; scales tensor-wise, or row-wise
``[M, 1]`` and ``[1, N]``), each checked against the fp32 product of the dequantized operands first.
_scaled_mm takes K and N only as multiples of 16 (M of any size): on other shapes ``torch_ms`` times it on
operands zero-padded to them, copied before timing (the note says so), and ``user_ms`` the code a user
must write for them: each call pads the operands (``F.pad``), then slices the result (on shapes it takes,
``user_ms`` is ``torch_ms``); ``user_ratio`` = user_ms / ms, summarised as ``user_ratio_median`` and
``user_ratio_worst``. On the CPU, where _scaled_mm does not run, ``torch_ms`` times the fp32 product
of the dequantized operands and the results are float16.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

import tilefuse

from .checks import error_text, rel_error, tolerance
from .launch import launch
from .results import print_table, row, run_info, write_csv
from .suite import pad16, parse_custom_shape, scaled_mm
from .timing import Cycle, bench_interleaved, rotating, settle

OP = "gemm_core"
GRIDS = {
    # Decode and prefill token counts (M) on Llama-3-8B layer shapes (N, K) at TP 1, with ragged M,
    # N and K (not multiples of the tiles).
    "parity": [(M, N, K) for M in (16, 64, 128, 333, 512, 1000, 1024, 4096, 8192)
               for N, K in ((4096, 4096), (14336, 4096), (4096, 14336), (6144, 4096), (5000, 3500),
                            (1000, 8000))],
    # Decode sizes on TP-2 layer shapes of Llama-3-8B and 70B.
    "decode": [(M, N, K) for M in (1, 16, 64)
               for N, K in ((4096, 8192), (8192, 4096), (14336, 4096), (4096, 14336), (6144, 4096))],
    # Small prefill chunks, where a fused variant (no split-K) has few tiles per SM.
    "small": [(M, N, K) for M in (128, 256) for N, K in ((4096, 8192), (14336, 4096), (4096, 14336))],
    "smoke": [(10, 40, 512), (70, 24, 200)],
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SCALINGS = ("tensorwise", "rowwise")
E4M3 = torch.float8_e4m3fn


def parse_fields(items: list) -> dict:
    """``["SPLIT_K=1", "num_stages=3"]`` -> ``{"SPLIT_K": 1, "num_stages": 3}`` (Config fields, integers)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise ValueError(f"--set {item!r}: expected FIELD=INTEGER")
        out[key.strip()] = int(value)
    return out


def config_for(M: int, N: int, K: int, dtype, device, fields: dict) -> tilefuse.Config:
    return tilefuse.Config.for_shape(M, N, K, dtype, device=device, comm=False, core=True).replace(**fields)


def _operands(M: int, N: int, K: int, dtype, dev, seed: int) -> tuple:
    """``(a [M, K], b [K, N], generator)``: random operands in ``dtype``, b a Linear weight's transpose."""
    g = torch.Generator(device=dev).manual_seed(seed)
    a = torch.randn(M, K, generator=g, device=dev).to(dtype)
    return a, torch.randn(N, K, generator=g, device=dev).to(dtype).t(), g


def _shape(ctx, M: int, N: int, K: int, dtype, fields: dict, args) -> list:
    """Check, then time, the core and torch.matmul on one shape; CSV rows."""
    dev = ctx.device
    cfg = config_for(M, N, K, dtype, dev, fields)
    note = " ".join(f"{k}={v}" for k, v in cfg.to_dict().items())

    def make(i):
        return _operands(M, N, K, dtype, dev, 1000 + i)[:2]

    sets = rotating(make, (M * K + N * K) * torch.empty((), dtype=dtype).element_size(), dev)
    out_core, out_torch = torch.empty(M, N, dtype=dtype, device=dev), torch.empty(M, N, dtype=dtype, device=dev)
    a, b = sets[0]
    err = rel_error(tilefuse.matmul(a, b, config=cfg, out=out_core), a.float() @ b.float())
    rows = [row(OP, "default", M, N, K, dtype, 1, "rel_err", err, note)]
    if not err <= tolerance(dtype, ctx.on_gpu):
        return rows + [row(OP, "default", M, N, K, dtype, 1, "error", float("nan"), f"relative error {err:.3g}")]
    cycle = Cycle(sets)
    settle(ctx, lambda: torch.matmul(*cycle(), out=out_torch))
    ms, torch_ms = bench_interleaved(ctx, [lambda: tilefuse.matmul(*cycle(), config=cfg, out=out_core),
                                           lambda: torch.matmul(*cycle(), out=out_torch)],
                                     warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
    return rows + [row(OP, "default", M, N, K, dtype, 1, metric, value, note)
                   for metric, value in (("ms", ms), ("torch_ms", torch_ms), ("ratio", torch_ms / ms))]


def _shape_fp8(ctx, M: int, N: int, K: int, scaling: str, fields: dict, args) -> list:
    """Check, then time, the core in float8 and torch._scaled_mm (on the CPU: the fp32 product of the
    dequantized operands) on one shape; CSV rows."""
    dev, rowwise = ctx.device, scaling == "rowwise"
    out_dtype = torch.bfloat16 if ctx.on_gpu else torch.float16  # the interpreter computes bfloat16 wrong
    cfg = config_for(M, N, K, E4M3, dev, fields)
    note = " ".join(f"{k}={v}" for k, v in cfg.to_dict().items())

    def make(i):
        a, b, g = _operands(M, N, K, E4M3, dev, 2000 + i)
        sa = torch.rand(M, 1, generator=g, device=dev) + 0.5 if rowwise else torch.tensor(0.75, device=dev)
        sb = torch.rand(1, N, generator=g, device=dev) + 0.5 if rowwise else torch.tensor(1.25, device=dev)
        if not ctx.on_gpu:
            return a, b, sa, sb, ()
        # _scaled_mm's operands: K and N padded to multiples of 16 (M needs none), b column-major, scale_b alike
        pa, pb = pad16(a, (1,)), pad16(b.t()).t()
        return a, b, sa, sb, (pa, pb, sa, pad16(sb, (1,)) if rowwise else sb)

    sets = rotating(make, M * K + N * K, dev)
    out_core = torch.empty(M, N, dtype=out_dtype, device=dev)
    a, b, sa, sb, padded = sets[0]
    err = rel_error(tilefuse.matmul(a, b, config=cfg, out=out_core, scale_a=sa, scale_b=sb),
                    (a.float() * sa) @ (b.float() * sb))
    rows = [row(OP, scaling, M, N, K, E4M3, 1, "rel_err", err, note)]
    if not err <= tolerance(out_dtype, ctx.on_gpu):
        return rows + [row(OP, scaling, M, N, K, E4M3, 1, "error", float("nan"), f"relative error {err:.3g}")]
    if not ctx.on_gpu:
        note += " | torch: fp32 matmul of the dequantized operands (_scaled_mm does not run on the CPU)"
    elif padded[0].shape != a.shape or padded[1].shape != b.shape:
        note += " | torch: _scaled_mm on operands with K and N zero-padded to multiples of 16 (the copy not timed)"

    def torch_fn():
        a, b, sa, sb, p = cycle()
        if p:
            return torch._scaled_mm(p[0], p[1], scale_a=p[2], scale_b=p[3], out_dtype=out_dtype)
        return (a.float() * sa) @ (b.float() * sb)

    def user_fn():  # what a user writes where _scaled_mm refuses the operands: pad on every call, then slice
        a, b, sa, sb, _ = cycle()
        return scaled_mm(a, b, sa, sb, out_dtype)

    def core_fn():
        a, b, sa, sb, _ = cycle()
        return tilefuse.matmul(a, b, config=cfg, out=out_core, scale_a=sa, scale_b=sb)

    cycle = Cycle(sets[:1])  # the first set's operands: checked above, and here the user's padded call
    pads = ctx.on_gpu and (padded[0].shape != a.shape or padded[1].shape != b.shape)
    if pads and not rel_error(user_fn(), (a.float() * sa) @ (b.float() * sb)) <= tolerance(out_dtype, ctx.on_gpu):
        raise AssertionError(f"{M}x{N}x{K}: the padded _scaled_mm call is wrong")
    cycle = Cycle(sets)
    settle(ctx, torch_fn)
    ms, torch_ms, *user = bench_interleaved(ctx, [core_fn, torch_fn] + ([user_fn] if pads else []),
                                            warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
    user_ms = user[0] if user else torch_ms
    return rows + [row(OP, scaling, M, N, K, E4M3, 1, metric, value, note)
                   for metric, value in (("ms", ms), ("torch_ms", torch_ms), ("ratio", torch_ms / ms),
                                         ("user_ms", user_ms), ("user_ratio", user_ms / ms))]


def _job(ctx, shapes: list, cases: list, fields: dict, args) -> list:
    """``cases``: torch dtypes (the core against torch.matmul) or scalings (float8, against _scaled_mm)."""
    info = run_info(ctx.device)
    rows: list = []
    for case in cases:
        fp8 = case in SCALINGS
        variant, dtype = (case, E4M3) if fp8 else ("default", case)
        ratios, user = [], []
        for M, N, K in shapes:
            try:
                got = (_shape_fp8(ctx, M, N, K, case, fields, args) if fp8 else
                       _shape(ctx, M, N, K, dtype, fields, args))
            except Exception as exc:  # recorded; the grid goes on
                got = [row(OP, variant, M, N, K, dtype, 1, "error", float("nan"), error_text(exc))]
                print(f"{M}x{N}x{K}: {error_text(exc)}", file=sys.stderr, flush=True)
            ratios += [r["value"] for r in got if r["metric"] == "ratio"]
            user += [r["value"] for r in got if r["metric"] == "user_ratio"]
            rows += got
            write_csv(rows, args.csv, info)
        if ratios:
            rows += [row(OP, variant, "all", "all", "all", dtype, 1, metric, value, f"{len(ratios)} shapes")
                     for name, got in (("ratio", ratios), ("user_ratio", user)) if got
                     for metric, value in ((f"{name}_median", statistics.median(got)), (f"{name}_worst", min(got)))]
            write_csv(rows, args.csv, info)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", default=None, choices=sorted(GRIDS),
                   help="shapes (default: parity on a GPU, smoke on the CPU)")
    p.add_argument("--shapes", default=None, help="comma-separated MxNxK instead of a grid")
    p.add_argument("--dtypes", default=None, help=f"comma-separated of {sorted(DTYPES)} (default bf16; CPU fp16)")
    p.add_argument("--fp8", default=None, metavar="SCALINGS",
                   help="comma-separated of tensorwise, rowwise: the core in float8 against torch._scaled_mm")
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=N",
                   help="Config fields to change from the shape's default, e.g. SPLIT_K=1")
    p.add_argument("--warmup-ms", type=float, default=25.0)
    p.add_argument("--rep-ms", type=float, default=100.0)
    p.add_argument("--csv", default="bench_out/gemm.csv")
    args = p.parse_args(argv)
    on_gpu = torch.cuda.is_available() and os.environ.get("TILEFUSE_BACKEND", "") != "cpu"
    try:
        fields = parse_fields(args.set)
        names = (args.dtypes or ("bf16" if on_gpu else "fp16")).split(",")
        dtypes = [DTYPES[n.strip()] for n in names]
        if args.fp8:
            dtypes = [s.strip() for s in args.fp8.split(",")]
            if not set(dtypes) <= set(SCALINGS):
                raise ValueError(f"--fp8 {args.fp8!r}: expected a comma-separated list of {list(SCALINGS)}")
        shapes = [parse_custom_shape(s) for s in args.shapes.split(",")] if args.shapes else \
            GRIDS[args.grid or ("parity" if on_gpu else "smoke")]
        if any(s is None for s in shapes):
            raise ValueError(f"--shapes {args.shapes!r}: expected MxNxK items")
    except (KeyError, ValueError) as err:
        p.error(str(err))
    rows = launch(_job, 1, shapes, dtypes, fields, args, heap_size=256 << 20)[0]
    records = [{"dtype": r["dtype"], "variant": r["variant"], "shape": f"{r['M']}x{r['N']}x{r['K']}",
                "metric": r["metric"], "value": r["value"]}
               for r in rows if r["metric"] in ("ratio", "ratio_median", "ratio_worst", "user_ratio_median",
                                                "user_ratio_worst", "error")]
    print_table(records, ["dtype", "variant", "shape", "metric", "value"],
                title="GEMM core vs torch.matmul, float8: torch._scaled_mm (ratio > 1: faster)")
    print(f"csv: {args.csv}")
    return 1 if any(r["metric"] == "error" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
