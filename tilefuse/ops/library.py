"""tilefuse's ops as ``torch.library`` custom ops (``torch.ops.tilefuse.<op>(a, b, variant, config, group)``),
traced by torch.compile with no graph break and differentiable. The real implementation runs the
public function's entry point (first-call exchanges, workspaces and tuning happen there, never while
tracing); the fake one checks the operands and gives the output's shape.

============================  ==========================  ====================================
op (rank r, W ranks)          output                      backward (dc: this rank's output grad)
============================  ==========================  ====================================
gemm_all_scatter              ``c [M, W*N_loc]``          ``g = reduce_scatter(dc column blocks)``;
                                                          ``da = g @ b^T``, ``db = a^T @ g``
all_gather_gemm               ``c [W*M_loc, N]``          ``da = gemm_reduce_scatter(dc, b^T)``,
                                                          ``db = all_gather(a)^T @ dc``
gemm_reduce_scatter           ``c [M/W, N]``              ``da, dc_full = all_gather_gemm(dc, b^T,
                                                          gathered)``; ``db = a^T @ dc_full``
gemm_all_reduce               ``c [M, N]`` (replicated)   ``da = dc @ b^T``, ``db = a^T @ dc``,
  (``+ bias [N]``)                                        ``dbias = dc`` summed over rows
============================  ==========================  ====================================

The all-reduce's backward is the identity (Megatron's row-parallel convention). Beside them:
``all_gather_gemm_gathered``, ``gemm_all_scatter_out`` (eager only, not differentiable),
``gemm_all_reduce_norm`` and the collectives ``all_gather_rows`` / ``reduce_scatter_rows``, each the
other's backward. Backward ops run the forward's variant with ``config=None``.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..runtime import get_heap, is_initialized
from ..runtime.scope import in_backward, saved_scope
from . import registry
from .common.checks import FLOAT8_DTYPES, check_divisible, check_operands
from .common.collectives import all_gather_cat, op_group
from .common.config import Config
from .common.scaled import check_scales
from .dispatch import resolve as resolve_auto
from .dispatch import run_auto
from .plain import reduce_scatter

_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(Config))
_ARGS = "Tensor a, Tensor b, str variant, int[]? config, str? group"
# A float8 call's scales and result dtype (common.scaled), the last arguments of every op's schema.
_SCALED = "Tensor? scale_a=None, Tensor? scale_b=None, ScalarType? out_dtype=None"


def _scaling(scale_a, scale_b, out_dtype) -> dict:
    """The keyword arguments of a float8 call's scaling, none for an unscaled call."""
    if scale_a is None and scale_b is None and out_dtype is None:
        return {}
    return {"scale_a": scale_a, "scale_b": scale_b, "out_dtype": out_dtype}


def encode_config(config) -> list[int] | None:
    """A :class:`Config` (or None) as the schema's ``int[]?``: its fields in declaration order."""
    if config is None:
        return None
    if not isinstance(config, Config):
        raise TypeError(f"config must be a tilefuse.Config or None, got {type(config).__name__}")
    return [getattr(config, name) for name in _CONFIG_FIELDS]


_DECODED: dict[tuple, Config] = {}


def decode_config(config: list[int] | None) -> Config | None:
    """Inverse of :func:`encode_config` (validated once per distinct list, then remembered)."""
    if config is None:
        return None
    key = tuple(config)
    hit = _DECODED.get(key)
    if hit is None:
        if len(key) != len(_CONFIG_FIELDS):
            raise ValueError(f"config: expected {len(_CONFIG_FIELDS)} ints ({', '.join(_CONFIG_FIELDS)}), "
                             f"got {len(key)}")
        hit = _DECODED[key] = Config(*key)
    return hit


@torch.compiler.assume_constant_result
def _name_of(group) -> str:
    return group.group_name


def group_name(group) -> str | None:
    """The name the schema carries for ``group`` (None stays None: the default group)."""
    if group is None or isinstance(group, str):
        return group
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed ProcessGroup, its name or None, got {type(group).__name__}")
    return _name_of(group)


