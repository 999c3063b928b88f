"""torch's ``ColwiseParallel`` and ``RowwiseParallel`` on tilefuse's fused ops (``tilefuse/nn/README.md``).

Parameters become DTensors as with torch's styles; the forward runs on the local shards with the op the
layouts call for (``Shard(d)``, d not the last dimension, shards tokens; moved to the front for the op):

=========  ================  ================  =============================================================
style      input layout      output layout     forward on rank r (backward)
=========  ================  ================  =============================================================
Colwise    Replicate         Shard(-1)         ``x @ w_r^T``, local (``dx = gemm_all_reduce(dy, w_r)``;
                                               a replicated DTensor input: ``dy @ w_r``, ``Partial()``)
Colwise    Replicate         Replicate         ``gemm_all_scatter(x, w_r^T)`` (``dx``: gemm_all_reduce)
Colwise    Shard(d)          Shard(-1)         ``all_gather_gemm`` over dim d (``dx``: gemm_reduce_scatter)
Rowwise    Shard(-1)         Replicate         ``gemm_all_reduce(x_r, w_r^T)`` (``dx = dy @ w_r``, local)
Rowwise    Shard(-1)         Shard(d)          ``gemm_reduce_scatter`` over dim d (``dx``: all_gather_gemm)
Rowwise    Replicate         either            this rank's input columns first (``dx`` all-gathered)
=========  ================  ================  =============================================================

Gradients follow DTensor's meaning; every forward and backward is collective over the mesh (:func:`tp_group`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel as _TorchColwise
from torch.distributed.tensor.parallel import RowwiseParallel as _TorchRowwise

from ..ops import calls
from ..ops.gemm_all_reduce import gemm_all_reduce
from ..ops.library import group_name
from ..runtime import get_heap, groups, init, is_initialized
from ..runtime.scope import in_backward, in_forward, saved_scope
from .functional import check_input, column_parallel_linear, row_parallel_linear

TP_DIM = "tp"  # the mesh dimension the styles use on a multi-dimensional mesh


def tp_mesh(device_mesh, who: str = "tilefuse.nn"):
    """The 1-D mesh the styles run on: ``device_mesh`` itself, or its ``"tp"`` dimension."""
    if getattr(device_mesh, "ndim", None) == 1:
        return device_mesh
    if TP_DIM in (getattr(device_mesh, "mesh_dim_names", None) or ()):
        return device_mesh[TP_DIM]
    raise ValueError(f"{who}: expected a 1-D DeviceMesh or one with a dimension named {TP_DIM!r}, got "
                     f"{device_mesh!r}; slice the tensor-parallel dimension first (mesh['tp'] for a mesh with "
                     "mesh_dim_names=('dp', 'tp'))")


def tp_group(device_mesh, who: str = "tilefuse.nn"):
    """The process group the ops run on for ``device_mesh``: the mesh's group if tilefuse serves it,
    else a served group of the same ranks in the same order, else the mesh's group after a collective
    ``tilefuse.init`` on it (with the default group's heap size if there is one)."""
    group = tp_mesh(device_mesh, who).get_group()
    if is_initialized(group):
        return group
    ranks = dist.get_process_group_ranks(group)
    for other in groups():
        if dist.get_process_group_ranks(other) == ranks:
            return other
    init(heap_size=get_heap().size if is_initialized() else None, group=group)
    return group


class TPLinearPlan:
    """How a parallelized ``nn.Linear`` runs (kind, layouts, mesh, group, variant); ``copy.deepcopy``
    keeps the same plan: process groups cannot be copied."""

    __slots__ = ("kind", "input_layout", "output_layout", "use_local_output", "mesh", "group", "group_name",
                 "world", "rank", "variant")

    def __init__(self, kind, input_layout, output_layout, use_local_output, mesh, group, variant):
        self.kind, self.input_layout, self.output_layout = kind, input_layout, output_layout
        self.use_local_output, self.mesh, self.group, self.variant = use_local_output, mesh, group, variant
        self.group_name = group_name(group)
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)

    def __deepcopy__(self, memo):
        return self

    def __repr__(self) -> str:
        return (f"{self.kind}: input {self.input_layout}, output {self.output_layout}, "
                f"rank {self.rank}/{self.world}, variant {self.variant!r}")


def _local(p):
    """The local shard of a DTensor parameter (differentiable where autograd needs it)."""
    if not isinstance(p, DTensor):
        return p
    if torch.compiler.is_compiling() or (torch.is_grad_enabled() and p.requires_grad):
        return p.to_local()
    return p._local_tensor  # no autograd needed: skip to_local's Function (host time at decode sizes)


