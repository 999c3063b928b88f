"""Bandwidth of the device API (store / load / put / get) against plain copies and the all-gather.

    python -m benchmarks.bandwidth --world 1 [--sizes default|quick|small|1M,64M,1G] [--csv PATH]
    python -m benchmarks bandwidth --world 2              # one process per GPU where there are enough
    torchrun --nproc-per-node 8 -m benchmarks.bandwidth --world 8

**One peer.** Every rank moves ``size`` bytes at the same time, at ring distance ``d = 0 .. W-1``:

=========  ==========================================================================
method     what rank r does
=========  ==========================================================================
store      ``tl.load`` its src, ``primitives.store`` into rank (r+d)'s dst
load       ``primitives.load`` rank (r+d)'s src, ``tl.store`` into its own dst
put        ``primitives.put``: rank (r+d)'s dst <- its src
get        ``primitives.get``: its dst <- rank (r+d)'s src
triton     (d = 0 only) plain ``tl.load``/``tl.store`` copy: what address translation costs
torch      ``copy_`` into rank (r+d)'s dst (d = 0: ``dst.copy_(src)``, a device-to-device copy;
           d > 0: into the peer's heap as mapped here, the copy engine over NVLink/P2P)
=========  ==========================================================================

d = 0 runs the API with ``peer == cur_rank`` (local memory). GB/s counts bytes read plus bytes
written (2 x size) over the slowest rank's median time.

**All peers** (W > 1): an all-gather of every rank's ``size``-byte src into every rank's dst
``[W, size]`` (slot q holds rank q's src, the own slot included, as ``all_gather_into_tensor``
fills it):

==============  ====================================================================================
method          what rank r does
==============  ====================================================================================
store_all       one kernel: its programs ``primitives.store`` its src into slot r of every rank
load_all        one kernel: its programs ``primitives.load`` every rank q's src into its slot q
put_all         as store_all, with ``primitives.put``
get_all         as load_all, with ``primitives.get``
torch_all       ``copy_`` of its src into slot r of every rank's dst as mapped here, one stream per
                destination (the copies run at once)
nccl_all_gather ``dist.all_gather_into_tensor`` on the process group (NCCL: one process per GPU).
                With gloo (the CPU, or ranks sharing a GPU) the row is ``gloo_all_gather``, through
                host memory for CUDA tensors: its times say nothing about links
==============  ====================================================================================

The kernels' work items interleave the destinations (item i goes to rank (r + i) mod W), so every
program touches every peer in turn and all links carry traffic at once. All-peer rows report bus
bandwidth, NCCL's convention for an all-gather: ``(W-1)/W x W x size / time``, the bytes a rank
receives from its peers per second (the own slot's local copy is done but not counted).

Every copy is checked once against the senders' data before it is timed (dst poisoned first).
Ranks sharing one GPU time-slice it: such numbers prove the copies work, not how fast links are.

CSV rows: ``op=bandwidth``, ``variant`` = method, ``M`` = bytes per rank, ``N`` = ring distance d
(-1 for the all-peer methods), ``K`` = copy programs (0 for torch and the all-gather), metrics
``ms``, ``GB/s`` (one peer), ``busbw_GB/s`` (all peers) and ``ok`` (1 when the copied data matched).
The summary ends with one line per size: put_all's bus bandwidth, the all-gather's, and their ratio.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from tilefuse.runtime import hw
from tilefuse.runtime import primitives as P

from .launch import is_main_process, launch
from .results import format_table, human_bytes, parse_bytes, print_table, row, run_info, write_csv
from .timing import bench_max

SIZE_SETS = {
    "default": "1M,4M,16M,64M,256M,1G",
    "quick": "1M,64M,1G",
    "small": "16K,64K",
}
MODES = {"store": 0, "load": 1, "put": 2, "get": 3, "triton": 4}
PUSH = ("store", "put", "torch")  # methods that write into the peer (pull methods read from it)
ONE_PEER = ("store", "load", "put", "get", "triton", "torch")
ALL_PEERS = ("store_all", "load_all", "put_all", "get_all", "torch_all")
ALL_PEERS_N = -1  # the CSV's N (ring distance) of the all-peer rows
SENTINEL = 0x5A5A5A5A


# Ranks are runtime values: Triton would otherwise specialise on rank or peer 1 and compile each
# mode twice (a second or more of compile each on an H200 host).
@triton.jit(do_not_specialize=["cur_rank", "peer"])
def _copy_kernel(
    dst_ptr, src_ptr,  # int32 symmetric addresses
    n, num_programs,
    cur_rank, peer, heap_bases,
    MODE: tl.constexpr, BLOCK: tl.constexpr,
):
    """Persistent copy of ``n`` int32 words between this rank and ``peer`` (see the module table)."""
    pid = tl.program_id(0)
    for start in range(pid * BLOCK, n, num_programs * BLOCK):
        offs = tl.max_contiguous(tl.multiple_of(start + tl.arange(0, BLOCK), BLOCK), BLOCK)  # [BLOCK]
        mask = offs < n
        if MODE == 0:
            value = tl.load(src_ptr + offs, mask=mask)
            P.store(dst_ptr + offs, value, cur_rank, peer, heap_bases, mask=mask)
        elif MODE == 1:
            value = P.load(src_ptr + offs, cur_rank, peer, heap_bases, mask=mask)
            tl.store(dst_ptr + offs, value, mask=mask)
        elif MODE == 2:
            P.put(dst_ptr + offs, src_ptr + offs, cur_rank, peer, heap_bases, mask=mask)
        elif MODE == 3:
            P.get(dst_ptr + offs, src_ptr + offs, cur_rank, peer, heap_bases, mask=mask)
        else:
            tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


@triton.jit(do_not_specialize=["cur_rank"])
def _all_peers_kernel(
    dst_ptr, src_ptr,  # int32 symmetric addresses: dst [W, n], src [n]
    n, num_programs,
    cur_rank, world, heap_bases,
    MODE: tl.constexpr, BLOCK: tl.constexpr,
):
    """All-gather of ``n`` int32 words per rank with every peer at once (see the module table):
    item i of this rank's ``world * cdiv(n, BLOCK)`` work items moves block ``i // world`` to or
    from rank ``(cur_rank + i) % world``; MODE 0/2 push into slot cur_rank, 1/3 pull into slot peer."""
    pid = tl.program_id(0)
    blocks = tl.cdiv(n, BLOCK)
    n64 = tl.cast(n, tl.int64)  # slot offsets pass 2**31 words at W * size >= 8 GiB
    for item in range(pid, world * blocks, num_programs):
        peer = (cur_rank + item % world) % world
        start = (item // world) * BLOCK
        offs = tl.max_contiguous(tl.multiple_of(start + tl.arange(0, BLOCK), BLOCK), BLOCK)  # [BLOCK]
        mask = offs < n
        if MODE == 0:
            value = tl.load(src_ptr + offs, mask=mask)
            P.store(dst_ptr + cur_rank * n64 + offs, value, cur_rank, peer, heap_bases, mask=mask)
        elif MODE == 1:
            value = P.load(src_ptr + offs, cur_rank, peer, heap_bases, mask=mask)
            tl.store(dst_ptr + peer * n64 + offs, value, mask=mask)
        elif MODE == 2:
            P.put(dst_ptr + cur_rank * n64 + offs, src_ptr + offs, cur_rank, peer, heap_bases, mask=mask)
        else:
            P.get(dst_ptr + peer * n64 + offs, src_ptr + offs, cur_rank, peer, heap_bases, mask=mask)


def _source_data(n: int, rank: int, size_index: int, device: torch.device) -> torch.Tensor:
    """Rank ``rank``'s src words for size number ``size_index`` (any rank can rebuild them)."""
    g = torch.Generator(device=device).manual_seed(1000 * size_index + rank + 1)
    return torch.randint(-(2**31), 2**31 - 1, (n,), generator=g, dtype=torch.int32, device=device)


