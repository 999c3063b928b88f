"""A/B of ``variant="auto"`` against the function it runs, on one shape, at world 1 (a diagnosis).

    python -m benchmarks.auto_ab --op all_gather_gemm --shape 8192x8192x28672 [--rounds 8] [--profile]

The suite, timing methods one after the other, measured auto 3-7 % slower than the plain path on
large shapes where auto *runs* the plain path (docs/RESULTS.md, "Method"). This times, on the same
inputs, in ``--rounds`` rounds of alternating order (median of do_bench per round, as the suite did
then; it now interleaves calls, which is what removed the gap: this tool shows the round-by-round
picture that found it):

- ``direct``: the registry entry auto chose (e.g. the plain path), called directly;
- ``public``: the public op with that variant named (``tilefuse.<op>(a, b, variant=<choice>)``);
- ``auto``: the public op with ``variant="auto"``;
- ``direct2``: ``direct`` again (a control: its ratio to ``direct`` is the noise).

It prints every round's time per method, so a method slow in one position shows, and with
``--profile`` the CUDA kernels each method launches (name, calls, mean µs) from ``torch.profiler``:
if auto launched anything different from ``direct``, it shows there.
"""

from __future__ import annotations

import argparse
import statistics

import torch

import tilefuse
from tilefuse.ops import dispatch, registry

from .launch import launch
from .results import parse_dtype
from .timing import bench, round_order, settle


def _kernels(fn, calls: int = 5) -> list:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        total = getattr(ev, "device_time_total", None)
        if total is None:
            total = getattr(ev, "cuda_time_total", 0.0)
        if ev.count and total:
            rows.append((ev.key[:90], ev.count, total / ev.count))
    return sorted(rows, key=lambda r: -r[1] * r[2])


def _job(ctx, op: str, M: int, N: int, K: int, dtype, rounds: int, profile: bool, settle_first: bool):
    g = torch.Generator(device=ctx.device).manual_seed(0)
    a = torch.randn(M, K, generator=g, device=ctx.device, dtype=torch.float32).to(dtype)
    b = torch.randn(K, N, generator=g, device=ctx.device, dtype=torch.float32).to(dtype)
    choice = dispatch.choose(op, a, b)
    direct = registry.get(op, choice.variant)
    kw = {} if choice.variant == "plain" else {"config": choice.config}
    public = getattr(tilefuse, op)
    methods = {
        "direct": lambda: direct(a, b, **kw),
        "public": lambda: public(a, b, variant=choice.variant, **kw),
        "auto": lambda: public(a, b, variant="auto"),
        "direct2": lambda: direct(a, b, **kw),
    }
    times: dict = {name: [] for name in methods}
    if settle_first:
        settle(ctx, methods["direct"])
    for rnd in range(rounds):
        for name in round_order(list(methods), rnd):
            times[name].append(bench(ctx, methods[name]))
    kernels = {name: _kernels(fn) for name, fn in methods.items()} if profile and ctx.on_gpu else {}
    return {"choice": f"{choice.variant} ({choice.source})", "times": times, "kernels": kernels}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", default="all_gather_gemm", choices=registry.OPS)
    p.add_argument("--shape", default="8192x8192x28672", help="MxNxK of the call's operands")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--profile", action="store_true", help="list the CUDA kernels of each method")
    p.add_argument("--no-settle", action="store_true", help="start timing on an idle GPU (boost clocks)")
    args = p.parse_args(argv)
    M, N, K = (int(x) for x in args.shape.lower().split("x"))
    dtype = parse_dtype(args.dtype) if torch.cuda.is_available() else torch.float16
    [res] = launch(_job, 1, args.op, M, N, K, dtype, args.rounds, args.profile, not args.no_settle)
    print(f"{args.op} {args.shape} {dtype}: auto runs {res['choice']}")
    base = statistics.median(res["times"]["direct"])
    for name, ts in res["times"].items():
        med = statistics.median(ts)
        print(f"  {name:8s} median {med:8.3f} ms  ratio to direct {base / med:5.3f}  rounds: "
              + " ".join(f"{t:.3f}" for t in ts))
    for name, rows in res["kernels"].items():
        print(f"  kernels of {name}:")
        for key, count, mean_us in rows[:6]:
            print(f"    {count:4d} x {mean_us:9.1f} us  {key}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
