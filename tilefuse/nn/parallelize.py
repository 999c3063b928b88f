"""Parallelize a model's ``nn.Linear`` submodules by a plan of style names (torch's and HF's meaning):
:data:`STYLES` (``tilefuse/nn/README.md``, "Plan strings", tables them with the op each runs) or
``ParallelStyle`` objects, applied as ``parallelize_module`` would."""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase
from types import MappingProxyType

import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle, PrepareModuleInput

from ..runtime import _env, get_heap, is_initialized
from .layers import ColumnParallelLinear, RowParallelLinear
from .styles import ColwiseParallel, RowwiseParallel, tp_group

#: Plan strings and what each makes.
STYLES = MappingProxyType({
    "colwise": "ColwiseParallel()",
    "rowwise": "RowwiseParallel()",
    "colwise_rep": "ColwiseParallel(output_layouts=Replicate())",
    "colwise_gather_output": "ColwiseParallel(output_layouts=Replicate())",
    "rowwise_rep": "RowwiseParallel(input_layouts=Replicate())",
    "rowwise_split_input": "RowwiseParallel(input_layouts=Replicate())",
    "colwise_seq": "ColumnParallelLinear (tokens sharded along dim 0 in)",
    "rowwise_seq": "RowParallelLinear (tokens sharded along dim 0 out)",
})
_SEQ_LAYERS = {"colwise_seq": ColumnParallelLinear, "rowwise_seq": RowParallelLinear}

#: Llama-style gated MLP, sequence-parallel (tokens along dim 0); its own forward runs unchanged.
LLAMA_MLP_PLAN = MappingProxyType({"gate_proj": "colwise_seq", "up_proj": "colwise_seq", "down_proj": "rowwise_seq"})

#: Llama attention projections, sequence-parallel: q/k/v return ``heads/W`` local heads (the module must
#: infer its head count from the projection width, as HF's Llama does), o_proj returns this rank's tokens.
LLAMA_ATTENTION_PLAN = MappingProxyType({"q_proj": "colwise_seq", "k_proj": "colwise_seq", "v_proj": "colwise_seq",
                                         "o_proj": "rowwise_seq"})

#: A Llama decoder layer in the replicated layout, HF's ``base_model_tp_plan`` names.
LLAMA_PLAN = MappingProxyType({"q_proj": "colwise", "k_proj": "colwise", "v_proj": "colwise", "o_proj": "rowwise",
                               "gate_proj": "colwise", "up_proj": "colwise", "down_proj": "rowwise"})


class _GatherSequence(PrepareModuleInput):
    """torch's ``PrepareModuleInput``, refused on a CUDA mesh over gloo (ranks sharing a GPU): torch's
    DTensor redistributions crash the processes there (a segmentation fault, torch 2.11)."""

    def _apply(self, module, device_mesh):
        gloo = any(dist.get_backend(g) == "gloo" for g in device_mesh.get_all_groups())
        if device_mesh.device_type == "cuda" and gloo:
            raise RuntimeError("llama_sequence_parallel_plan: the sequence-parallel layout's gathers run through "
                               "torch's DTensor, which crashes the process under gloo on CUDA tensors (ranks sharing "
                               "a GPU use gloo); run it with one GPU per rank and NCCL")
        return super()._apply(module, device_mesh)


def llama_sequence_parallel_plan(variant: str = "auto", sequence_dim: int = 1, mlp_input: str = "fused") -> dict:
    """A ``parallelize_module`` plan for one HF ``LlamaDecoderLayer`` with ``[B, S/W, H]`` activations,
    tokens sharded along ``sequence_dim`` (``tilefuse/nn/README.md``, "The sequence-parallel decoder layer").

    The attention gets the whole sequence through one ``PrepareModuleInput`` all-gather; o_proj and down
    are ``gemm_reduce_scatter``; gate/up are ``all_gather_gemm`` on this rank's tokens
    (``mlp_input="fused"``) or local GEMMs behind one all-gather (``"gather"``, torch's plan). Applying
    it on a CUDA mesh over gloo raises.
    """
    if mlp_input not in ("fused", "gather"):
        raise ValueError(f"llama_sequence_parallel_plan: mlp_input must be 'fused' or 'gather', got {mlp_input!r}")
    seq = Shard(sequence_dim)
    plan = {
        "self_attn": _GatherSequence(input_kwarg_layouts={"hidden_states": seq},
                                     desired_input_kwarg_layouts={"hidden_states": Replicate()}),
        **{f"self_attn.{p}_proj": ColwiseParallel(variant=variant) for p in "qkv"},
        "self_attn.o_proj": RowwiseParallel(output_layouts=seq, variant=variant),
    }
    if mlp_input == "gather":
        plan["mlp"] = _GatherSequence(input_layouts=(seq,), desired_input_layouts=(Replicate(),))
    gate_up_input = seq if mlp_input == "fused" else Replicate()
    for p in ("gate", "up"):
        plan[f"mlp.{p}_proj"] = ColwiseParallel(input_layouts=gate_up_input, variant=variant)
    plan["mlp.down_proj"] = RowwiseParallel(output_layouts=seq, variant=variant)
    return plan