def _token_dim(who: str, placement, x: torch.Tensor, what: str) -> int:
    d = placement.dim % x.dim()
    if d == x.dim() - 1:
        raise ValueError(f"{who}: the {what} layout Shard({placement.dim}) shards the feature dimension of a "
                         f"{x.dim()}-D activation; a token dimension (Shard(0) or Shard(1) for [B, S, H]) was expected")
    return d


def _input(who: str, plan: TPLinearPlan, x) -> tuple[torch.Tensor, bool]:
    """The local input (a DTensor redistributed to the input layout first), and whether its gradient
    may stay ``Partial()``: a replicated DTensor's, reduced once where it was made (torch's behaviour)."""
    if isinstance(x, DTensor):
        want = plan.input_layout
        want = Shard(want.dim % x.dim()) if isinstance(want, Shard) else want
        if tuple(x.placements) != (want,):
            x = x.redistribute(plan.mesh, (want,))
        if isinstance(want, Replicate) and plan.kind == "colwise":
            return x.to_local(grad_placements=(Partial(),)), True
        return x.to_local(), False
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{who}: input must be a torch.Tensor or DTensor, got {type(x).__name__}")
    return x, False


def _output(plan: TPLinearPlan, y: torch.Tensor):
    if plan.use_local_output:
        return y
    out = plan.output_layout
    out = Shard(out.dim % y.dim()) if isinstance(out, Shard) else out
    return DTensor.from_local(y, plan.mesh, (out,), run_check=False)


class _ColumnReplicated(torch.autograd.Function):
    """Colwise linear of a replicated ``x [M, in]``, ``w [n, in]``: ``x @ w^T + b`` ``[M, n]``, or with
    ``gather`` ``gemm_all_scatter(x, w^T) + all_gather(b)`` ``[M, W*n]``. Backward on ``g``, this rank's
    columns of ``dy``: ``dx = gemm_all_reduce(g, w)`` (or ``g @ w``, left ``Partial()``), ``dw = g^T @ x``."""

    @staticmethod
    def forward(ctx, x, w, b, group, variant, gather, rank, reduce_dx):
        if gather:
            y = calls.call("gemm_all_scatter", x, w.t(), variant=variant, config=None, group=group)
            if b is not None:
                y = y + torch.ops.tilefuse.all_gather_rows(b.reshape(1, -1), group).reshape(-1)
        else:
            y = torch.nn.functional.linear(x, w, b)
        ctx.save_for_backward(x, w)
        ctx.has_bias, ctx.group, ctx.variant, ctx.gather, ctx.rank = b is not None, group, variant, gather, rank
        ctx.reduce_dx, ctx.scope = reduce_dx, saved_scope()
        return y

    @staticmethod
    def backward(ctx, dy):
        return in_backward(ctx.scope, _ColumnReplicated.grads, ctx, dy)

    @staticmethod
    def grads(ctx, dy):
        x, w = ctx.saved_tensors
        n = w.shape[0]
        g = (dy[:, ctx.rank * n:(ctx.rank + 1) * n] if ctx.gather else dy).contiguous()  # [M, n]
        dx = None
        if ctx.needs_input_grad[0] and ctx.reduce_dx:
            dx = calls.call("gemm_all_reduce", g, w, variant=ctx.variant, config=None, group=ctx.group)
        elif ctx.needs_input_grad[0]:
            dx = g @ w  # this rank's share; the caller's DTensor reduces it (a Partial() gradient)
        dw = g.t() @ x if ctx.needs_input_grad[1] else None  # [n, in]
        db = g.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db, None, None, None, None, None


class _SplitFeatures(torch.autograd.Function):
    """This rank's block ``[..., n]`` of a replicated ``x [..., W*n]``; the backward all-gathers them."""

    @staticmethod
    def forward(ctx, x, group, world, rank):
        n = x.shape[-1] // world
        ctx.group, ctx.n, ctx.lead = group, n, x.shape[:-1]
        return x[..., rank * n:(rank + 1) * n].contiguous()

    @staticmethod
    def backward(ctx, g):
        cols = g.reshape(-1, ctx.n).t().contiguous()  # [n, T]
        full = torch.ops.tilefuse.all_gather_rows(cols, ctx.group)  # [W*n, T]
        return full.t().reshape(*ctx.lead, -1), None, None, None


