"""The decode hot path of a tensor-parallel decoder layer: row-parallel GEMM + all-reduce + residual add
+ RMSNorm, at decode sizes, eagerly and inside CUDA graphs.

    python -m benchmarks decode --world 2 --out OUT                           # two GPUs: spawned ranks
    torchrun --nproc-per-node 2 -m benchmarks.decode --out OUT                # the same under torchrun
    python -m benchmarks decode --world 2 --variants fused_sequential --out OUT   # one GPU, ranks sharing it
    python -m benchmarks decode --smoke --world 2 --out OUT                   # CPU ranks: tiny, no graphs

Every rank holds ``a [M, K/W]`` (this rank's shard of the layer input), ``b [K/W, N]`` (its rows of the
projection's weight, the transpose of a Linear weight), the replicated ``residual [M, N]`` and norm
weight ``[N]``, and gets ``(y, s)``: ``s = all_reduce(a @ b) + residual``, ``y = rms_norm(s) * w``.
Shapes (``--shapes``): Llama-3-8B and -70B o_proj (``N = K = hidden``) and down_proj (``N = hidden,
K = intermediate``). Methods:

========================  ==========================================================================
method                    what runs
========================  ==========================================================================
tilefuse.<variant>        ``tilefuse.gemm_all_reduce(a, b, variant=..., residual=, norm_weight=)``:
                          the fused call with the epilogue (``--variants``; default auto,
                          fused_sequential and wg_specialized)
cublas_nccl               torch.matmul, ``torch.distributed.all_reduce`` (NCCL; gloo through the host
                          where ranks share a GPU, which no graph captures), add, RMSNorm in torch
cublas_symm_one_shot      torch.matmul into a torch symmetric-memory buffer, ``symm_mem.one_shot_all_reduce``,
                          add, RMSNorm in torch; skipped with a note where symmetric memory is
                          unavailable (ranks sharing a GPU, no CUDA, a torch build without it)
========================  ==========================================================================

Per (shape, M, method): one checked call (relative error of ``y`` and ``s`` against the fp32
composition, and whether both have the same bits on every rank), then ``--rounds`` rounds with the
methods interleaved; ``us_per_call`` is the median over rounds of the maximum over ranks of
``--calls`` back-to-back calls (eager) or graph replays (graph) between CUDA events (host time on CPU
ranks). Each method cycles through ``--weights`` weights (a model reads each layer's weight once).
CSV ``<out>/decode.csv``, long format: ``shape, method, M, N, K, dtype, world, mode, metric, value,
note, device, commit``; ``K`` is the full inner size.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

import tilefuse
from tilefuse.tuning.autotune import cuda_ms_per_call

from .checks import error_text
from .launch import is_main_process, launch
from .results import commit_id, write_rows
from .timing import capture_graph, sync

CSV_COLUMNS = ["shape", "method", "M", "N", "K", "dtype", "world", "mode", "metric", "value", "note", "device",
               "commit"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# (N, K) of the row-parallel projections: o_proj [hidden <- heads * head_dim], down_proj [hidden <- inter].
SHAPES = {"llama3-8b.o_proj": (4096, 4096), "llama3-8b.down_proj": (4096, 14336),
          "llama3-70b.o_proj": (8192, 8192), "llama3-70b.down_proj": (8192, 28672)}
SMOKE_SHAPES = {"tiny.o_proj": (64, 96), "tiny.down_proj": (40, 48)}
DEFAULT_VARIANTS = ("auto", "fused_sequential", "wg_specialized")
BASELINES = ("cublas_nccl", "cublas_symm_one_shot")
EPS = 1e-5


def symm_unavailable(ctx) -> str | None:
    """Why torch's symmetric memory cannot run here (None: try it)."""
    if ctx.device.type != "cuda":
        return "skipped: torch's symmetric memory needs CUDA devices"
    if ctx.pg_backend != "nccl":
        return "skipped: ranks share a GPU (gloo); torch's symmetric memory needs one GPU per rank"
    try:
        import torch.distributed._symmetric_memory  # noqa: F401
    except ImportError:
        return "skipped: this torch build has no symmetric memory"
    return None


