"""Short summary of a folder of benchmark outputs: test outcome, bandwidth, suite results.

    python -m benchmarks summary OUT_DIR
    python -m benchmarks summary --markdown SUITE.csv    # the tables of docs/RESULTS.md

Reads ``tests.log``, ``bandwidth.csv``, every ``soak*.csv`` and every ``suite*.csv`` where present;
prints compact tables (a device run returns only the tail of its output, so this is what must fit).
``--markdown`` prints a suite CSV as one Markdown table per op: per-rank shape, the baselines'
times, every method's speedup over plain (the best tilefuse variant in bold), the ideal overlap's,
and the commit.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

from .results import format_table, human_bytes, read_csv

SHORT_OPS = {"gemm_all_scatter": "gas", "all_gather_gemm": "agg", "gemm_reduce_scatter": "grs",
             "gemm_all_reduce": "gar"}
SHORT_METHODS = {"core": "core", "plain": "plain", "bulk_sync": "bulk",
                 "producer_consumer": "pc", "fused_sequential": "fs", "wg_specialized": "ws",
                 "reference": "ref", "auto": "auto"}
HOST_COLUMNS = ("plain", "auto", "plain_again")  # their host_ms is shown (the auto-vs-plain question)


def tests_summary(log: Path) -> list:
    if not log.exists():
        return ["tests: no tests.log (stage not run)"]
    lines = log.read_text(errors="replace").splitlines()
    outcome = [ln for ln in lines if re.search(r"\b\d+ (passed|failed|error|errors|skipped)\b", ln)]
    failed = [ln for ln in lines if ln.startswith(("FAILED ", "ERROR "))]
    if outcome:
        head = outcome[-1].strip("= ")
    elif lines and not lines[0].startswith("==="):
        head = lines[0]  # a message instead of a pytest run (e.g. skipped without a GPU)
    else:
        head = "no pytest summary line (killed by the stage timeout?)"
    out = ["tests: " + head]
    out += ["  " + ln[:160] for ln in failed[:15]]
    if len(failed) > 15:
        out.append(f"  ... {len(failed) - 15} more")
    return out


def _short(label: str) -> str:
    return SHORT_METHODS.get(label, label)


def bandwidth_summary(csv: Path) -> list:
    """The one-peer table (GB/s read + written per ring distance), and at W > 1 the all-peer table (bus
    bandwidth of the device API's all-gathers, torch's peer copies and the process group's
    all-gather) with one line per size: put_all against the all-gather."""
    if not csv.exists():
        return ["bandwidth: no csv"]

    df = read_csv(csv)
    if df.empty:
        return ["bandwidth: empty csv"]
    from .bandwidth import ALL_PEERS_N, ONE_PEER, all_peers_lines, all_peers_table

    one = df[df.N != ALL_PEERS_N]
    recs: dict = {}
    for r in one.itertuples(index=False):
        rec = recs.setdefault((int(r.N), int(r.M)), {"size": human_bytes(int(r.M)), "d": int(r.N)})
        if r.metric == "GB/s":
            rec[r.variant] = r.value
        if r.metric == "ok" and r.value != 1.0:
            rec["bad"] = (rec.get("bad", "") + " " + r.variant).strip()
    methods = [m for m in ONE_PEER if (one.variant == m).any()]
    world, device = int(df.world.iloc[0]), df.device.iloc[0]
    title = f"bandwidth GB/s (read + written), world {world}, {device}"
    out = [format_table([recs[k] for k in sorted(recs)], ["size", "d"] + methods + ["bad"], title)]
    if (df.N == ALL_PEERS_N).any():
        rows = df.fillna({"note": ""}).to_dict("records")
        out += [all_peers_table(rows, world, device)] + all_peers_lines(rows)
    return out


def soak_summary(csv: Path) -> list:
    """One line per soak CSV: calls done of requested and why it stopped, checks, memory verdict, and the
    mean host ms of a fused call of a new shape, a second call and a later one (rank 0)."""
    df = read_csv(csv).fillna({"note": ""})
    if df.empty:
        return [f"soak {csv.name}: empty csv"]
    run = df[df["op"].isna() | (df["op"] == "")]  # the whole run's rows (per-op rows name their op)

    def value(metric, cls=None, default=math.nan):
        hit = run[run.metric == metric]
        hit = hit[hit.note == cls] if cls else hit
        return float(hit.value.iloc[-1]) if len(hit) else default

    def note(metric):
        hit = run[run.metric == metric]
        return str(hit.note.iloc[-1]) if len(hit) else ""

    stop = note("stopped_by_budget") or "?"
    if value("complete", default=1.0) != 1.0:
        stop += ", UNFINISHED: " + (note("complete")[:200] or "rank 0's last progress record")
    line = (f"soak {csv.name}: {value('calls'):.0f}/{value('requested'):.0f} calls ({stop}), "
            f"{value('calls_per_s'):.1f} calls/s, checked {value('checked'):.0f}, failed {value('failed'):.0f}, "
            f"memory {note('memory_flat') or '?'}, {value('workspaces_made'):.0f} workspaces made, "
            f"{value('triton_compiles'):.0f} Triton compiles")
    costs = [f"{cls} {value('call_ms', cls):.1f} ms" for cls in ("new fused", "second fused", "later fused")
             if not math.isnan(value("call_ms", cls))]
    out = [line + ("; host ms a call: " + ", ".join(costs) if costs else "")]
    failed = note("failed")
    if failed:
        out.append(f"  {failed[:300]}")
    return out


def suite_summary(csv: Path) -> list:
    """Per op and shape of a suite CSV: ms of gemm / comm / plain, then each method's speedup over plain."""
    if not csv.exists():
        return [f"suite: no {csv.name}"]

    df = read_csv(csv)
    if df.empty:
        return ["suite: empty csv"]
    records, columns = [], []
    for (op, M, N, K), g in df.groupby(["op", "M", "N", "K"], sort=False):
        rec = {"op": SHORT_OPS.get(op, op), "MxNxK": f"{M}x{N}x{K}"}
        for r in g.itertuples(index=False):
            col = {"torch_fused": "tfused", "ideal": "ideal"}.get(r.variant, _short(r.variant))
            if r.variant in ("gemm", "comm", "plain") and r.metric == "ms":
                rec[f"{r.variant} ms"] = r.value
            elif r.variant == "ideal":
                if r.metric == "ideal_speedup":
                    rec["ideal"] = f"{r.value:.2f}"
                    columns.append("ideal") if "ideal" not in columns else None
            elif r.metric == "speedup_vs_plain" and r.variant != "plain":
                rec[col] = f"{r.value:.2f}" if rec.get(col) is None else rec[col]
                columns.append(col) if col not in columns else None
            elif r.metric == "host_ms" and r.variant in HOST_COLUMNS:
                rec[f"host {col}"] = f"{r.value * 1e3:.0f}"
                columns.append(f"host {col}") if f"host {col}" not in columns else None
            elif r.metric == "error" or (r.metric == "ok" and r.value != 1.0):
                rec[col] = "ERR" if r.metric == "error" else "F"
                columns.append(col) if col not in columns else None
        records.append(rec)
    info = df.iloc[0]
    title = (f"suite at world {info['world']}, {info['dtype']}, {info['device']}, commit {info['commit']}: "
             "speedup over plain (torch.matmul + NCCL); ideal = (gemm + comm) / max(gemm, comm); "
             "host X = host time of a call of X in us (calls timed one at a time)")
    return [format_table(records, ["op", "MxNxK", "gemm ms", "comm ms", "plain ms"] + columns, title)]


