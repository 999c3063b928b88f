"""tilefuse's GEMM core (``tilefuse.matmul``) against torch.matmul at world 1, on a grid of shapes.

    python -m benchmarks gemm --grid parity --dtypes bf16,fp16 --csv bench_out/gemm.csv
    python -m benchmarks gemm --grid small --set SPLIT_K=1           # one config field changed
    python -m benchmarks gemm --shapes 333x6144x4096,16x4096x4096

Every variant runs this K loop, so the core's speed against cuBLAS bounds what any variant can reach.
Per shape and dtype the two are timed in the same rounds, their calls interleaved one by one, each
after an L2 clear, with CUDA events (:func:`benchmarks.timing.bench_interleaved`); inputs rotate past
L2. ``b`` is a Linear weight (``w.t()``, column-major) as in the tensor-parallel layers. The core runs
``Config.for_shape(M, N, K, dtype, comm=False)``, the config a variant takes where no table covers the
shape, with the ``--set`` fields changed. Each result is checked against an fp32 product first.

CSV (long format, written shape by shape): per shape ``ms`` of the core, ``torch_ms`` and ``ratio`` =
torch_ms / ms (above 1: faster than torch.matmul), ``rel_err``; per dtype ``ratio_median`` and
``ratio_worst`` over the grid (shape ``all``); the config in ``note``.
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
from .suite import parse_custom_shape
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
    return tilefuse.Config.for_shape(M, N, K, dtype, device=device, comm=False).replace(**fields)


def _shape(ctx, M: int, N: int, K: int, dtype, fields: dict, args) -> list:
    """Check, then time, the core and torch.matmul on one shape; CSV rows."""
    dev = ctx.device
    cfg = config_for(M, N, K, dtype, dev, fields)
    note = " ".join(f"{k}={v}" for k, v in cfg.to_dict().items())

    def make(i):
        g = torch.Generator(device=dev).manual_seed(1000 + i)
        a = torch.randn(M, K, generator=g, device=dev).to(dtype)
        b = torch.randn(N, K, generator=g, device=dev).to(dtype).t()  # a Linear weight's transpose
        return a, b

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


def _job(ctx, shapes: list, dtypes: list, fields: dict, args) -> list:
    info = run_info(ctx.device)
    rows: list = []
    for dtype in dtypes:
        ratios = []
        for M, N, K in shapes:
            try:
                got = _shape(ctx, M, N, K, dtype, fields, args)
            except Exception as exc:  # recorded; the grid goes on
                got = [row(OP, "default", M, N, K, dtype, 1, "error", float("nan"), error_text(exc))]
                print(f"{M}x{N}x{K}: {error_text(exc)}", file=sys.stderr, flush=True)
            ratios += [r["value"] for r in got if r["metric"] == "ratio"]
            rows += got
            write_csv(rows, args.csv, info)
        if ratios:
            rows += [row(OP, "default", "all", "all", "all", dtype, 1, metric, value, f"{len(ratios)} shapes")
                     for metric, value in (("ratio_median", statistics.median(ratios)), ("ratio_worst", min(ratios)))]
            write_csv(rows, args.csv, info)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", default=None, choices=sorted(GRIDS),
                   help="shapes (default: parity on a GPU, smoke on the CPU)")
    p.add_argument("--shapes", default=None, help="comma-separated MxNxK instead of a grid")
    p.add_argument("--dtypes", default=None, help=f"comma-separated of {sorted(DTYPES)} (default bf16; CPU fp16)")
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
        shapes = [parse_custom_shape(s) for s in args.shapes.split(",")] if args.shapes else \
            GRIDS[args.grid or ("parity" if on_gpu else "smoke")]
        if any(s is None for s in shapes):
            raise ValueError(f"--shapes {args.shapes!r}: expected MxNxK items")
    except (KeyError, ValueError) as err:
        p.error(str(err))
    rows = launch(_job, 1, shapes, dtypes, fields, args, heap_size=256 << 20)[0]
    records = [{"dtype": r["dtype"], "shape": f"{r['M']}x{r['N']}x{r['K']}", "metric": r["metric"],
                "value": r["value"]} for r in rows if r["metric"] in ("ratio", "ratio_median", "ratio_worst", "error")]
    print_table(records, ["dtype", "shape", "metric", "value"], title="GEMM core vs torch.matmul (ratio > 1: faster)")
    print(f"csv: {args.csv}")
    return 1 if any(r["metric"] == "error" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
