"""PNG plots of the benchmarks' CSVs (and of tuner tables), each stamped with what it was measured on.

    python -m benchmarks plot CSV_OR_TABLE [...] --out DIR

What each input becomes (its kind is read from its columns):

``speedup_<op>_w<W>_<dtype>.png``   a suite CSV: one group of bars per shape, one bar per method
    (plain, torch_fused, the variants, auto): ``speedup_vs_plain``. The dashed line at 1 is plain; the
    black tick over a group is the ideal speedup ``(t_gemm + t_comm) / max(t_gemm, t_comm)``.
``host_w<W>.png``                   a host-cost CSV (``mode`` eager / graph, metrics ``host_us`` and
    ``wall_us``): per op, eager host µs per call and µs per call replayed in a CUDA graph, per M.
``decode_w<W>.png``                 a decode CSV (``mode`` eager / graph, metric ``us_per_call``): per
    shape, µs per call of each ``method`` eagerly and in a CUDA graph, per M.
``tuned_<op>_<arch>_ws<W>.png``     a tuner table (JSON): per tuned shape, the plain time over each
    variant's best candidate; the tick is the table's choice.

Every figure's title (and its PNG's ``Description``) names the device, the torch and triton versions
and the commit, taken from the CSV's ``device``, ``torch``, ``triton`` and ``commit`` columns (a
table's provenance); a column a CSV lacks reads "not recorded" unless ``--fill torch=2.11.0 ...``
gives its value. Where a measurement
occurs more than once (appended runs), the last row wins. Needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from .results import read_csv

NOT_BARS = ("gemm", "comm", "ideal")  # the ingredients of the ideal, not competitors
FIRST = ("plain", "torch", "torch_fused")  # baselines lead, auto ends


def _order(methods) -> list:
    methods = [m for m in dict.fromkeys(methods) if m not in NOT_BARS]
    head = [m for m in FIRST if m in methods]
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


def stamp(facts) -> str:
    """``device, torch X, triton Y, commit Z`` from a row (or a table's provenance)."""
    def get(key):
        value = facts.get(key, None)
        return "not recorded" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)

    return f"{get('device')}, torch {get('torch')}, triton {get('triton')}, commit {get('commit')}"


def kind(frame) -> str:
    metrics = set(frame["metric"])
    if "mode" in frame.columns and "us_per_call" in metrics:
        return "decode"
    if "mode" in frame.columns and "host_us" in metrics:
        return "host"
    if "speedup_vs_plain" in metrics:
        return "suite"
    raise ValueError(f"not a suite, host or decode CSV (metrics {sorted(metrics)[:8]})")


def _bars(ax, labels, methods, values, ticks=None):
    """Grouped bars ``values[method][i]``, one group per label; ``ticks``: a black tick per group."""
    width = 0.8 / max(1, len(methods))
    xs = list(range(len(labels)))
    for j, method in enumerate(methods):
        ax.bar([x - 0.4 + width * (j + 0.5) for x in xs], values[method], width, label=method)
    if ticks is not None:
        for x, v in zip(xs, ticks):
            if not math.isnan(v):
                ax.hlines(v, x - 0.42, x + 0.42, colors="black", linewidth=2.0)
        ax.plot([], [], color="black", linewidth=2.0, label="ideal")
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, fontsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def _last(frame, **match) -> float:
    hit = frame
    for key, value in match.items():
        hit = hit[hit[key] == value]
    return float(hit["value"].iloc[-1]) if not hit.empty else float("nan")


def suite_plots(plt, frame, out: Path) -> list:
    frame = frame.assign(shape=frame["shape"].fillna("").astype(str)) if "shape" in frame else frame.assign(shape="")
    written = []
    for (op, world, dtype), part in frame.groupby(["op", "world", "dtype"], sort=False):
        shapes = list(dict.fromkeys(zip(part["shape"], part["M"], part["N"], part["K"])))
        methods = _order(part.loc[part["metric"] == "ms", "variant"])
        if not methods:
            continue

        def at(shape, method, metric, part=part):
            name, M, N, K = shape
            return _last(part, shape=name, M=M, N=N, K=K, variant=method, metric=metric)

        values = {m: [at(s, m, "speedup_vs_plain") for s in shapes] for m in methods}
        fig, ax = plt.subplots(figsize=(min(24.0, max(8.0, 0.3 * len(shapes) * (len(methods) + 1) + 2.0)), 4.8))
        _bars(ax, [f"{n}\n{M}x{N}x{K}" if n else f"{M}x{N}x{K}" for n, M, N, K in shapes], methods, values,
              ticks=[at(s, "ideal", "ideal_speedup") for s in shapes])
        ax.axhline(1.0, color="gray", linestyle="--", linewidth=1.0)
        finite = [v for vs in values.values() for v in vs if v == v and v > 0]
        if finite and max(finite) / min(finite) > 30:  # only interpreter runs spread so far
            ax.set_yscale("log")
        ax.set_ylabel("t_plain / t_method  (plain = torch.matmul + collective)")
        ax.set_title(f"speedup over plain: {op}, world {world}, {dtype}\n{stamp(part.iloc[-1])}", fontsize=9)
        fig.tight_layout()
        written.append(_save(plt, fig, out / f"speedup_{op}_w{world}_{dtype}.png", stamp(part.iloc[-1])))
    return written


