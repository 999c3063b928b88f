"""The tuner: ``python -m tilefuse.tuning --op OP --shapes SET[,SET] [--dtype bfloat16] [--out DIR]``.

Also ``python -m tilefuse.tune``; on every rank under torchrun, else at world 1 (``tilefuse/tuning/README.md``,
"The tuner"). Results go into the decision cache or, with ``--out``, a config table.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import logging
import math
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

import torch
import torch.distributed as dist

import tilefuse
from tilefuse.ops import registry
from tilefuse.ops.common.checks import FLOAT8_DTYPES
from tilefuse.ops.common.config import SMALL_M_TILES, WARP_SPEC_VARIANTS, Config, default_config
from tilefuse.runtime import hw
from tilefuse.tuning import autotune, cache, rules, tables
from tilefuse.tuning.shapes import local_shapes
from tilefuse.tuning.tables import m_bucket

log = logging.getLogger("tilefuse")

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages), most promising first; 128x128 with 4 and 6 stages.
TILES = [(128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4), (128, 128, 64, 4, 6),
         (256, 128, 64, 8, 3), (64, 128, 64, 4, 4)]
INTERPRETER_TILES = [(32, 32, 32, 4, 1), (64, 64, 64, 4, 1)]
# Tried second above SMALL_M for 16-bit dtypes by config.WARP_SPEC_VARIANTS, with WARP_SPEC = 1.
WARP_SPEC_TILE = (128, 256, 64, 4, 4)
SMALL_M = 256  # up to this M (decode, small batches) the tiles are decode-size (candidate_configs)
SMALL_M_SPLITS = [8, 16]  # COMM_SMS tried at small M: little to move, the GEMM keeps most programs
SPLITS = [8, 16, 32]


def candidate_configs(variant: str, M: int, N: int, K: int, dtype, num_sms: int, interpreter: bool,
                      quick: bool, *, op: str = "", world: int = 1) -> list[Config]:
    """One variant's search space for a shape (distinct, fitting the device, at most
    ``rules.MAX_TUNER_CONFIGS``): its default first, then tiles x warps/stages x GEMM/communication splits."""
    comm = variant in rules.COMM_VARIANTS
    base = default_config(M, N, K, dtype, num_sms=num_sms, interpreter=interpreter, comm=comm)
    if interpreter:
        tiles, splits = INTERPRETER_TILES, [2]
    elif M <= SMALL_M:  # BLOCK_M 64/32/16 (none taller than M needs) x BLOCK_N 128/64, 4 warps, 4 stages;
        # above M = 64 config.SMALL_M_TILES before them and 128x128 after
        top = max(16, 1 << (M - 1).bit_length())
        tiles = [(bm, bn, 64, 4, 4) for bm in (64, 32, 16) if bm <= top for bn in (128, 64)]
        if M > 64:
            tiles = [(bm, bn, bk, 4, stages) for bm, bn, bk, stages in SMALL_M_TILES] + tiles + [(128, 128, 64, 4, 4)]
        splits = SMALL_M_SPLITS
    else:
        tiles, splits = TILES, SPLITS
    splits = splits if comm else [0]
    if quick and not interpreter:
        tiles, splits = tiles[:2], splits[:2]
    out = [base]
    if not interpreter and M > SMALL_M and dtype.itemsize <= 2 and variant in WARP_SPEC_VARIANTS.get(op, ()):
        bm, bn, bk, warps, stages = WARP_SPEC_TILE
        out.append(base.replace(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages, WARP_SPEC=1))
    out += [base.replace(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk if dtype.itemsize < 4 else min(bk, 32), num_warps=warps,
                         num_stages=stages, COMM_SMS=comm_sms, WARP_SPEC=0,  # the default's tile may specialize
                         GEMM_SMS=base.GEMM_SMS if interpreter else num_sms - comm_sms)
            for bm, bn, bk, warps, stages in tiles for comm_sms in splits if comm_sms < num_sms]
    return list(dict.fromkeys(out))[:rules.MAX_TUNER_CONFIGS]  # distinct, in order


def _inputs(op: str, M: int, N: int, K: int, dtype, device, n_sets: int, seed: int = 17) -> list[tuple]:
    """``n_sets`` of ``(a, b, keywords)``: b the same on every rank, a too for gemm_all_scatter;
    float8 operands with tensor-wise scales (bfloat16 results), b a float8 Linear weight's transpose
    (column-major, as ``torch._scaled_mm`` takes it)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    a_seed = seed if op == "gemm_all_scatter" else seed + 1000 * (dist.get_rank() + 1)
    fp8 = dtype in FLOAT8_DTYPES  # unit-scale values, the product's scale in scale_b
    scales = {"scale_a": torch.ones((), device=device), "scale_b": torch.full((), K ** -0.5, device=device)}
    ab = [(torch.randn(M, K, generator=torch.Generator().manual_seed(a_seed + i)).to(dtype=dtype, device=device),
           torch.randn(N, K, generator=g).to(dtype=dtype, device=device).t() if fp8 else
           torch.randn(K, N, generator=g).to(dtype=dtype, device=device)) for i in range(n_sets)]
    return [(a, b, scales) if fp8 else (a, b / K ** 0.5, {}) for a, b in ab]


