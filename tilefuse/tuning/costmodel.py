"""A conservative cost model for shapes nothing tuned: may a fused variant replace the plain path?
The smallest speedup the tables measured within ``RADIUS`` in log2 (M, N, K) (``tilefuse/tuning/README.md``,
"The cost model"; ``python -m tilefuse.tuning.loo`` runs :func:`leave_one_out`)."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

from ..ops.common.config import Config
from . import tables
from .shapes import OPS

RADIUS = 1.0
WIN = 0.05  # a model's pick must predict at least this much less time than plain
_FITTED: dict = {}  # the samples of the last (op, arch, world, dtype, table generation, search dirs)


@dataclass(frozen=True)
class Sample:
    M: int
    N: int
    K: int
    plain_ms: float
    speedups: dict = field(default_factory=dict)  # variant -> (plain_ms / variant_ms, config dict)


@dataclass(frozen=True)
class Prediction:
    variant: str
    speedup: float  # predicted plain_ms / variant_ms
    config: Config | None
    neighbours: tuple  # ((M, N, K), ...) the prediction rests on

    @property
    def wins(self) -> bool:
        return self.variant != tables.PLAIN and 1.0 / self.speedup <= 1.0 - WIN


def sample_of(entry: dict) -> Sample | None:
    """The measurements of one table entry, or None if it has no plain time."""
    plain_ms = entry.get("plain_ms")
    if not isinstance(plain_ms, (int, float)) or plain_ms <= 0:
        return None
    by_variant: dict = {}
    for c in entry.get("candidates", []):
        if isinstance(c.get("time_ms"), (int, float)) and c["time_ms"] > 0:
            by_variant.setdefault(c.get("variant"), []).append(c)
    best: dict = {}
    for v, cs in by_variant.items():
        c = min([c for c in cs if c.get("final")] or cs, key=lambda c: c["time_ms"])  # decision-round times first
        best[v] = (c["time_ms"], c.get("config"))
    if entry.get("variant") not in (None, tables.PLAIN) and entry.get("variant") not in best:
        best[entry["variant"]] = (entry["time_ms"], entry.get("config"))
    speedups = {v: (plain_ms / t, cfg) for v, (t, cfg) in best.items() if v != tables.PLAIN and cfg is not None}
    return Sample(entry["M"], entry["N"], entry["K"], float(plain_ms), speedups)


def samples(op: str, arch: str, world: int, dtype: str) -> list[Sample]:
    """Every measured shape of the tables for (op, arch, world, dtype); a user table's hides the shipped one."""
    out, seen = [], set()
    for directory in tables.search_dirs():
        for e in tables.load_table(tables.table_path(directory, op, arch, world)) or []:
            key = (e["M"], e["N"], e["K"])
            if e["dtype"] != dtype or key in seen:
                continue
            seen.add(key)
            if (s := sample_of(e)) is not None:
                out.append(s)
    return out


def predict_from(data: list[Sample], M: int, N: int, K: int, *, radius: float = RADIUS) -> Prediction | None:
    if min(M, N, K) < 1:
        return None  # an empty operand: nothing to predict (the plain path handles it)
    q = (math.log2(M), math.log2(N), math.log2(K))
    pts = ((math.dist(q, (math.log2(s.M), math.log2(s.N), math.log2(s.K))), s) for s in data)
    near = sorted(((d, s) for d, s in pts if d <= radius), key=lambda t: t[0])
    if not near:
        return None
    neighbours = tuple((s.M, s.N, s.K) for _, s in near)
    preds = {v: min(s.speedups[v][0] for _, s in near) for v in set.intersection(*(set(s.speedups) for _, s in near))}
    if not preds:
        return Prediction(tables.PLAIN, 1.0, None, neighbours)
    v = max(sorted(preds), key=preds.get)  # the first of equal predictions by name
    return Prediction(v, preds[v], Config.from_dict(near[0][1].speedups[v][1]), neighbours)


def predict(op: str, arch: str, world: int, M: int, N: int, K: int, dtype: str) -> Prediction | None:
    """The model's pick for a shape (None: no measurement near it); samples read once per table generation."""
    key = (op, arch, world, dtype, tables.generation(), tuple(str(d) for d in tables.search_dirs()))
    if key not in _FITTED:
        _FITTED.clear()
        _FITTED[key] = samples(op, arch, world, dtype)
    return predict_from(_FITTED[key], M, N, K)


def leave_one_out(data: list[Sample], *, radius: float = RADIUS) -> list[dict]:
    """Each sample predicted from the others: per sample the pick, its predicted and measured speedup,
    what auto would run and its speedup over plain."""
    rows = []
    for i, s in enumerate(data):
        p = predict_from(data[:i] + data[i + 1:], s.M, s.N, s.K, radius=radius)
        measured = {v: sp for v, (sp, _) in s.speedups.items()}
        row = {"M": s.M, "N": s.N, "K": s.K, "best_measured": max([1.0] + list(measured.values())),
               "pick": None, "predicted": None, "measured": None}
        if p is not None and p.variant != tables.PLAIN:
            row.update(pick=p.variant, predicted=p.speedup, measured=measured.get(p.variant))
        runs = p.variant if p is not None and p.wins else tables.PLAIN
        row.update(auto_runs=runs, auto_speedup=1.0 if runs == tables.PLAIN else measured.get(runs, float("nan")))
        rows.append(row)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tilefuse.tuning.loo",
                                description="Leave-one-out error of the cost model on the config tables.")
    p.add_argument("--arch", default="nvidia-h200")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--radius", type=float, default=RADIUS)
    p.add_argument("--rows", action="store_true", help="print every held-out shape too")
    args = p.parse_args(argv)
    print("| op | W | shapes | predicted | mean abs err | max abs err | fused picks | worst auto/plain | missed wins |")
    print("|---|---|---|---|---|---|---|---|---|")
    for op in OPS:
        for world in (1, 2, 4, 8):
            if not (data := samples(op, args.arch, world, args.dtype)):
                continue
            rows = leave_one_out(data, radius=args.radius)
            pairs = [(r["predicted"], r["measured"]) for r in rows if None not in (r["predicted"], r["measured"])]
            errs = [abs(pr / m - 1.0) for pr, m in pairs] or [float("nan")]
            fused = sum(r["auto_runs"] != tables.PLAIN for r in rows)
            missed = sum(r["best_measured"] >= 1.0 / (1.0 - WIN) and r["auto_runs"] == tables.PLAIN for r in rows)
            print(f"| {op} | {world} | {len(rows)} | {len(pairs)} | {sum(errs) / len(errs):.1%} | {max(errs):.1%} "
                  f"| {fused} | {min(r['auto_speedup'] for r in rows):.3f} | {missed} |")
            if args.rows:
                for r in rows:
                    pred = "-" if r["predicted"] is None else \
                        f"{r['pick']} {r['predicted']:.3f} (measured {r['measured']:.3f})"
                    print(f"|   {r['M']}x{r['N']}x{r['K']} | | | {pred} | | | {r['auto_runs']} "
                          f"| {r['auto_speedup']:.3f} | best {r['best_measured']:.3f} |")
    return 0