def add_rms_norm(c, r, w):
    """The torch epilogue: ``s = c + r``, ``y = rms_norm(s) * w`` in fp32, one rounding; ``(y, s)``."""
    s = c + r
    x = s.float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(s.dtype), s


class SymmOneShot:
    """torch.matmul into a symmetric-memory buffer, then torch's one-shot all-reduce of it."""

    def __init__(self, ctx, M: int, N: int, dtype: torch.dtype):
        import torch.distributed._symmetric_memory as symm_mem

        group = dist.group.WORLD
        self.group_name = group.group_name
        if hasattr(symm_mem, "enable_symm_mem_for_group"):  # required before rendezvous on older torch
            symm_mem.enable_symm_mem_for_group(self.group_name)
        self.buf = symm_mem.empty((M, N), dtype=dtype, device=ctx.device)
        symm_mem.rendezvous(self.buf, group)

    def __call__(self, a, b):
        torch.matmul(a, b, out=self.buf)
        return torch.ops.symm_mem.one_shot_all_reduce(self.buf, "sum", self.group_name)


def _method(ctx, name: str, M: int, N: int, dtype):
    """``(a, b, residual, w) -> (y, s)`` of method ``name`` (raises if it cannot run here)."""
    if name.startswith("tilefuse."):
        variant = name.removeprefix("tilefuse.")
        return lambda a, b, r, w: tilefuse.gemm_all_reduce(a, b, variant=variant, residual=r, norm_weight=w, eps=EPS)
    if name == "cublas_nccl":
        return lambda a, b, r, w: add_rms_norm(tilefuse.gemm_all_reduce(a, b, variant="plain"), r, w)
    if name == "cublas_symm_one_shot":
        why = symm_unavailable(ctx)
        if why is not None:
            raise RuntimeError(why)
        one_shot = SymmOneShot(ctx, M, N, dtype)
        return lambda a, b, r, w: add_rms_norm(one_shot(a, b), r, w)
    raise ValueError(f"unknown method {name!r}")


def _reference(ctx, a, b, r, w):
    """``(y, s)`` in fp32 from every rank's ``a`` and ``b``."""
    c = a.float() @ b.float()
    if ctx.world > 1:  # through the host group: works whatever the ranks' devices
        host = c.cpu()
        dist.all_reduce(host, group=ctx.host_group)
        c = host.to(c.device)
    s = c + r.float()
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS) * w.float(), s


def _digest(c: torch.Tensor) -> tuple:
    """Two position-weighted sums of c's raw bits (int64, wrapping): equal results give equal digests."""
    bits = c.detach().contiguous().view({2: torch.int16, 4: torch.int32}[c.element_size()]).to(torch.int64)
    rows = torch.arange(1, c.shape[0] + 1, device=c.device, dtype=torch.int64)
    cols = torch.arange(1, c.shape[1] + 1, device=c.device, dtype=torch.int64)
    return (int((bits.sum(dim=1) * rows).sum()), int((bits.sum(dim=0) * cols).sum()))


def _checks(ctx, got, ref) -> dict:
    """``rel_error_{y,s}`` (max over ranks of ``max|x - ref| / max|ref|``) and ``same_bits_{y,s}``
    (1 if every rank's result has rank 0's bits)."""
    out = {}
    for what, x, x_ref in zip(("y", "s"), got, ref):
        err = ((x.float() - x_ref).abs().max() / x_ref.abs().max().clamp_min(1e-30)).item() if x.numel() else 0.0
        out[f"rel_error_{what}"] = ctx.max(err)
        out[f"same_bits_{what}"] = float(len(set(ctx.all_gather_object(_digest(x)))) == 1)
    return out


def _try(ctx, fn):
    """``(value, None)``, or ``(None, note)`` on every rank if ``fn`` raised on any rank (ranks agree on
    every failure, so no rank is left inside a collective)."""
    value, err = None, None
    try:
        value = fn()
        sync(ctx.device)
    except Exception as e:  # recorded, and the run goes on
        err = e
    if ctx.all_true(err is None):
        return value, None
    return None, error_text(err) if err is not None else "failed on another rank"


