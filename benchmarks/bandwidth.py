"""Bandwidth of the device API (store / load / put / get) against plain copies.

    python -m benchmarks.bandwidth --world 1 [--sizes default|quick|small|1M,64M,1G] [--csv PATH]
    torchrun --nproc-per-node 8 -m benchmarks.bandwidth --world 8

Every rank moves ``size`` bytes at the same time, at ring distance ``d = 0 .. W-1``:

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

d = 0 runs the API with ``peer == cur_rank`` (local memory). Every copy is checked once against
the sending rank's data before it is timed. GB/s counts bytes read plus bytes written (2 x size)
over the slowest rank's median time. Ranks sharing one GPU time-slice it: such numbers prove the
copies work, not how fast links are.

CSV rows: ``op=bandwidth``, ``variant`` = method, ``M`` = bytes per rank, ``N`` = ring distance d,
``K`` = copy programs, metrics ``ms``, ``GB/s`` and ``ok`` (1 when the copied data matched).
"""

from __future__ import annotations

import argparse
import gc
import sys

import torch
import triton
import triton.language as tl

from tilefuse.runtime import hw
from tilefuse.runtime import primitives as P

from .launch import is_main_process, launch
from .results import human_bytes, parse_bytes, print_table, row, run_info, write_csv
from .timing import bench_max

SIZE_SETS = {
    "default": "1M,4M,16M,64M,256M,1G",
    "quick": "1M,64M,1G",
    "small": "16K,64K",
}
MODES = {"store": 0, "load": 1, "put": 2, "get": 3, "triton": 4}
PUSH = ("store", "put", "torch")  # methods that write into the peer (pull methods read from it)
SENTINEL = 0x5A5A5A5A


@triton.jit
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


def _source_data(n: int, rank: int, size_index: int, device: torch.device) -> torch.Tensor:
    """Rank ``rank``'s src words for size number ``size_index`` (any rank can rebuild them)."""
    g = torch.Generator(device=device).manual_seed(1000 * size_index + rank + 1)
    return torch.randint(-(2**31), 2**31 - 1, (n,), generator=g, dtype=torch.int32, device=device)


def _peer_view(ctx, t: torch.Tensor, peer: int) -> torch.Tensor | None:
    """``t`` (a heap tensor of this rank) as mapped from ``peer``'s heap, or None if unavailable."""
    maps = getattr(getattr(ctx.heap, "_maps", None), "tensors", None)
    if peer == ctx.rank:
        return t
    if maps is None or maps[peer] is None:
        return None
    off = ctx.heap.offset_of(t)
    return maps[peer][off:off + t.numel() * t.element_size()].view(t.dtype)


def run_rank(ctx, sizes: list, warmup_ms: float, rep_ms: float, cpu_reps: int, csv: str,
             append: bool) -> dict:
    """Measure every (size, distance, method); ``{"rows", "info"}`` (the rows agree on all ranks).

    Rank 0 adds each size's rows to ``csv`` as soon as they are measured.
    """
    rows = []
    info = run_info(ctx.device)
    for size_index, nbytes in enumerate(sizes):
        gc.collect()  # the previous size's buffers must be back in the heap on every rank alike
        size_rows = _measure_size(ctx, size_index, nbytes, warmup_ms, rep_ms, cpu_reps)
        ctx.barrier()
        rows += size_rows
        if ctx.rank == 0:
            write_csv(size_rows, csv, info, append=append or size_index > 0)
    return {"rows": rows, "info": info}


def _measure_size(ctx, size_index: int, nbytes: int, warmup_ms, rep_ms, cpu_reps) -> list:
    rows = []
    heap = ctx.heap
    block = 4096 if ctx.on_gpu else 1024
    num_warps = 8 if ctx.on_gpu else 4
    n = nbytes // 4
    programs = max(1, min(hw.num_sms(ctx.device) * (4 if ctx.on_gpu else 1), triton.cdiv(n, block)))
    src = heap.empty(n, dtype=torch.int32)
    dst = heap.empty(n, dtype=torch.int32)
    heap.check_symmetric("bandwidth buffers", src, dst)
    src.copy_(_source_data(n, ctx.rank, size_index, ctx.device))
    for d in range(ctx.world):
        peer = (ctx.rank + d) % ctx.world
        methods = ["store", "load", "put", "get"] + (["triton"] if d == 0 else []) + ["torch"]
        for method in methods:
            if method == "torch":
                target = _peer_view(ctx, dst, peer)
                if not ctx.all_true(target is not None):
                    continue

                def fn(target=target):
                    target.copy_(src)
            else:

                def fn(method=method, peer=peer):
                    _copy_kernel[(programs,)](dst, src, n, programs, ctx.rank, peer, heap.heap_bases,
                                              MODE=MODES[method], BLOCK=block, num_warps=num_warps)

            sender = (ctx.rank - d) % ctx.world if method in PUSH else peer
            ok, ms, note = _check_and_time(ctx, fn, dst, sender, n, size_index, warmup_ms, rep_ms, cpu_reps)
            gbps = 2 * nbytes / (ms * 1e-3) / 1e9 if ms == ms else float("nan")
            for metric, value in (("ms", ms), ("GB/s", gbps), ("ok", float(ok))):
                rows.append(row("bandwidth", method, nbytes, d, programs, "int32", ctx.world, metric, value,
                                note))
    return rows


