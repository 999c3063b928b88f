"""gemm_all_reduce at decode and prefill sizes: every variant, auto, plain and torch's one-shot all-reduce,
eagerly and inside CUDA graphs.

    python -m benchmarks.allreduce_decode [--world 1,2] [--M 1,16,64,256,1024,8192] [--N 8192] [--K 8192]
                                          [--dtype bf16] [--calls 40] [--rounds 3] [--weights 1]
                                          [--csv allreduce_decode.csv]
    python -m benchmarks.allreduce_decode --smoke --world 2     # CPU ranks: tiny shapes, no graphs

Every rank holds ``a [M, K/W]`` and ``b [K/W, N]`` (its K shard of the row-parallel linear) and
gets ``all_reduce(a @ b)`` ``[M, N]``. Methods:

==================  ==========================================================================
method              what runs
==================  ==========================================================================
bulk_sync ...       the four tilefuse variants' entry points (partials pushed to all)
auto                ``tilefuse.gemm_all_reduce(a, b)`` (``variant="auto"``; needs the op in the
                    registry)
plain               torch.matmul + ``torch.distributed.all_reduce`` (NCCL when every rank has a
                    GPU of its own; gloo through the host otherwise, which no graph can capture)
symm_one_shot       torch.matmul into a torch symmetric-memory buffer
                    (``torch.distributed._symmetric_memory.empty`` + ``rendezvous``), then
                    ``torch.ops.symm_mem.one_shot_all_reduce``; skipped (an ``error`` row) where
                    torch's symmetric memory is unavailable
gemm                torch.matmul alone, no all-reduce: what a call would cost if communication
                    were free (not the op's result, so not checked)
fused_sequential    fused_sequential on the tiles it takes without split-K (whole K a tile),
.whole_k            passed as its config: where the default splits K (decode sizes on a GPU), the
                    form of before; by name
==================  ==========================================================================

Per (M, method): one checked call (relative error against the fp32 reference, and whether the
result has the same bits on every rank), then ``--rounds`` rounds; a round times every method in
turn (methods interleaved, so clock swings hit all of them alike):

==========  =============  ====================================================================
mode        metric         how
==========  =============  ====================================================================
eager       us_per_call    ``--calls`` back-to-back calls between CUDA events (host time on CPU
                           ranks), after a device sync and a host barrier, divided by the calls
graph       us_per_call    one call captured in a ``torch.cuda.CUDAGraph`` after warm-up; CUDA
                           events around ``--calls`` back-to-back replays, divided by the replays
check       rel_error      ``max|c - ref| / max|ref|`` against fp32 matmul + fp32 all-reduce
check       same_bits      1 if every rank's result has the same bits as rank 0's, else 0
==========  =============  ====================================================================

With ``--linear-weights`` every ``b`` is the transpose of a ``torch.nn.Linear`` weight ``[N, K/W]``
(column-major, as tilefuse's row-parallel layers pass it); by default a row-major ``[K/W, N]``.

With ``--weights n`` a timed call runs the method on n different ``b`` in turn (a graph captures the
n calls) and the time is divided by n: as in a model's decode step, where each layer's weight is read
once, no call finds its weight left in L2 by the call before (with one weight, a B of 64 MiB is
partly in the H200's 50 MiB L2 at every back-to-back call or replay).

A timing value is the median over rounds of the maximum over ranks. A method that raises gets an
``error`` row whose note is the error, and the run goes on (ranks agree on every failure first, so
no rank is left inside a collective). CSV, long format: ``op, variant, M, N, K, dtype, world, mode,
metric, value, device, commit, note``; ``K`` is the full inner size (each rank holds K/W of it).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import tilefuse
from tilefuse.ops import plain as plain_ops
from tilefuse.ops import registry
from tilefuse.ops.gemm_all_reduce import ENTRY_POINTS, OP, gemm_all_reduce
from tilefuse.tuning.autotune import cuda_ms_per_call

from .common import commit_id, error_text, is_main_process, launch
from .results import write_rows
from .timing import capture_graph, sync

CSV_COLUMNS = ["op", "variant", "M", "N", "K", "dtype", "world", "mode", "metric", "value", "device", "commit",
               "note"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
VARIANTS = ("bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized")
WHOLE_K = "fused_sequential.whole_k"
METHODS = VARIANTS + ("auto", "plain", "symm_one_shot", "gemm") + (WHOLE_K,)
DEFAULT_METHODS = VARIANTS + ("auto", "plain", "symm_one_shot", "gemm")


def _agree(ctx, ok: bool) -> bool:
    """True on every rank iff ``ok`` on every rank (host group: works whatever the device state)."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=ctx.host_group)
    return bool(flag.item())