PANELS = {  # kind -> (mode, metric, what) per panel
    "host": (("eager", "host_us", "eager host µs per call"),
             ("graph", "wall_us", "µs per call replayed in a CUDA graph")),
    "decode": (("eager", "us_per_call", "µs per eager call"), ("graph", "us_per_call", "µs per call in a CUDA graph")),
}


def per_m_plots(plt, frame, out: Path, what: str) -> list:
    """One figure per world: a row of panels per op (or shape), one group of bars per M, one bar per
    method."""
    written = []
    by = "op" if "op" in frame.columns else "shape"
    for world, part in frame.groupby("world", sort=True):
        ops = list(dict.fromkeys(part[by]))
        fig, axes = plt.subplots(len(ops), len(PANELS[what]), figsize=(16, 3.6 * len(ops)), squeeze=False)
        for i, op in enumerate(ops):
            sub = part[part[by] == op]
            ms = sorted(dict.fromkeys(int(m) for m in sub["M"]))
            methods = _order(sub["variant"])
            for j, (mode, metric, label) in enumerate(PANELS[what]):
                values = {m: [_last(sub, M=M, variant=m, mode=mode, metric=metric) for M in ms] for m in methods}
                _bars(axes[i][j], [f"M = {M}" for M in ms], methods, values)
                axes[i][j].set_ylabel("µs")
                axes[i][j].set_title(f"{op}, world {world}: {label}", fontsize=9)
        facts = part.iloc[-1]
        fig.suptitle(f"{what}, world {world}, N = {facts.get('N', '')}, K = {facts.get('K', '')}, "
                     f"{facts.get('dtype', '')}: {stamp(facts)}", fontsize=10)
        fig.tight_layout()
        written.append(_save(plt, fig, out / f"{what}_w{world}.png", stamp(facts)))
    return written


def table_plot(plt, path: Path, out: Path) -> list:
    data = json.loads(path.read_text())
    entries = [e for e in data["entries"] if e.get("candidates")]
    if not entries:
        return []
    variants = list(dict.fromkeys(c["variant"] for e in entries for c in e["candidates"]))
    values: dict = {v: [] for v in variants}
    for e in entries:
        for v in variants:
            times = [c["time_ms"] for c in e["candidates"] if c["variant"] == v and "time_ms" in c]
            final = [c["time_ms"] for c in e["candidates"] if c["variant"] == v and c.get("final")]
            values[v].append(e["plain_ms"] / min(final or times) if times else float("nan"))
    fig, ax = plt.subplots(figsize=(min(24.0, max(8.0, 0.3 * len(entries) * (len(variants) + 1) + 2.0)), 4.8))
    _bars(ax, [f"{e['M']}x{e['N']}x{e['K']}" for e in entries], variants, values,
          ticks=[e["plain_ms"] / e["time_ms"] for e in entries])
    ax.get_legend().get_texts()[-1].set_text("chosen")
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1.0)
    ax.set_ylabel("t_plain / t_variant's best candidate")
    ax.set_title(f"tuned table {data['op']}, {data['arch']}, world {data['world_size']}\n"
                 f"{stamp(data.get('provenance', {}))}", fontsize=9)
    fig.tight_layout()
    name = f"tuned_{data['op']}_{data['arch']}_ws{data['world_size']}.png"
    return [_save(plt, fig, out / name, stamp(data.get("provenance", {})))]


def _save(plt, fig, path: Path, facts: str) -> Path:
    """The figure as a PNG whose ``Description`` text chunk holds the run facts (what tests/test_docs.py
    reads back)."""
    fig.savefig(path, dpi=110, metadata={"Description": f"measured on {facts}"})
    plt.close(fig)
    return path


def plot(paths, out_dir, fill: dict | None = None) -> list:
    """The figures of every CSV or table in ``paths``, written into ``out_dir``; returns their paths
    ([] without matplotlib, saying so). ``fill``: values of run-fact columns a CSV lacks."""
    plt = _pyplot()
    if plt is None:
        print("plots skipped: matplotlib is not installed (the 'bench' extra)", file=sys.stderr, flush=True)
        return []
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in map(Path, paths):
        if path.suffix == ".json":
            written += table_plot(plt, path, out)
            continue
        frame = read_csv(path)
        if "variant" not in frame.columns and "method" in frame.columns:
            frame = frame.rename(columns={"method": "variant"})
        frame = frame.assign(**{k: v for k, v in (fill or {}).items() if k not in frame.columns})
        what = kind(frame)
        keys = [c for c in ("op", "world", "dtype", "M", "N", "K", "shape", "variant", "mode", "metric") if c in frame]
        frame = frame.drop_duplicates(subset=keys, keep="last")
        written += suite_plots(plt, frame, out) if what == "suite" else per_m_plots(plt, frame, out, what)
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", help="suite / host / decode CSVs, tuner tables (JSON)")
    p.add_argument("--out", default="bench_out/plots", help="folder for the PNG files")
    p.add_argument("--fill", nargs="*", default=[], metavar="COLUMN=VALUE",
                   help="a run fact (device, torch, triton, commit) for CSVs without that column")
    args = p.parse_args(argv)
    try:
        fill = dict(item.split("=", 1) for item in args.fill)
        paths = plot(args.inputs, args.out, fill)
    except (ValueError, KeyError, FileNotFoundError) as err:
        p.error(str(err))
    for path in paths:
        print(path)
    return 0 if paths else 1


if __name__ == "__main__":
    sys.exit(main())