MD_VARIANTS = ("bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized")
MD_OTHERS = ("auto", "plain_again", "core", "torch_fused")
MD_BASELINES = ("plain", "gemm", "comm", "ideal")  # the columns before and after the methods


def suite_markdown(csv: Path) -> list:
    """One Markdown table per op of a suite CSV (see the module docstring)."""
    df = read_csv(csv)
    if df.empty:
        return [f"{csv}: empty"]
    df = df.fillna({"note": ""})
    out = []
    for op, g_op in df.groupby("op", sort=False):
        # Methods with a speedup or a failure on some shape (torch_fused skipped everywhere has no column).
        shown = g_op[(g_op.metric.isin(["speedup_vs_plain", "error"])) | ((g_op.metric == "ok") & (g_op.value != 1.0))]
        # The variants' other forms (copy_engine, <variant>.ws, ...) after the four.
        forms = [m for m in dict.fromkeys(shown.variant) if m not in MD_VARIANTS + MD_OTHERS + MD_BASELINES]
        methods = [m for m in MD_VARIANTS if (shown.variant == m).any()] + forms + \
            [m for m in MD_OTHERS if (shown.variant == m).any()]
        head = ["shape", "M×N×K", "gemm ms", "comm ms", "plain ms"] + methods + ["ideal"]
        lines = [f"**{op}**, world {g_op.world.iloc[0]}, {g_op.dtype.iloc[0]}, {g_op.device.iloc[0]}, "
                 f"commit `{g_op.commit.iloc[0]}` (`{csv.as_posix()}`)", "",
                 "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        keys = ["shape", "M", "N", "K"] if "shape" in g_op else ["M", "N", "K"]
        for key, g in g_op.groupby(keys, sort=False):
            def value(method, metric, g=g):
                hit = g[(g.variant == method) & (g.metric == metric)]
                return float(hit.value.iloc[0]) if len(hit) else math.nan

            M, N, K = (int(g[c].iloc[0]) for c in ("M", "N", "K"))
            speed = {m: value(m, "speedup_vs_plain") for m in methods}
            fine = [m for m in MD_VARIANTS + tuple(forms) if m in speed and not math.isnan(speed[m])]
            best = max(fine, key=lambda m: speed[m], default=None)
            cells = [str(key[0]) if "shape" in g_op else "", f"{M}×{N}×{K}"]
            cells += [f"{value(m, 'ms'):.3f}" for m in ("gemm", "comm", "plain")]
            for m in methods:
                if (g[(g.variant == m)].metric == "error").any() or value(m, "ok") == 0.0:
                    cells.append("fail")
                elif math.isnan(speed[m]):
                    cells.append("—")
                else:
                    cells.append(f"**{speed[m]:.2f}**" if m == best else f"{speed[m]:.2f}")
            cells.append(f"{value('ideal', 'ideal_speedup'):.2f}")
            lines.append("| " + " | ".join(cells) + " |")
        out += lines + [""]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", default=["bench_out"], help="output folders, or suite CSVs with --markdown")
    parser.add_argument("--markdown", action="store_true", help="print suite CSVs as Markdown tables")
    args = parser.parse_args(argv)
    if args.markdown:
        for path in map(Path, args.paths):
            if not path.is_file():
                parser.error(f"--markdown needs suite CSV files; {path} is not one")
            print("\n".join(suite_markdown(path)))
        return 0
    for out in map(Path, args.paths):
        _folder(out)
    return 0


def _folder(out: Path) -> None:
    parts = tests_summary(out / "tests.log") + [""] + bandwidth_summary(out / "bandwidth.csv")
    for csv in sorted(out.glob("soak*.csv")):
        parts += [""] + soak_summary(csv)
    for csv in sorted(out.glob("suite*.csv")):
        parts += [""] + suite_summary(csv)
    print("\n".join(parts))


if __name__ == "__main__":
    sys.exit(main())
