"""Sequence-parallel tensor-parallel MLP block: parallelize a Llama-style MLP and check it.

    torchrun --nproc-per-node 2 examples/tp_mlp.py             # 2 CPU ranks without a GPU (Triton's interpreter)
    torchrun --nproc-per-node 4 examples/tp_mlp.py --hf        # the MLP is transformers' LlamaMLP (random weights)

Each rank builds the same full MLP block ``x + down(silu(gate(norm(x))) * up(norm(x)))``, swaps its
linears for tilefuse layers with ``tilefuse.nn.LLAMA_MLP_PLAN`` (gate/up colwise: all_gather_gemm;
down rowwise: gemm_reduce_scatter), feeds its own block of tokens and compares output, input gradient
and every sharded weight gradient with the unsharded block run on all tokens. Rank 0 prints the
largest errors; the exit code is 1 if one is above 1e-2 of its reference's largest value. With GPUs,
rank r runs on GPU r % count (NCCL when every rank has a GPU of its own, gloo when ranks share one).
Needs only an installed tilefuse (and transformers for ``--hf``).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import tilefuse
from tilefuse.nn import LLAMA_MLP_PLAN, parallelize
from tilefuse.nn.reference import GatedMLP  # Llama's MLP: down(silu(gate(x)) * up(x))


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


def check(args) -> bool:
    """One rank, started by torchrun: whether every error is within the tolerance."""
    rank, W = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    gpus = torch.cuda.device_count()
    if gpus:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % gpus)
    dist.init_process_group("nccl" if gpus >= W else "gloo")
    device = tilefuse.init(heap_size=None if gpus else 64 << 20).device
    torch.set_num_threads(1)
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
    pairs = {  # (tilefuse's, the unsharded block's)
        "output": (y, y_ref[rows]),
        "input grad": (x_loc.grad, x.grad[rows]),
        "gate_proj weight grad": (tp.mlp.gate_proj.weight.grad, full.mlp.gate_proj.weight.grad[cols]),
        "up_proj weight grad": (tp.mlp.up_proj.weight.grad, full.mlp.up_proj.weight.grad[cols]),
        "down_proj weight grad": (tp.mlp.down_proj.weight.grad, full.mlp.down_proj.weight.grad[:, cols]),
    }
    errors = {name: (got - ref).abs().max() / ref.abs().max() for name, (got, ref) in pairs.items()}
    values = torch.stack(list(errors.values())).float()
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    values = values.cpu()
    ok = bool((values <= 1e-2).all())
    if rank == 0:
        mlp_name = type(full.mlp).__name__
        print(f"TP MLP block ({mlp_name}, hidden {args.hidden}, intermediate {args.inter}) over {W} ranks "
              f"on {device.type}, {args.tokens_per_rank} tokens per rank, variant {args.variant!r}")
        print(f"  rank 0 layers: {tp.mlp.gate_proj}")
        for name, err in zip(errors, values.tolist()):
            print(f"  max |error| / max |reference| {name:<22} {err:.3e}", flush=True)
        print("OK" if ok else "ERRORS ABOVE 1e-2", flush=True)
    tilefuse.shutdown()
    dist.destroy_process_group()
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--inter", type=int, default=96, help="intermediate size (divisible by the world size)")
    parser.add_argument("--tokens-per-rank", type=int, default=8)
    parser.add_argument("--variant", default="auto")
    parser.add_argument("--hf", action="store_true", help="use transformers' LlamaMLP (the tilefuse[hf] extra)")
    args = parser.parse_args()
    if "WORLD_SIZE" not in os.environ:
        parser.error("start it with torchrun: torchrun --nproc-per-node 2 examples/tp_mlp.py")
    if args.inter % int(os.environ["WORLD_SIZE"]):
        parser.error(f"--inter {args.inter} must be divisible by the world size {os.environ['WORLD_SIZE']}")
    return 0 if check(args) else 1


if __name__ == "__main__":
    sys.exit(main())
