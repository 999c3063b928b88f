"""Plain-torch modules to parallelize: what tests, examples and benchmarks start from."""

from __future__ import annotations

from torch import nn


class GatedMLP(nn.Module):
    """Llama's MLP, ``down(silu(gate(x)) * up(x))``, with the submodule names LLAMA_MLP_PLAN expects."""

    def __init__(self, hidden: int, inter: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=bias)
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))