def _gathered_data(n: int, world: int, size_index: int, device: torch.device) -> torch.Tensor:
    """What an all-gather of every rank's src leaves in each rank's dst: ``[W * n]``."""
    return torch.cat([_source_data(n, q, size_index, device) for q in range(world)])


def collective_name(ctx) -> str:
    """The all-gather rows' method name: ``nccl_all_gather`` or ``<backend>_all_gather``."""
    return f"{ctx.pg_backend}_all_gather"


def run_rank(ctx, sizes: list, warmup_ms: float, rep_ms: float, cpu_reps: int, csv: str,
             append: bool, max_reps: int = 50) -> dict:
    """Measure every (size, distance, method) and the all-peer methods; ``{"rows", "info"}`` (the rows
    agree on all ranks). Rank 0 adds each size's rows to ``csv`` as soon as they are measured."""
    rows = []
    info = run_info(ctx.device)
    timing = {"warmup_ms": warmup_ms, "rep_ms": rep_ms, "cpu_reps": cpu_reps, "max_reps": max_reps}
    with warnings.catch_warnings():  # torch >= 2.13 names all_gather_into_tensor deprecated; 2.11 has no other
        warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)
        t0 = time.perf_counter()
        for size_index, nbytes in enumerate(sizes):
            t_size = time.perf_counter()
            gc.collect()  # the previous size's buffers must be back in the heap on every rank alike
            size_rows = _measure_size(ctx, size_index, nbytes, timing)
            ctx.barrier()
            rows += size_rows
            if ctx.rank == 0:
                if csv:
                    write_csv(size_rows, csv, info, append=append or size_index > 0)
                now = time.perf_counter()
                print(f"bandwidth: {human_bytes(nbytes)} measured in {now - t_size:.1f} s ({now - t0:.1f} s since the "
                      "ranks came up)", file=sys.stderr, flush=True)
    return {"rows": rows, "info": info}