def tp_forward(module: nn.Linear, x) -> torch.Tensor:
    """Forward of a linear parallelized by :class:`ColwiseParallel` or :class:`RowwiseParallel` (see the
    module docstring)."""
    plan: TPLinearPlan = module._tilefuse_tp
    colwise = plan.kind == "colwise"
    who = "ColwiseParallel" if colwise else "RowwiseParallel"
    x, partial_grad = _input(who, plan, x)
    w, b = _local(module.weight), _local(module.bias)
    if colwise:
        check_input(who, x, w, b, w.shape[1], "in_features")
        if isinstance(plan.input_layout, Replicate):
            gather = isinstance(plan.output_layout, Replicate)
            lead = x.shape[:-1]
            x2 = x.reshape(-1, x.shape[-1])
            grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, w, b))
            if not gather and not grad and not torch.compiler.is_compiling():
                y = torch.nn.functional.linear(x2, w, b)  # inference: nothing to differentiate
            else:
                y = _ColumnReplicated.apply(x2.contiguous(), w, b, plan.group_name, plan.variant, gather, plan.rank,
                                            not partial_grad)
            return _output(plan, y.reshape(*lead, y.shape[-1]))
        linear, d = column_parallel_linear, _token_dim(who, plan.input_layout, x, "input")
    else:
        if isinstance(plan.input_layout, Replicate):
            check_input(who, x, w, b, w.shape[1] * plan.world, "in_features")
            x = _SplitFeatures.apply(x, plan.group_name, plan.world, plan.rank)
        else:
            check_input(who, x, w, b, w.shape[1], "in_features / mesh size: the input's feature shard")
        if isinstance(plan.output_layout, Replicate):
            lead = x.shape[:-1]
            y = gemm_all_reduce(x.reshape(-1, x.shape[-1]).contiguous(), w.t(), variant=plan.variant,
                                group=plan.group, bias=b)
            return _output(plan, y.reshape(*lead, y.shape[-1]))
        linear, d = row_parallel_linear, _token_dim(who, plan.output_layout, x, "output")
        if x.shape[d] % plan.world != 0:
            raise ValueError(f"{who}: the token dimension (dim {d} of the input, size {x.shape[d]}) must be "
                             f"divisible by the mesh size ({plan.world}): the output layout "
                             f"Shard({plan.output_layout.dim}) reduce-scatters it")
    # tokens sharded along dim d: moved to the front for the dim-0 sequence-parallel linear, and back
    y = linear(x if d == 0 else x.movedim(d, 0), w, b, group=plan.group, variant=plan.variant)
    return _output(plan, y if d == 0 else y.movedim(0, d).contiguous())


class TPLinear(nn.Linear):
    """An ``nn.Linear`` after a tilefuse style: DTensor parameters, tilefuse forward."""

    def forward(self, x):
        return in_forward(tp_forward, self, x)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, tp=({self._tilefuse_tp!r})"


_MIXED: dict[tuple[type, type], type] = {(TPLinear, nn.Linear): TPLinear}


def mix_in(module: nn.Module, mixin: type, **attrs) -> None:
    """Make ``module`` an instance of ``mixin`` over its own class (keeping its methods), with ``attrs``."""
    cls = type(module)
    if issubclass(cls, mixin):
        return
    if (mixin, cls) not in _MIXED:
        _MIXED[mixin, cls] = type(f"{mixin.__name__.lstrip('_')}{cls.__name__}", (mixin, cls),
                                  {"__module__": mixin.__module__})
    module.__class__ = _MIXED[mixin, cls]
    for name, value in attrs.items():
        object.__setattr__(module, name, value)  # not nn.Module's: a module value is no submodule