SHORTLIST_RATIO = 1.0  # a finalist's first-pass time, alone and back to back, is at most this x plain's
DECIDE_S = 2.0  # seconds of timed calls for the decision between plain and the shortlist (autotune.tune)
SETTLE_S = 1.5  # a GPU at its power limit dips in clock about a second into a load, then holds steady


def settle(fn, *, device: torch.device, seconds: float = SETTLE_S, agree=None, max_calls: int = 2000) -> int:
    """Run ``fn()`` back to back for about ``seconds`` on a GPU, so the next timing starts at steady
    clocks; returns the count, ``agree(n)``'s where given (required when ``fn`` is collective)."""
    if device.type != "cuda" or seconds <= 0:
        return 0
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize(device)
    n = min(max_calls, math.ceil(seconds / max(time.perf_counter() - t0, 1e-6)))
    n = int(agree(n)) if agree is not None else n
    for _ in range(n):
        fn()
    torch.cuda.synchronize(device)
    return n


clock = time.perf_counter  # the budget's clock (tests replace it)


class Budget:
    """Whether the next item (a shape) still fits in ``seconds`` (rank 0's; None: no limit): collective
    :meth:`fits` says yes while the time since ``start`` plus the median cost of the items done, maximum
    over the ranks, stays within ``seconds``. The first item always runs."""

    def __init__(self, seconds: float | None, group, *, start: float | None = None,
                 what: str = "tilefuse.tune: budget"):
        if seconds is not None and not seconds > 0:
            raise ValueError(f"a time budget must be > 0 seconds, got {seconds!r}")
        self.seconds, self.group, self.what = seconds, group, what
        self.start = clock() if start is None else start
        self.marks: list = []  # agreed seconds since start at each call of fits
        self.costs: list = []  # agreed seconds of each finished item, its left-out part removed
        self.elapsed, self.estimate = 0.0, None  # seconds since start, and a shape's expected seconds

    def fits(self, left_out_s: float = 0.0) -> bool:
        """``left_out_s``: seconds of the item just finished that later ones will not spend (compiling)."""
        mine = {"elapsed": clock() - self.start, "left_out": max(0.0, float(left_out_s)), "seconds": self.seconds}
        views = autotune.all_gather(mine, self.group, what=f"{self.what}: item {len(self.marks) + 1}")
        self.elapsed = max(v["elapsed"] for v in views)
        seconds = views[0]["seconds"]
        if self.marks:
            self.costs.append(max(0.0, self.elapsed - self.marks[-1] - max(v["left_out"] for v in views)))
        self.marks.append(self.elapsed)
        self.estimate = statistics.median(self.costs) if self.costs else None
        return seconds is None or self.estimate is None or self.elapsed + self.estimate <= seconds


def _ms(x: float) -> float:
    return round(float(x), 5)


def _ms_of(d: dict) -> dict:
    return {n: _ms(t) for n, t in d.items()}


def _round_record(label: str, reps: int, times: dict, block: dict, spread: dict) -> dict:
    return {"round": label, "reps": reps, "call_ms": _ms_of(times), "block_ms": _ms_of(block), "spread": _ms_of(spread)}


