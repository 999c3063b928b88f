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

``python -m benchmarks.plots --host-overhead CSV [...] --out DIR`` plots ``benchmarks.host_overhead``
CSVs instead: ``host_overhead_w<W>.png``, one row of panels per op, eager host µs per call (left)
and wall µs per replayed call inside a CUDA graph (right), one group per M, one bar per method
(plain and torch.matmul + the collective first).

``python -m benchmarks.plots --table TABLE.json [...] --out DIR`` plots tuner tables instead:
``tuned_<op>_<arch>_ws<W>.png``, one group per tuned shape, one bar per variant: the plain path's
time over the variant's best candidate (second-pass time where it reached the second pass), and a
black tick for what the table chose.

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

    from .results import read_csv

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


def _grouped_bars(ax, groups: int, methods, values) -> list:
    """Bars of ``values[method][i]`` on ``ax``, one group per i, one bar per method; returns the
    groups' x positions."""
    width = 0.8 / max(1, len(methods))
    xs = list(range(groups))
    for j, method in enumerate(methods):
        ax.bar([x - 0.4 + width * (j + 0.5) for x in xs], values[method], width, label=method)
    return xs


def _bars(plt, shapes, methods, values, title, ylabel, ideal_ticks=None):
    """One grouped bar chart; ``values[method][i]`` is the bar of shape i."""
    import math

    fig_w = min(24.0, max(8.0, 0.3 * len(shapes) * (len(methods) + 1) + 2.0))
    fig, ax = plt.subplots(figsize=(fig_w, 4.8))
    xs = _grouped_bars(ax, len(shapes), methods, values)
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


def plot_tables(paths, out_dir) -> list:
    """One figure per tuner table (``tilefuse/configs/<op>/<arch>_ws<W>.json``): speedup over plain of
    each variant's best candidate, per tuned shape; returns the PNG paths."""
    import json

    plt = _pyplot()
    if plt is None:
        print("plots skipped: matplotlib is not installed", file=sys.stderr, flush=True)
        return []
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        entries = [e for e in data["entries"] if e.get("candidates")]
        if not entries:
            continue
        variants = list(dict.fromkeys(c["variant"] for e in entries for c in e["candidates"]))
        shapes = [("", e["M"], e["N"], e["K"]) for e in entries]
        values = {v: [] for v in variants}
        chosen = []
        for e in entries:
            for v in variants:
                times = [c["time_ms"] for c in e["candidates"] if c["variant"] == v and "time_ms" in c]
                final = [c["time_ms"] for c in e["candidates"] if c["variant"] == v and c.get("final")]
                best = min(final or times) if times else float("nan")
                values[v].append(e["plain_ms"] / best if best == best else float("nan"))
            chosen.append(e["plain_ms"] / e["time_ms"])
        prov = data.get("provenance", {})
        title = (f"tuned table {data['op']}, {data['arch']}, world {data['world_size']}: plain time / variant's "
                 f"best candidate (tick: the table's choice)\n{prov.get('device', '')}, torch {prov.get('torch', '')}, "
                 f"commit {prov.get('commit', '')}, {prov.get('date', '')}")
        fig = _bars(plt, shapes, variants, values, title, "t_plain / t_variant", ideal_ticks=chosen)
        for text in fig.axes[0].get_legend().get_texts():
            if text.get_text() == "ideal":  # the tick marks the table's choice here
                text.set_text("chosen")
        target = out_dir / f"tuned_{data['op']}_{data['arch']}_ws{data['world_size']}.png"
        fig.savefig(target, dpi=110)
        plt.close(fig)
        written.append(target)
    return written


HOST_METHODS_FIRST = ("plain", "torch")
# Forms that host_overhead times for comparison only, left out of the plot: the variants with the begin
# kernel (names ending so), plain through the custom op and through the registry entry.
HOST_LEFT_OUT = ("plain_custom_op", "plain_entry")
HOST_LEFT_OUT_SUFFIX = "+begin_kernel"


def plot_host_overhead(paths, out_dir, plt=None) -> list:
    """One figure per world size of ``benchmarks.host_overhead`` CSVs; returns the PNG paths."""
    import pandas as pd

    plt = plt or _pyplot()
    if plt is None:
        print("plots skipped: matplotlib is not installed", file=sys.stderr, flush=True)
        return []
    from .results import read_csv

    frame = pd.concat([read_csv(p) for p in paths], ignore_index=True)  # text columns as text: commit 63924e7
    names = frame["variant"].astype(str)
    frame = frame[~names.isin(HOST_LEFT_OUT) & ~names.str.endswith(HOST_LEFT_OUT_SUFFIX)]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for world, part in frame.groupby("world", sort=True):
        ops = list(dict.fromkeys(part["op"]))
        fig, axes = plt.subplots(len(ops), 2, figsize=(16, 3.6 * len(ops)), squeeze=False)
        for row, op in enumerate(ops):
            sub = part[part["op"] == op]
            ms = sorted(dict.fromkeys(int(m) for m in sub["M"]))
            names = list(dict.fromkeys(sub["variant"]))
            methods = [m for m in HOST_METHODS_FIRST if m in names] + \
                [m for m in names if m not in HOST_METHODS_FIRST]
            for col, (mode, metric, what) in enumerate((("eager", "host_us", "eager host µs per call"),
                                                         ("graph", "wall_us", "µs per call replayed in a CUDA graph"))):
                ax = axes[row][col]
                values = {}
                for method in methods:
                    values[method] = []
                    for M in ms:
                        hit = sub[(sub["M"] == M) & (sub["variant"] == method) & (sub["mode"] == mode)
                                  & (sub["metric"] == metric)]
                        values[method].append(float(hit["value"].iloc[-1]) if not hit.empty else float("nan"))
                ax.set_xticks(_grouped_bars(ax, len(ms), methods, values))
                ax.set_xticklabels([f"M = {M}" for M in ms], fontsize=8)
                ax.set_ylabel("µs")
                ax.set_title(f"{op}, world {world}: {what}", fontsize=9)
                if col == 1:
                    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        facts = part.iloc[0]
        fig.suptitle(f"host cost and graph replay, world {world}: {facts.get('device', '')}, "
                     f"N = {facts.get('N', '')}, K = {facts.get('K', '')}, {facts.get('dtype', '')}, "
                     f"commit {facts.get('commit', '')}", fontsize=10)
        fig.tight_layout()
        path = out_dir / f"host_overhead_w{world}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv", nargs="?", help="a CSV written by benchmarks.suite")
    parser.add_argument("--table", nargs="+", default=[], help="tuner tables (JSON) to plot instead")
    parser.add_argument("--host-overhead", nargs="+", default=[],
                        help="benchmarks.host_overhead CSVs to plot instead")
    parser.add_argument("--out", default="bench_out/plots", help="folder for the PNG files")
    args = parser.parse_args(argv)
    if not args.csv and not args.table and not args.host_overhead:
        parser.error("give a suite CSV, --table TABLE.json ... or --host-overhead CSV ...")
    paths = make_plots(args.csv, args.out) if args.csv else []
    paths += plot_tables(args.table, args.out)
    paths += plot_host_overhead(args.host_overhead, args.out) if args.host_overhead else []
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
