"""Host time per call of ``variant="auto"`` against the plain path it runs, on a tiny shape, world 1.

    python -m benchmarks.dispatch_cost [--calls 20000] [--shape 16x32x64]

At decode sizes a call's host work is comparable to its kernel (docs/RESULTS.md, "One H200, world 1"), so the
dispatcher's cost matters there. This times, on the host clock, ``--calls`` back-to-back calls of:
torch.matmul alone, each op's plain path (``tilefuse.ops.registry``), and the public op with
``variant="auto"`` (the tables choose plain at world 1), and prints microseconds per call. On a GPU
the calls are queued, not waited for (the kernels are small), so this is host time.
"""

from __future__ import annotations

import argparse
import time

import torch

import tilefuse
from tilefuse.ops import registry

from .launch import launch


def _per_call_us(fn, calls: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def _job(ctx, M: int, N: int, K: int, calls: int) -> list:
    dtype = torch.bfloat16 if ctx.on_gpu else torch.float16
    a = torch.randn(M, K, device=ctx.device).to(dtype)
    b = torch.randn(K, N, device=ctx.device).to(dtype)
    out = tilefuse.empty(M, N, dtype=dtype)
    rows = [("torch.matmul", _per_call_us(lambda: a @ b, calls), None)]
    for op in registry.OPS:
        kw = {"out": out} if op == "gemm_all_scatter" else {}
        plain = registry.get(op, "plain")
        public = getattr(tilefuse, op)
        t_plain = _per_call_us(lambda f=plain, kw=kw: f(a, b, **kw), calls)
        t_auto = _per_call_us(lambda f=public, kw=kw: f(a, b, variant="auto", **kw), calls)
        rows.append((op, t_plain, t_auto))
    if ctx.on_gpu:
        torch.cuda.synchronize()
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--shape", default="16x32x64", help="MxNxK")
    args = p.parse_args(argv)
    M, N, K = (int(x) for x in args.shape.lower().split("x"))
    [rows] = launch(_job, 1, M, N, K, args.calls)
    for name, t_plain, t_auto in rows:
        if t_auto is None:
            print(f"{name:22s} {t_plain:7.1f} us/call")
        else:
            print(f"{name:22s} plain {t_plain:7.1f} us/call   auto {t_auto:7.1f} us/call   "
                  f"auto - plain {t_auto - t_plain:+.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