def _programs(ctx, n_items: int) -> int:
    """Copy programs: up to four per multiprocessor on a GPU (one per core on the CPU), at most one per item."""
    return max(1, min(hw.num_sms(ctx.device) * (4 if ctx.on_gpu else 1), n_items))


def _measure_size(ctx, size_index: int, nbytes: int, timing: dict) -> list:
    rows = []
    heap = ctx.heap
    block = 4096 if ctx.on_gpu else 1024
    num_warps = 8 if ctx.on_gpu else 4
    n = nbytes // 4
    W = ctx.world
    programs = _programs(ctx, triton.cdiv(n, block))
    src = heap.empty(n, dtype=torch.int32)
    gathered = heap.empty(W * n, dtype=torch.int32)  # [W, n]: slot q for rank q; slot 0 is the one-peer dst
    heap.check_symmetric("bandwidth buffers", src, gathered)
    src.copy_(_source_data(n, ctx.rank, size_index, ctx.device))
    dst = gathered[:n]
    for d in range(W):
        peer = (ctx.rank + d) % W
        for method in ("store", "load", "put", "get") + (("triton",) if d == 0 else ()) + ("torch",):
            if method == "torch":
                target = heap.peer_view(dst, peer)

                def fn(target=target):
                    target.copy_(src)
            else:

                def fn(method=method, peer=peer):
                    _copy_kernel[(programs,)](dst, src, n, programs, ctx.rank, peer, heap.heap_bases,
                                              MODE=MODES[method], BLOCK=block, num_warps=num_warps)

            sender = (ctx.rank - d) % W if method in PUSH else peer

            def expected(sender=sender):
                return _source_data(n, sender, size_index, ctx.device)

            ok, ms, note = _check_and_time(ctx, fn, dst, expected, timing)
            gbps = 2 * nbytes / (ms * 1e-3) / 1e9 if ms == ms else float("nan")
            k = 0 if method == "torch" else programs
            for metric, value in (("ms", ms), ("GB/s", gbps), ("ok", float(ok))):
                rows.append(row("bandwidth", method, nbytes, d, k, "int32", W, metric, value, note))
    if W > 1:
        rows += _measure_all_peers(ctx, size_index, nbytes, src, gathered, timing, block, num_warps)
    return rows


