"""torch.compile(fullgraph=True) of code calling the ops and the nn layers, forward and backward.

Backend ``aot_eager`` on the CPU (the ops' kernels run in Triton's interpreter; AOTAutograd traces
the backward through the ops' autograd formulas), Inductor on a GPU. A counting backend proves one
graph with no break (fullgraph) and no recompile when new data of the same shapes comes in; the
compiled results match the same code run eagerly.

One compiled function per op runs every variant side by side (each on its own leaf tensors), so
each op costs one compilation per world size.
"""

import pytest
import torch
from ophelpers import assert_matches

import tilefuse
from tilefuse.nn import ColumnParallelLinear, RowParallelLinear
from tilefuse.ops import registry

WORLDS = [2, 3]
STEPS = 2  # compiled calls with fresh data after the first: the graph count must stay at one
# Tiny shapes: a [M, K] @ b [K, N]; M divisible by 2 and 3 (gemm_reduce_scatter scatters rows).
M, K, N = 12, 24, 20


def _variants(op: str) -> list:
    have = registry.variants(op)
    return [v for v in (*tilefuse.VARIANTS, "plain") if v in have] + ["auto"]


def _counter(ctx):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    return CompileCounterWithBackend("inductor" if ctx.on_gpu else "aot_eager")


def _data(ctx, op, step, dtype, count):
    """``count`` independent (a, b) leaf pairs (same values) and an output gradient for step ``step``."""
    g = torch.Generator().manual_seed(1000 * step + 10 * ctx.rank + 1)
    shared = torch.Generator().manual_seed(1000 * step)
    # gemm_all_scatter's a is the same on every rank; the others' are this rank's shard.
    a = torch.randn(M, K, generator=shared if op == "gemm_all_scatter" else g)
    b = torch.randn(K, N, generator=g)
    W = ctx.world
    out_shape = {"gemm_all_scatter": (M, W * N), "all_gather_gemm": (W * M, N),
                 "gemm_reduce_scatter": (M // W, N), "gemm_all_reduce": (M, N)}[op]
    dc = torch.randn(out_shape, generator=g).to(ctx.device, dtype)
    pairs = [(a.to(ctx.device, dtype).requires_grad_(), b.to(ctx.device, dtype).requires_grad_())
             for _ in range(count)]
    return pairs, dc


def _step(fn, op, pairs, dc):
    outs = fn(*[t for pair in pairs for t in pair])
    loss = sum((c.float() * dc.float()).sum() for c in outs)
    loss.backward()
    return [c.detach() for c in outs], [(a.grad, b.grad) for a, b in pairs]


def job_ops(ctx, op, dtype):
    variants = _variants(op)
    public = getattr(tilefuse, op)

    def fn(*tensors):
        return [public(tensors[2 * i], tensors[2 * i + 1], variant=v) for i, v in enumerate(variants)]

    cnt = _counter(ctx)
    compiled = torch.compile(fn, fullgraph=True, backend=cnt)
    K_tol = max(K, ctx.world * M)
    for step in range(STEPS + 1):
        pairs, dc = _data(ctx, op, step, dtype, len(variants))
        ref_pairs, _ = _data(ctx, op, step, dtype, len(variants))
        outs, grads = _step(compiled, op, pairs, dc)
        ref_outs, ref_grads = _step(fn, op, ref_pairs, dc)
        for v, c, ref, (da, db), (rda, rdb) in zip(variants, outs, ref_outs, grads, ref_grads):
            what = f"rank {ctx.rank}/{ctx.world} {op} {v} {dtype} step {step}"
            assert_matches(c, ref, dtype, K_tol, ctx.on_gpu, f"{what}: compiled output vs eager")
            assert_matches(da, rda, dtype, K_tol, ctx.on_gpu, f"{what}: compiled grad of a vs eager")
            assert_matches(db, rdb, dtype, K_tol, ctx.on_gpu, f"{what}: compiled grad of b vs eager")
        assert cnt.frame_count == 1, f"{op}: {cnt.frame_count} graphs after step {step} (recompiled)"
    tilefuse.barrier()
    return cnt.op_count


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("op", registry.OPS)
def test_ops_compile_fullgraph(pools, op, world):
    """Every variant of the op (and plain, auto) in one compiled graph, forward and backward."""
    dtype = torch.float32
    assert all(n >= 1 for n in pools.run(world, job_ops, op, dtype))


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
    for step in range(STEPS + 1):
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


@pytest.mark.parametrize("world,variant", [(2, "auto"), (3, "auto"), (2, "fused_sequential")])
def test_layers_compile_fullgraph(pools, world, variant):
    """ColumnParallelLinear + RowParallelLinear (a gated MLP) compiled forward + backward."""
    assert all(pools.run(world, job_layers, variant))
