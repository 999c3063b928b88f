"""tilefuse.nn: TP layers (forward + backward) against an unsharded nn.Linear, plan swap, HF LlamaMLP."""

import copy
import importlib.util

import pytest
import torch
from ophelpers import assert_matches
from torch import nn

import tilefuse
from tilefuse.nn import (
    LLAMA_MLP_PLAN,
    ColumnParallelLinear,
    RowParallelLinear,
    parallelize,
)
from tilefuse.ops import registry

WORLDS = [2, 3, pytest.param(4, marks=pytest.mark.slow)]  # W = 4: GPU runs and `make test-all`
LAYER_VARIANTS = ["reference", "auto"]
HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
# (bias, local leading dims, forward steps before one backward): plain tokens; sequence-first
# [S, B] leading dims; two forwards before the backward (a saved gathered input must survive them).
COLUMN_CASES = [(True, (5,), 1), (False, (3, 2), 2)]
ROW_CASES = [(True, (3, 2), 2), (False, (5,), 1)]


def _rand(shape, seed, device):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(device)


def _close(ctx, got, ref, K, what):
    scale = max(1.0, float(ref.abs().max()))
    assert_matches(got, ref, torch.float32, K, ctx.on_gpu, f"rank {ctx.rank}/{ctx.world}: {what}", scale=scale)


def _column_case(ctx, variant, bias, lead_loc, steps, seed):
    """ColumnParallelLinear vs nn.Linear: rank r feeds tokens block r, gets all tokens x its columns."""
    W, r = ctx.world, ctx.rank
    in_f, out_f = 24, 8 * W
    torch.manual_seed(seed)
    lin = nn.Linear(in_f, out_f, bias=bias).to(ctx.device)
    layer = ColumnParallelLinear.from_linear(lin, variant=variant)
    d0, n = lead_loc[0], out_f // W
    rows, cols = slice(r * d0, (r + 1) * d0), slice(r * n, (r + 1) * n)
    full_lead = (W * d0, *lead_loc[1:])
    loss_ref, loss = 0.0, 0.0
    xs = []
    for step in range(steps):
        x = _rand((*full_lead, in_f), seed * 10 + step, ctx.device).requires_grad_()
        dy = _rand((*full_lead, out_f), seed * 10 + 5 + step, ctx.device)
        y_ref = lin(x)
        x_loc = x.detach()[rows].clone().requires_grad_()
        y = layer(x_loc)
        _close(ctx, y, y_ref[..., cols], in_f, f"column {variant} bias={bias} lead={lead_loc} output {step}")
        loss_ref = loss_ref + (y_ref * dy).sum()
        loss = loss + (y * dy[..., cols]).sum()
        xs.append((x, x_loc))
    loss_ref.backward()
    loss.backward()
    K = max(W * d0, in_f, out_f) * steps
    what = f"column {variant} bias={bias} lead={lead_loc}"
    for step, (x, x_loc) in enumerate(xs):
        _close(ctx, x_loc.grad, x.grad[rows], out_f, f"{what}: input grad {step}")
    _close(ctx, layer.weight.grad, lin.weight.grad[cols], K, f"{what}: weight grad")
    if bias:
        _close(ctx, layer.bias.grad, lin.bias.grad[cols], K, f"{what}: bias grad")
    else:
        assert layer.bias is None