def _measure_all_peers(ctx, size_index, nbytes, src, gathered, timing, block, num_warps) -> list:
    """The all-peer methods and the process group's all-gather for one size (module table)."""
    rows = []
    heap = ctx.heap
    W, n, rank = ctx.world, nbytes // 4, ctx.rank
    programs = _programs(ctx, W * triton.cdiv(n, block))
    mine = gathered[rank * n:(rank + 1) * n]
    targets = [heap.peer_view(mine, q) for q in range(W)]  # slot r of every rank's dst, as mapped here
    streams = [torch.cuda.Stream(ctx.device) for _ in range(W)] if ctx.on_gpu else []
    methods: dict = {}
    for method in ALL_PEERS[:4]:

        def fn(method=method):
            _all_peers_kernel[(programs,)](gathered, src, n, programs, rank, W, heap.heap_bases,
                                           MODE=MODES[method.removesuffix("_all")], BLOCK=block,
                                           num_warps=num_warps)
        methods[method] = (fn, gathered, programs)

    def torch_all():
        if not streams:
            for t in targets:
                t.copy_(src)
            return
        main = torch.cuda.current_stream(ctx.device)
        for s, t in zip(streams, targets):
            s.wait_stream(main)
            with torch.cuda.stream(s):
                t.copy_(src)
        for s in streams:
            main.wait_stream(s)

    methods["torch_all"] = (torch_all, gathered, 0)
    coll = collective_name(ctx)
    host = ctx.on_gpu and ctx.pg_backend == "gloo"  # gloo has no CUDA all-gather: through host memory
    coll_src = src.cpu() if host else src.clone()  # an ordinary tensor, as a user would pass
    coll_out = torch.empty(W * n, dtype=torch.int32, device=coll_src.device)

    def all_gather():
        dist.all_gather_into_tensor(coll_out, coll_src)

    methods[coll] = (all_gather, coll_out, 0)
    note_coll = "" if ctx.pg_backend == "nccl" else (
        f"{ctx.pg_backend} all-gather, not NCCL" + (" (through host memory)" if host else "")
        + ": its times say nothing about the links")

    def expected():
        return _gathered_data(n, W, size_index, ctx.device)

    for method, (fn, out, k) in methods.items():
        ok, ms, note = _check_and_time(ctx, fn, out, expected, timing)
        busbw = (W - 1) * nbytes / (ms * 1e-3) / 1e9 if ms == ms else float("nan")
        note = note or (note_coll if method == coll else "")
        for metric, value in (("ms", ms), ("busbw_GB/s", busbw), ("ok", float(ok))):
            rows.append(row("bandwidth", method, nbytes, ALL_PEERS_N, k, "int32", W, metric, value, note))
    return rows


def _check_and_time(ctx, fn, out, expected, timing: dict):
    """Check one copy (``out`` against ``expected()``), then time it: ``(ok on every rank, ms, note)``."""
    note = ""
    try:
        out.fill_(SENTINEL)
        ctx.barrier()  # every destination is poisoned before anyone writes into it
        fn()
        ctx.barrier()  # every rank's copy has landed
        want = expected().to(out.device)  # made where the src was (a generator's numbers depend on its device)
        ok = bool(torch.equal(out, want))
        if not ok:
            bad = (out != want).nonzero()
            note = (f"rank {ctx.rank}: {bad.numel()} of {out.numel()} words differ from the senders' src "
                    f"(first at word {int(bad[0])})")
        del want
        ok = ctx.all_true(ok)
        ms = bench_max(ctx, fn, warmup_ms=timing["warmup_ms"], rep_ms=timing["rep_ms"],
                       cpu_reps=timing["cpu_reps"], max_reps=timing["max_reps"])
    except Exception as err:  # record and go on; at world > 1 the other ranks must fail alike
        ok, ms, note = False, float("nan"), f"{type(err).__name__}: {err}".splitlines()[0][:300]
    return ok, ms, note


def summarize(rows: list) -> list:
    """One record per (size, distance) with the GB/s of every one-peer method (for the terminal)."""
    table: dict = {}
    for r in rows:
        if r["N"] == ALL_PEERS_N:
            continue
        key = (r["M"], r["N"])
        rec = table.setdefault(key, {"size": human_bytes(r["M"]), "d": r["N"]})
        if r["metric"] == "GB/s":
            rec[r["variant"]] = r["value"]
        if r["metric"] == "ok" and r["value"] != 1.0:
            rec["bad"] = (rec.get("bad", "") + " " + r["variant"]).strip()
    return [table[k] for k in sorted(table, key=lambda k: (k[1], k[0]))]