def _check_and_time(ctx, fn, dst, sender, n, size_index, warmup_ms, rep_ms, cpu_reps):
    """Check one copy against the sender's data, then time it: ``(ok on every rank, ms, note)``."""
    note = ""
    try:
        dst.fill_(SENTINEL)
        ctx.barrier()  # every dst is poisoned before anyone writes into it
        fn()
        ctx.barrier()  # every rank's copy has landed
        expected = _source_data(n, sender, size_index, ctx.device)
        ok = bool(torch.equal(dst, expected))
        if not ok:
            bad = int((dst != expected).sum())
            note = f"rank {ctx.rank}: {bad} of {n} words differ from rank {sender}'s src"
        del expected
        ok = ctx.all_true(ok)
        ms = bench_max(ctx, fn, warmup_ms=warmup_ms, rep_ms=rep_ms, cpu_reps=cpu_reps)
    except Exception as err:  # record and go on; at world > 1 the other ranks must fail alike
        ok, ms, note = False, float("nan"), f"{type(err).__name__}: {err}".splitlines()[0][:300]
    return ok, ms, note


def summarize(rows: list) -> list:
    """One record per (size, distance) with the GB/s of every method (for the terminal)."""
    table: dict = {}
    for r in rows:
        key = (r["M"], r["N"])
        rec = table.setdefault(key, {"size": human_bytes(r["M"]), "d": r["N"]})
        if r["metric"] == "GB/s":
            rec[r["variant"]] = r["value"]
        if r["metric"] == "ok" and r["value"] != 1.0:
            rec["bad"] = (rec.get("bad", "") + " " + r["variant"]).strip()
    return [table[k] for k in sorted(table, key=lambda k: (k[1], k[0]))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=int, default=1, help="ranks (processes); torchrun sets its own")
    parser.add_argument("--sizes", default="default",
                        help=f"one of {sorted(SIZE_SETS)} or a list like 1M,64M,1G (bytes per rank)")
    parser.add_argument("--csv", default="bench_out/bandwidth.csv")
    parser.add_argument("--append", action="store_true", help="append to the CSV instead of replacing it")
    parser.add_argument("--warmup-ms", type=float, default=25.0)
    parser.add_argument("--rep-ms", type=float, default=100.0)
    parser.add_argument("--cpu-reps", type=int, default=2, help="timed calls per measurement on the CPU")
    args = parser.parse_args(argv)
    sizes = [parse_bytes(s) for s in SIZE_SETS.get(args.sizes, args.sizes).split(",") if s.strip()]
    if any(s % 4 or s <= 0 for s in sizes):
        parser.error("sizes must be positive multiples of 4 bytes")
    heap_size = 2 * max(sizes) + (32 << 20)
    results = launch(run_rank, args.world, sizes, args.warmup_ms, args.rep_ms, args.cpu_reps, args.csv,
                     args.append, heap_size=heap_size)
    if not is_main_process():
        return 0
    rows, info = results[0]["rows"], results[0]["info"]
    records = summarize(rows)
    methods = [m for m in ("store", "load", "put", "get", "triton", "torch") if any(m in r for r in records)]
    print_table(records, ["size", "d"] + methods + ["bad"],
                title=f"bandwidth GB/s (read + written), world {rows[0]['world'] if rows else '?'}, "
                      f"{info['device']}")
    print(f"csv: {args.csv}")
    failed = [r for r in rows if r["metric"] == "ok" and r["value"] != 1.0]
    for r in failed:
        print(f"MISMATCH {r['variant']} size={r['M']} d={r['N']}: {r['note']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