def _time_us(ctx, call, calls: int, graph=None) -> float:
    """µs per call of ``calls`` back-to-back calls (or replays of ``graph``) after a device sync and a
    host barrier: CUDA events on a GPU, the host clock on CPU ranks."""
    if graph is not None:
        graph.replay()
        call = graph.replay
    ctx.barrier()
    if ctx.device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        return (time.perf_counter() - t0) / calls * 1e6
    return cuda_ms_per_call(call, calls) * 1e3


def _one(ctx, opts, shape: str, N: int, K: int, M: int, methods: list, graphs: bool) -> list:
    """The rows of one (shape, M): each method checked, then timed in interleaved rounds."""
    dtype = DTYPES[opts.dtype]
    k_loc = K // ctx.world
    rows = []

    def record(name, mode, metric, value, note=""):
        rows.append(dict(shape=shape, method=name, M=M, N=N, K=K, dtype=opts.dtype, world=ctx.world, mode=mode,
                         metric=metric, value=value, note=note))

    g = torch.Generator().manual_seed(1 + ctx.rank)
    shared = torch.Generator().manual_seed(1000 + M)
    a = (torch.randn(M, k_loc, generator=g) / k_loc**0.5).to(ctx.device, dtype)
    bs = [torch.randn(N, k_loc, generator=g).to(ctx.device, dtype).t() for _ in range(opts.weights)]
    r = torch.randn(M, N, generator=shared).to(ctx.device, dtype)
    w = (1.0 + 0.1 * torch.randn(N, generator=shared)).to(ctx.device, dtype)
    ref = _reference(ctx, a, bs[0], r, w)
    ready = {}
    for name in methods:
        fn, note = _try(ctx, lambda name=name: _method(ctx, name, M, N, dtype))
        if note is not None:
            record(name, "eager", "skipped" if "skipped: " in note else "error", float("nan"), note)
            continue
        got, note = _try(ctx, lambda fn=fn: fn(a, bs[0], r, w))
        if note is not None:
            record(name, "eager", "error", float("nan"), note)
            continue
        for metric, value in _checks(ctx, got, ref).items():
            record(name, "check", metric, value)
        del got
        timed = (lambda fn=fn: [fn(a, b, r, w) for b in bs])
        graph = None
        if graphs and name == "cublas_nccl" and ctx.pg_backend != "nccl":
            record(name, "graph", "skipped", float("nan"), "skipped: gloo's all-reduce goes through the host, "
                   "which a CUDA graph cannot capture (ranks sharing a GPU)")
        elif graphs:
            graph, note = _try(ctx, lambda timed=timed: capture_graph(ctx.device, timed, opts.warmup))
            if note is not None:
                record(name, "graph", "error", float("nan"), note)
        ready[name] = (timed, graph)
    times: dict = {}
    for rnd in range(opts.rounds):
        for name in (list(ready) if rnd % 2 == 0 else list(reversed(ready))):
            call, graph = ready[name]
            for _ in range(opts.warmup):
                call()
            times.setdefault((name, "eager"), []).append(ctx.max(_time_us(ctx, call, opts.calls) / opts.weights))
            if graph is not None:
                us = _time_us(ctx, call, opts.calls, graph) / opts.weights
                times.setdefault((name, "graph"), []).append(ctx.max(us))
    note = f"{opts.weights} weights in turn" if opts.weights > 1 else ""
    for (name, mode), values in times.items():
        record(name, mode, "us_per_call", statistics.median(values), note)
    return rows


def run_rank(ctx, opts) -> list:
    """The rank function: every shape, M and method; the rows (values already over ranks)."""
    graphs = opts.graphs and ctx.device.type == "cuda"
    methods = [f"tilefuse.{v}" for v in opts.variants] + list(BASELINES)
    rows = []
    for shape, (N, K) in opts.shapes.items():
        if K % ctx.world:
            raise ValueError(f"{shape}: K = {K} must be divisible by the world size {ctx.world}")
        for M in opts.M:
            rows += _one(ctx, opts, shape, N, K, M, methods, graphs)
            sync(ctx.device)
            tilefuse.barrier()
            tilefuse.clear_workspaces()  # collective: this M's heap buffers go back (graphs are gone)
    return rows