class _TilefuseStyle:
    """Constructor checks and ``_apply`` of the two styles; ``KIND``, ``SHARDS``, ``LAYOUTS`` set by each."""

    KIND = ""
    SHARDS: tuple = ()  # (weight placement, bias placement)
    LAYOUTS: tuple = ()  # (input placements allowed, output placements allowed)

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output: bool = True,
                 variant: str = "auto"):
        super().__init__(input_layouts=input_layouts, output_layouts=output_layouts, use_local_output=use_local_output)
        who = type(self).__name__
        inp, out = self.input_layouts[0], self.output_layouts[0]
        for name, value, allowed in zip(("input_layouts", "output_layouts"), (inp, out), self.LAYOUTS):
            if not isinstance(value, allowed):
                names = " or ".join(f"{t.__name__}()" if t is Replicate else f"{t.__name__}(dim)" for t in allowed)
                raise ValueError(f"{who}: {name} must be {names}, got {value!r}")
        if not isinstance(variant, str):
            raise TypeError(f"{who}: variant must be a string, got {type(variant).__name__}")
        self.variant = variant
        side, feature = ("output", out) if self.KIND == "colwise" else ("input", inp)  # the side sharded by features
        if isinstance(feature, Shard) and feature.dim != -1:
            raise ValueError(f"{who}: {side}_layouts Shard({feature.dim}): a {self.KIND} {side} is sharded along its "
                             "last (feature) dimension; pass Shard(-1) (or Replicate())")
        if self.KIND == "colwise" and isinstance(out, Replicate) and isinstance(inp, Shard):
            raise ValueError(f"{who}: input_layouts {inp} with output_layouts Replicate() is not "
                             "supported: gather the tokens (Replicate() input) or keep the output Shard(-1)")

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        who = type(self).__name__
        device_mesh = tp_mesh(device_mesh, who)
        if isinstance(module, nn.Embedding):
            return super()._apply(module, device_mesh)  # torch's own embedding sharding and hooks
        if not isinstance(module, nn.Linear):
            raise TypeError(f"{who}: tilefuse's styles parallelize nn.Linear (and nn.Embedding, as torch's "
                            f"styles do), got {type(module).__name__}")
        if isinstance(module.weight, DTensor):
            raise ValueError(f"{who}: this {type(module).__name__} is already parallelized (its weight is a DTensor)")
        group = tp_group(device_mesh, who)
        world = dist.get_world_size(group)
        what = "out_features" if self.KIND == "colwise" else "in_features"
        if (split := getattr(module, what)) % world != 0:
            raise ValueError(f"{who}: {what} = {split} must be divisible by the mesh size ({world}): the weight "
                             "is split evenly along it")
        # distribute_tensor for an even split: a broadcast of group rank src's full parameter (None: each
        # keeps its own), then local slicing (gloo cannot scatter CUDA tensors)
        src = getattr(self, "src_data_rank", 0)
        for name, layout in zip(("weight", "bias"), self.SHARDS):
            if (param := getattr(module, name)) is not None:
                full = param.detach().to(get_heap(group).device)
                if src is not None and world > 1:
                    full = full.contiguous().clone()
                    dist.broadcast(full, src=dist.get_global_rank(group, src), group=group)
                if isinstance(layout, Shard):
                    full = full.chunk(world, layout.dim)[dist.get_rank(group)].contiguous()
                dparam = DTensor.from_local(full, device_mesh, [layout], run_check=False)
                module.register_parameter(name, nn.Parameter(dparam, requires_grad=param.requires_grad))
        if type(module).forward is not nn.Linear.forward:
            raise TypeError(f"{who}: {type(module).__name__} overrides nn.Linear.forward; only linears that run "
                            "nn.Linear's own forward can be parallelized by tilefuse (use torch's styles for it)")
        mix_in(module, TPLinear)
        module._tilefuse_tp = TPLinearPlan(self.KIND, self.input_layouts[0], self.output_layouts[0],
                                           self.use_local_output, device_mesh, group, self.variant)
        return module

    def __repr__(self) -> str:
        return (f"tilefuse.nn.{type(self).__name__}(input_layouts={self.input_layouts[0]}, output_layouts="
                f"{self.output_layouts[0]}, use_local_output={self.use_local_output}, variant={self.variant!r})")


class ColwiseParallel(_TilefuseStyle, _TorchColwise):
    """torch's ``ColwiseParallel`` for ``nn.Linear``, run on tilefuse's ops.

    Args:
        input_layouts: ``Replicate()`` (default: the whole input ``[..., in]`` on every rank) or
            ``Shard(d)``, tokens sharded along dim ``d`` (``Shard(1)`` for ``[B, S/W, in]``).
        output_layouts: ``Shard(-1)`` (default: ``[..., out/W]``, this rank's output features) or
            ``Replicate()`` (``[..., out]`` on every rank; replicated input only).
        use_local_output: return a plain tensor (default) or a DTensor with the output layout.
        variant: ``"auto"`` (default), ``"plain"``, ``"reference"`` or one of ``tilefuse.VARIANTS``.

    Weight ``[out, in]`` and bias become ``Shard(0)``. ``nn.Embedding`` gets torch's own sharding.
    """

    KIND = "colwise"
    SHARDS = (Shard(0), Shard(0))
    LAYOUTS = ((Replicate, Shard), (Shard, Replicate))


class RowwiseParallel(_TilefuseStyle, _TorchRowwise):
    """torch's ``RowwiseParallel`` for ``nn.Linear``, run on tilefuse's ops.

    Args:
        input_layouts: ``Shard(-1)`` (default: ``[..., in/W]``, what a colwise layer returns) or
            ``Replicate()`` (``[..., in]``: this rank's columns are taken).
        output_layouts: ``Replicate()`` (default: ``[..., out]``, the sum over ranks, the same bits on
            every rank) or ``Shard(d)``, tokens sharded along dim ``d`` (``Shard(1)``: ``[B, S/W, out]``).
        use_local_output, variant: as for :class:`ColwiseParallel`.

    Weight ``[out, in]`` becomes ``Shard(1)``, the bias ``Replicate()`` (added once, after the sum).
    ``nn.Embedding`` gets torch's own sharding.
    """

    KIND = "rowwise"
    SHARDS = (Shard(1), Replicate())
    LAYOUTS = ((Shard, Replicate), (Replicate, Shard))
