"""Sequence-parallel tensor-parallel MLP block: parallelize a Llama-style MLP and check it.

Each of W ranks (processes started by ``benchmarks.launch``, the repository's rank launcher) builds
the same full MLP block ``x + down(silu(gate(norm(x))) * up(norm(x)))``, swaps its linears for
tilefuse layers with ``LLAMA_MLP_PLAN`` (gate/up colwise: all_gather_gemm; down rowwise:
gemm_reduce_scatter), feeds its own block of tokens and compares output, input gradient and every
sharded weight gradient with the unsharded block run on all tokens. Rank 0 prints the largest errors.

    python examples/tp_mlp.py                  # W=2 CPU ranks (Triton interpreter), gloo
    python examples/tp_mlp.py --world 4 --hf   # the MLP is transformers' LlamaMLP (random weights)

With GPUs the ranks run on them (rank r on GPU r % count; NCCL when every rank has a GPU of its
own, gloo when ranks share one).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path

# The repository root, for the shared rank launcher; importing it switches Triton's interpreter on
# when there is no GPU, before any kernel module is imported (again in every spawned rank).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.launch import LaunchError, launch  # noqa: E402
from tilefuse.nn.reference import GatedMLP  # noqa: E402


class MLPBlock(nn.Module):
    """Pre-norm residual MLP block; the norm and the residual act on this rank's tokens only."""

    def __init__(self, mlp: nn.Module, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.mlp = mlp

    def forward(self, x):
        return x + self.mlp(self.norm(x))


def _make_mlp(args) -> nn.Module:
    if args.hf:
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaMLP

        cfg = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.inter, hidden_act="silu",
                          num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=1, vocab_size=32)
        return LlamaMLP(cfg)
    return GatedMLP(args.hidden, args.inter)


def _rank_main(ctx, args) -> None:
    """One rank: the launcher has set its device, the process group and the symmetric heap."""
    from tilefuse.nn import LLAMA_MLP_PLAN, parallelize

    torch.set_num_threads(1)
    rank, device, W = ctx.rank, ctx.device, ctx.world
    torch.manual_seed(0)  # the same full block on every rank
    full = MLPBlock(_make_mlp(args), args.hidden).to(device)
    tp = parallelize(copy.deepcopy(full), LLAMA_MLP_PLAN, variant=args.variant)

    T = W * args.tokens_per_rank
    g = torch.Generator().manual_seed(1)
    x = torch.randn(T, args.hidden, generator=g).to(device).requires_grad_()
    dy = torch.randn(T, args.hidden, generator=g).to(device)
    y_ref = full(x)
    (y_ref * dy).sum().backward()

    rows = slice(rank * args.tokens_per_rank, (rank + 1) * args.tokens_per_rank)
    x_loc = x.detach()[rows].clone().requires_grad_()
    y = tp(x_loc)
    (y * dy[rows]).sum().backward()

    n = args.inter // W
    cols = slice(rank * n, (rank + 1) * n)
    errors = {
        "output": (y - y_ref[rows]).abs().max(),
        "input grad": (x_loc.grad - x.grad[rows]).abs().max(),
        "gate_proj weight grad": (tp.mlp.gate_proj.weight.grad - full.mlp.gate_proj.weight.grad[cols]).abs().max(),
        "up_proj weight grad": (tp.mlp.up_proj.weight.grad - full.mlp.up_proj.weight.grad[cols]).abs().max(),
        "down_proj weight grad":
            (tp.mlp.down_proj.weight.grad - full.mlp.down_proj.weight.grad[:, cols]).abs().max(),
    }
    values = torch.stack(list(errors.values())).float().cpu()
    dist.all_reduce(values, op=dist.ReduceOp.MAX, group=ctx.host_group)  # gloo: host tensors
    if rank == 0:
        mlp_name = type(full.mlp).__name__
        print(f"TP MLP block ({mlp_name}, hidden {args.hidden}, intermediate {args.inter}) over {W} ranks "
              f"on {device.type}, {args.tokens_per_rank} tokens per rank, variant {args.variant!r}")
        print(f"  rank 0 layers: {tp.mlp.gate_proj}")
        for name, err in zip(errors, values.tolist()):
            print(f"  max |error| {name:<22} {err:.3e}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--inter", type=int, default=96, help="intermediate size (divisible by --world)")
    parser.add_argument("--tokens-per-rank", type=int, default=8)
    parser.add_argument("--variant", default="auto")
    parser.add_argument("--hf", action="store_true", help="use transformers' LlamaMLP (tilefuse[hf] extra)")
    args = parser.parse_args()
    if args.world < 1 or args.inter % args.world:
        parser.error(f"--inter {args.inter} must be divisible by --world {args.world} (>= 1)")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    heap = None if torch.cuda.is_available() else 64 << 20
    try:
        launch(_rank_main, args.world, args, heap_size=heap, timeout=600)
    except LaunchError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
