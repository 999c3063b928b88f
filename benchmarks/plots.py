"""PNG plots of a suite CSV (``benchmarks.suite``): two figures per op, world size and dtype.

    python -m benchmarks.plots CSV [--out DIR]

``speedup_<op>_w<W>_<dtype>.png``
    grouped bars, one group per shape, one bar per method: ``speedup_vs_plain`` (time of the plain
    path / time of the method). The dashed line at 1 is the plain path; a black tick over each
    group marks the ideal speedup ``(t_gemm + t_comm) / max(t_gemm, t_comm)``, the most any
    overlap can give on that shape.
``vs_ideal_<op>_w<W>_<dtype>.png``
    the same groups, bars ``t_method / t_ideal`` with ``t_ideal = max(t_gemm, t_comm)``: 1 (the
    dashed line) is perfect overlap, the plain path sits near ``ideal_speedup``; lower is better.

Methods that failed their check or raised have no ``ms`` row and no bar. Where the CSV holds a
measurement more than once (appended runs), the last row wins. Needs matplotlib (the ``bench``
extra); without it :func:`make_plots` prints why and returns no files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

NOT_BARS = ("gemm", "comm", "ideal")  # the ingredients of the ideal, not competitors
BASELINE_ORDER = ("plain", "torch_fused")


def _method_order(methods) -> list:
    """plain, torch_fused, then the tilefuse variants in CSV order, auto last."""
    methods = [m for m in dict.fromkeys(methods) if m not in NOT_BARS]
    head = [m for m in BASELINE_ORDER if m in methods]
    tail = [m for m in methods if m == "auto"]
    return head + [m for m in methods if m not in head and m not in tail] + tail


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def load(csv) -> object:
    """The CSV as a pandas frame, one row per (op, world, dtype, shape, method, metric), last wins."""
    import pandas as pd

    from .common import read_csv

    frame = csv if isinstance(csv, pd.DataFrame) else read_csv(csv)
    if "shape" not in frame.columns:  # a CSV without the suite's columns: name shapes by size
        frame = frame.assign(shape="", set="")
    frame = frame.assign(shape=frame["shape"].fillna("").astype(str))
    keys = ["op", "world", "dtype", "M", "N", "K", "shape", "variant", "metric"]
    return frame.drop_duplicates(subset=keys, keep="last")


def _groups(frame):
    for (op, world, dtype), part in frame.groupby(["op", "world", "dtype"], sort=False):
        shapes = list(dict.fromkeys(zip(part["shape"], part["M"], part["N"], part["K"])))
        yield op, int(world), dtype, part, shapes


def _label(shape) -> str:
    name, M, N, K = shape
    return f"{name}\n{M}x{N}x{K}" if name else f"{M}x{N}x{K}"


def _value(part, shape, method, metric):
    name, M, N, K = shape
    hit = part[(part["shape"] == name) & (part["M"] == M) & (part["N"] == N) & (part["K"] == K)
               & (part["variant"] == method) & (part["metric"] == metric)]
    if hit.empty:
        return float("nan")
    return float(hit["value"].iloc[-1])


def _bars(plt, shapes, methods, values, title, ylabel, ideal_ticks=None):
    """One grouped bar chart; ``values[method][i]`` is the bar of shape i."""
    import math

    width = 0.8 / max(1, len(methods))
    fig_w = min(24.0, max(8.0, 0.3 * len(shapes) * (len(methods) + 1) + 2.0))
    fig, ax = plt.subplots(figsize=(fig_w, 4.8))
    xs = list(range(len(shapes)))
    for j, method in enumerate(methods):
        offs = [x - 0.4 + width * (j + 0.5) for x in xs]
        ax.bar(offs, values[method], width, label=method)
    if ideal_ticks is not None:
        for x, v in zip(xs, ideal_ticks):
            if not math.isnan(v):
                ax.hlines(v, x - 0.42, x + 0.42, colors="black", linewidth=2.0)
        ax.plot([], [], color="black", linewidth=2.0, label="ideal")
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1.0)
    finite = [v for vs in values.values() for v in vs if v == v and v > 0]
    if finite and max(finite) / min(finite) > 30:
        ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([_label(s) for s in shapes], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    return fig


def make_plots(csv, out_dir) -> list:
    """Write the figures of ``csv`` (a path or a frame) into ``out_dir``; returns the PNG paths."""
    plt = _pyplot()
    if plt is None:
        print("plots skipped: matplotlib is not installed (pip install matplotlib, or the 'bench' extra)",
              file=sys.stderr, flush=True)
        return []
    frame = load(csv)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for op, world, dtype, part, shapes in _groups(frame):
        facts = part.iloc[0]
        where = (f"{op}, world {world}, {dtype}\n{facts.get('device', '')}, torch {facts.get('torch', '')}, "
                 f"commit {facts.get('commit', '')}")
        methods = _method_order(part.loc[part["metric"] == "ms", "variant"])
        if not methods or not shapes:
            continue
        ideal_ms = [_value(part, s, "ideal", "ms") for s in shapes]
        ideal_speedup = [_value(part, s, "ideal", "ideal_speedup") for s in shapes]

        speedups = {m: [_value(part, s, m, "speedup_vs_plain") for s in shapes] for m in methods}
        fig = _bars(plt, shapes, methods, speedups, f"speedup over plain: {where}",
                    "t_plain / t_method  (plain = torch.matmul + collective)", ideal_ticks=ideal_speedup)
        path = out_dir / f"speedup_{op}_w{world}_{dtype}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

        ratios = {m: [_value(part, s, m, "ms") / t if t and t == t else float("nan")
                      for s, t in zip(shapes, ideal_ms)] for m in methods}
        fig = _bars(plt, shapes, methods, ratios, f"time against the ideal: {where}",
                    "t_method / max(t_gemm, t_comm)  (1 = perfect overlap)")
        path = out_dir / f"vs_ideal_{op}_w{world}_{dtype}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    if not written:
        print("plots: no timed methods in the CSV", file=sys.stderr, flush=True)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv", help="a CSV written by benchmarks.suite")
    parser.add_argument("--out", default="bench_out/plots", help="folder for the PNG files")
    args = parser.parse_args(argv)
    for path in make_plots(args.csv, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
