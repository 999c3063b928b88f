"""tilefuse demo: move data between every pair of ranks through the symmetric heap, then run every op
and variant and compare it with its reference.

    torchrun --nproc-per-node 2 examples/demo.py
    python examples/demo.py [--world W]      # starts torchrun itself (what `make demo` runs)

One rank per GPU where there are enough GPUs (NCCL); ranks sharing a GPU otherwise (gloo); with no
GPU, CPU ranks that run the kernels in Triton's interpreter. Needs only an installed tilefuse.

1. Every rank fills a heap buffer with its own data. For each device primitive of
   ``tilefuse.runtime.primitives`` (store, load, put, get) a small Triton kernel moves it between
   every pair of ranks (store and put run on the sending rank and write into the receiver's heap;
   load and get run on the receiving rank and read the sender's), and the receiver checks it.
2. Every op runs once per variant (``tilefuse.VARIANTS``, ``plain``, and the named forms) on a small
   ragged shape and is compared with ``variant="reference"`` (fp32 torch + torch.distributed).

Rank 0 prints a table for each part; the exit code is 1 if anything did not match.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import tilefuse  # with no GPU it switches Triton's interpreter on, before the kernel below is made
from tilefuse.runtime import primitives as P

PRIMITIVES = {"store": 0, "load": 1, "put": 2, "get": 3}
PUSH = ("store", "put")  # run by the sender; load and get are run by the receiver
OPS = (tilefuse.gemm_all_scatter, tilefuse.all_gather_gemm, tilefuse.gemm_reduce_scatter, tilefuse.gemm_all_reduce)
FORMS = {"all_gather_gemm": ("copy_engine",)}  # named forms besides the four variants


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
    return torch.randn(n, generator=torch.Generator().manual_seed(1234 + rank)).to(device)


def exchange(rank: int, world: int, heap) -> list:
    """Part 1: (src, dst, primitive, run by, bytes, ok) for every pair whose dst is this rank."""
    n = 4096 if heap.device.type == "cuda" else 1000  # not a multiple of the block: the tail is masked
    send = tilefuse.empty(n, dtype=torch.float32)
    recv = tilefuse.empty(world, n, dtype=torch.float32)
    send.copy_(rank_data(rank, n, heap.device))
    expected = [rank_data(s, n, heap.device) for s in range(world)]
    rows = []
    for name, mode in PRIMITIVES.items():
        recv.fill_(float("nan"))
        tilefuse.barrier()  # every slot is poisoned before any rank writes
        exchange_kernel[(world,)](send, recv, n, rank, heap.heap_bases, MODE=mode, BLOCK=256)
        tilefuse.barrier()  # every rank's writes have landed
        for src in range(world):
            rows.append({"src": src, "dst": rank, "primitive": name, "run by": src if name in PUSH else rank,
                         "bytes": n * 4, "ok": bool(torch.equal(recv[src], expected[src]))})
    return rows


def inputs(op: str, rank: int, world: int, dtype, device):
    """Small ragged shapes; each rank's shard is scaled by (rank + 1) so that a misrouted one shows."""
    def rnd(shape, seed, scale=1.0):
        return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale).to(device, dtype)

    if op == "gemm_all_scatter":  # a [M, K] the same everywhere, b [K, N_loc] per rank
        return rnd((72, 80), 1), rnd((80, 40), 10 + rank, rank + 1.0)
    if op == "all_gather_gemm":  # a [M_loc, K] per rank, b [K, N] the same everywhere
        return rnd((40, 80), 20 + rank, rank + 1.0), rnd((80, 72), 2)
    return rnd((24 * world, 80), 30 + rank, rank + 1.0), rnd((80, 72), 40 + rank)  # a [M, K_loc], b [K_loc, N]


