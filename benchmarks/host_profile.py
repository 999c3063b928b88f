"""Where an op call's host time goes: cProfile of many back-to-back calls at world 1 (from a call
signature's third call on, a fused variant replays its launch plan; the launch-plan counts close
the output).

    python -m benchmarks.host_profile [--op all_gather_gemm] [--variant wg_specialized] [--M 16]
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
    from tilefuse.ops.common import launch

    print(f"launch plans: {launch.plan_stats()}")
    tilefuse.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