def _row_case(ctx, variant, bias, lead, steps, seed):
    """RowParallelLinear vs nn.Linear: rank r feeds all tokens x its input columns, gets tokens block r."""
    W, r = ctx.world, ctx.rank
    in_f, out_f = 8 * W, 24
    lead = (W * lead[0], *lead[1:])  # dim 0 must divide by W
    torch.manual_seed(seed)
    lin = nn.Linear(in_f, out_f, bias=bias).to(ctx.device)
    layer = RowParallelLinear.from_linear(lin, variant=variant)
    d0, n = lead[0] // W, in_f // W
    rows, cols = slice(r * d0, (r + 1) * d0), slice(r * n, (r + 1) * n)
    loss_ref, loss = 0.0, 0.0
    xs = []
    for step in range(steps):
        x = _rand((*lead, in_f), seed * 10 + step, ctx.device).requires_grad_()
        dy = _rand((*lead, out_f), seed * 10 + 5 + step, ctx.device)
        y_ref = lin(x)
        x_in = x.detach()[..., cols].clone().requires_grad_()
        y = layer(x_in)
        _close(ctx, y, y_ref[rows], in_f, f"row {variant} bias={bias} lead={lead} output {step}")
        loss_ref = loss_ref + (y_ref * dy).sum()
        loss = loss + (y * dy[rows]).sum()
        xs.append((x, x_in))
    loss_ref.backward()
    loss.backward()
    K = max(lead[0], in_f, out_f) * steps
    what = f"row {variant} bias={bias} lead={lead}"
    for step, (x, x_in) in enumerate(xs):
        _close(ctx, x_in.grad, x.grad[..., cols], out_f, f"{what}: input grad {step}")
    _close(ctx, layer.weight.grad, lin.weight.grad[:, cols], K, f"{what}: weight grad")
    if bias:
        _close(ctx, layer.bias.grad, lin.bias.grad, K, f"{what}: bias grad (replicated, full)")


def job_layers(ctx, variant):
    for i, (bias, lead, steps) in enumerate(COLUMN_CASES):
        _column_case(ctx, variant, bias, lead, steps, seed=100 + i)
    for i, (bias, lead, steps) in enumerate(ROW_CASES):
        _row_case(ctx, variant, bias, lead, steps, seed=200 + i)
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("variant", LAYER_VARIANTS)
def test_layers_match_nn_linear(pools, variant, world):
    """Outputs, input grads, weight and bias grad slices; bias on/off; [S, B] leading dims."""
    assert all(pools.run(world, job_layers, variant))


def job_gathered_in_workspace(ctx):
    """A variant may hand back its gathered input in a heap workspace that the next call reuses."""
    from tilefuse.nn import functional

    real = functional.all_gather_gemm
    buffers = {}

    def workspace_returning(a, b, **kwargs):
        c, gathered = real(a, b, **kwargs)
        key = (tuple(gathered.shape), gathered.dtype)
        if key not in buffers:
            buffers[key] = tilefuse.empty(*gathered.shape, dtype=gathered.dtype)
        buffers[key].data.copy_(gathered)  # as a kernel writes: no autograd version bump
        return (c, buffers[key]) if kwargs.get("return_gathered") else c

    functional.all_gather_gemm = workspace_returning
    try:
        _column_case(ctx, "reference", True, (3, 2), steps=2, seed=300)
    finally:
        functional.all_gather_gemm = real
    tilefuse.barrier()
    return True


def test_saved_input_survives_workspace_reuse(pools):
    """Two forwards, then one backward, with the gathered input handed back in a reused heap buffer."""
    assert all(pools.run(2, job_gathered_in_workspace))


def job_layers_quick(ctx, variant):
    _column_case(ctx, variant, True, (3, 2), 1, seed=400)
    _row_case(ctx, variant, True, (3, 2), 1, seed=500)
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("variant", tilefuse.VARIANTS)
def test_layers_every_variant(pools, variant):
    """Each registered fused variant under both layers (transposed-view b, gathered input and grad)."""
    if variant not in registry.variants("all_gather_gemm") or variant not in registry.variants(
            "gemm_reduce_scatter"):
        pytest.skip(f"{variant} is not registered for both ops yet")
    assert all(pools.run(2, job_layers_quick, variant))


