"""torch.compile(fullgraph=True) of code calling the ops and the nn layers, forward and backward.

Backend ``aot_eager`` on the CPU (the ops' kernels run in Triton's interpreter; AOTAutograd traces
the backward through the ops' autograd formulas), Inductor on a GPU. A counting backend proves one
graph with no break (fullgraph) and no recompile when new data of the same shapes comes in.

One compiled function runs several (op, variant) calls side by side, each on its own leaf tensors
(one compilation per test); the compiled outputs and gradients are checked against the global fp32
computation of :mod:`test_autograd`.
"""

import pytest
import torch
from ophelpers import assert_matches
from test_autograd import M, N, check_grads, make_inputs, reference, variants

import tilefuse
from tilefuse.nn import ColumnParallelLinear, RowParallelLinear
from tilefuse.ops import registry

STEPS = 2  # the first call compiles; the second, with fresh data, must find the same graph
# W = 3 runs auto for every op, all in one graph (untuned shapes: a fused variant for
# gemm_all_scatter and all_gather_gemm, plain for gemm_reduce_scatter): the tracing does not depend
# on W beyond the fake's shape rule, and W = 2 covers every variant.


def _counter(ctx):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    return CompileCounterWithBackend("inductor" if ctx.on_gpu else "aot_eager")


def job_ops(ctx, calls, dtype, explicit_group=False):
    """``calls``: (op, variant) pairs, all run by one compiled function, each on its own leaves.
    ``explicit_group``: pass the world group object (traced as its name) instead of None."""
    group = torch.distributed.group.WORLD if explicit_group else None

    def fn(*tensors):
        return [getattr(tilefuse, op)(tensors[2 * i], tensors[2 * i + 1], variant=v, group=group)
                for i, (op, v) in enumerate(calls)]

    cnt = _counter(ctx)
    compiled = torch.compile(fn, fullgraph=True, backend=cnt)
    for step in range(STEPS):
        inputs = [make_inputs(ctx, op, dtype, seed=10 * step + i) for i, (op, _) in enumerate(calls)]
        refs = [reference(ctx, op, a, b, dc) for (op, _), (a, b, dc) in zip(calls, inputs)]
        leaves = [t.requires_grad_() for a, b, _ in inputs for t in (a, b)]
        outs = compiled(*leaves)
        sum((c.float() * dc.float()).sum() for c, (_, _, dc) in zip(outs, inputs)).backward()
        for (op, v), c, (a, b, _), ref in zip(calls, outs, inputs, refs):
            check_grads(ctx, f"rank {ctx.rank}/{ctx.world} compiled {op} {v} {dtype} step {step}", dtype,
                   (c.detach(), a.grad, b.grad), ref)
        assert cnt.frame_count == 1, f"{cnt.frame_count} graphs after step {step} (recompiled)"
    tilefuse.barrier()
    return cnt.op_count


# In make test the gathering op and the reducing op; every op in the slow set.
@pytest.mark.parametrize("op", [op if op in ("all_gather_gemm", "gemm_all_reduce")
                                else pytest.param(op, marks=pytest.mark.slow) for op in registry.OPS])
def test_ops_compile_fullgraph(pools, op):
    """W = 2: every variant of the op (and plain, auto) in one compiled graph, forward and backward."""
    calls = [(op, v) for v in variants(op) if v != "reference"]
    assert all(n >= len(calls) for n in pools.run(2, job_ops, calls, torch.float32))


@pytest.mark.slow
def test_ops_compile_fullgraph_world3(pools):
    """W = 3: every op (auto) in one compiled graph, forward and backward; the group passed explicitly."""
    calls = [(op, "auto") for op in registry.OPS]
    assert all(n >= len(calls) for n in pools.run(3, job_ops, calls, torch.float32, explicit_group=True))


class _MLP(torch.nn.Module):
    """Llama-style gated MLP on the TP layers: down(silu(gate(x)) * up(x)), sequence-parallel."""

    def __init__(self, d, f, variant, bias, device):
        super().__init__()
        kw = dict(variant=variant, device=device)
        self.gate = ColumnParallelLinear(d, f, bias=bias, seed=1, **kw)
        self.up = ColumnParallelLinear(d, f, bias=bias, seed=2, **kw)
        self.down = RowParallelLinear(f, d, bias=bias, seed=3, **kw)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def job_layers(ctx, variant):
    W = ctx.world
    model = _MLP(16, 8 * W, variant, True, ctx.device)
    cnt = _counter(ctx)
    compiled = torch.compile(model, fullgraph=True, backend=cnt)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 * step + ctx.rank)
        x = torch.randn(3, 2, 16, generator=g).to(ctx.device)  # [S_loc, B, d] sequence-first
        dy = torch.randn(3, 2, 16, generator=g).to(ctx.device)
        grads = []
        for run in (compiled, model):
            model.zero_grad()
            xi = x.clone().requires_grad_()
            y = run(xi)
            (y * dy).sum().backward()
            grads.append([y.detach(), xi.grad] + [p.grad.clone() for p in model.parameters()])
        for i, (got, ref) in enumerate(zip(*grads)):
            assert_matches(got, ref, torch.float32, 8 * W * 3, ctx.on_gpu,
                           f"rank {ctx.rank}/{W} {variant} step {step}: tensor {i} (output, dx, params)")
        assert cnt.frame_count == 1, f"{cnt.frame_count} graphs after step {step} (recompiled)"
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("world,variant", [(2, "fused_sequential"), pytest.param(3, "auto", marks=pytest.mark.slow)])
def test_layers_compile_fullgraph(pools, world, variant):
    """ColumnParallelLinear + RowParallelLinear (a gated MLP) compiled forward + backward."""
    assert all(pools.run(world, job_layers, variant))