def _gather(ctx, value: torch.Tensor) -> list:
    parts = [torch.empty_like(value) for _ in range(ctx.world)]
    dist.all_gather(parts, value, group=ctx.host_group)
    return parts


def _max_over_ranks(ctx, value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.host_group)
    return float(t.item())


class SymmOneShot:
    """torch.matmul into a symmetric-memory buffer, then torch's one-shot all-reduce of it."""

    def __init__(self, ctx, M: int, N: int, dtype: torch.dtype):
        if ctx.device.type != "cuda":
            raise RuntimeError("torch symmetric memory needs CUDA devices")
        import torch.distributed._symmetric_memory as symm_mem

        group = dist.group.WORLD
        self.group_name = group.group_name
        if hasattr(symm_mem, "enable_symm_mem_for_group"):  # required before rendezvous on older torch
            symm_mem.enable_symm_mem_for_group(self.group_name)
        self.buf = symm_mem.empty((M, N), dtype=dtype, device=ctx.device)
        symm_mem.rendezvous(self.buf, group)
        self.op = torch.ops.symm_mem.one_shot_all_reduce

    def __call__(self, a, b):
        torch.matmul(a, b, out=self.buf)
        return self.op(self.buf, "sum", self.group_name)


def whole_k_config(ctx, M: int, N: int, k_loc: int, dtype) -> tilefuse.Config:
    """The config gemm_all_reduce's fused_sequential takes without a caller's config where it does not
    split K (``_setup.default_tiles`` of the default config)."""
    from tilefuse.ops.common.config import default_config
    from tilefuse.ops.gemm_all_reduce._prepare import default_tiles
    from tilefuse.runtime import hw

    interp = hw.interpreting()
    cfg = default_config(M, N, k_loc, dtype, num_sms=hw.num_sms(ctx.device), interpreter=interp, comm=False)
    return default_tiles(cfg, M, N, dtype, comm=False, interpreter=interp)


def _method(ctx, name: str, M: int, N: int, k_loc: int, dtype):
    """The callable ``(a, b) -> c`` of method ``name`` (raises if it cannot run here)."""
    if name in VARIANTS:
        fn = ENTRY_POINTS[name]
        return lambda a, b: fn(a, b)
    if name == WHOLE_K:
        cfg = whole_k_config(ctx, M, N, k_loc, dtype)
        fn = ENTRY_POINTS["fused_sequential"]
        return lambda a, b: fn(a, b, config=cfg)
    if name == "auto":
        if OP not in registry.OPS:
            raise RuntimeError(f"variant='auto' needs {OP!r} in tilefuse.ops.registry.OPS")
        return lambda a, b: gemm_all_reduce(a, b)
    if name == "plain":
        return lambda a, b: plain_ops.gemm_all_reduce(a, b)
    if name == "symm_one_shot":
        return SymmOneShot(ctx, M, N, dtype)
    if name == "gemm":  # the floor: no communication at all
        return lambda a, b: torch.matmul(a, b)
    raise ValueError(f"unknown method {name!r}; methods are {METHODS}")


def _reference(a, b):
    return ENTRY_POINTS["reference"](a, b).float()


def _digest(c: torch.Tensor) -> torch.Tensor:
    """Two position-weighted sums of c's raw bits (int64, wrapping): equal results give equal digests."""
    bits = c.detach().contiguous().view({2: torch.int16, 4: torch.int32}[c.element_size()]).to(torch.int64)
    rows = torch.arange(1, c.shape[0] + 1, device=c.device, dtype=torch.int64)
    cols = torch.arange(1, c.shape[1] + 1, device=c.device, dtype=torch.int64)
    return torch.stack([(bits.sum(dim=1) * rows).sum(), (bits.sum(dim=0) * cols).sum()]).cpu()


