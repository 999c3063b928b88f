"""tilefuse demo: start ranks, move data between every pair through the symmetric heap, run every op.

    python examples/demo.py [--world W]

Ranks (started by ``benchmarks.launch``, the repository's rank launcher): one per GPU when there are
several; two processes sharing the GPU when there is one (gloo process group); two CPU ranks running
kernels in Triton's interpreter when there is none.

1. Every rank fills a heap buffer with its own random data. For each device primitive
   (``tilefuse.runtime.primitives``: store, load, put, get) a small Triton kernel moves it between
   every pair of ranks (store/put run on the sending rank and write into the receiver's heap;
   load/get run on the receiving rank and read the sender's heap), and the receiver checks it.
2. Every op runs once per registered variant on a small shape and is compared with its
   ``reference`` (fp32 torch + torch.distributed collectives).

Prints a table for each part; the exit code is 1 if anything did not match.
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

# The repository root, for the shared rank launcher; importing it switches Triton's interpreter on
# when there is no GPU, before any kernel module is imported (again in every spawned rank, which
# imports this file).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import tilefuse  # noqa: E402
from benchmarks.launch import LaunchError, gpu_count, launch, pg_backend  # noqa: E402
from tilefuse.ops import registry  # noqa: E402
from tilefuse.runtime import primitives as P  # noqa: E402

PRIMITIVES = {"store": 0, "load": 1, "put": 2, "get": 3}
PUSH = ("store", "put")  # run by the sender; load/get are run by the receiver


@triton.jit
def exchange_kernel(
    send_ptr,  # float32[n] on the heap: this rank's data
    recv_ptr,  # float32[world, n] on the heap: slot s receives rank s's data
    n, cur_rank, heap_bases,
    MODE: tl.constexpr, BLOCK: tl.constexpr,
):
    """Program p moves data between this rank and rank p with one primitive."""
    peer = tl.program_id(0)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)  # [BLOCK]
        mask = offs < n
        if MODE == 0:  # store: my data -> peer's slot `cur_rank`
            value = tl.load(send_ptr + offs, mask=mask)
            P.store(recv_ptr + cur_rank * n + offs, value, cur_rank, peer, heap_bases, mask=mask)
        elif MODE == 1:  # load: peer's data -> my slot `peer`
            value = P.load(send_ptr + offs, cur_rank, peer, heap_bases, mask=mask)
            tl.store(recv_ptr + peer * n + offs, value, mask=mask)
        elif MODE == 2:  # put: my data -> peer's slot `cur_rank`
            P.put(recv_ptr + cur_rank * n + offs, send_ptr + offs, cur_rank, peer, heap_bases, mask=mask)
        else:  # get: peer's data -> my slot `peer`
            P.get(recv_ptr + peer * n + offs, send_ptr + offs, cur_rank, peer, heap_bases, mask=mask)


def rank_data(rank: int, n: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(1234 + rank)
    return torch.randn(n, generator=g).to(device)


def exchange(rank: int, world: int, device) -> list:
    """Part 1: returns (src, dst, primitive, bytes, ok) for every pair whose dst is this rank."""
    n = 4096 if device.type == "cuda" else 1000  # not a multiple of the block: the tail is masked
    heap = tilefuse.get_heap()
    send = tilefuse.empty(n, dtype=torch.float32)
    recv = tilefuse.empty(world, n, dtype=torch.float32)
    send.copy_(rank_data(rank, n, device))
    expected = [rank_data(s, n, device) for s in range(world)]
    rows = []
    for name, mode in PRIMITIVES.items():
        recv.fill_(float("nan"))
        tilefuse.barrier()  # every slot is poisoned before any rank writes
        exchange_kernel[(world,)](send, recv, n, rank, heap.heap_bases, MODE=mode, BLOCK=256)
        tilefuse.barrier()  # every rank's writes have landed
        for src in range(world):
            ok = bool(torch.equal(recv[src], expected[src]))
            rows.append({"src": src, "dst": rank, "primitive": name,
                         "run by": src if name in PUSH else rank, "bytes": n * 4, "ok": ok})
    return rows


def _inputs(op: str, rank: int, world: int, dtype, device):
    """Small ragged shapes; each rank's shard is scaled by (rank + 1) so a misrouted one shows."""
    def rnd(shape, seed, scale=1.0):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(shape, generator=g) * scale).to(dtype=dtype, device=device)

    if op == "gemm_all_scatter":  # a [M, K] the same everywhere, b [K, N_loc] per rank
        M, N, K = 72, 40, 80
        return rnd((M, K), 1), rnd((K, N), 10 + rank, rank + 1.0), K
    if op == "all_gather_gemm":  # a [M_loc, K] per rank, b [K, N] the same everywhere
        M, N, K = 40, 72, 80
        return rnd((M, K), 20 + rank, rank + 1.0), rnd((K, N), 2), K
    M, N, K = 24 * world, 72, 80  # gemm_reduce_scatter: a [M, K_loc], b [K_loc, N] per rank
    return rnd((M, K), 30 + rank, rank + 1.0), rnd((K, N), 40 + rank), K