def job_init(ctx):
    W, r = ctx.world, ctx.rank
    col = ColumnParallelLinear(16, 4 * W, bias=True, seed=11, device=ctx.device)
    torch.manual_seed(11)
    ref = nn.Linear(16, 4 * W, bias=True).to(ctx.device)
    assert torch.equal(col.weight, ref.weight[4 * r:4 * (r + 1)])
    assert torch.equal(col.bias, ref.bias[4 * r:4 * (r + 1)])
    row = RowParallelLinear(4 * W, 12, bias=True, seed=12, device=ctx.device, dtype=torch.float16)
    torch.manual_seed(12)
    ref = nn.Linear(4 * W, 12, bias=True).to(ctx.device)
    assert row.weight.dtype == torch.float16 and row.weight.shape == (12, 4)
    assert torch.equal(row.weight, ref.weight[:, 4 * r:4 * (r + 1)].half())
    assert torch.equal(row.bias, ref.bias.half())
    torch.manual_seed(1000 + r)  # the ranks' own generators disagree: the seed must come from rank 0
    shared = RowParallelLinear(4 * W, 12, bias=True, device=ctx.device)
    return shared.bias.detach().cpu(), shared.weight.detach().cpu()


@pytest.mark.parametrize("world", [2, 3])
def test_init_is_sharded_nn_linear(pools, world):
    """A seed gives rank r its slice of nn.Linear's init; without one, rank 0's seed is shared."""
    out = pools.run(world, job_init)
    biases, weights = zip(*out)
    for b in biases[1:]:
        assert torch.equal(b, biases[0]), "replicated bias differs across ranks: seed not shared"
    assert not torch.equal(weights[0], weights[1]), "ranks hold the same weight columns"
    full = torch.cat(weights, dim=1)
    bound = 1.0 / full.shape[1] ** 0.5  # kaiming_uniform(a=sqrt(5)) on fan_in = full in_features
    assert float(full.abs().max()) <= bound