def job_dispatch_paths(ctx):
    """Eager calls with no gradient skip the dispatcher (same result as the custom op); anything
    that traces (a dispatch mode, here a recording one) sees the custom op."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    a, b, _ = make_inputs(ctx, "gemm_reduce_scatter", torch.float32, seed=3)
    direct = tilefuse.gemm_reduce_scatter(a, b, variant="fused_sequential")
    via_op = torch.ops.tilefuse.gemm_reduce_scatter(a, b, "fused_sequential", None, None)
    assert torch.equal(direct, via_op)
    with Record() as rec:
        traced = tilefuse.gemm_reduce_scatter(a, b, variant="fused_sequential")
    assert "tilefuse.gemm_reduce_scatter.default" in rec.seen, rec.seen
    assert torch.equal(traced, direct)

    # Compiled out= (run into the op's buffer, copied into out) and return_gathered.
    a, b, _ = make_inputs(ctx, "gemm_all_scatter", torch.float32, seed=4)
    out = tilefuse.empty(M, ctx.world * N, dtype=torch.float32)
    eager = tilefuse.gemm_all_scatter(a, b, variant="bulk_sync")
    cnt = _counter(ctx)

    def into(a, b):
        return tilefuse.gemm_all_scatter(a, b, variant="bulk_sync", out=out) * 1

    got = torch.compile(into, fullgraph=True, backend=cnt)(a, b)
    assert torch.equal(out, eager) and torch.equal(got, eager) and cnt.frame_count == 1
    a, b, _ = make_inputs(ctx, "all_gather_gemm", torch.float32, seed=5)
    c, gathered = torch.compile(lambda a, b: tilefuse.all_gather_gemm(a, b, variant="wg_specialized",
                                                                      return_gathered=True), fullgraph=True,
                                backend=_counter(ctx))(a, b)
    c_ref, gathered_ref = tilefuse.all_gather_gemm(a, b, variant="wg_specialized", return_gathered=True)
    assert torch.equal(c, c_ref) and torch.equal(gathered, gathered_ref)
    tilefuse.barrier()
    return True


def test_eager_direct_path_dispatch_modes_out_and_gathered(pools):
    assert all(pools.run(2, job_dispatch_paths))


def job_all_reduce_bias(ctx, variants_):
    """gemm_all_reduce with a bias compiled (fullgraph: the bias is an argument of the custom op),
    forward and backward: c = all_reduce(a @ b) + bias, dbias = dc summed over rows (dc, bias shared)."""

    def fn(bias, *tensors):
        return [tilefuse.gemm_all_reduce(tensors[2 * i], tensors[2 * i + 1], variant=v, bias=bias)
                for i, v in enumerate(variants_)]

    cnt = _counter(ctx)
    compiled = torch.compile(fn, fullgraph=True, backend=cnt)
    for step in range(STEPS):
        inputs = [make_inputs(ctx, "gemm_all_reduce", torch.float32, seed=10 * step + i)
                  for i in range(len(variants_))]
        bias = torch.randn(N, generator=torch.Generator().manual_seed(7 + step)).to(ctx.device).requires_grad_()
        refs = [reference(ctx, "gemm_all_reduce", a, b, dc) for a, b, dc in inputs]
        leaves = [t.requires_grad_() for a, b, _ in inputs for t in (a, b)]
        outs = compiled(bias, *leaves)
        sum((c * dc).sum() for c, (_, _, dc) in zip(outs, inputs)).backward()
        for v, c, (a, b, _), (c_ref, da, db) in zip(variants_, outs, inputs, refs):
            check_grads(ctx, f"rank {ctx.rank} compiled gemm_all_reduce {v} + bias, step {step}", torch.float32,
                        (c.detach(), a.grad, b.grad), (c_ref + bias.detach(), da, db))
        dbias = sum(dc.sum(0) for _, _, dc in inputs)  # every call added the same bias
        assert_matches(bias.grad, dbias, torch.float32, M, ctx.on_gpu, f"rank {ctx.rank} grad of bias, step {step}")
        assert cnt.frame_count == 1, f"{cnt.frame_count} graphs after step {step} (recompiled)"
    tilefuse.barrier()
    return True


def test_all_reduce_bias_compiles_and_differentiates(pools):
    assert all(pools.run(2, job_all_reduce_bias, ["wg_specialized", "plain", "auto"]))


def job_split_k_config(ctx):
    """gemm_all_reduce's fused_sequential with a config that splits K, compiled (fullgraph: the config
    is an argument of the custom op), forward and backward, against the fp32 computation."""
    from test_gemm_all_reduce import SPLIT_CFGS

    cfg = tilefuse.Config(**SPLIT_CFGS[0])
    cnt = _counter(ctx)
    compiled = torch.compile(lambda a, b: tilefuse.gemm_all_reduce(a, b, variant="fused_sequential", config=cfg),
                             fullgraph=True, backend=cnt)
    for step in range(STEPS):
        a, b, dc = make_inputs(ctx, "gemm_all_reduce", torch.float32, seed=40 + step)
        ref = reference(ctx, "gemm_all_reduce", a, b, dc)
        a.requires_grad_()
        b.requires_grad_()
        c = compiled(a, b)
        (c * dc).sum().backward()
        check_grads(ctx, f"rank {ctx.rank} compiled split-K fused_sequential, step {step}", torch.float32,
                    (c.detach(), a.grad, b.grad), ref)
        assert cnt.frame_count == 1, f"{cnt.frame_count} graphs after step {step} (recompiled)"
    tilefuse.barrier()
    return True


def test_split_k_config_compiles(pools):
    assert all(pools.run(2, job_split_k_config))
