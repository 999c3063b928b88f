"""How a public op call reaches its implementation: the variant's entry point itself where
:func:`_direct` allows, else the ``torch.library`` custom op (:mod:`tilefuse.ops.library`)."""

from __future__ import annotations

import torch

from . import registry
from .dispatch import run_auto
from .library import _scaling, encode_config, group_name, resolve_group, run_norm


def _direct(a, b, kwargs: dict) -> dict | None:
    """Where an eager call may skip the dispatcher (nothing traces it, plain tensors, no gradient),
    the keyword arguments its entry point needs (those not None or False), else None."""
    if _is_compiling() or _dispatch_modes() or not (_plain(a) and _plain(b)):
        return None
    given = {}
    for name, value in kwargs.items():
        if value is not None and value is not False:
            if not _plain(value):
                return None
            given[name] = value
    return given


def _plain(t) -> bool:
    """``t`` is no tensor (the entry point's checks name it) or a plain tensor needing no gradient."""
    return not isinstance(t, _Tensor) or (type(t) in _PLAIN_TYPES and not (t.requires_grad and _grad_enabled()))


_Tensor = torch.Tensor
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_is_compiling = torch.compiler.is_dynamo_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack  # what _get_current_dispatch_mode reads first
_grad_enabled = torch.is_grad_enabled
_get = registry.get


def call(op: str, a, b, variant: str = "auto", config=None, group=None, *, out=None, return_gathered=False,
         bias=None, scale_a=None, scale_b=None, out_dtype=None):
    """The entry point (auto: :func:`.dispatch.run_auto`) where :func:`_direct` allows: the custom op's
    dispatch costs as much host time as a plain call at decode sizes; else ``torch.ops.tilefuse.<op>``
    (all_gather_gemm whose ``b`` needs a gradient: the gathered-output op, for ``all_gather(a)``)."""
    if (out is None and bias is None and scale_a is None and scale_b is None and out_dtype is None
            and not return_gathered and type(a) in _PLAIN_TYPES and type(b) in _PLAIN_TYPES
            and not (_grad_enabled() and (a.requires_grad or b.requires_grad))
            and not _is_compiling() and not _dispatch_modes()):  # _direct's common case: a and b alone
        if type(group) is str:
            group = resolve_group(group)
        if variant == "auto":
            return run_auto(op, a, b, config, group)
        return _get(op, variant)(a, b, config=config, group=group)
    kwargs = {"out": out, "return_gathered": return_gathered, "bias": bias}
    given = _direct(a, b, {**kwargs, "scale_a": scale_a, "scale_b": scale_b, "out_dtype": out_dtype})
    if given is not None:
        if type(group) is str:
            group = resolve_group(group)
        if variant == "auto":
            return run_auto(op, a, b, config, group, **given)
        return _get(op, variant)(a, b, config=config, group=group, **given)
    if not isinstance(variant, str):
        raise TypeError(f"{op}: variant must be a string, got {type(variant).__name__}")
    cfg, grp = encode_config(config), group_name(group)
    ops = torch.ops.tilefuse
    scaling = _scaling(scale_a, scale_b, out_dtype)
    if op == "all_gather_gemm":
        if return_gathered or (b.requires_grad and torch.is_grad_enabled()):
            c, gathered = ops.all_gather_gemm_gathered(a, b, variant, cfg, grp, **scaling)
            return (c, gathered) if return_gathered else c
    elif op == "gemm_all_scatter":
        if out is not None:
            if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
                raise RuntimeError("gemm_all_scatter(): functions with out=... arguments don't support automatic "
                                   "differentiation; call it without out= (or under torch.no_grad())")
            if torch.compiler.is_compiling():
                # Traced code functionalises a mutated argument (the op would write into a copy of out, off
                # the heap): the compiled call runs the op into its own buffer and copies the result into out.
                return out.copy_(ops.gemm_all_scatter(a, b, variant, cfg, grp, **scaling))
            ops.gemm_all_scatter_out(a, b, out, variant, cfg, grp, **scaling)
            return out
    elif op == "gemm_all_reduce":
        if bias is not None:
            return ops.gemm_all_reduce(a, b, variant, cfg, grp, bias, **scaling)
    unexpected = sorted(name for name, value in kwargs.items() if value is not None and value is not False)
    if unexpected:
        raise TypeError(f"{op}: unexpected keyword argument(s) {unexpected}")
    return getattr(ops, op)(a, b, variant, cfg, grp, **scaling)


def call_norm(a, b, *, variant: str, config, group, bias, residual, norm_weight, eps):
    """``torch.ops.tilefuse.gemm_all_reduce_norm`` (or, as :func:`call`, the entry point directly)."""
    if not isinstance(variant, str):
        raise TypeError(f"gemm_all_reduce: variant must be a string, got {type(variant).__name__}")
    if norm_weight is None:
        raise ValueError("gemm_all_reduce: residual= is the residual of the fused RMSNorm; pass norm_weight= "
                         "with it (or add the residual to the result yourself)")
    if _direct(a, b, {"bias": bias, "residual": residual, "norm_weight": norm_weight}) is not None:
        return run_norm(a, b, variant, config, resolve_group(group) if isinstance(group, str) else group, bias,
                        residual, norm_weight, eps)
    return torch.ops.tilefuse.gemm_all_reduce_norm(a, b, variant, encode_config(config), group_name(group), bias,
                                                    residual, norm_weight, float(eps))