def style_from_name(name: str, variant: str = "auto") -> ParallelStyle:
    """The tilefuse ``ParallelStyle`` for a plan string of torch's / HF's meaning (not the ``_seq`` names)."""
    if name in ("colwise", "colwise_rep", "colwise_gather_output"):
        return ColwiseParallel(output_layouts=None if name == "colwise" else Replicate(), variant=variant)
    if name in ("rowwise", "rowwise_rep", "rowwise_split_input"):
        return RowwiseParallel(input_layouts=None if name == "rowwise" else Replicate(), variant=variant)
    known = sorted(k for k in STYLES if k not in _SEQ_LAYERS)
    raise ValueError(f"style_from_name: {name!r} is not a style of torch's / HF's meaning that tilefuse runs; "
                     f"known: {known}")


def from_hf_plan(tp_plan: Mapping[str, str], variant: str = "auto") -> dict[str, ParallelStyle]:
    """A ``parallelize_module`` plan of tilefuse styles from a Hugging Face ``tp_plan`` (module path ->
    HF style name); HF styles tilefuse has none for (``"sequence_parallel"``, ...) raise."""
    if not isinstance(tp_plan, Mapping):
        raise TypeError(f"from_hf_plan: tp_plan must be a mapping, got {type(tp_plan).__name__}")
    out = {}
    for path, name in tp_plan.items():
        try:
            out[path] = style_from_name(name, variant)
        except ValueError as err:
            raise ValueError(f"from_hf_plan: entry {path!r}: {str(err).removeprefix('style_from_name: ')}") from None
    return out


def parallelize(module: nn.Module, plan: Mapping[str, str | ParallelStyle], group=None, variant: str = "auto", *,
                mesh=None) -> nn.Module:
    """Parallelize the submodules named by ``plan``, in place; returns ``module``.

    Args:
        module: the full, unsharded model, the same on every rank.
        plan: submodule name -> plan string (:data:`STYLES`) or ``ParallelStyle``. A name is a dotted
            path or an fnmatch glob (``"layers.*.mlp.up_proj"``) and also matches the trailing part of
            a path (``"gate_proj"`` at any depth). Every entry must match a module, none may get two
            styles, a plan string needs an ``nn.Linear``; the whole plan is checked before any change.
        group: the process group (default: the world); ignored when ``mesh`` is given.
        variant: the op variant of every string entry; style objects carry their own.
        mesh: the 1-D DeviceMesh for styles (default: one made from ``group``, on the heap's device type).

    The ``_seq`` strings swap in :class:`ColumnParallelLinear` / :class:`RowParallelLinear` (this rank's
    shard, copied); the rest keep the module with DTensor parameters. Collective over the group.
    """
    who = "parallelize"
    if not isinstance(module, nn.Module):
        raise TypeError(f"{who}: module must be an nn.Module, got {type(module).__name__}")
    if not isinstance(plan, Mapping):
        raise TypeError(f"{who}: plan must be a mapping from submodule names to styles, got {type(plan).__name__}")
    names = [name for name, _ in module.named_modules() if name]
    chosen: dict[str, tuple[str, object]] = {}
    for pattern, entry in plan.items():
        if not isinstance(entry, ParallelStyle) and not (isinstance(entry, str) and entry in STYLES):
            raise ValueError(f"{who}: plan entry {pattern!r} has unknown style {entry!r}; "
                             f"styles are {sorted(STYLES)} or ParallelStyle objects")
        hits = [name for name in names if fnmatchcase(name, pattern) or fnmatchcase(name, "*." + pattern)]
        if not hits:
            shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
            raise ValueError(f"{who}: plan entry {pattern!r} matches no submodule of "
                             f"{type(module).__name__} (its submodules: {shown or 'none'})")
        for name in hits:
            if name in chosen and chosen[name][1] != entry:
                raise ValueError(f"{who}: submodule {name!r} is matched as {chosen[name][1]!r} by "
                                 f"{chosen[name][0]!r} and as {entry!r} by {pattern!r}")
            chosen[name] = (pattern, entry)
    for name, (pattern, entry) in chosen.items():
        sub = module.get_submodule(name)
        # torch's styles check their modules themselves
        needs = ((nn.Linear,) if isinstance(entry, str) else (nn.Linear, nn.Embedding)
                 if isinstance(entry, (ColwiseParallel, RowwiseParallel)) else (nn.Module,))
        if not isinstance(sub, needs):
            kinds = " or ".join(f"nn.{t.__name__}" for t in needs)
            raise TypeError(f"{who}: plan entry {pattern!r} matches {name!r}, a {type(sub).__name__}; "
                            f"only {kinds} modules can be made {entry!r}")
    if not chosen:
        return module
    if mesh is not None:
        group = tp_group(mesh, who)
    elif any(not isinstance(e, str) or e not in _SEQ_LAYERS for _, e in chosen.values()):  # styles need a mesh
        device_type = get_heap().device.type if is_initialized() else _env.requested_backend()
        mesh = DeviceMesh.from_group(group if group is not None else dist.group.WORLD, device_type)
    for name, (_, entry) in chosen.items():
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        if isinstance(entry, str) and entry in _SEQ_LAYERS:
            setattr(parent, child, _SEQ_LAYERS[entry].from_linear(getattr(parent, child), group=group, variant=variant))
        else:
            (style_from_name(entry, variant) if isinstance(entry, str) else entry)._apply(getattr(parent, child), mesh)
    return module