class _Gated(nn.Module):
    """Llama-style gated MLP in plain torch: down(silu(gate(x)) * up(x))."""

    def __init__(self, d, f, bias):
        super().__init__()
        self.gate_proj = nn.Linear(d, f, bias=bias)
        self.up_proj = nn.Linear(d, f, bias=bias)
        self.down_proj = nn.Linear(f, d, bias=bias)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class _Block(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.fc_in = nn.Linear(d, f, bias=True)
        self.act = nn.GELU()
        self.fc_out = nn.Linear(f, d, bias=True)

    def forward(self, x):
        return self.fc_out(self.act(self.fc_in(x)))


class _Toy(nn.Module):
    def __init__(self, d=16, f=24):
        super().__init__()
        self.blocks = nn.ModuleList([_Block(d, f), _Block(d, f)])
        self.mlp = _Gated(d, f, bias=False)
        self.head = nn.Linear(d, d)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        x = x + self.mlp(x)
        return self.head(x)


TOY_PLAN = {"blocks.*.fc_in": "colwise_seq", "blocks.?.fc_out": "rowwise_seq"}


def job_parallelize(ctx):
    W, r = ctx.world, ctx.rank
    torch.manual_seed(3)
    full = _Toy(f=12 * W).to(ctx.device)
    tp = copy.deepcopy(full)
    assert parallelize(tp, TOY_PLAN) is tp
    parallelize(tp, LLAMA_MLP_PLAN)  # bare names match "mlp.gate_proj" etc.
    for i in range(2):
        assert isinstance(tp.blocks[i].fc_in, ColumnParallelLinear)
        assert isinstance(tp.blocks[i].fc_out, RowParallelLinear)
    assert isinstance(tp.mlp.gate_proj, ColumnParallelLinear) and isinstance(tp.mlp.up_proj, ColumnParallelLinear)
    assert isinstance(tp.mlp.down_proj, RowParallelLinear)
    assert type(tp.head) is nn.Linear and isinstance(tp.blocks[0].act, nn.GELU)

    T_loc = 3
    x = _rand((W * T_loc, 16), 7, ctx.device).requires_grad_()
    dy = _rand((W * T_loc, 16), 8, ctx.device)
    y_ref = full(x)
    (y_ref * dy).sum().backward()
    rows = slice(r * T_loc, (r + 1) * T_loc)
    x_loc = x.detach()[rows].clone().requires_grad_()
    y = tp(x_loc)
    _close(ctx, y, y_ref[rows], 16, "toy output")
    (y * dy[rows]).sum().backward()
    _close(ctx, x_loc.grad, x.grad[rows], 16, "toy input grad")
    n = 12
    for name in ("blocks.0.fc_in", "blocks.1.fc_in", "mlp.gate_proj", "mlp.up_proj"):
        got, ref = tp.get_submodule(name), full.get_submodule(name)
        _close(ctx, got.weight.grad, ref.weight.grad[r * n:(r + 1) * n], W * T_loc, f"{name} weight grad")
        if ref.bias is not None:
            _close(ctx, got.bias.grad, ref.bias.grad[r * n:(r + 1) * n], W * T_loc, f"{name} bias grad")
    for name in ("blocks.0.fc_out", "blocks.1.fc_out", "mlp.down_proj"):
        got, ref = tp.get_submodule(name), full.get_submodule(name)
        _close(ctx, got.weight.grad, ref.weight.grad[:, r * n:(r + 1) * n], W * T_loc, f"{name} weight grad")
        if ref.bias is not None:
            _close(ctx, got.bias.grad, ref.bias.grad, W * T_loc, f"{name} bias grad")
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("world", [2, 3])
def test_parallelize_plan_with_globs(pools, world):
    """Glob plan + LLAMA_MLP_PLAN on a toy model: swapped types, output and grads match unsharded."""
    assert all(pools.run(world, job_parallelize))


def job_hf_llama_mlp(ctx, variant, bias):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    W, r = ctx.world, ctx.rank
    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, hidden_act="silu", mlp_bias=bias,
                      num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=1, vocab_size=32)
    torch.manual_seed(5)
    full = LlamaMLP(cfg).to(ctx.device)
    tp = parallelize(copy.deepcopy(full), LLAMA_MLP_PLAN, variant=variant)
    T_loc = 4
    x = _rand((W * T_loc, 64), 9, ctx.device).requires_grad_()
    dy = _rand((W * T_loc, 64), 10, ctx.device)
    y_ref = full(x)
    (y_ref * dy).sum().backward()
    rows = slice(r * T_loc, (r + 1) * T_loc)
    x_loc = x.detach()[rows].clone().requires_grad_()
    y = tp(x_loc)  # LlamaMLP's own forward, unchanged
    _close(ctx, y, y_ref[rows], 96, "LlamaMLP output")
    (y * dy[rows]).sum().backward()
    _close(ctx, x_loc.grad, x.grad[rows], 96, "LlamaMLP input grad")
    n = 96 // W
    for name in ("gate_proj", "up_proj"):
        got, ref = getattr(tp, name), getattr(full, name)
        _close(ctx, got.weight.grad, ref.weight.grad[r * n:(r + 1) * n], W * T_loc, f"{name} weight grad")
        if bias:
            _close(ctx, got.bias.grad, ref.bias.grad[r * n:(r + 1) * n], W * T_loc, f"{name} bias grad")
    _close(ctx, tp.down_proj.weight.grad, full.down_proj.weight.grad[:, r * n:(r + 1) * n], W * T_loc,
           "down_proj weight grad")
    if bias:
        _close(ctx, tp.down_proj.bias.grad, full.down_proj.bias.grad, W * T_loc, "down_proj bias grad")
    tilefuse.barrier()
    return True


@pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="transformers is not installed (pip install transformers, "
                    "or the tilefuse[hf] extra): the HF LlamaMLP check needs it")
@pytest.mark.parametrize("world,variant,bias",
                         [(2, "auto", True), pytest.param(3, "auto", False, marks=pytest.mark.slow)])
def test_hf_llama_mlp(pools, world, variant, bias):
    """A random tiny HF LlamaMLP, parallelized with LLAMA_MLP_PLAN: token shard of output, grad slices."""
    assert all(pools.run(world, job_hf_llama_mlp, variant, bias))