def resolve_group(name: str | None):
    """The process group called ``name`` (None: the default group, passed on as None)."""
    if name is None:
        return None
    try:
        return dist.distributed_c10d._resolve_process_group(name)
    except Exception as err:
        raise ValueError(f"no process group is named {name!r} in this process") from err


def world_size(group: str | None) -> int:
    """World size of the named group for the fakes (None: tilefuse's default group); not cached."""
    if group is None and is_initialized():
        return get_heap().world_size
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("tilefuse ops: torch.distributed is not initialised; call "
                           "torch.distributed.init_process_group(...) and tilefuse.init() first")
    return dist.get_world_size(resolve_group(group))


def _owned(t: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
    """``t`` as a custom op may return it: contiguous (the fake's strides), sharing no storage with an
    input, not in a heap workspace that the op's next call reuses."""
    if not t.is_contiguous():
        return t.contiguous()
    ptr = t.untyped_storage().data_ptr()
    if any(ptr == x.untyped_storage().data_ptr() for x in inputs) or (is_initialized() and get_heap().is_on_heap(t)):
        return t.clone()
    return t


def _entry(op: str, a, b, variant: str, config, group, **kwargs):
    """The named variant's entry point of ``op``, or auto's choice."""
    if variant == "auto":
        return run_auto(op, a, b, config, group, **kwargs)
    return registry.get(op, variant)(a, b, config=config, group=group, **kwargs)


def run(op: str, a, b, variant: str, config: list[int] | None, group: str | None, **kwargs):
    """:func:`_entry` from the schema's arguments."""
    return _entry(op, a, b, variant, decode_config(config), resolve_group(group), **kwargs)


@dataclass(frozen=True)
class OpSpec:
    """One op: its output shape from ``(M, K, N, W)`` and its backward ``(ctx, a, b, dc) -> (da, db)``."""

    name: str
    out_shape: Callable[[int, int, int, int], tuple]
    backward: Callable
    rows_divisible: bool = False  # M must be a multiple of the world size
    bias: bool = False  # the op takes an optional ``bias [N]`` added to the output (last schema argument)


def _back_gemm_all_scatter(ctx, a, b, dc):
    # c = [a_0 b_0 | ... | a_{W-1} b_{W-1}] on every rank: a_r b_r's gradient is the sum over ranks of
    # their dc's column block r.
    g = torch.ops.tilefuse.reduce_scatter_rows(dc.t().contiguous(), ctx.group).t()  # [M, N_loc]
    return _linear_grads(ctx, a, b, g)


def _back_all_gather_gemm(ctx, a, b, dc):
    # The gathered-output op keeps all_gather(a); this one gathers again.
    a_full = torch.ops.tilefuse.all_gather_rows(a, ctx.group) if ctx.needs_input_grad[1] else None
    return _gathered_grads(ctx, a_full, b, dc, None)[:2]


def _back_gemm_reduce_scatter(ctx, a, b, dc):
    da = db = None
    if ctx.needs_input_grad[0]:
        da, dc_full = torch.ops.tilefuse.all_gather_gemm_gathered(dc, b.t(), ctx.variant, None, ctx.group)
    elif ctx.needs_input_grad[1]:
        dc_full = torch.ops.tilefuse.all_gather_rows(dc, ctx.group)
    if ctx.needs_input_grad[1]:
        db = a.t() @ dc_full  # [K_loc, N]
    return da, db


def _linear_grads(ctx, a, b, g):
    """``(g @ b^T, a^T @ g)``, each where its input needs it."""
    return g @ b.t() if ctx.needs_input_grad[0] else None, a.t() @ g if ctx.needs_input_grad[1] else None


SPECS: dict[str, OpSpec] = {
    spec.name: spec for spec in (
        OpSpec("gemm_all_scatter", lambda M, K, N, W: (M, W * N), _back_gemm_all_scatter),
        OpSpec("all_gather_gemm", lambda M, K, N, W: (W * M, N), _back_all_gather_gemm),
        OpSpec("gemm_reduce_scatter", lambda M, K, N, W: (M // W, N), _back_gemm_reduce_scatter, rows_divisible=True),
        OpSpec("gemm_all_reduce", lambda M, K, N, W: (M, N), _linear_grads, bias=True),
    )
}


def _fake_out(spec: OpSpec, a, b, group, bias=None, scale_a=None, scale_b=None, out_dtype=None):
    check_operands(spec.name, a, b)
    scaled = check_scales(spec.name, a, b, scale_a, scale_b, out_dtype)
    W = world_size(group)
    if spec.rows_divisible:
        check_divisible(spec.name, "M (rows of a)", a.shape[0], W, "the world size")
    if bias is not None:
        from .gemm_all_reduce._prepare import check_bias

        check_bias(spec.name, bias, a, b)
    dtype = a.dtype if scaled is None else scaled.out_dtype
    return a.new_empty(spec.out_shape(a.shape[0], a.shape[1], b.shape[1], W), dtype=dtype)


def _no_float8_backward(ctx) -> None:
    if ctx.float8:
        raise NotImplementedError("tilefuse: float8 calls (scale_a=, scale_b=) are forward-only: no backward "
                                  "through them; call them under torch.no_grad() or with inputs that need no grad")


def _save(ctx, inputs, a):
    ctx.variant, ctx.group = inputs[2], inputs[4]
    ctx.scope = saved_scope()  # the backward's calls run under the forward's steps, as "backward"
    ctx.float8 = inputs[0].dtype in FLOAT8_DTYPES
    ctx.save_for_backward(a if ctx.needs_input_grad[1] else None, inputs[1] if ctx.needs_input_grad[0] else None)
    ctx.set_materialize_grads(False)


def _define(spec: OpSpec) -> None:
    def impl(a, b, variant, config, group, *args):
        bias, *scales = _split_bias(spec, args)
        kwargs = {"bias": bias} if bias is not None else {}
        return _owned(run(spec.name, a, b, variant, config, group, **kwargs, **_scaling(*scales)), a, b)

    def backward(ctx, dc):
        _no_float8_backward(ctx)
        grads = [None] * len(ctx.needs_input_grad)  # a, b, variant, config, group (, bias)
        if dc is not None:
            dc = dc.contiguous()
            grads[0], grads[1] = in_backward(ctx.scope, spec.backward, ctx, *ctx.saved_tensors, dc)
            # Each rank's c gets the bias once: its gradient is dc's row sum.
            if spec.bias and len(grads) > 5 and ctx.needs_input_grad[5]:
                grads[5] = dc.sum(0, dtype=torch.float32).to(dc.dtype)
        return tuple(grads)

    schema = f"({_ARGS}, Tensor? bias=None, {_SCALED}) -> Tensor" if spec.bias else f"({_ARGS}, {_SCALED}) -> Tensor"
    op = torch.library.custom_op(f"tilefuse::{spec.name}", impl, mutates_args=(), schema=schema)
    op.register_fake(lambda a, b, variant, config, group, *args: _fake_out(spec, a, b, group, *_split_bias(spec, args)))
    op.register_autograd(backward, setup_context=lambda ctx, inputs, output: _save(ctx, inputs, inputs[0]))


def _split_bias(spec: OpSpec, args: tuple) -> tuple:
    """``(bias, scale_a, scale_b, out_dtype)`` from the schema's arguments after ``group`` (left out: None)."""
    return ((args if spec.bias else (None, *args)) + (None,) * 4)[:4]


for _spec in SPECS.values():
    _define(_spec)


@torch.library.custom_op("tilefuse::all_gather_gemm_gathered", mutates_args=(),
                         schema=f"({_ARGS}, {_SCALED}) -> (Tensor, Tensor)")
def all_gather_gemm_gathered(a, b, variant, config, group, scale_a=None, scale_b=None, out_dtype=None):
    """all_gather_gemm returning the gathered A as well."""
    c, gathered = run("all_gather_gemm", a, b, variant, config, group, return_gathered=True,
                      **_scaling(scale_a, scale_b, out_dtype))
    return _owned(c, a, b), _owned(gathered, a, b)


@all_gather_gemm_gathered.register_fake
def _(a, b, variant, config, group, scale_a=None, scale_b=None, out_dtype=None):
    c = _fake_out(SPECS["all_gather_gemm"], a, b, group, None, scale_a, scale_b, out_dtype)
    return c, a.new_empty((c.shape[0], a.shape[1]))


def _gathered_grads(ctx, a_full, b, dc, dgathered):
    """``(da [M_loc, K], db [K, N], None...)`` of all_gather_gemm from ``dc`` (and the gathered A's grad)."""
    _no_float8_backward(ctx)
    da = db = None
    if dc is not None:
        dc = dc.contiguous()
        if ctx.needs_input_grad[0]:
            da = torch.ops.tilefuse.gemm_reduce_scatter(dc, b.t(), ctx.variant, None, ctx.group)
        if ctx.needs_input_grad[1]:
            db = a_full.t() @ dc  # [K, N]
    if dgathered is not None and ctx.needs_input_grad[0]:  # the gathered A was used downstream too
        extra = torch.ops.tilefuse.reduce_scatter_rows(dgathered.contiguous(), ctx.group)
        da = extra if da is None else da + extra
    return da, db, None, None, None, None, None, None


# db needs all_gather(a): the op's own second output
all_gather_gemm_gathered.register_autograd(
    lambda ctx, dc, dgathered: in_backward(ctx.scope, _gathered_grads, ctx, *ctx.saved_tensors, dc, dgathered),
    setup_context=lambda ctx, inputs, output: _save(ctx, inputs, output[1]))


@torch.library.custom_op("tilefuse::gemm_all_scatter_out", mutates_args=("out",),
                         schema="(Tensor a, Tensor b, Tensor(a!) out, str variant, int[]? config, "
                                f"str? group, {_SCALED}) -> ()")
def gemm_all_scatter_out(a, b, out, variant, config, group, scale_a=None, scale_b=None, out_dtype=None) -> None:
    """gemm_all_scatter into a caller's ``out``."""
    run("gemm_all_scatter", a, b, variant, config, group, out=out, **_scaling(scale_a, scale_b, out_dtype))


@gemm_all_scatter_out.register_fake
def _(a, b, out, variant, config, group, scale_a=None, scale_b=None, out_dtype=None) -> None:
    _fake_out(SPECS["gemm_all_scatter"], a, b, group, None, scale_a, scale_b, out_dtype)


# gemm_all_reduce with the residual-add + RMSNorm epilogue: ``(y, new_residual)`` (gemm_all_reduce/norm.py).
# Backward, g the gradient of s = all_reduce(a @ b) (+ bias) (+ residual): g = rms_norm_backward(dy) +
# d(new_residual); then gemm_all_reduce's formulas, d(residual) = g, d(norm_weight) = sum over rows of
# dy * s * rsqrt(mean(s^2) + eps).
def run_norm(a, b, variant: str, config, group, bias, residual, norm_weight, eps: float):
    """The entry point of ``variant`` with the epilogue; ``auto`` first resolves its choice (so that a
    fused_sequential choice runs the epilogue in its kernel)."""
    from .gemm_all_reduce.norm import check_norm_args, run_with_norm

    kwargs = {} if bias is None else {"bias": bias}
    if variant == "auto":
        check_norm_args("gemm_all_reduce", a, b, residual, norm_weight, eps)
        variant, _, chosen = resolve_auto("gemm_all_reduce", a, b, group, kwargs)[:3]
        config = chosen if config is None else config
    entry = lambda a, b, **kw: _entry("gemm_all_reduce", a, b, variant, config, group, **kw)
    return run_with_norm(entry, a, b, variant=variant, residual=residual, norm_weight=norm_weight, eps=eps, **kwargs)


@torch.library.custom_op("tilefuse::gemm_all_reduce_norm", mutates_args=(),
                         schema=f"({_ARGS}, Tensor? bias, Tensor? residual, Tensor norm_weight, float eps) "
                                "-> (Tensor, Tensor)")
def gemm_all_reduce_norm(a, b, variant, config, group, bias, residual, norm_weight, eps):
    y, s = run_norm(a, b, variant, decode_config(config), resolve_group(group), bias, residual, norm_weight, eps)
    others = (a, b) if residual is None else (a, b, residual)
    return _owned(y, *others), _owned(s, *others)


@gemm_all_reduce_norm.register_fake
def _(a, b, variant, config, group, bias, residual, norm_weight, eps):
    from .gemm_all_reduce.norm import check_norm_args

    c = _fake_out(SPECS["gemm_all_reduce"], a, b, group, bias)
    check_norm_args("gemm_all_reduce", a, b, residual, norm_weight, eps)
    return c, torch.empty_like(c)


def _norm_setup(ctx, inputs, output):
    needs = ctx.needs_input_grad
    ctx.eps = inputs[8]
    ctx.save_for_backward(inputs[0] if needs[1] else None, inputs[1] if needs[0] else None, output[1], inputs[7])
    ctx.set_materialize_grads(False)


def _norm_backward(ctx, dy, ds):
    from .gemm_all_reduce.norm import rms_norm_backward

    a, b, s, weight = ctx.saved_tensors
    needs = ctx.needs_input_grad  # a, b, variant, config, group, bias, residual, norm_weight, eps
    g, dweight = rms_norm_backward(s, weight, ctx.eps, dy, ds, needs[7])
    grads = [None] * 9
    if g is not None:
        g = g.contiguous()
        grads[0], grads[1] = _linear_grads(ctx, a, b, g)
        grads[5] = g.sum(0, dtype=torch.float32).to(g.dtype) if needs[5] else None
        grads[6] = g if needs[6] else None
    grads[7] = dweight
    return tuple(grads)


gemm_all_reduce_norm.register_autograd(_norm_backward, setup_context=_norm_setup)


@torch.library.custom_op("tilefuse::all_gather_rows", mutates_args=(), schema="(Tensor x, str? group) -> Tensor")
def all_gather_rows(x, group):
    """Every rank's ``x [R, C]`` stacked by rows in group-rank order: ``[W*R, C]``."""
    return _owned(all_gather_cat(x.contiguous(), dim=0, group=op_group(resolve_group(group))), x)


all_gather_rows.register_fake(lambda x, group: x.new_empty((world_size(group) * x.shape[0], *x.shape[1:])))


@torch.library.custom_op("tilefuse::reduce_scatter_rows", mutates_args=(), schema="(Tensor x, str? group) -> Tensor")
def reduce_scatter_rows(x, group):
    """Row block r of the sum over ranks of ``x [W*R, C]``: ``[R, C]``."""
    grp = op_group(resolve_group(group))
    check_divisible("reduce_scatter_rows", "rows of x", x.shape[0], dist.get_world_size(grp), "the world size")
    return _owned(reduce_scatter(x.contiguous(), grp), x)


@reduce_scatter_rows.register_fake
def _(x, group):
    W = world_size(group)
    check_divisible("reduce_scatter_rows", "rows of x", x.shape[0], W, "the world size")
    return x.new_empty((x.shape[0] // W, *x.shape[1:]))


_rows_setup = lambda ctx, inputs, output: setattr(ctx, "group", inputs[1])
all_gather_rows.register_autograd(
    lambda ctx, g: (torch.ops.tilefuse.reduce_scatter_rows(g.contiguous(), ctx.group), None), setup_context=_rows_setup)
reduce_scatter_rows.register_autograd(
    lambda ctx, g: (torch.ops.tilefuse.all_gather_rows(g.contiguous(), ctx.group), None), setup_context=_rows_setup)
