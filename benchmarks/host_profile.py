"""Where an op call's host time goes: cProfile of many back-to-back calls at world 1. ``--parts``:
instead of cProfile, the pieces a call is made of (the entry points, the collective call's
bookkeeping, an output allocation, device queries) each timed alone.

    python -m benchmarks.host_profile [--op all_gather_gemm] [--variant wg_specialized] [--M 16]
    python -m benchmarks.host_profile --parts --op OP --variant V [--M 16]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", default="all_gather_gemm")
    parser.add_argument("--variant", default="wg_specialized")
    parser.add_argument("--M", type=int, default=16)
    parser.add_argument("--N", type=int, default=4096)
    parser.add_argument("--K", type=int, default=4096)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--top", type=int, default=35)
    parser.add_argument("--parts", action="store_true", help="time the parts of a call each alone, not cProfile")
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("gloo", rank=0, world_size=1)
    import tilefuse
    from tilefuse.ops import registry

    tilefuse.init(heap_size=1 << 30)
    dev = tilefuse.get_heap().device
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float16
    a = torch.randn(args.M, args.K, device=dev, dtype=dtype)
    b = torch.randn(args.N, args.K, device=dev, dtype=dtype).t()
    if args.parts:
        print(f"{args.op} {args.variant} M={args.M} N={args.N} K={args.K}", flush=True)
        _time_parts(args.op, args.variant, a, b, args.calls)
        tilefuse.shutdown()
        dist.destroy_process_group()
        return
    fns = {"variant": registry.get(args.op, args.variant), "plain": registry.get(args.op, "plain"),
           "public": getattr(tilefuse, args.op)}
    for name, fn in fns.items():
        kw = {"variant": args.variant} if name == "public" else {}
        for _ in range(5):
            fn(a, b, **kw)
        tilefuse.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fn(a, b, **kw)
        host = (time.perf_counter() - t0) / args.calls * 1e6
        tilefuse.synchronize()
        print(f"{name:8s} host {host:8.1f} us/call", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.calls):
        fns["public"](a, b, variant=args.variant)
    prof.disable()
    tilefuse.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())
    tilefuse.shutdown()
    dist.destroy_process_group()


def _time_parts(op: str, variant: str, a, b, calls: int, n: int = 20000) -> None:
    """Mean host us of the pieces a call is made of, each alone: ``n`` times each (200 first,
    untimed), whole op calls ``calls`` times (5 first)."""
    import torch

    import tilefuse
    from tilefuse.ops import registry
    from tilefuse.runtime import world

    fn = registry.get(op, variant)
    public = getattr(tilefuse, op)
    idx = a.device.index or 0
    parts = {
        f"public tilefuse.{op}(a, b, variant={variant!r})": lambda: public(a, b, variant=variant),
        f"registry {op}.{variant}(a, b)": lambda: fn(a, b),
        "CollectiveCall enter + exit, nothing inside": lambda: world.CollectiveCall(op).__enter__().__exit__(
            None, None, None),
        "world.in_call()": world.in_call,
        "torch.empty(M, N)": lambda: torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device),
        "a.device": lambda: a.device,
        "a.data_ptr()": a.data_ptr,
    }
    if a.is_cuda:
        parts.update({
            "torch.cuda.current_device()": torch.cuda.current_device,
            "torch.cuda.is_current_stream_capturing()": torch.cuda.is_current_stream_capturing,
            "torch._C._cuda_getCurrentRawStream(i)": lambda: torch._C._cuda_getCurrentRawStream(idx),
            "torch.cuda.current_stream(i)": lambda: torch.cuda.current_stream(idx),
        })
    print("parts of a call, each alone:")
    for name, f in parts.items():
        whole = "(a, b" in name
        for _ in range(5 if whole else 200):
            f()
        reps = calls if whole else n
        t0 = time.perf_counter_ns()
        for _ in range(reps):
            f()
        us = (time.perf_counter_ns() - t0) / reps / 1e3
        tilefuse.synchronize()
        print(f"  {us:7.2f} us  {name}")


if __name__ == "__main__":
    main()