def tune_shape(op: str, M: int, N: int, K: int, dtype, *, quick: bool, reps: int, keep: int,
               margin: float = autotune.MARGIN, decide_s: float = DECIDE_S, stats: dict | None = None) -> dict:
    """Tune one shape on every rank (collective); returns its table entry. :func:`autotune.screen`
    shortlists the ``keep`` best (at most ``SHORTLIST_RATIO`` x plain's time), :func:`autotune.tune`
    decides. ``stats`` (optional) receives ``warm_up_s``: the first pass's warm-up seconds, max over ranks."""
    # Workspaces are kept per shape: a sweep over large shapes would fill the heap.
    tilefuse.synchronize()
    tilefuse.barrier()
    tilefuse.clear_workspaces()
    heap = tilefuse.get_heap()
    device, group, world = heap.device, heap.group, heap.world_size
    interpreter, num_sms = hw.interpreting(), hw.num_sms(device)
    # Calls rotate over up to 4 input sets, together about twice a 64 MiB L2: a call rarely finds its operands cached.
    n_sets = 1 if interpreter else max(1, min(4, -(-2 * 64 * 2**20 // max((M * K + K * N) * dtype.itemsize, 1))))
    sets = _inputs(op, M, N, K, dtype, device, n_sets)
    dtype_name = str(dtype).removeprefix("torch.")
    what = f"tune {op} {M}x{N}x{K} {dtype_name}"

    def runner(fn, **kw):  # each call takes the next input set from set 0: the check sees plain's operands
        calls = itertools.count()
        def call():
            a, b, scales = sets[next(calls) % n_sets]
            return fn(a, b, **scales, **kw)

        return call

    plain = registry.get(op, tables.PLAIN)
    space = {}  # name -> (variant, config), in search order
    for variant in registry.tunable(op):
        if variant not in registry.variants(op) or rules.skip_reason(op, variant, N, world):
            continue
        configs = candidate_configs(variant, M, N, K, dtype, num_sms, interpreter, quick, op=op, world=world)
        for i, cfg in enumerate(configs):
            space[variant if i == 0 else f"{variant}#{i}"] = (variant, cfg)  # as first-call tuning names them

    def candidates(names):
        return [autotune.Candidate("plain", tables.PLAIN, None, runner(plain))] + [autotune.Candidate(
            n, *space[n], runner(registry.get(op, space[n][0]), config=space[n][1])) for n in names]

    first = autotune.screen(candidates(list(space)), device=device, group=group, what=f"{what}: first pass", reps=reps)
    if stats is not None:
        stats["warm_up_s"] = first.warm_up_s

    def ratio(n):  # the worse of its first-pass times to plain's, alone and back to back
        return max(t[n] / t["plain"] if t["plain"] > 0 else math.inf for t in (first.times, first.block))

    records = {name: {"name": name, "variant": variant, "config": cfg.to_dict(),
                      **({"error": first.dropped[name][:300]} if name in first.dropped else
                         {"time_ms": _ms(first.times[name]), "block_ms": _ms(first.block[name])})}
               for name, (variant, cfg) in space.items()}
    ranked = sorted((n for n in first.times if n != "plain"), key=lambda n: (ratio(n), n))
    shortlist = [n for n in ranked if ratio(n) <= SHORTLIST_RATIO][:keep]
    plain_first = ({"plain": d["plain"]} for d in (first.times, first.block, first.spread))
    decision = {"margin": margin, "first_pass": _round_record("first pass", first.reps, *plain_first),
                "finalists": shortlist, "rounds": []}
    variant, config, times, block, pick = tables.PLAIN, None, first.times, first.block, "plain"
    if shortlist:
        settle(runner(plain), device=device, agree=lambda n: max(autotune.all_gather(n, group, what=f"{what}: settle")))
        res = autotune.tune(candidates(shortlist), device=device, group=group, what=f"{what}: decision",
                            budget=decide_s, margin=margin)
        variant, config, times, block = res.variant, res.config, res.times, res.block
        pick = "plain" if variant == tables.PLAIN else next(n for n in shortlist if space[n] == (variant, config))
        decision["rounds"].append(_round_record("decision", res.reps, res.times, res.block, res.spread))
        if (c := res.confirmed) is not None:
            decision["rounds"].append(_round_record("confirmation", c["reps"], c["times"], c["block"], c["spread"]))
        if res.dropped:
            decision["dropped"] = res.dropped
        for n in shortlist:  # first_ms: the first pass's times; time_ms only where the decision round timed it
            rec = records[n]
            rec.update(first_ms=rec.pop("time_ms"), first_block_ms=rec.pop("block_ms"))
            if n in res.times:
                rec.update(time_ms=_ms(res.times[n]), block_ms=_ms(res.block[n]), final=True)
            else:
                rec["error"] = res.dropped.get(n, "dropped in the decision round")[:300]
    else:
        decision["note"] = ("keep = 0" if keep == 0 else f"no candidate measured at most {SHORTLIST_RATIO:g}x plain's "
                            "time both ways in the first pass") + ": plain, without a decision round"
    decision["pick"] = pick
    failed = [r for r in records.values() if "error" in r]
    if failed and dist.get_rank() == 0:
        kinds = sorted({re.sub(r"^rank \d+: ", "", r["error"]).split(":")[0] for r in failed})
        log.warning("tilefuse.tune: %s %dx%dx%d: %d of %d candidates failed (%s); see the entry's candidates",
                    op, M, N, K, len(failed), len(records), ", ".join(kinds))
    entry = {"M": M, "N": N, "K": K, "dtype": dtype_name, "variant": variant,
             "config": None if config is None else config.to_dict(), "time_ms": _ms(times[pick]),
             "plain_ms": _ms(times["plain"]), "block_ms": _ms(block[pick]), "plain_block_ms": _ms(block["plain"]),
             "decision": decision, "candidates": list(records.values())}
    if shortlist and res.device:  # device time measured: the graph pick, the same as the eager one or not
        graph_config = None if res.graph_config is None else res.graph_config.to_dict()
        entry["graph"] = {"variant": res.graph_variant, "config": graph_config, "device_ms": _ms_of(res.device)}
        if res.graph_confirmed is not None:
            entry["graph"]["confirm_device_ms"] = _ms_of(res.graph_confirmed["device"])
    return entry


def write_table(out_dir: Path, op: str, entries: list[dict], *, reps: int, margin: float = autotune.MARGIN,
                decide_s: float = DECIDE_S, left_out: list | None = None, commit: str | None = None) -> Path:
    """Merge ``entries`` into ``op``'s config table under ``out_dir``; ``commit`` goes in the provenance."""
    if not commit:  # this checkout's, where there is one
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip() or "unknown"
        except Exception:
            commit = "unknown"
    heap = tilefuse.get_heap()
    provenance = {
        "device": torch.cuda.get_device_name(heap.device) if heap.device.type == "cuda" else "cpu (interpreter)",
        "world_size": heap.world_size, "torch": torch.__version__, "triton": __import__("triton").__version__,
        "commit": commit, "date": datetime.date.today().isoformat(),
        "timing": f"tilefuse.tune (tilefuse/tuning/README.md): first pass {reps} samples of every candidate, "
                  f"then {decide_s:g} s of timed calls to decide; margin max({margin:.0%}, 2x the uncertainty)",
    }
    if left_out:
        provenance["left_out"] = ("not tuned in this run (--budget-s): "
                                  + ", ".join(f"{s['name']} ({s['M']}x{s['N']}x{s['K']})" for s in left_out))
    return tables.write_table(out_dir, op, hw.arch_name(heap.device), heap.world_size, entries, provenance)


def write_cache(op: str, e: dict, *, margin: float = autotune.MARGIN) -> Path:
    """Put the entry ``e`` in the decision cache under its M bucket; returns the cache file."""
    heap = tilefuse.get_heap()
    key = cache.entry_key(hw.arch_name(heap.device), heap.world_size, op, e["dtype"], e["N"], e["K"], m_bucket(e["M"]))
    kept = ("variant", "config", "M", "time_ms", "plain_ms", "block_ms", "plain_block_ms")
    return cache.put({key: {**{k: e[k] for k in kept}, "margin": margin, "source": "python -m tilefuse.tuning",
                            "date": datetime.date.today().isoformat()}})


def run(argv=None) -> tuple[list[dict], list[dict], Path | None]:
    """The command on this rank: ``(entries tuned, shapes left out by --budget-s, file written or None)``."""
    t_start = clock()
    p = argparse.ArgumentParser(prog="python -m tilefuse.tuning", description=__doc__.split("\n\n")[0])
    p.add_argument("--op", required=True, choices=registry.OPS)
    p.add_argument("--shapes", default="tiny",
                   help="shape sets from tilefuse/tuning/shapes.json, comma-separated ('models': every model's set)")
    p.add_argument("--shape", action="append", default=[], help="an extra per-rank shape MxNxK")
    p.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16", "float32", "float8_e4m3fn"],
                   help="float8_e4m3fn: scaled operands (tensor-wise scales, bfloat16 results)")
    p.add_argument("--out", help="write a config table under this directory (default: the user's decision cache)")
    p.add_argument("--reps", type=int, default=5, help="samples of every candidate in the first pass")
    p.add_argument("--keep", type=int, default=3, help="candidates of the first pass that reach the decision")
    p.add_argument("--decide-s", type=float, default=DECIDE_S, help="seconds of timed calls for each decision")
    p.add_argument("--quick", action="store_true", help="a smaller search space")
    p.add_argument("--margin", type=float, default=autotune.MARGIN,
                   help="the smallest win over plain a variant needs, alone and back to back (fraction)")
    p.add_argument("--commit", help="the commit in a table's provenance (default: git rev-parse of this checkout)")
    p.add_argument("--budget-s", type=float, help="seconds for the whole run: shapes start while the next one is "
                                                   "expected to fit; the log names those left out")
    args = p.parse_args(argv)
    if args.reps < 1 or args.keep < 0 or args.decide_s < 0 or not (args.budget_s is None or args.budget_s > 0):
        p.error("--reps must be >= 1, --keep >= 0, --decide-s >= 0 and --budget-s > 0")
    if not dist.is_initialized():
        if "RANK" in os.environ:
            if torch.cuda.is_available():
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        else:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    heap = tilefuse.init()
    rank = dist.get_rank()
    shapes = local_shapes(args.op, args.shapes, dist.get_world_size()) if args.shapes else []
    for s in args.shape:
        M, N, K = (int(x) for x in s.lower().split("x"))
        shapes.append({"name": s, "M": M, "N": N, "K": K})
    by_shape: dict = {}
    for s in shapes:  # two sets can name one shape
        by_shape.setdefault((s["M"], s["N"], s["K"]), s)
    unique = list(by_shape.values())
    budget = Budget(args.budget_s, heap.group, start=t_start, what=f"tilefuse.tune {args.op}: budget")
    entries, left_out, path, stats = [], [], None, {"warm_up_s": 0.0}
    for i, s in enumerate(unique):
        # Later shapes mostly reuse the kernels a first pass compiles: the estimate leaves that time out.
        if not budget.fits(stats["warm_up_s"]):
            left_out = unique[i:]
            if rank == 0:
                names = ", ".join(f"{x['name']} ({x['M']}x{x['N']}x{x['K']})" for x in left_out)
                print(f"{args.op}: budget --budget-s {args.budget_s:g}: stopped after {budget.elapsed:.0f} s "
                      f"(a shape takes about {budget.estimate:.1f} s besides compiling); tuned {i} of "
                      f"{len(unique)} shapes, left out: {names}", flush=True)
            break
        e = tune_shape(args.op, s["M"], s["N"], s["K"], getattr(torch, args.dtype), quick=args.quick, reps=args.reps,
                       keep=args.keep, margin=args.margin, decide_s=args.decide_s, stats=stats)
        entries.append(e)
        if rank == 0:
            print(f"{args.op} {s['name']} ({s['M']}x{s['N']}x{s['K']}): {e['variant']} {e['time_ms']:.3f} ms "
                  f"alone, {e['block_ms']:.3f} back to back (plain {e['plain_ms']:.3f} / {e['plain_block_ms']:.3f} "
                  f"ms, {e['plain_ms'] / e['time_ms']:.2f}x / {e['plain_block_ms'] / e['block_ms']:.2f}x)", flush=True)
            # Written after every shape: a run cut short keeps what it tuned.
            path = write_cache(args.op, e, margin=args.margin) if args.out is None else write_table(
                Path(args.out), args.op, entries, reps=args.reps, margin=args.margin, decide_s=args.decide_s,
                commit=args.commit)
    if rank == 0 and left_out and entries and args.out is not None:
        path = write_table(Path(args.out), args.op, entries, reps=args.reps, margin=args.margin,
                           decide_s=args.decide_s, left_out=left_out, commit=args.commit)
    if rank == 0 and path is not None:
        print(f"wrote {path}", flush=True)
    tilefuse.barrier()
    return entries, left_out, path


def main(argv=None) -> int:
    run(argv)
    return 0
