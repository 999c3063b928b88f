"""Short summary of a gpu_session.sh output folder: test outcome, bandwidth, ops against torch.matmul.

    python -m benchmarks.summary OUT_DIR

Reads ``tests.log``, ``bandwidth.csv`` and ``ops_world1.csv`` where present; prints compact tables
(the device tool returns only the tail of the output, so this is what must fit).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from .common import format_table, human_bytes, read_csv

SHORT_OPS = {"gemm_all_scatter": "gas", "all_gather_gemm": "agg", "gemm_reduce_scatter": "grs"}
SHORT_METHODS = {"tilefuse.matmul": "core", "plain": "plain", "bulk_sync": "bulk",
                 "producer_consumer": "pc", "fused_sequential": "fs", "wg_specialized": "ws",
                 "reference": "ref", "auto": "auto"}
HOST_COLUMNS = ("plain", "auto", "plain_again")  # their host_ms is shown (the auto-vs-plain question)
LEGEND = ("columns after torch: time of torch.matmul / time of the method (1.00 = as fast); "
          "core = tilefuse GEMM core alone, bulk/pc/fs/ws = bulk_sync/producer_consumer/"
          "fused_sequential/wg_specialized, * = out=None (result copied out of the heap); "
          "F = wrong result, ERR = raised")


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
    base, star = (label[: -len("[out=None]")], "*") if label.endswith("[out=None]") else (label, "")
    return SHORT_METHODS.get(base, base) + star


def bandwidth_summary(csv: Path) -> list:
    if not csv.exists():
        return ["bandwidth: no csv"]

    df = read_csv(csv)
    if df.empty:
        return ["bandwidth: empty csv"]
    recs: dict = {}
    for r in df.itertuples(index=False):
        rec = recs.setdefault((int(r.N), int(r.M)), {"size": human_bytes(int(r.M)), "d": int(r.N)})
        if r.metric == "GB/s":
            rec[r.variant] = r.value
        if r.metric == "ok" and r.value != 1.0:
            rec["bad"] = (rec.get("bad", "") + " " + r.variant).strip()
    methods = [m for m in ("store", "load", "put", "get", "triton", "torch") if (df.variant == m).any()]
    world = int(df.world.iloc[0])
    title = f"bandwidth GB/s (read + written), world {world}, {df.device.iloc[0]}"
    return [format_table([recs[k] for k in sorted(recs)], ["size", "d"] + methods + ["bad"], title)]


def ops_summary(csv: Path) -> list:
    if not csv.exists():
        return ["ops_world1: no csv"]

    df = read_csv(csv)
    if df.empty:
        return ["ops_world1: empty csv"]
    shapes: dict = {}
    columns: list = []
    for r in df.itertuples(index=False):
        key = (r.op, int(r.M), int(r.N), int(r.K))
        rec = shapes.setdefault(key, {"op": SHORT_OPS.get(r.op, r.op), "MxNxK": f"{r.M}x{r.N}x{r.K}",
                                      "_status": {}, "_ratio": {}})
        if r.variant == "torch.matmul":
            if r.metric == "TFLOP/s":
                rec["torch TF/s"] = r.value
            continue
        col = _short(r.variant)
        if col not in columns:
            columns.append(col)
        if r.metric == "vs_torch":
            rec["_ratio"][col] = r.value
        elif r.metric == "ok" and r.value != 1.0:
            rec["_status"][col] = "F"
        elif r.metric == "error":
            rec["_status"][col] = "ERR"
    records = []
    for rec in shapes.values():
        out = {k: v for k, v in rec.items() if not k.startswith("_")}
        for col in columns:
            ratio = rec["_ratio"].get(col)
            mark = rec["_status"].get(col, "")
            if mark == "ERR" or (ratio is None and mark):
                out[col] = mark
            elif ratio is None:
                out[col] = "-"
            else:
                out[col] = f"{mark}{ratio:.2f}"
        records.append(out)
    info = df.iloc[0]
    title = (f"ops at world 1, {info['dtype']}, {info['device']}, torch {info['torch']}, "
             f"triton {info['triton']}, commit {info['commit']}")
    return [format_table(records, ["op", "MxNxK", "torch TF/s"] + columns, title), LEGEND]


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


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "bench_out")
    parts = tests_summary(out / "tests.log") + [""] + bandwidth_summary(out / "bandwidth.csv") + [""]
    parts += ops_summary(out / "ops_world1.csv")
    for csv in sorted(out.glob("suite*.csv")):
        parts += [""] + suite_summary(csv)
    print("\n".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