def run_ops(rank: int, world: int, device) -> list:
    """Part 2: every variant of every op against the reference on this rank."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16  # interpreter bf16 is wrong
    rows = []
    for op in registry.OPS:
        a, b, K = _inputs(op, rank, world, dtype, device)
        ref = registry.get(op, "reference")(a, b).float()
        scale = ref.abs().max().item()
        for variant in registry.variants(op):
            if variant == "reference":
                continue
            try:
                got = registry.get(op, variant)(a, b)
                tilefuse.synchronize()
                err = (got.float() - ref).abs().max().item()
                # fp32 accumulation of K products, one rounding to the output dtype (~2^-8 relative).
                tol = (2e-2 if dtype == torch.bfloat16 else 4e-3) * scale
                ok = bool(got.shape == ref.shape and err <= tol)  # NaN fails
                note = ""
            except Exception as exc:
                err, ok, note = float("nan"), False, f"{type(exc).__name__}: {exc}".splitlines()[0][:80]
                tilefuse.barrier()
            rows.append({"op": op, "variant": variant, "rank": rank, "max_abs_err": err,
                         "max_abs_ref": scale, "ok": ok, "note": note})
    return rows


def rank_job(ctx) -> tuple:
    """Both parts on one rank (the launcher has set its device, process group and heap)."""
    pairs = exchange(ctx.rank, ctx.world, ctx.device)
    gc.collect()  # part 1's heap buffers must be freed on every rank alike before the ops allocate
    return pairs, run_ops(ctx.rank, ctx.world, ctx.device)


def table(records: list, columns: list) -> str:
    def cell(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    cells = [[cell(r[c]) for c in columns] for r in records]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description="tilefuse demo")
    parser.add_argument("--world", type=int, default=None,
                        help="ranks (default: one per GPU if several, else 2)")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    gpus = gpu_count()
    world = args.world or (gpus if gpus > 1 else 2)
    if world < 1:
        parser.error(f"--world must be >= 1, got {world}")
    where = f"{gpus} GPU(s)" if gpus else "the CPU (Triton interpreter)"
    # NCCL when every rank has a GPU of its own; it refuses two ranks on one GPU, so gloo then.
    print(f"tilefuse demo: {world} ranks on {where}, {pg_backend(world)} process group", flush=True)
    heap = (256 << 20) if gpus else (64 << 20)
    try:
        got = launch(rank_job, world, heap_size=heap, timeout=args.timeout)
    except LaunchError as err:
        print(err, file=sys.stderr)
        return 1

    pairs = sorted((r for pr, _ in got for r in pr),
                   key=lambda r: (list(PRIMITIVES).index(r["primitive"]), r["src"], r["dst"]))
    print("\n1. data moved between every pair of ranks (checked on the receiving rank)")
    print(table(pairs, ["src", "dst", "primitive", "run by", "bytes", "ok"]))

    per_rank = [r for _, ops in got for r in ops]
    merged: dict = {}
    for r in per_rank:  # worst rank per (op, variant)
        key = (r["op"], r["variant"])
        m = merged.setdefault(key, {**r, "ok": True})
        m["ok"] = m["ok"] and r["ok"]
        if not r["max_abs_err"] <= m["max_abs_err"]:  # NaN wins
            m["max_abs_err"] = r["max_abs_err"]
        m["max_abs_ref"] = max(m["max_abs_ref"], r["max_abs_ref"])
        m["note"] = m["note"] or r["note"]
    ops = list(merged.values())
    print("\n2. every op variant against its reference (worst rank)")
    print(table(ops, ["op", "variant", "max_abs_err", "max_abs_ref", "ok", "note"]))

    bad = [r for r in pairs if not r["ok"]] + [r for r in ops if not r["ok"]]
    print(f"\n{'ALL OK' if not bad else f'{len(bad)} MISMATCH(ES)'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
