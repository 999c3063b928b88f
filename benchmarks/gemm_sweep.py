"""The GEMM core against torch.matmul at world 1: default configs or a sweep of candidates, per shape.

For every shape of a grid and every dtype, the Triton GEMM core (``tilefuse.ops.common.gemm.matmul``)
and torch.matmul are timed in the same round, their calls interleaved one by one, each after an L2
clear, with CUDA events; the median of each is kept (``benchmarks.timing.bench_interleaved``). B is a
Linear weight (``w.t()``, column-major) as in the TP layers.

    python -m benchmarks gemm_sweep --grid parity --default-only --dtypes bf16,fp16 --csv parity.csv
    python -m benchmarks gemm_sweep --grid parity --max-m 1024 --csv sweep.csv     # candidates too
    python -m benchmarks gemm_sweep --grid parity --warp-spec --ms 512,4096          # warp-specialized tiles

Grids: ``parity`` (M in 16..8192, small M with large K, M not a multiple of the tile, N and K that
are not multiples of 128: the GEMM-core parity target), ``classic`` (the shapes the tile classes
were first chosen on) and ``smoke`` (tiny shapes, for the CPU interpreter). ``--default-only`` times
the config ``default_config(..., split_k=True)`` picks for an untuned shape; otherwise every
candidate of :func:`candidates` (tile shapes x warps/stages x ``SPLIT_K``; with
``--warp-spec`` those of :func:`warp_spec_candidates`, ``--no-split`` :func:`no_split_candidates`) is timed too,
next to the default, and where K's rows are off the descriptor path (not multiples of 16 bytes) the
default with the other choice of copying them onto it (:func:`padding`).

On a GPU the timed configs are first compiled by ``--warm-procs`` processes at once (Triton's
on-disk cache then serves the timing process), so compile time does not eat the time budget.

CSV (``--csv``, long format, ``benchmarks.results`` columns plus ``config``, written shape by shape so
that a run cut short keeps what it measured): per shape and config the
``ms`` of the Triton GEMM, ``torch_ms`` of torch.matmul in the same round and ``ratio`` =
torch_ms / ms (above 1: faster than torch.matmul), and on a GPU the compiled kernel's ``regs`` (per
thread), ``spills`` and ``smem`` (bytes); per dtype and method (``default``, and ``best``
per shape in a sweep) the ``ratio_median`` and ``ratio_worst`` over the grid (shape ``all``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from pathlib import Path

import torch

from .results import COLUMNS, parse_dtype, print_table, row, run_info, write_csv

OP = "gemm_core"
GRIDS = {
    # Decode and prefill token counts (M) on TP layer shapes (N, K): Llama-3-8B MLP up / down at
    # TP 1, a square one, and ragged N / K (not multiples of 128).
    "parity": [(M, N, K) for M in (16, 64, 128, 333, 512, 1000, 1024, 4096, 8192)
               for N, K in ((4096, 4096), (14336, 4096), (4096, 14336), (6144, 4096), (5000, 3500),
                            (1000, 8000))],
    "classic": [
        (16, 4096, 4096), (64, 14336, 4096), (128, 4096, 14336), (256, 7168, 4096), (333, 6144, 4096),
        (512, 4096, 4096), (1000, 14336, 4096), (1024, 4096, 7168), (2048, 3584, 8192), (3000, 4000, 3000),
        (4096, 14336, 4096), (4096, 4096, 14336), (4100, 5000, 3500), (8192, 8192, 8192),
        (8192, 3584, 14336), (16384, 1536, 4096),
    ],
    # Decode sizes on TP-2 layer shapes (attention/MLP projections of Llama-3-8B and 70B halves):
    # the shapes where the fused variants, which take no SPLIT_K, had too few tiles for the SMs.
    "decode": [(M, N, K) for M in (1, 16, 64)
               for N, K in ((4096, 8192), (8192, 4096), (14336, 4096), (4096, 14336), (6144, 4096))],
    # Small prefill chunks on the same layer shapes: M past the narrow decode tiles, where a fused
    # variant (no SPLIT_K) still has few tiles per SM.
    "small": [(M, N, K) for M in (128, 256)
              for N, K in ((4096, 8192), (14336, 4096), (4096, 14336))],
    "smoke": [(10, 40, 512), (70, 24, 200)],
}

# Sweep candidates: (BLOCK_M, BLOCK_N, warps, stages) by M class; each with SPLIT_K candidates.
SMALL_M_TILES = [(16, 64, 4, 6), (16, 128, 4, 6), (32, 128, 4, 6), (64, 64, 4, 6), (64, 128, 4, 4),
                 (64, 128, 4, 6), (64, 256, 8, 4)]
LARGE_M_TILES = [(64, 128, 4, 4), (128, 128, 4, 4), (64, 256, 4, 4), (128, 256, 8, 3), (128, 64, 4, 5),
                 (64, 64, 4, 6)]
# Without SPLIT_K at M <= 64 (what the fused variants can run): narrow tiles give every SM a tile,
# deeper K steps keep each SM's loads in flight. (BLOCK_N, BLOCK_K, stages), 4 warps, BLOCK_M from M.
NO_SPLIT_DECODE = [(bn, bk, st) for bn in (16, 32, 64, 128)
                   for bk, stages in ((64, (4, 6)), (128, (4, 6)), (256, (3, 4))) for st in stages]
# Without SPLIT_K past M = 256 (config.SMALL_M_MAX): 128-row tiles, (BLOCK_N, BLOCK_K, stages, warps).
MID_M_NO_SPLIT = [(128, 64, 4, 4), (128, 64, 5, 4), (128, 64, 6, 4), (128, 128, 3, 4), (64, 64, 5, 4), (64, 128, 4, 4),
                  (256, 64, 3, 8)]
# Warp-specialized tiles (Config.WARP_SPEC = 1; 4 warps per group, one producer and two consumer
# groups): (BLOCK_M, BLOCK_N, BLOCK_K, stages). 64x256 and 8-warp groups do not specialize.
WARP_SPEC_TILES = [(64, 128, 64, 4), (128, 64, 64, 5), (128, 64, 128, 4), (128, 128, 64, 4), (128, 128, 64, 5),
                   (128, 128, 128, 3), (128, 256, 64, 3), (128, 256, 64, 4), (256, 128, 64, 3)]
# The default config with its tiles loop flattened, not flattened (matmul's own rule flattens
# unspecialized 128-row tiles on the descriptor path; it never flattens a warp-specialized loop), and
# with its tiles stored through a descriptor of C, whole or in two halves of their columns (matmul's
# flatten, tma_store; the stores apply where the default has no split-K, the halves and
# the flattening not to a warp-specialized loop): --epilogue.
EPILOGUES = [("+flatten", {"flatten": True}), ("-flatten", {"flatten": False}), ("+tma_store", {"tma_store": 1}),
             ("+tma_store_halves", {"tma_store": 2})]
SPLITS = (1, 2, 3, 4, 6, 8)


def epilogues(default) -> list:
    """``(tag, config, matmul keywords)``: the entries of :data:`EPILOGUES` that change what
    ``default`` runs (none with split-K). For a warp-specialized loop, which
    :func:`matmul` neither flattens nor stores in halves, the whole-tile descriptor store, and with one
    stage fewer (its store takes a stage's shared memory), with and without the store."""
    if default.SPLIT_K > 1:
        return []
    if default.WARP_SPEC:
        fewer = default.replace(num_stages=default.num_stages - 1)
        return [("+tma_store", default, {"tma_store": 1}), (f"_s{fewer.num_stages}", fewer, {}),
                (f"_s{fewer.num_stages}+tma_store", fewer, {"tma_store": 1})]
    return [(tag, default, kw) for tag, kw in EPILOGUES]


def label(cfg, pad: bool | None = None) -> str:
    """``BMxBNxBK_wW_sS[_kSPLIT][_pad|_nopad]``, as in the CSV's ``config`` column (``_pad`` /
    ``_nopad``: operands off the descriptor path copied onto it, or not,
    against ``PAD_MIN_M``)."""
    text = f"{cfg.BLOCK_M}x{cfg.BLOCK_N}x{cfg.BLOCK_K}_w{cfg.num_warps}_s{cfg.num_stages}"
    text += f"_k{cfg.SPLIT_K}" if cfg.SPLIT_K > 1 else ""
    text += "_ws" if cfg.WARP_SPEC else ""
    return text + ("" if pad is None else "_pad" if pad else "_nopad")


@contextlib.contextmanager
def padding(pad: bool | None):
    """Within it, ``matmul`` copies misaligned operands onto the descriptor path always (True), never
    (False) or by its own rule (None: ``gemm.PAD_MIN_M``)."""
    from tilefuse.ops.common import gemm

    saved = gemm.PAD_MIN_M
    if pad is not None:
        gemm.PAD_MIN_M = 0 if pad else 1 << 62
    try:
        yield
    finally:
        gemm.PAD_MIN_M = saved


def no_split_candidates(M: int, N: int, K: int, dtype: torch.dtype, num_sms: int) -> list:
    """``SPLIT_K = 1`` configs (:data:`NO_SPLIT_DECODE`) whose stages fit in 200 KiB of shared memory;
    BLOCK_M is M rounded up to a power of two in [16, 64], and above M = 64 also 128 (up to 32
    columns: narrower 128-row tiles than that are not in the list). Past ``SMALL_M_MAX`` rows the
    128-row tiles of :data:`MID_M_NO_SPLIT` instead."""
    import triton

    from tilefuse.ops.common.config import SMALL_M_MAX, Config

    out = []
    if M > SMALL_M_MAX:  # past the small-M tiles: the 128-row tiles of the wider classes, stages swept
        for bn, bk, stages, warps in MID_M_NO_SPLIT:
            out.append(Config(BLOCK_M=128, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=warps, num_stages=stages,
                              GEMM_SMS=num_sms, COMM_SMS=0))
        return out
    bms = [max(16, min(64, triton.next_power_of_2(M)))] + ([128] if M > 64 else [])
    for bm in bms:
        for bn, bk, stages in NO_SPLIT_DECODE:
            if stages * (bm + bn) * bk * dtype.itemsize > 200 * 1024 or bk > max(64, triton.next_power_of_2(K)):
                continue
            if bm > 64 and bn < 32:
                continue
            out.append(Config(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=4, num_stages=stages,
                              GEMM_SMS=num_sms, COMM_SMS=0))
    return out


def kernel_info(fn, kern=None) -> dict:
    """Registers per thread, spilled registers, shared memory bytes and compiled warps (more than the
    launch's where a loop was warp-specialized) of the kernel ``kern``
    (default: the GEMM core's) that ``fn()`` launches (its last launch; empty where they cannot be
    read, e.g. in the interpreter)."""
    from tilefuse.ops.common import gemm

    kern, seen = kern or gemm.matmul_kernel, []
    run = getattr(kern, "_launch", None)  # a FastKernel's launch (absent in the interpreter: nothing to read)
    if run is None:
        fn()
        return {}

    def spy(grid, *args, **kwargs):
        out = run(grid, *args, **kwargs)
        seen.append(out)
        return out

    kern._launch = spy
    try:
        fn()
    finally:
        del kern._launch
    compiled = seen[-1] if seen else None
    info = {}
    for metric, get in (("regs", lambda k: k.n_regs), ("spills", lambda k: k.n_spills),
                        ("smem", lambda k: k.metadata.shared), ("warps", lambda k: k.metadata.num_warps)):
        try:
            info[metric] = float(get(compiled))
        except Exception:  # noqa: BLE001 - the interpreter's kernels have none of these
            pass
    return info


def warp_spec_candidates(M: int, N: int, K: int, dtype: torch.dtype, num_sms: int) -> list:
    """``WARP_SPEC = 1`` configs (:data:`WARP_SPEC_TILES` whose BLOCK_M is at most M rounded up to a
    power of two, and whose stages fit in 220 KiB of shared memory), and those up to 128 x 128 also
    without it (wider tiles without it want 8 warps: the defaults')."""
    import triton

    from tilefuse.ops.common.config import Config

    out = []
    for bm, bn, bk, stages in WARP_SPEC_TILES:
        if bm > max(64, triton.next_power_of_2(M)) or stages * (bm + bn) * bk * dtype.itemsize > 220 * 1024:
            continue
        cfg = Config(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=4, num_stages=stages,
                     GEMM_SMS=num_sms, COMM_SMS=0, WARP_SPEC=1)
        out.append(cfg)
        if bm * bn <= 128 * 128:  # a tile 4 warps also run well without it
            out.append(cfg.replace(WARP_SPEC=0))
    return out


def candidates(M: int, N: int, K: int, dtype: torch.dtype, num_sms: int, interpreter: bool) -> list:
    """Configs tried for one shape besides the default: tiles of M's class (M <= 64: the small-M tiles
    whose BLOCK_M is at most M rounded up), each with the SPLIT_K values that keep ``tiles x SPLIT_K``
    within two waves and at least ``MIN_SLICE_STEPS`` K steps per slice."""
    import triton

    from tilefuse.ops.common.config import MIN_SLICE_STEPS, Config

    if interpreter:
        tiles_list, block_k = [(16, 32, 4, 1), (32, 32, 4, 1)], 16
    else:
        tiles_list = SMALL_M_TILES if M <= 64 else LARGE_M_TILES
        tiles_list = [t for t in tiles_list if t[0] <= max(16, triton.next_power_of_2(M))]
        block_k = 32 if dtype.itemsize >= 4 else 64
    programs = min(num_sms, 4) if interpreter else num_sms
    steps = triton.cdiv(K, block_k)
    out = []
    for bm, bn, warps, stages in tiles_list:
        if dtype.itemsize >= 4 and not interpreter:
            stages = min(stages, 3)
        tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        for split in SPLITS:
            if split > 1 and (tiles * split > 2 * programs or steps < split * MIN_SLICE_STEPS):
                continue
            out.append(Config(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=block_k, GROUP_M=8, num_warps=warps,
                              num_stages=stages, GEMM_SMS=programs, COMM_SMS=0, SPLIT_K=split))
    return out


def _warm_chunk(items: list, deadline: float = float("inf")) -> int:
    """Run ``matmul`` once for every ``(M, N, K, dtype name, config dict, pad, matmul keywords)`` (in a
    spawned process), so that its kernels land in Triton's on-disk cache, until ``time.time()`` passes
    ``deadline``; returns the count run. A config that fails (it does not compile, say) is skipped:
    the timing process records its error."""
    from tilefuse.ops.common.config import Config
    from tilefuse.ops.common.gemm import matmul

    device = "cuda" if torch.cuda.is_available() else "cpu"
    done = 0
    for M, N, K, dtype_name, cfg, pad, kw in items:
        if time.time() > deadline:
            break
        dtype = getattr(torch, dtype_name)
        a = torch.empty(M, K, device=device, dtype=dtype).normal_()
        w = torch.empty(N, K, device=device, dtype=dtype).normal_()
        try:
            with padding(pad):
                matmul(a, w.t(), torch.empty(M, N, device=device, dtype=dtype), Config.from_dict(cfg), **kw)
        except Exception:  # noqa: BLE001 - recorded when the shape is timed
            continue
        done += 1
    if device == "cuda":
        torch.cuda.synchronize()
    return done


def warm_compile(items: list, procs: int, seconds: float) -> tuple[int, float]:
    """Compile the kernels of ``items`` (see :func:`_warm_chunk`) in ``procs`` processes at once
    (Triton compiles on the CPU, one kernel at a time per process), for at most about ``seconds``;
    returns ``(items run, seconds taken)``. The timing process then loads them from the cache
    instead of compiling between timed shapes (what was not reached compiles there)."""
    import functools
    import multiprocessing

    t0 = time.monotonic()
    count = 0
    if procs > 0 and items:
        procs = min(procs, len(items))
        chunks = [items[i::procs] for i in range(procs)]
        with multiprocessing.get_context("spawn").Pool(procs) as pool:
            count = sum(pool.map(functools.partial(_warm_chunk, deadline=time.time() + seconds), chunks))
    return count, time.monotonic() - t0


def _ctx(device: torch.device):
    from .launch import RankCtx

    return RankCtx(rank=0, world=1, device=device, heap=None, pg_backend="none", host_group=None)


def start_one_process(device: torch.device) -> tuple:
    """``(ctx, sms, info)`` of a one-process GEMM benchmark on ``device``: its rank context, the
    multiprocessors (4 in the interpreter) and the run facts; a GPU is settled first (:func:`settle`)."""
    on_gpu = device.type == "cuda"
    sms = torch.cuda.get_device_properties(device).multi_processor_count if on_gpu else 4
    info = run_info(device)
    if on_gpu:
        settle(device)
    return _ctx(device), sms, info


def settle(device: torch.device, seconds: float = 2.0) -> None:
    """Keep the GPU busy with torch.matmul for ``seconds`` before the first timed shape: the first
    dozen shapes of a run, timed right after the compiling processes, once measured the GEMM core up
    to 4x slower than the same shapes in another dtype later in that run, and than earlier runs."""
    x = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(10):
            x @ x
        torch.cuda.synchronize(device)


def summarize(ratios: dict) -> list:
    """``[(method, median, worst, shapes)]`` of ``{method: [ratio per shape]}`` (NaN ratios skipped)."""
    out = []
    for method, values in ratios.items():
        good = [v for v in values if v == v]
        if good:
            out.append((method, statistics.median(good), min(good), len(good)))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", choices=sorted(GRIDS), default="parity")
    parser.add_argument("--csv", "--out", dest="csv", default="gemm_sweep.csv", help="long-format CSV")
    parser.add_argument("--dtypes", "--dtype", dest="dtypes", default="bfloat16",
                        help="comma-separated: bf16, fp16, fp32")
    parser.add_argument("--default-only", action="store_true",
                        help="time only the config default_config(..., split_k=True) picks")
    parser.add_argument("--max-m", type=int, default=None, help="leave out shapes with a larger M")
    parser.add_argument("--ms", default=None, help="comma-separated: only the grid's shapes with these M")
    parser.add_argument("--ns", default=None, help="comma-separated: only the grid's shapes with these N")
    parser.add_argument("--no-split", action="store_true",
                        help="configs without SPLIT_K, as the fused variants run them: the default is "
                             "default_config(..., split_k=False), the candidates (M <= 64) narrow tiles and "
                             "deeper K steps")
    parser.add_argument("--warp-spec", action="store_true",
                        help="the candidates are warp-specialized tiles (Config.WARP_SPEC) and the same tiles "
                             "without it (GPU)")
    parser.add_argument("--epilogue", action="store_true",
                        help="the candidates are the default config with the tiles loop flattened, not "
                             "flattened, and with tiles stored through a descriptor of C, whole or in two "
                             "halves (matmul's flatten, tma_store; where they change the default; GPU)")
    parser.add_argument("--torch-kernels", action="store_true",
                        help="record the kernels torch.matmul launches per shape (metric 'kernels', names in note)")
    parser.add_argument("--quick", action="store_true", help="the first 4 shapes, the first 3 candidates")
    parser.add_argument("--rep-ms", type=float, default=60.0, help="each method's share of timed calls")
    parser.add_argument("--max-reps", type=int, default=400)
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="stop starting new shapes this long after the start (compiling ahead: half of it)")
    parser.add_argument("--warm-procs", type=int, default=None,
                        help="processes that compile every timed config first (GPU; default: half the CPUs, "
                             "at most 16; 0: compile while timing)")
    args = parser.parse_args(argv)
    t_start = time.monotonic()  # the budget counts compiling too

    from tilefuse.ops.common.config import default_config
    from tilefuse.ops.common.gemm import matmul

    from .timing import bench_interleaved

    dtypes = [parse_dtype(d) for d in args.dtypes.split(",") if d.strip()]
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    interpreter = not on_gpu
    if interpreter and args.grid != "smoke":
        raise SystemExit("gemm_sweep: no GPU: only --grid smoke runs in the interpreter")
    sms = torch.cuda.get_device_properties(device).multi_processor_count if on_gpu else 8
    ctx = _ctx(device)
    shapes = [s for s in GRIDS[args.grid] if args.max_m is None or s[0] <= args.max_m]
    if args.ms:
        keep = {int(m) for m in args.ms.split(",") if m.strip()}
        shapes = [s for s in shapes if s[0] in keep]
    if args.ns:
        keep = {int(n) for n in args.ns.split(",") if n.strip()}
        shapes = [s for s in shapes if s[1] in keep]
    if args.quick:
        shapes = shapes[:4]
    from tilefuse.ops.common import gemm

    plans = {}  # (dtype, shape) -> [(name, config, pad)]
    for dtype in dtypes:
        for M, N, K in shapes:
            default = default_config(M, N, K, dtype, num_sms=sms, interpreter=interpreter, comm=False,
                                     split_k=not args.no_split)
            configs = [("default", default, None, {})]
            if args.epilogue and not interpreter:
                configs += [(f"default{tag}", cfg, None, kw) for tag, cfg, kw in epilogues(default)]
            elif not args.default_only:
                if args.warp_spec and not interpreter:
                    pool = warp_spec_candidates(M, N, K, dtype, sms)
                elif args.no_split and not interpreter:
                    pool = no_split_candidates(M, N, K, dtype, sms)
                else:
                    pool = candidates(M, N, K, dtype, sms, interpreter)
                extra = [cfg for cfg in pool if cfg != default]
                configs += [(label(cfg), cfg, None, {}) for cfg in extra[: 3 if args.quick else None]]
                if on_gpu and (K * dtype.itemsize) % 16:  # rows off the descriptor path: the other choice
                    flipped = M < gemm.PAD_MIN_M
                    configs.append((label(default, flipped), default, flipped, {}))
            plans[(dtype, (M, N, K))] = configs
    procs = args.warm_procs
    if procs is None:
        procs = min(16, max(1, (os.cpu_count() or 2) // 2))
    if on_gpu and procs > 0:
        items = [(M, N, K, str(dtype).removeprefix("torch."), cfg.to_dict(), pad, kw)
                 for (dtype, (M, N, K)), configs in plans.items() for _, cfg, pad, kw in configs]
        print(f"gemm_sweep: compiling {len(items)} configs in {procs} processes", flush=True)
        count, took = warm_compile(items, procs, seconds=args.budget_s / 2)
        print(f"gemm_sweep: ran {count} of them in {took:.1f} s", flush=True)
    if on_gpu:
        settle(device)
    info = run_info(device)
    columns = COLUMNS + ["config"]
    Path(args.csv).unlink(missing_ok=True)  # rows are appended shape by shape: a cut-off run keeps its rows
    rows, table = [], []
    ratios: dict = {}
    stopped = False
    for dtype in dtypes:
        for M, N, K in shapes:
            if time.monotonic() - t_start > args.budget_s:
                stopped = True
                break
            gen = torch.Generator(device=device).manual_seed(M * 7 + N * 3 + K)
            a = torch.randn(M, K, device=device, dtype=torch.float32, generator=gen).to(dtype)
            w = torch.randn(N, K, device=device, dtype=torch.float32, generator=gen).to(dtype)
            b = w.t()
            c = torch.empty(M, N, device=device, dtype=dtype)
            ref = (a.float() @ b.float()) if interpreter else torch.matmul(a, b).float()
            configs = plans[(dtype, (M, N, K))]
            default = configs[0][1]
            best, default_ratio = None, float("nan")
            for name, cfg, pad, kw in configs:
                try:
                    with padding(pad):
                        # compile, and check the result once
                        built = kernel_info(lambda cfg=cfg, kw=kw, a=a, b=b, c=c: matmul(a, b, c, cfg, **kw))
                        err = ((c.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
                        if not err <= (2e-2 if dtype == torch.bfloat16 else 1e-2):
                            raise AssertionError(f"relative error {err:.2e}")
                        t, t_ref = bench_interleaved(
                            ctx, [lambda cfg=cfg, a=a, b=b, c=c, kw=kw: matmul(a, b, c, cfg, **kw),
                                  lambda a=a, b=b: torch.matmul(a, b)],
                            rep_ms=args.rep_ms, max_reps=args.max_reps)
                except Exception as err:  # out of shared memory for this tile, a wrong result, ...
                    rows.append(dict(row(OP, name, M, N, K, dtype, 1, "error", float("nan"),
                                         note=f"{type(err).__name__}: {err}"[:300]), config=label(cfg, pad)))
                    if name == "default":
                        ratios.setdefault((dtype, "default"), []).append(float("nan"))
                    continue
                ratio = t_ref / t
                for metric, value in (("ms", t), ("torch_ms", t_ref), ("ratio", ratio), *built.items()):
                    rows.append(dict(row(OP, name, M, N, K, dtype, 1, metric, value), config=label(cfg, pad)))
                if name == "default":
                    default_ratio = ratio
                    ratios.setdefault((dtype, "default"), []).append(ratio)
                    table.append(dict(dtype=str(dtype).removeprefix("torch."), shape=f"{M}x{N}x{K}",
                                      config=label(cfg), torch_ms=t_ref, ms=t, ratio=ratio))
                if best is None or ratio > best[1]:
                    best = (name if kw else label(cfg, pad), ratio)
            if args.torch_kernels and on_gpu:
                from .auto_ab import _kernels

                names = ";".join(name for name, _, _ in _kernels(lambda a=a, b=b: torch.matmul(a, b), calls=2))
                rows.append(dict(row(OP, "torch", M, N, K, dtype, 1, "kernels", float("nan"), note=names[:300]),
                                 config=""))
            if not args.default_only and best is not None:
                ratios.setdefault((dtype, "best"), []).append(best[1])
                rows.append(dict(row(OP, "best", M, N, K, dtype, 1, "ratio", best[1]), config=best[0]))
            write_csv(rows, args.csv, info, append=True, columns=columns)
            rows = []
            print(f"{str(dtype).removeprefix('torch.')} {M}x{N}x{K}: default {label(default)} {default_ratio:.3f}x"
                  + (f", best {best[0]} {best[1]:.3f}x" if best and not args.default_only else ""), flush=True)
            del a, w, b, c, ref
        if stopped:
            print(f"gemm_sweep: budget of {args.budget_s:.0f} s spent; the remaining shapes were not timed",
                  flush=True)
            break
    summary = []
    for (dtype, method), med, worst, n in summarize(ratios):
        name = str(dtype).removeprefix("torch.")
        summary.append(dict(dtype=name, method=method, shapes=n, ratio_median=med, ratio_worst=worst))
        for metric, value in (("ratio_median", med), ("ratio_worst", worst), ("shapes", n)):
            rows.append(dict(row(OP, method, "all", "all", "all", dtype, 1, metric, value), config=""))
    write_csv(rows, args.csv, info, append=True, columns=columns)
    print_table(table, ["dtype", "shape", "config", "torch_ms", "ms", "ratio"], "GEMM core, default configs")
    print_table(summary, ["dtype", "method", "shapes", "ratio_median", "ratio_worst"],
                "ratio = torch.matmul time / GEMM-core time (above 1: faster)")
    print(f"wrote {args.csv}", flush=True)


if __name__ == "__main__":
    main()