def _print(rows: list) -> None:
    t = {(r["shape"], r["M"], r["method"], r["mode"]): r["value"] for r in rows if r["metric"] == "us_per_call"}
    for (shape, M, name, mode), us in sorted(t.items()):
        base = t.get((shape, M, "cublas_nccl", mode))
        ratio = f"  nccl/this {base / us:5.2f}x" if base else ""
        print(f"{shape:22s} M={M:<4d} {name:30s} {mode:5s} {us:9.1f} us{ratio}")
    for r in rows:
        if r["metric"] in ("error", "skipped"):
            print(f"{r['shape']:22s} M={r['M']:<4d} {r['method']:30s} {r['mode']}: {r['note'][:140]}")
        elif r["metric"].startswith("same_bits") and r["value"] != 1.0 and r["method"].startswith("tilefuse."):
            print(f"{r['shape']:22s} M={r['M']:<4d} {r['method']:30s} {r['metric']}: results differ between ranks")


def parse_options(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2, help="ranks to spawn (ignored under torchrun)")
    p.add_argument("--M", default="1,4,16,64,256", help="decode batch sizes, comma-separated")
    p.add_argument("--shapes", default=",".join(SHAPES), help="of " + ", ".join(SHAPES))
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                   help="tilefuse variants of the fused call (auto, plain or tilefuse.VARIANTS)")
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default bf16 on GPUs, fp16 on CPUs")
    p.add_argument("--calls", type=int, default=40, help="back-to-back calls (or replays) per timing")
    p.add_argument("--weights", type=int, default=4, help="weights a timed call cycles through, each once")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--no-graphs", dest="graphs", action="store_false", help="eager only")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, M 1,4, one call and round, no graphs (CPU "
                   "plumbing check; the timings mean nothing)")
    p.add_argument("--heap", type=int, default=None, help="heap bytes per rank (default: from the shapes)")
    p.add_argument("--out", default="decode_out", help="folder for decode.csv")
    opts = p.parse_args(argv)
    if opts.smoke:
        opts.shapes, opts.calls, opts.rounds, opts.warmup, opts.weights, opts.graphs = SMOKE_SHAPES, 1, 1, 0, 1, False
        if opts.M == p.get_default("M"):
            opts.M = "1,4"
    else:
        unknown = [s for s in opts.shapes.split(",") if s.strip() not in SHAPES]
        if unknown:
            p.error(f"unknown shapes {unknown}; shapes are {list(SHAPES)}")
        opts.shapes = {s.strip(): SHAPES[s.strip()] for s in opts.shapes.split(",")}
    opts.M = [int(m) for m in str(opts.M).split(",") if m.strip()]
    opts.variants = [v.strip() for v in opts.variants.split(",") if v.strip()]
    if opts.weights < 1:
        p.error(f"--weights must be at least 1, got {opts.weights}")
    opts.dtype = opts.dtype or ("bf16" if torch.cuda.is_available() and not opts.smoke else "fp16")
    return opts


def heap_bytes(opts) -> int:
    """Heap per rank: every (shape, M)'s stage (graphs keep theirs until shutdown), with room to spare."""
    item = DTYPES[opts.dtype].itemsize
    world = int(os.environ.get("WORLD_SIZE", opts.world))
    stage = sum(world * M * N * item for N, _ in opts.shapes.values() for M in opts.M)
    return max(64 << 20, int(stage * 1.5) + (64 << 20))


def main(argv=None) -> int:
    opts = parse_options(argv)
    per_rank = launch(run_rank, opts.world, opts, heap_size=opts.heap or heap_bytes(opts))
    if not is_main_process():
        return 0
    rows = per_rank[0]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    print(f"decode: world {rows[0]['world'] if rows else opts.world}, {opts.dtype}, {device}")
    _print(rows)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    write_rows(str(out / "decode.csv"), rows, CSV_COLUMNS, device=device, commit=commit_id())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