def summarize_all_peers(rows: list) -> tuple[list, list]:
    """Per size: every all-peer method's bus bandwidth and put_all / the all-gather; (records, columns)."""
    table: dict = {}
    methods: list = []
    for r in rows:
        if r["N"] != ALL_PEERS_N:
            continue
        rec = table.setdefault(r["M"], {"size": human_bytes(r["M"])})
        if r["metric"] == "busbw_GB/s":
            rec[r["variant"]] = r["value"]
            if r["variant"] not in methods:
                methods.append(r["variant"])
        if r["metric"] == "ok" and r["value"] != 1.0:
            rec["bad"] = (rec.get("bad", "") + " " + r["variant"]).strip()
    coll = next((m for m in methods if m.endswith("_all_gather")), None)
    ratio = f"put_all/{coll}" if coll else None
    for rec in table.values():
        if ratio:
            put, ref = rec.get("put_all", math.nan), rec.get(coll, math.nan)
            rec[ratio] = put / ref if ref and ref == ref and put == put else math.nan
    columns = ["size"] + [m for m in ALL_PEERS if m in methods] + ([coll, ratio] if coll else []) + ["bad"]
    return [table[k] for k in sorted(table)], columns


def all_peers_lines(rows: list) -> list:
    """The closing lines: per size, put_all's bus bandwidth, the all-gather's and their ratio."""
    records, columns = summarize_all_peers(rows)
    coll = next((c for c in columns if c.endswith("_all_gather")), None)
    if not records or coll is None:
        return []
    out = []
    for rec in records:
        put, ref = rec.get("put_all", math.nan), rec.get(coll, math.nan)
        out.append(f"bandwidth all peers {rec['size']}: put_all {put:.4g} GB/s, {coll} {ref:.4g} GB/s (bus), "
                   f"ratio {put / ref if ref else math.nan:.3g}")
    return out


def all_peers_table(rows: list, world, device: str) -> str:
    records, columns = summarize_all_peers(rows)
    return format_table(records, columns, title=f"all peers: bus bandwidth GB/s ((W-1)/W x W x size / time), world "
                                                 f"{world}, {device}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=int, default=1, help="ranks (processes); torchrun sets its own")
    parser.add_argument("--sizes", default="default",
                        help=f"one of {sorted(SIZE_SETS)} or a list like 1M,64M,1G (bytes per rank)")
    parser.add_argument("--csv", default="bench_out/bandwidth.csv")
    parser.add_argument("--append", action="store_true", help="append to the CSV instead of replacing it")
    parser.add_argument("--warmup-ms", type=float, default=25.0)
    parser.add_argument("--rep-ms", type=float, default=100.0)
    parser.add_argument("--max-reps", type=int, default=50, help="most timed calls per measurement at world > 1 "
                        "(each after a host barrier: small sizes are barrier-bound)")
    parser.add_argument("--cpu-reps", type=int, default=2, help="timed calls per measurement on the CPU")
    args = parser.parse_args(argv)
    sizes = [parse_bytes(s) for s in SIZE_SETS.get(args.sizes, args.sizes).split(",") if s.strip()]
    if not sizes or any(s % 4 or s <= 0 for s in sizes):
        parser.error("sizes must be positive multiples of 4 bytes")
    if args.max_reps < 1 or args.cpu_reps < 1:
        parser.error("--max-reps and --cpu-reps must be >= 1")
    # under torchrun the world is torchrun's, whatever --world says
    world = int(os.environ["WORLD_SIZE"]) if "WORLD_SIZE" in os.environ else args.world
    # src + the [W, size] gathered dst (one-peer copies use its first slot) + room for the rest
    heap_size = (world + 1) * max(sizes) + (32 << 20)
    results = launch(run_rank, world, sizes, args.warmup_ms, args.rep_ms, args.cpu_reps, args.csv,
                     args.append, args.max_reps, heap_size=heap_size)
    if not is_main_process():
        return 0
    rows, info = results[0]["rows"], results[0]["info"]
    world = rows[0]["world"] if rows else world
    records = summarize(rows)
    methods = [m for m in ONE_PEER if any(m in r for r in records)]
    print_table(records, ["size", "d"] + methods + ["bad"],
                title=f"bandwidth GB/s (read + written), world {world}, {info['device']}")
    if any(r["N"] == ALL_PEERS_N for r in rows):
        print(all_peers_table(rows, world, info["device"]))
        print("\n".join(all_peers_lines(rows)))
    print(f"csv: {args.csv}")
    failed = [r for r in rows if r["metric"] == "ok" and r["value"] != 1.0]
    for r in failed:
        print(f"MISMATCH {r['variant']} size={r['M']} d={r['N']}: {r['note']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
