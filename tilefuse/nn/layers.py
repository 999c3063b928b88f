"""Sequence-parallel linear modules (:mod:`tilefuse.nn.functional`) with ``[out, in]`` weights created sharded."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from ..runtime.scope import in_forward
from .functional import LOCAL_VARIANTS, column_parallel_linear, row_parallel_linear, world_of


class _ParallelLinear(nn.Module):
    """Shared set-up of the two layers; ``SHARD_DIM`` is the weight dimension split across ranks."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, group=None,
                 variant: str = "auto", device=None, dtype=None, *, seed: int | None = None):
        super().__init__()
        self._setup(in_features, out_features, bias, group, variant, device, dtype)
        self.reset_parameters(seed)

    def _setup(self, in_features, out_features, bias, group, variant, device, dtype) -> None:
        who = type(self).__name__
        world, rank = world_of(group, who)
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{who}: {name} must be a positive int, got {value!r}")
        if not isinstance(variant, str):
            raise TypeError(f"{who}: variant must be a string, got {type(variant).__name__}")
        sharded = (out_features, "out_features") if self.SHARD_DIM == 0 else (in_features, "in_features")
        if sharded[0] % world != 0:
            raise ValueError(f"{who}: {sharded[1]} = {sharded[0]} must be divisible by the world size "
                             f"({world}): the weight is split along it")
        self.in_features, self.out_features = in_features, out_features
        self.group, self.variant = group, variant
        self.world_size, self.rank = world, rank
        shape = [out_features, in_features]
        shape[self.SHARD_DIM] //= world  # the bias is split with the weight's rows, or whole
        kw = dict(device=device, dtype=dtype)
        self.weight = nn.Parameter(torch.empty(shape, **kw))
        self.register_parameter("bias", nn.Parameter(torch.empty(shape[0], **kw)) if bias else None)

    @torch.no_grad()
    def _load(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        """Copy this rank's slices of a full ``[out, in]`` weight and ``[out]`` bias into the parameters."""
        self.weight.copy_(weight.chunk(self.world_size, self.SHARD_DIM)[self.rank])
        if self.bias is not None:
            self.bias.copy_(bias.chunk(self.world_size)[self.rank] if self.SHARD_DIM == 0 else bias)

    def reset_parameters(self, seed: int | None = None) -> None:
        """Keep this rank's shard of what ``torch.manual_seed(seed); nn.Linear(in, out, bias)`` gets on
        the CPU in fp32. Without ``seed`` group rank 0 draws one and broadcasts it (collective)."""
        if seed is None:
            device = torch.cuda.current_device() if dist.get_backend(self.group) == "nccl" else "cpu"
            box = torch.randint(0, 2**62, (1,)).to(device)  # every rank draws: the RNG streams stay in step
            dist.broadcast(box, src=dist.get_global_rank(self.group, 0) if self.group is not None else 0,
                           group=self.group)
            seed = int(box.item())
        out_f, in_f, g = self.out_features, self.in_features, torch.Generator().manual_seed(seed)
        weight = nn.init.kaiming_uniform_(torch.empty(out_f, in_f), a=math.sqrt(5), generator=g)
        bound = 1.0 / math.sqrt(in_f)
        bias = nn.init.uniform_(torch.empty(out_f), -bound, bound, generator=g) if self.bias is not None else None
        self._load(weight, bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, variant: str = "auto"):
        """This rank's shard (a copy) of the full ``linear``, the same on every rank (device, dtype and
        requires_grad kept)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"{cls.__name__}.from_linear: expected an nn.Linear, got {type(linear).__name__}")
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        w = linear.weight
        layer._setup(linear.in_features, linear.out_features, linear.bias is not None, group, variant,
                     w.device, w.dtype)
        layer._load(w, linear.bias)  # no_grad
        for mine, theirs in zip(layer.parameters(), (w, linear.bias)):  # weight, then the bias if there is one
            mine.requires_grad_(theirs.requires_grad)
        return layer

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, local_weight={tuple(self.weight.shape)}, "
                f"rank={self.rank}/{self.world_size}, variant={self.variant!r}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1 and self.variant in LOCAL_VARIANTS:  # TP size 1: nn.Linear's call
            return F.linear(x, self.weight, self.bias)
        return in_forward(self._LINEAR, x, self.weight, self.bias, group=self.group, variant=self.variant)


class ColumnParallelLinear(_ParallelLinear):
    """``nn.Linear`` split by output features, fed this rank's tokens: ``[d0, ..., in] -> [W*d0, ..., out/W]``
    (:func:`column_parallel_linear` on rows ``r*out/W ... (r+1)*out/W`` of the weight and bias). Construction
    without ``seed``, every forward and backward are collective over ``group``; ``variant``: ``"auto"``,
    ``"plain"``, ``"reference"`` or one of ``tilefuse.VARIANTS``."""

    SHARD_DIM = 0
    _LINEAR = staticmethod(column_parallel_linear)


class RowParallelLinear(_ParallelLinear):
    """``nn.Linear`` split by input features, returning this rank's tokens: ``[d0, ..., in/W] -> [d0/W, ..., out]``
    (:func:`row_parallel_linear` on columns ``r*in/W ... (r+1)*in/W`` of the weight, the whole bias);
    collective like :class:`ColumnParallelLinear`."""

    SHARD_DIM = 1
    _LINEAR = staticmethod(row_parallel_linear)