def job_bad_inputs(ctx):
    def raises(exc, match, fn, *args, **kwargs):
        with pytest.raises(exc, match=match):
            fn(*args, **kwargs)

    dev = ctx.device
    raises(ValueError, r"ColumnParallelLinear: out_features = 15 must be divisible by the world size \(2\)",
           ColumnParallelLinear, 16, 15, seed=0)
    raises(ValueError, r"RowParallelLinear: in_features = 15 must be divisible by the world size \(2\)",
           RowParallelLinear, 15, 16, seed=0)
    raises(ValueError, r"RowParallelLinear: in_features = 15", RowParallelLinear.from_linear, nn.Linear(15, 4))
    raises(TypeError, r"from_linear: expected an nn.Linear, got GELU", ColumnParallelLinear.from_linear, nn.GELU())
    row = RowParallelLinear(8, 4, seed=0, device=dev)
    raises(ValueError, r"token dimension \(dim 0 of the input, size 5\) must be divisible by the world size "
           r"\(2\): the forward reduce-scatters", row, torch.randn(5, 4, device=dev))
    raises(ValueError, r"size 3\) must be divisible", row, torch.randn(3, 2, 4, device=dev))
    col = ColumnParallelLinear(16, 8, seed=0, device=dev)
    raises(ValueError, r"ColumnParallelLinear: input has 12 features .* expected 16", col,
           torch.randn(3, 12, device=dev))
    raises(ValueError, r"must have a token dimension", col, torch.randn(16, device=dev))
    raises(TypeError, r"input has dtype torch.float16 but the weight has dtype torch.float32", col,
           torch.randn(3, 16, device=dev).half())

    model = _Toy()
    raises(ValueError, r"plan entry 'blocks.\*.nope' matches no submodule of _Toy", parallelize, model,
           {"blocks.*.nope": "colwise"})
    raises(TypeError, r"'blocks.\*.act' matches 'blocks.0.act', a GELU; only nn.Linear", parallelize, model,
           {"blocks.*.fc_in": "colwise", "blocks.*.act": "colwise"})
    raises(ValueError, r"unknown style 'diagonal'; styles are \['colwise', 'colwise_gather_output', 'colwise_rep', "
           r"'colwise_seq', 'rowwise', 'rowwise_rep', 'rowwise_seq', 'rowwise_split_input'\] or ParallelStyle",
           parallelize, model, {"head": "diagonal"})
    raises(ValueError, r"'blocks.0.fc_in' is matched as 'colwise' by 'blocks.\*' and as 'rowwise'", parallelize,
           model, {"blocks.*": "colwise", "blocks.0.fc_in": "rowwise"})
    raises(TypeError, r"plan must be a mapping", parallelize, model, [("head", "colwise")])
    assert all(type(m) is nn.Linear for n, m in model.named_modules() if n.endswith(("fc_in", "fc_out"))), \
        "a rejected plan replaced modules"
    tilefuse.barrier()
    return True


def test_bad_inputs(pools):
    assert all(pools.run(2, job_bad_inputs))


def test_needs_torch_distributed():
    with pytest.raises(RuntimeError, match=r"ColumnParallelLinear: torch.distributed is not initialised"):
        ColumnParallelLinear(16, 8, seed=0)


def job_tp_size_one_is_nn_linear(ctx):
    """At TP size 1 (auto, plain) both layers and both functional forms dispatch exactly nn.Linear's ops."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from tilefuse.nn.functional import column_parallel_linear, row_parallel_linear

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    def ops_of(fn, x):
        rec = Record()
        rec.seen = []
        with rec:
            y = fn(x)
        return rec.seen, y

    lin = nn.Linear(24, 16).to(ctx.device)
    x = _rand((5, 24), 1, ctx.device)
    want, ref = ops_of(lin, x)
    for variant in ("auto", "plain"):
        for layer in (ColumnParallelLinear.from_linear(lin, variant=variant),
                      RowParallelLinear.from_linear(lin, variant=variant)):
            got, y = ops_of(layer, x)
            assert got == want and torch.equal(y, ref), (type(layer).__name__, variant, got, want)
        for fn in (column_parallel_linear, row_parallel_linear):
            got, y = ops_of(lambda x, fn=fn, v=variant: fn(x, lin.weight, lin.bias, variant=v), x)
            assert got == want and torch.equal(y, ref), (fn.__name__, variant, got, want)
    return True


def test_tp_size_one_is_nn_linear(pools):
    assert all(pools.run(1, job_tp_size_one_is_nn_linear))
