"""Swap a model's ``nn.Linear`` submodules for tensor-parallel tilefuse layers, by a plan."""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase
from types import MappingProxyType

from torch import nn

from .layers import ColumnParallelLinear, RowParallelLinear

STYLES = MappingProxyType({"colwise": ColumnParallelLinear, "rowwise": RowParallelLinear})

#: Llama-style gated MLP: ``down(act(gate(x)) * up(x))``. gate/up take this rank's tokens and return
#: every rank's tokens on the local intermediate shard, the activation and product run on that shard,
#: and down returns this rank's tokens: the module's own forward works unchanged.
LLAMA_MLP_PLAN = MappingProxyType({"gate_proj": "colwise", "up_proj": "colwise", "down_proj": "rowwise"})

#: Llama attention projections. The number of attention heads and of key/value heads must be
#: divisible by the world size: q/k/v then return ``heads/W`` local heads for every rank's tokens,
#: the attention math itself must run on those local heads (this plan does not change it; the
#: module must infer its head count from the projection width or be told ``heads/W``), and o_proj
#: sums the local heads' contributions and returns this rank's tokens.
LLAMA_ATTENTION_PLAN = MappingProxyType({
    "q_proj": "colwise", "k_proj": "colwise", "v_proj": "colwise", "o_proj": "rowwise",
})


def _matches(name: str, pattern: str) -> bool:
    """``pattern`` names ``name`` whole, or names its trailing components (``"gate_proj"`` matches
    ``"layers.0.mlp.gate_proj"``). fnmatch globs: ``*`` also crosses dots."""
    return fnmatchcase(name, pattern) or fnmatchcase(name, "*." + pattern)


def parallelize(module: nn.Module, plan: Mapping[str, str], group=None, variant: str = "auto") -> nn.Module:
    """Replace the ``nn.Linear`` submodules named by ``plan`` with sharded tilefuse layers, in place.

    ``plan`` maps submodule names to a style: ``"colwise"`` (:class:`ColumnParallelLinear`) or
    ``"rowwise"`` (:class:`RowParallelLinear`). A name is a dotted path as in
    ``module.named_modules()`` or an fnmatch glob (``"layers.*.mlp.up_proj"``); it also matches
    the trailing part of a path, so ``"gate_proj"`` finds every ``gate_proj`` at any depth. Each
    matched module must be an ``nn.Linear`` (the full, unsharded layer, the same on every rank);
    rank r keeps its shard (:meth:`ColumnParallelLinear.from_linear`). Every entry must match at
    least one module, and no module may be matched with two styles. The whole plan is checked
    before anything is replaced. Returns ``module``.

    Ready plans: :data:`LLAMA_MLP_PLAN`, :data:`LLAMA_ATTENTION_PLAN` (attention heads must be
    divisible by the world size; the attention math then runs on the local heads).
    """
    who = "parallelize"
    if not isinstance(module, nn.Module):
        raise TypeError(f"{who}: module must be an nn.Module, got {type(module).__name__}")
    if not isinstance(plan, Mapping):
        raise TypeError(f"{who}: plan must be a mapping from submodule names to styles, got "
                        f"{type(plan).__name__}")
    names = [name for name, _ in module.named_modules() if name]
    chosen: dict[str, tuple[str, str]] = {}
    for pattern, style in plan.items():
        if style not in STYLES:
            raise ValueError(f"{who}: plan entry {pattern!r} has unknown style {style!r}; "
                             f"styles are {sorted(STYLES)}")
        hits = [name for name in names if _matches(name, pattern)]
        if not hits:
            shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
            raise ValueError(f"{who}: plan entry {pattern!r} matches no submodule of "
                             f"{type(module).__name__} (its submodules: {shown or 'none'})")
        for name in hits:
            if name in chosen and chosen[name][1] != style:
                raise ValueError(f"{who}: submodule {name!r} is matched as {chosen[name][1]!r} by "
                                 f"{chosen[name][0]!r} and as {style!r} by {pattern!r}")
            chosen[name] = (pattern, style)
    for name, (pattern, style) in chosen.items():
        sub = module.get_submodule(name)
        if not isinstance(sub, nn.Linear):
            raise TypeError(f"{who}: plan entry {pattern!r} matches {name!r}, a {type(sub).__name__}; "
                            f"only nn.Linear modules can be made {style}")
    for name, (_, style) in chosen.items():
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        layer = STYLES[style].from_linear(getattr(parent, child), group=group, variant=variant)
        setattr(parent, child, layer)
    return module