def run_ops(rank: int, world: int, device) -> list:
    """Part 2: every variant of every op against the reference on this rank."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16  # the interpreter's bf16 is wrong
    rows = []
    for fn in OPS:
        op = fn.__name__
        a, b = inputs(op, rank, world, dtype, device)
        ref = fn(a, b, variant="reference").float()
        scale = ref.abs().max().item()
        for variant in (*tilefuse.VARIANTS, *FORMS.get(op, ()), "plain"):
            try:
                got = fn(a, b, variant=variant)
                tilefuse.synchronize()
                err = (got.float() - ref).abs().max().item()
                # fp32 accumulation, one rounding to the output dtype (~2^-8 relative in bf16).
                ok = bool(got.shape == ref.shape and err <= (2e-2 if dtype == torch.bfloat16 else 4e-3) * scale)
                note = ""
            except Exception as exc:
                err, ok, note = float("nan"), False, f"{type(exc).__name__}: {exc}".splitlines()[0][:80]
                tilefuse.barrier()
            rows.append({"op": op, "variant": variant, "max_abs_err": err, "max_abs_ref": scale, "ok": ok,
                         "note": note})
    return rows


def table(records: list, columns: list) -> str:
    cells = [[f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c]) for c in columns] for r in records]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)), "  ".join("-" * w for w in widths)]
    return "\n".join(lines + ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells])


def worst(per_rank: list) -> list:
    """One row per (op, variant): the worst rank's error; ok only if every rank's result was."""
    merged: dict = {}
    for r in per_rank:
        m = merged.setdefault((r["op"], r["variant"]), dict(r))
        m["ok"] = m["ok"] and r["ok"]
        if not r["max_abs_err"] <= m["max_abs_err"]:  # NaN wins
            m["max_abs_err"] = r["max_abs_err"]
        m["max_abs_ref"] = max(m["max_abs_ref"], r["max_abs_ref"])
        m["note"] = m["note"] or r["note"]
    return list(merged.values())


def rank_main() -> int:
    """One rank, started by torchrun."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    gpus = torch.cuda.device_count() if os.environ.get("TILEFUSE_BACKEND") != "cpu" else 0
    if gpus:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % gpus)
    backend = "nccl" if gpus >= world else "gloo"  # NCCL refuses two ranks on one GPU
    dist.init_process_group(backend)
    heap = tilefuse.init(heap_size=(256 << 20) if gpus else (64 << 20))
    if rank == 0:
        where = f"{gpus} GPU(s)" if gpus else "the CPU (Triton's interpreter)"
        print(f"tilefuse demo: {world} ranks on {where}, {backend} process group", flush=True)
    pairs = exchange(rank, world, heap)
    ops = run_ops(rank, world, heap.device)
    got: list = [None] * world
    dist.all_gather_object(got, (pairs, ops))
    pairs = sorted((r for p, _ in got for r in p), key=lambda r: (PRIMITIVES[r["primitive"]], r["src"], r["dst"]))
    ops = worst([r for _, o in got for r in o])
    bad = [r for r in pairs + ops if not r["ok"]]
    if rank == 0:
        print("\n1. data moved between every pair of ranks (checked on the receiving rank)")
        print(table(pairs, ["src", "dst", "primitive", "run by", "bytes", "ok"]))
        print("\n2. every op variant against its reference (worst rank)")
        print(table(ops, ["op", "variant", "max_abs_err", "max_abs_ref", "ok", "note"]))
        print(f"\n{'ALL OK' if not bad else f'{len(bad)} MISMATCH(ES)'}", flush=True)
    tilefuse.shutdown()
    dist.destroy_process_group()
    return 1 if bad else 0


def main() -> int:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return rank_main()
    parser = argparse.ArgumentParser(description="tilefuse demo (starts torchrun)")
    parser.add_argument("--world", type=int, default=None, help="ranks (default: the GPU count if several, else 2)")
    args = parser.parse_args()
    gpus = torch.cuda.device_count() if os.environ.get("TILEFUSE_BACKEND") != "cpu" else 0
    world = args.world or (gpus if gpus > 1 else 2)
    if world < 1:
        parser.error(f"--world must be >= 1, got {world}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
           os.path.abspath(__file__)]
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
