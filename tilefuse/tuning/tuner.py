"""The tuner: ``python -m tilefuse.tuning --op OP --shapes SET[,SET] [--dtype bfloat16] [--out DIR]``.

(``python -m tilefuse.tune`` is the same command.) Run it on every rank (``torchrun --nproc-per-node
W -m tilefuse.tuning ...``); without torchrun it runs at world 1. For each shape it times the plain
path and every variant × candidate config (tile sizes, warps/stages, GEMM_SMS/COMM_SMS split),
prunes with a cheap first pass, times the best few again, checks each survivor's result against the
plain path, and keeps a variant only if it beats plain by the margin.

Where the results go: by default into the user's decision cache (:mod:`tilefuse.tuning.cache`,
``TILEFUSE_CACHE_DIR``), one entry per (shape's M bucket, N, K), which ``variant="auto"`` reads in
every later process; with ``--out DIR``, into the config table ``DIR/<op>/<arch>_ws<W>.json``
(schema: ``tilefuse/configs/README.md``; the shipped tables are ``--out tilefuse/configs``), whose
entries for shapes it did not tune are kept.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import statistics
import subprocess
from pathlib import Path

import torch
import torch.distributed as dist

import tilefuse
from tilefuse.ops import registry
from tilefuse.ops.common.config import Config, default_config
from tilefuse.runtime import hw
from tilefuse.tuning import cache, rules, tables
from tilefuse.tuning.buckets import m_bucket
from tilefuse.tuning.shapes import local_shapes
from tilefuse.tuning.timing import cross_rank_max, median_ms, medians_interleaved, settle

log = logging.getLogger("tilefuse")

COMM_VARIANTS = rules.COMM_VARIANTS
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages), most promising first.
TILES = [(128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4), (256, 128, 64, 8, 3),
         (64, 128, 64, 4, 4)]
INTERPRETER_TILES = [(32, 32, 32, 4, 1), (64, 64, 64, 4, 1)]
SMALL_M = 256  # up to this M (decode, small batches) the tiles come from small_m_tiles
SMALL_M_SPLITS = [8, 16]  # COMM_SMS tried at small M: little to move, the GEMM keeps most programs
SPLITS = [8, 16, 32]


def small_m_tiles(M: int) -> list[tuple]:
    """Decode-size tiles: BLOCK_M 64/32/16 (none above the smallest power of two >= M, at least 16)
    x BLOCK_N 128/64 (more column tiles keep more programs busy reading B), 4 warps, 4 stages; and
    128x128 above M = 64."""
    top = max(16, 1 << (M - 1).bit_length())
    tiles = [(bm, bn, 64, 4, 4) for bm in (64, 32, 16) if bm <= top for bn in (128, 64)]
    if M > 64:
        tiles.append((128, 128, 64, 4, 4))
    return tiles


def candidate_configs(variant: str, M: int, N: int, K: int, dtype, num_sms: int, interpreter: bool,
                      quick: bool, *, op: str = "", world: int = 1) -> list[Config]:
    """The search space of one variant for one shape (deduplicated, all fitting the device, at most
    ``rules.MAX_TUNER_CONFIGS``): the variant's default first, then tile sizes x warps/stages x
    GEMM/communication splits, then ``op``'s own forms at ``world`` (:mod:`tilefuse.tuning.rules`:
    all_gather_gemm's copy-engine form, gemm_all_reduce's two-shot twins of the first few)."""
    comm = variant in COMM_VARIANTS
    base = default_config(M, N, K, dtype, num_sms=num_sms, interpreter=interpreter, comm=comm)
    if interpreter:
        tiles = INTERPRETER_TILES
        splits = [2] if comm else [0]
    else:
        tiles = small_m_tiles(M) if M <= SMALL_M else TILES
        splits = (SMALL_M_SPLITS if M <= SMALL_M else SPLITS) if comm else [0]
        if quick:
            tiles, splits = tiles[:2], splits[:2]
    out = [base]
    for bm, bn, bk, warps, stages in tiles:
        for comm_sms in splits:
            if comm_sms >= num_sms:
                continue
            cfg = base.replace(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk if dtype.itemsize < 4 else min(bk, 32),
                               num_warps=warps, num_stages=stages, COMM_SMS=comm_sms,
                               GEMM_SMS=num_sms - comm_sms if not interpreter else base.GEMM_SMS)
            if cfg not in out:
                out.append(cfg)
    flat = default_config(M, N, K, dtype, num_sms=num_sms, interpreter=interpreter, comm=False)
    extra = [c for c in rules.extra_configs(op, variant, flat, num_sms, world) if c not in out]
    twins = [t for t in (rules.two_shot_form(op, variant, c, num_sms, world)
                         for c in out[:rules.TUNER_TWO_SHOT_TWINS]) if t is not None]
    extra += [t for t in twins if t not in extra]
    return out[:rules.MAX_TUNER_CONFIGS - len(extra)] + extra


def _inputs(op: str, M: int, N: int, K: int, dtype, device, n_sets: int, seed: int):
    g = torch.Generator(device="cpu").manual_seed(seed)
    rank = dist.get_rank()
    sets = []
    for i in range(n_sets):
        a_seed = seed + i if op == "gemm_all_scatter" else seed + 1000 * (rank + 1) + i
        ga = torch.Generator().manual_seed(a_seed)
        a = torch.randn(M, K, generator=ga).to(dtype=dtype, device=device)
        b = torch.randn(K, N, generator=g).to(dtype=dtype, device=device) / K ** 0.5
        sets.append((a, b))
    return sets


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))


FINAL_ROUNDS = 4  # second-pass rounds (calls interleaved); each finalist's time is the median of its rounds
MARGIN = 0.03  # a variant replaces the plain path only if it is at least this much faster (drift between
# measurements of the same GEMM on one H200 reached 5-10 % within a run: docs/PERF.md, "Method")


def tune_shape(op: str, M: int, N: int, K: int, dtype, *, quick: bool, reps: int, keep: int,
               margin: float = MARGIN) -> dict:
    # Workspaces are kept per shape: without this, a sweep over large shapes fills the heap and later
    # shapes' candidates fail with HeapFullError instead of being timed.
    tilefuse.synchronize()
    tilefuse.barrier()
    tilefuse.clear_workspaces()
    heap = tilefuse.get_heap()
    device = heap.device
    interpreter = hw.interpreting()
    num_sms = hw.num_sms(device)
    bytes_per_set = (M * K + K * N) * dtype.itemsize
    n_sets = 1 if interpreter else max(1, min(4, -(-2 * 64 * 2**20 // max(bytes_per_set, 1))))
    sets = _inputs(op, M, N, K, dtype, device, n_sets, seed=17)
    state = {"i": 0}

    def runner(fn, **kw):
        def call():
            a, b = sets[state["i"] % n_sets]
            state["i"] += 1
            return fn(a, b, **kw)
        return call

    plain = registry.get(op, tables.PLAIN)
    plain_ms = median_ms(runner(plain), device=device, reps=reps)
    a0, b0 = sets[0]
    ref = plain(a0, b0)
    ref = ref[0] if isinstance(ref, tuple) else ref
    candidates = []
    first_reps = max(2, reps // 3)
    for variant in registry.VARIANTS:
        if variant not in registry.variants(op) or rules.skip_reason(op, variant, N, dist.get_world_size()):
            continue
        fn = registry.get(op, variant)
        configs = candidate_configs(variant, M, N, K, dtype, num_sms, interpreter, quick, op=op,
                                    world=dist.get_world_size())
        for cfg in configs:
            entry = {"variant": variant, "config": cfg.to_dict()}
            try:
                got = fn(a0, b0, config=cfg)
                got = got[0] if isinstance(got, tuple) else got
                tilefuse.synchronize()
                err = _rel_err(got, ref)
                tol = 2e-2 if dtype != torch.float32 or not interpreter else 1e-4
                if not err < tol:
                    raise AssertionError(f"relative error {err:.3g} against the plain path")
                entry["time_ms"] = median_ms(runner(fn, config=cfg), device=device, reps=first_reps)
            except Exception as exc:  # a candidate that fails is recorded, never chosen
                entry["error"] = f"{type(exc).__name__}: {exc}"[:300]
                tilefuse.barrier()
            candidates.append(entry)
    timed = sorted((c for c in candidates if "time_ms" in c), key=lambda c: c["time_ms"])
    # Second pass: the plain path and the best few again, their calls interleaved one by one, in
    # FINAL_ROUNDS rounds (a GPU at its power cap swings its clock: timing one candidate after another
    # hands each a different phase; docs/PERF.md, "Method").
    finalists = [(None, plain)] + [(c, registry.get(op, c["variant"])) for c in timed[:keep]]
    settle(runner(plain), device=device, agree=lambda n: cross_rank_max(n, None))
    calls = [runner(fn, **({} if c is None else {"config": Config.from_dict(c["config"])})) for c, fn in finalists]
    second: dict = {i: [] for i in range(len(finalists))}
    for _ in range(FINAL_ROUNDS):
        for i, t in enumerate(medians_interleaved(calls, device=device, reps=max(2, reps // 2))):
            second[i].append(t)
    plain_ms = statistics.median(second[0])
    for i, (c, _) in enumerate(finalists[1:], start=1):
        c["time_ms"] = statistics.median(second[i])
        c["final"] = True
    finals = sorted((c for c in timed[:keep]), key=lambda c: c["time_ms"])
    best = finals[0] if finals else None
    dtype_name = str(dtype).removeprefix("torch.")
    failed = [c for c in candidates if "error" in c]
    if failed and dist.get_rank() == 0:
        kinds = sorted({c["error"].split(":")[0] for c in failed})
        log.warning("tilefuse.tune: %s %dx%dx%d: %d of %d candidates failed (%s); see the entry's candidates",
                    op, M, N, K, len(failed), len(candidates), ", ".join(kinds))
    if best is None or best["time_ms"] > plain_ms * (1.0 - margin):  # within the noise: plain is the safe choice
        return {"M": M, "N": N, "K": K, "dtype": dtype_name, "variant": tables.PLAIN, "config": None,
                "time_ms": plain_ms, "plain_ms": plain_ms, "candidates": candidates}
    return {"M": M, "N": N, "K": K, "dtype": dtype_name, "variant": best["variant"], "config": best["config"],
            "time_ms": best["time_ms"], "plain_ms": plain_ms, "candidates": candidates}


def _commit() -> str:
    if os.environ.get("TILEFUSE_COMMIT"):  # a copy of the checkout without .git (a device machine)
        return os.environ["TILEFUSE_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def write_table(out_dir: Path, op: str, entries: list[dict], *, reps: int, margin: float = MARGIN) -> Path:
    heap = tilefuse.get_heap()
    on_gpu = heap.device.type == "cuda"
    provenance = {
        "device": torch.cuda.get_device_name(heap.device) if on_gpu else "cpu (interpreter)",
        "world_size": heap.world_size, "torch": torch.__version__, "triton": __import__("triton").__version__,
        "commit": _commit(), "date": datetime.date.today().isoformat(),
        "timing": f"tilefuse.tune: median of {reps} calls after 3 warm-up calls, barrier before each, "
                  "CUDA events, max over ranks; inputs rotated over sets larger than twice the L2; finalists "
                  f"and plain in {FINAL_ROUNDS} rounds of interleaved calls, median of the rounds; a variant "
                  f"replaces plain only if at least {margin:.0%} faster",
    }
    return tables.write_table(out_dir, op, hw.arch_name(heap.device), heap.world_size, entries, provenance)


def write_cache(op: str, entries: list[dict], *, margin: float = MARGIN) -> Path:
    """Put the tuned ``entries`` in the user's decision cache, one per M bucket (the entry tuned last
    wins a bucket that two shapes fall in); returns the cache file."""
    heap = tilefuse.get_heap()
    arch, world = hw.arch_name(heap.device), heap.world_size
    out = {}
    for e in entries:
        key = cache.entry_key(arch, world, op, e["dtype"], e["N"], e["K"], m_bucket(e["M"]))
        out[key] = {"variant": e["variant"], "config": e["config"], "M": e["M"], "time_ms": e["time_ms"],
                    "plain_ms": e["plain_ms"], "margin": margin, "source": "python -m tilefuse.tuning",
                    "date": datetime.date.today().isoformat()}
    return cache.put(out)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tilefuse.tuning", description=__doc__.split("\n\n")[0])
    p.add_argument("--op", required=True, choices=registry.OPS)
    p.add_argument("--shapes", default="tiny",
                   help="shape sets from tilefuse/tuning/shapes.json, comma-separated ('models': every model's set)")
    p.add_argument("--shape", action="append", default=[], help="an extra per-rank shape MxNxK")
    p.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--out", default=None,
                   help="write a config table under this directory (the shipped ones: tilefuse/configs); "
                        "default: the user's decision cache (TILEFUSE_CACHE_DIR, else ~/.cache/tilefuse)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--keep", type=int, default=3, help="candidates timed again in the second pass")
    p.add_argument("--quick", action="store_true", help="a smaller search space")
    p.add_argument("--margin", type=float, default=MARGIN,
                   help="how much faster than the plain path a variant must be to be chosen (fraction)")
    args = p.parse_args(argv)
    if not dist.is_initialized():
        if "RANK" in os.environ:
            if torch.cuda.is_available():
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        else:
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    tilefuse.init()
    W = dist.get_world_size()
    dtype = getattr(torch, args.dtype)
    shapes = local_shapes(args.op, args.shapes, W) if args.shapes else []
    for s in args.shape:
        M, N, K = (int(x) for x in s.lower().split("x"))
        shapes.append({"name": s, "M": M, "N": N, "K": K})
    seen, unique = set(), []
    for s in shapes:  # sets can name one shape twice (iris-4096x14336 is Llama-3-8B's down projection)
        if (s["M"], s["N"], s["K"]) not in seen:
            seen.add((s["M"], s["N"], s["K"]))
            unique.append(s)
    entries = []
    for s in unique:
        e = tune_shape(args.op, s["M"], s["N"], s["K"], dtype, quick=args.quick, reps=args.reps, keep=args.keep,
                       margin=args.margin)
        entries.append(e)
        if dist.get_rank() == 0:
            print(f"{args.op} {s['name']} ({s['M']}x{s['N']}x{s['K']}): {e['variant']} {e['time_ms']:.3f} ms "
                  f"(plain {e['plain_ms']:.3f} ms, {e['plain_ms'] / e['time_ms']:.2f}x)", flush=True)
            # Written after every shape: a run cut short keeps what it tuned.
            if args.out is None:
                path = write_cache(args.op, [e], margin=args.margin)
            else:
                path = write_table(Path(args.out), args.op, entries, reps=args.reps, margin=args.margin)
    if dist.get_rank() == 0 and entries:
        print(f"wrote {path}")
    tilefuse.barrier()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