def _check(ctx, c: torch.Tensor, ref: torch.Tensor) -> dict:
    err = ((c.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item() if c.numel() else 0.0
    digest = _digest(c)
    same = all(torch.equal(d, digest) for d in _gather(ctx, digest))
    return {"rel_error": _max_over_ranks(ctx, err), "same_bits": 1.0 if same else 0.0}


def _time_eager(ctx, call, calls: int) -> float:
    sync(ctx.device)
    dist.barrier(group=ctx.host_group)
    if ctx.device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        return (time.perf_counter() - t0) / calls * 1e6
    return cuda_ms_per_call(call, calls) * 1e3


def _time_graph(ctx, graph, replays: int) -> float:
    graph.replay()
    sync(ctx.device)
    dist.barrier(group=ctx.host_group)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays * 1e3


def _try(ctx, fn):
    """``(value, None)``, or ``(None, note)`` on every rank if ``fn`` raised on any rank."""
    value, err = None, None
    try:
        value = fn()
        sync(ctx.device)
    except Exception as e:  # recorded, and the run goes on
        err = e
    if _agree(ctx, err is None):
        return value, None
    return None, error_text(err) if err is not None else "failed on another rank"


def _job(ctx, Ms, N, K, dtype_name, methods, calls, rounds, warmup, graphs, weights=1, linear=False) -> list:
    dtype = DTYPES[dtype_name]
    W = ctx.world
    if K % W:
        raise ValueError(f"K = {K} must be divisible by the world size {W}")
    k_loc = K // W
    graphs = graphs and ctx.device.type == "cuda"
    rows = []

    def record(name, M, mode, metric, value, note=""):
        rows.append(dict(op=OP, variant=name, M=M, N=N, K=K, dtype=dtype_name, world=W, mode=mode, metric=metric,
                         value=value, note=note))

    for M in Ms:
        g = torch.Generator().manual_seed(1 + ctx.rank)
        a = (torch.randn(M, k_loc, generator=g) / k_loc**0.5).to(ctx.device, dtype)

        def weight(g=g):  # [K/W, N]: row-major, or a Linear weight's transpose
            if linear:
                return torch.randn(N, k_loc, generator=g).to(ctx.device, dtype).t()
            return torch.randn(k_loc, N, generator=g).to(ctx.device, dtype)

        b = weight()
        # With several weights a timed call runs the method on each in turn, as a model's step reads
        # each layer's weight once: none of them is left in L2 by the call before.
        bs = [b] + [weight() for _ in range(weights - 1)]
        ref = _reference(a, b)
        ready = {}  # name -> (eager call, graph or None)
        for name in methods:
            fn, note = _try(ctx, lambda name=name, M=M: _method(ctx, name, M, N, k_loc, dtype))
            if note is not None:
                record(name, M, "eager", "error", float("nan"), note)
                continue
            call = (lambda fn=fn, a=a, b=b: fn(a, b))
            c, note = _try(ctx, call)  # first call: workspaces, rendezvous, table lookup
            if note is not None:
                record(name, M, "eager", "error", float("nan"), note)
                continue
            if name != "gemm":  # the local partial alone is not the op's result
                for metric, value in _check(ctx, c, ref).items():
                    record(name, M, "check", metric, value)
            del c
            graph = None
            timed = call if weights == 1 else (lambda fn=fn, a=a, bs=bs: [fn(a, x) for x in bs])
            if graphs:
                graph, note = _try(ctx, lambda timed=timed: capture_graph(ctx.device, timed, warmup))
                if note is not None:
                    record(name, M, "graph", "error", float("nan"), note)
            ready[name] = (timed, graph)
        times: dict = {}
        for r in range(rounds):
            order = list(ready) if r % 2 == 0 else list(reversed(ready))
            for name in order:
                call, graph = ready[name]
                for _ in range(warmup):
                    call()
                eager_us = _time_eager(ctx, call, calls) / weights
                times.setdefault((name, "eager"), []).append(_max_over_ranks(ctx, eager_us))
                if graph is not None:
                    graph_us = _time_graph(ctx, graph, calls) / weights
                    times.setdefault((name, "graph"), []).append(_max_over_ranks(ctx, graph_us))
        for (name, mode), values in times.items():
            notes = ([f"{weights} weights in turn"] if weights > 1 else []) + (["Linear weights"] if linear else [])
            record(name, M, mode, "us_per_call", statistics.median(values), "; ".join(notes))
        del ready
        sync(ctx.device)
        tilefuse.barrier()
        tilefuse.clear_workspaces()  # collective: this M's heap buffers go back
    return rows


def heap_bytes(Ms, N: int, world: int, dtype: torch.dtype) -> int:
    """Heap per rank: the staging of every M (graphs keep theirs until shutdown), with room to spare."""
    stage = sum(world * M * N * dtype.itemsize for M in Ms)
    return max(64 << 20, int(stage * 1.5) + (64 << 20))


def _print(rows: list) -> None:
    t = {(r["M"], r["variant"], r["mode"]): r["value"] for r in rows if r["metric"] == "us_per_call"}
    for (M, name, mode), us in sorted(t.items()):
        plain = t.get((M, "plain", mode))
        ratio = f"  plain/this {plain / us:5.2f}x" if plain else ""
        print(f"M={M:<5d} {name:34s} {mode:5s} {us:10.1f} us{ratio}")
    for r in rows:
        if r["metric"] == "error":
            print(f"M={r['M']:<5d} {r['variant']:26s} {r['mode']}: ERROR {r['note'][:160]}")
        elif r["metric"] == "same_bits" and r["value"] != 1.0 and r["variant"] in VARIANTS:
            print(f"M={r['M']:<5d} {r['variant']:26s} results differ between ranks")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", default="2", help="world sizes, comma-separated")
    p.add_argument("--M", default="1,16,64,256,1024,8192", help="rows of a, comma-separated")
    p.add_argument("--N", type=int, default=8192)
    p.add_argument("--K", type=int, default=8192, help="full inner size; each rank holds K/W")
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default bf16 on GPUs, fp16 on CPUs")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                   help="comma-separated, of " + ",".join(METHODS) + "; or all (default: "
                        + ",".join(DEFAULT_METHODS) + ")")
    p.add_argument("--calls", type=int, default=40, help="back-to-back calls (or replays) per timing")
    p.add_argument("--weights", type=int, default=1,
                   help="weights (b) a timed call cycles through, each once (default 1: the same b every call, "
                        "part of it left in L2 by the call before)")
    p.add_argument("--linear-weights", action="store_true",
                   help="b is the transpose of a Linear weight [N, K/W] (column-major), not a row-major [K/W, N]")
    p.add_argument("--rounds", type=int, default=3, help="timings per method, interleaved between methods")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--no-graphs", action="store_true", help="eager only")
    p.add_argument("--smoke", action="store_true", help="CPU check of the plumbing: M 1,16, N=64, K=96, 2 calls, "
                   "1 round, no graphs (timings mean nothing)")
    p.add_argument("--heap", type=int, default=None, help="heap bytes per rank (default: from the shapes)")
    p.add_argument("--csv", default="allreduce_decode.csv")
    args = p.parse_args(argv)
    if args.smoke:
        args.N, args.K, args.calls, args.rounds, args.warmup, args.no_graphs = 64, 96, 2, 1, 0, True
        if args.M == p.get_default("M"):
            args.M = "1,16"
    methods = list(METHODS) if args.methods.strip() == "all" else [m.strip() for m in args.methods.split(",")
                                                                      if m.strip()]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        p.error(f"unknown method(s) {unknown}; methods are {list(METHODS)}")
    if args.weights < 1:
        p.error(f"--weights must be at least 1, got {args.weights}")
    Ms = [int(m) for m in args.M.split(",")]
    worlds = [int(w) for w in args.world.split(",")]
    for world in worlds:
        if world < 1 or args.K % world:
            p.error(f"K = {args.K} must be divisible by every world size (got {world})")
    dtype = args.dtype or ("bf16" if torch.cuda.is_available() else "fp16")
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    commit = commit_id()
    rows = []
    for world in worlds:
        heap = args.heap or heap_bytes(Ms, args.N, world, DTYPES[dtype])
        per_rank = launch(_job, world, Ms, args.N, args.K, dtype, methods, args.calls, args.rounds, args.warmup,
                          not args.no_graphs, args.weights, args.linear_weights, heap_size=heap)
        if not is_main_process():
            continue  # under torchrun: rank 0 reports
        got = per_rank[0]  # every value is already the maximum (or the agreement) over ranks
        layout = "Linear weights" if args.linear_weights else "row-major b"
        print(f"allreduce_decode: world {world}, N={args.N}, K={args.K} (K/W per rank), {dtype}, {layout}, {device}")
        _print(got)
        rows += got
    if not is_main_process():
        return 0
    write_rows(args.csv, rows, CSV_COLUMNS, device=device, commit=commit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
