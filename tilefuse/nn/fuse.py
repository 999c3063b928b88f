"""Fuse each row-parallel projection of a tensor-parallel decoder with the residual add and the
RMSNorm after it: one ``gemm_all_reduce(..., residual=, norm_weight=)`` call each.

A Llama-family decoder layer in the replicated layout (o_proj and down_proj ``rowwise``) runs::

    h = x + o_proj(attn(input_layernorm(x)))          all-reduce, add, norm (post_attention_layernorm)
    x' = h + down_proj(mlp(post_attention_layernorm(h)))   all-reduce, add, norm (the next layer's
                                                           input_layernorm, or the model's final norm)

After :func:`fuse_allreduce_norm` layer i runs::

    a_loc = attn(normed_i)                            o_proj deferred: this rank's heads, unprojected
    (n, h) = gemm_all_reduce(a_loc, Wo_r^T, residual=x, norm_weight=post_attention_layernorm.weight)
    m_loc = mlp(n)                                    down_proj deferred
    (normed_{i+1}, x') = gemm_all_reduce(m_loc, Wd_r^T, residual=h, norm_weight=next norm's weight)

and hands ``Carried(normed_{i+1}, x')`` to layer i+1, which skips its own input_layernorm; the final
norm returns the carried normed value (with no final norm the last layer returns ``x'``). Only the
forwards of the layers, their o_proj and down_proj and the final norm change; parameters stay.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import Replicate, Shard

from ..ops.gemm_all_reduce import gemm_all_reduce
from .styles import TPLinear, _input, _local, mix_in


@dataclass(frozen=True)
class Carried:
    """What a fused decoder layer hands the next: the next norm's output and the residual stream (not a
    tuple, which code taking ``output[0]`` of a layer would take apart)."""

    normed: torch.Tensor
    residual: torch.Tensor


def _eps(norm: nn.Module) -> float:
    for name in ("variance_epsilon", "eps"):
        value = getattr(norm, name, None)
        if isinstance(value, (int, float)):
            return float(value)
    raise TypeError(f"fuse_allreduce_norm: {type(norm).__name__} has no variance_epsilon or eps; only RMSNorms "
                    "with a weight [hidden] and an epsilon can be fused")


def project_add_norm(linear: nn.Module, x, residual: torch.Tensor, norm: nn.Module | None):
    """``linear`` (a rowwise tilefuse linear) on this rank's ``x [..., in/W]``, plus ``residual [...,
    out]``, then ``norm``: ``(norm(s), s)`` from one fused call, or ``(None, s)`` without a norm."""
    plan = linear._tilefuse_tp
    x, _ = _input("fuse_allreduce_norm", plan, x)
    w, b = _local(linear.weight), _local(linear.bias)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    res2 = residual.reshape(-1, residual.shape[-1]).contiguous()
    if norm is None:
        s = gemm_all_reduce(x2, w.t(), variant=plan.variant, group=plan.group, bias=b) + res2
        return None, s.reshape(*lead, s.shape[-1])
    y, s = gemm_all_reduce(x2, w.t(), variant=plan.variant, group=plan.group, bias=b, residual=res2,
                           norm_weight=_local(norm.weight), eps=_eps(norm))
    return y.reshape(*lead, y.shape[-1]), s.reshape(*lead, s.shape[-1])


class _Deferred:
    """A rowwise linear whose projection the decoder layer runs (fused): its forward returns its input."""

    def forward(self, x):
        return x


class _CarriedNorm:
    """The final norm: a carried value is already normed (by the last layer's fused call)."""

    def forward(self, x):
        if isinstance(x, Carried):
            return x.normed
        return super().forward(x)


class _FusedLayer:
    """A decoder layer with its two projections fused (see the module docstring)."""

    def forward(self, hidden_states, *args, **kwargs):
        kwargs.update(zip(self._tilefuse_arg_names, args))
        if "past_key_values" in kwargs and "cache" in self._tilefuse_arg_names:
            kwargs["cache"] = kwargs.pop("past_key_values")
        normed, residual = ((hidden_states.normed, hidden_states.residual) if isinstance(hidden_states, Carried)
                            else (self.input_layernorm(hidden_states), hidden_states))
        attn = self.self_attn(hidden_states=normed, **kwargs)
        attn = attn[0] if isinstance(attn, tuple) else attn
        normed, residual = project_add_norm(self.self_attn.o_proj, attn, residual, self.post_attention_layernorm)
        nxt, residual = project_add_norm(self.mlp.down_proj, self.mlp(normed), residual, self._tilefuse_next_norm)
        return residual if nxt is None else Carried(nxt, residual)


def _is_layer(m: nn.Module) -> bool:
    return all(hasattr(m, n) for n in ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")) and \
        hasattr(m.self_attn, "o_proj") and hasattr(m.mlp, "down_proj")


def _check_rowwise(name: str, linear: nn.Module) -> None:
    plan = getattr(linear, "_tilefuse_tp", None)
    if not isinstance(linear, TPLinear) or plan is None or plan.kind != "rowwise":
        raise TypeError(f"fuse_allreduce_norm: {name} is a {type(linear).__name__}, not a linear parallelized by "
                        "tilefuse's RowwiseParallel; parallelize the model in the replicated layout first "
                        "(tilefuse.nn.parallelize(model, LLAMA_PLAN) or from_hf_plan(config.base_model_tp_plan))")
    if not isinstance(plan.output_layout, Replicate) or not plan.use_local_output or \
            not isinstance(plan.input_layout, Shard):
        raise ValueError(f"fuse_allreduce_norm: {name} runs {plan!r}; only the replicated layout (input "
                         "Shard(-1), output Replicate(), local output) ends in an all-reduce to fuse")


def fuse_allreduce_norm(model: nn.Module) -> nn.Module:
    """Fuse every decoder layer's o_proj and down_proj with the residual add and RMSNorm after them;
    in place, returns ``model``. Talks to no peer (the fused calls are collective).

    Args:
        model: a Llama-family HF model (or any module with a list of decoder layers and, optionally, a
            final ``norm`` beside it) parallelized in the replicated layout by tilefuse's styles. A
            decoder layer has ``self_attn.o_proj``, ``mlp.down_proj``, ``input_layernorm`` and
            ``post_attention_layernorm``; each one's output goes straight into the next, the last one's
            into the final norm (as HF's models do).

    Outputs and every gradient are the unfused model's (the norm in fp32, rounded once).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"fuse_allreduce_norm: model must be an nn.Module, got {type(model).__name__}")
    stacks = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m)
              and all(_is_layer(layer) for layer in m)]
    if not stacks:
        raise ValueError(f"fuse_allreduce_norm: {type(model).__name__} has no list of decoder layers (modules with "
                         "self_attn.o_proj, mlp.down_proj, input_layernorm and post_attention_layernorm)")
    for list_name, layers in stacks:
        for i, layer in enumerate(layers):
            for sub in ("self_attn.o_proj", "mlp.down_proj"):
                _check_rowwise(f"{list_name}.{i}.{sub}", layer.get_submodule(sub))
        final = getattr(model.get_submodule(list_name.rpartition(".")[0]), "norm", None)  # "": the model
        nexts = [layer.input_layernorm for layer in layers[1:]] + [final]  # the norm after each layer
        for norm in [layer.post_attention_layernorm for layer in layers] + nexts:
            if norm is not None:
                _eps(norm)
        for layer, nxt in zip(layers, nexts):
            names = list(inspect.signature(type(layer).forward).parameters)[2:]
            mix_in(layer, _FusedLayer, _tilefuse_next_norm=nxt, _tilefuse_arg_names=names)
            mix_in(layer.self_attn.o_proj, _Deferred)
            mix_in(layer.mlp.down_proj, _Deferred)
        if final is not None:
            mix_in(final, _CarriedNorm)
    return model
