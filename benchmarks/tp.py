"""Forward + backward of a Llama-style SwiGLU MLP: plain torch module vs the same module parallelized
with tilefuse's TP layers (``tilefuse.nn.parallelize`` + ``LLAMA_MLP_PLAN``), and the same layers on the
plain path (``variant="plain"``: torch.matmul + torch.distributed all-gather / reduce-scatter, i.e.
plain tensor parallelism), in the same run.

    python -m benchmarks tp [--world 2] [--size 8b|tiny] [--variant auto] [--csv PATH]

``8b``: hidden 4096, intermediate 14336, T = 8192 tokens, bf16 (Llama-3-8B). At world 1 the
parallel module computes exactly what the plain one does (all_gather_gemm and gemm_reduce_scatter
over one rank), so the ratio is the TP layers' overhead; with W ranks each rank holds T/W tokens
and a 1/W shard of the weights. The result is checked against the plain module before timing.
"""

from __future__ import annotations

import argparse
import copy
import statistics

import torch

from tilefuse.nn.reference import GatedMLP

from .checks import rel_error
from .launch import launch
from .results import print_table, row, run_info, write_csv
from .timing import bench_interleaved, settle

SIZES = {"8b": (4096, 14336, 8192), "tiny": (64, 96, 64)}  # hidden, intermediate, tokens


def _rank_job(ctx, size: str, variant: str):
    import tilefuse.nn as tnn

    hidden, inter, tokens = SIZES[size]
    dtype = torch.bfloat16 if ctx.on_gpu else torch.float32
    torch.manual_seed(0)
    plain = GatedMLP(hidden, inter).to(device=ctx.device, dtype=dtype)
    for p in plain.parameters():
        p.data.mul_(0.5)
    par = tnn.parallelize(copy.deepcopy(plain), tnn.LLAMA_MLP_PLAN, variant=variant)
    torch_tp = tnn.parallelize(copy.deepcopy(plain), tnn.LLAMA_MLP_PLAN, variant="plain")
    x_full = torch.randn(tokens, hidden, device=ctx.device, dtype=dtype)
    rows = tokens // ctx.world
    x_loc = x_full[ctx.rank * rows:(ctx.rank + 1) * rows].clone()
    dy_full = torch.randn(tokens, hidden, device=ctx.device, dtype=dtype)
    dy_loc = dy_full[ctx.rank * rows:(ctx.rank + 1) * rows].clone()

    def step(module, x, dy):
        def run():
            module.zero_grad(set_to_none=True)
            xi = x.detach().requires_grad_(True)
            module(xi).backward(dy)
            return xi.grad
        return run

    ref_y = plain(x_full)[ctx.rank * rows:(ctx.rank + 1) * rows]
    err = rel_error(par(x_loc), ref_y)
    methods = {"plain": step(plain, x_full, dy_full), "par": step(par, x_loc, dy_loc),
               "tp": step(torch_tp, x_loc, dy_loc)}
    settle(ctx, methods["plain"])  # steady clocks first (docs/RESULTS.md, "Method")
    rounds = [bench_interleaved(ctx, list(methods.values())) for _ in range(2)]  # calls interleaved
    t_plain, t_par, t_tp = (statistics.median(r[i] for r in rounds) for i in range(3))
    flops = 3 * 2 * tokens * hidden * inter * 3  # three GEMMs, forward + two backward GEMMs each
    return {"device": run_info(ctx.device)["device"], "dtype": str(dtype).removeprefix("torch."),
            "plain_ms": t_plain, "tilefuse_ms": t_par, "torch_tp_ms": t_tp, "rel_err": err,
            "tflops_plain": flops / t_plain / 1e9,
            "tflops_tilefuse": flops / ctx.world / t_par / 1e9}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--size", default=None, choices=sorted(SIZES), help="default: 8b on a GPU, tiny on the CPU")
    p.add_argument("--variant", default="auto")
    p.add_argument("--csv", default="bench_out/tp.csv", help="appended to")
    args = p.parse_args(argv)
    args.size = args.size or ("8b" if torch.cuda.is_available() else "tiny")
    res = launch(_rank_job, args.world, args.size, args.variant)[0]
    hidden, inter, tokens = SIZES[args.size]
    record = {"size": args.size, "world": args.world, "variant": args.variant,
              "plain ms (all tokens)": f"{res['plain_ms']:.3f}",
              "tilefuse ms (T/W tokens)": f"{res['tilefuse_ms']:.3f}",
              "torch TP ms (T/W tokens)": f"{res['torch_tp_ms']:.3f}",
              "plain/tilefuse": f"{res['plain_ms'] / res['tilefuse_ms']:.3f}",
              "torch TP/tilefuse": f"{res['torch_tp_ms'] / res['tilefuse_ms']:.3f}", "rel_err": f"{res['rel_err']:.2e}"}
    print_table([record], list(record), title="SwiGLU MLP forward + backward")
    if args.csv:
        dt = res["dtype"]
        rows_ = [row("tp_mlp", m, tokens, inter, hidden, dt, args.world, "ms", v)
                 for m, v in (("plain", res["plain_ms"]), (f"tilefuse[{args.variant}]", res["tilefuse_ms"]),
                              ("torch_tp", res["torch_tp_ms"]))]
        rows_.append(row("tp_mlp", f"tilefuse[{args.variant}]", tokens, inter, hidden, dt, args.world,
                         "rel_err", res["rel_err"]))
        write_csv(rows_, args.csv, dict(run_info(), device=res["device"]), append=True)
    return 0 if res["rel_err"] < 2e-2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
