"""Autograd of the raw ops against torch's, for every op and variant.

The reference is the global computation in fp32: every rank gathers all ranks' ``a``, ``b`` and
output gradients (torch.distributed), builds every rank's output from them with torch.matmul and
backpropagates ``sum over ranks s of <c_s, dc_s>``; rank r's gradients are those of its own ``a``
and ``b``. That is the tensor-parallel convention (the backward of an all-gather is a
reduce-scatter, and the other way round). ``gemm_all_reduce`` follows Megatron's row-parallel
convention (the all-reduce's backward is the identity): its output gradient is the same on every
rank and counts once.
"""

import pytest
import torch
from ophelpers import assert_matches

import tilefuse
from tilefuse.ops import registry
from tilefuse.ops.common.collectives import all_gather_cat

M, K, N = 12, 24, 20  # M divisible by 2 and 3


def variants(op: str) -> list:
    have = registry.variants(op)
    return [v for v in (*tilefuse.VARIANTS, "plain", "reference") if v in have] + ["auto"]


def out_shape(op: str, W: int) -> tuple:
    return {"gemm_all_scatter": (M, W * N), "all_gather_gemm": (W * M, N),
            "gemm_reduce_scatter": (M // W, N), "gemm_all_reduce": (M, N)}[op]


def make_inputs(ctx, op: str, dtype, seed: int):
    """This rank's ``a``, ``b`` and output gradient ``dc`` (``a`` shared for gemm_all_scatter, ``dc``
    shared for gemm_all_reduce: those are replicated on every rank in their layer)."""
    own = torch.Generator().manual_seed(seed * 100 + ctx.rank + 1)
    shared = torch.Generator().manual_seed(seed * 100)
    a = torch.randn(M, K, generator=shared if op == "gemm_all_scatter" else own)
    b = torch.randn(K, N, generator=own)
    dc = torch.randn(out_shape(op, ctx.world), generator=shared if op == "gemm_all_reduce" else own)
    return tuple(t.to(ctx.device, dtype) for t in (a, b, dc))


def _gather(ctx, t: torch.Tensor) -> list:
    """Every rank's ``t`` (fp32, this rank's device), in rank order."""
    stacked = all_gather_cat(t.float().unsqueeze(0).contiguous(), dim=0)
    return list(stacked.unbind(0))


def reference(ctx, op: str, a, b, dc, dgathered=None):
    """``(c, da, db)`` of rank ``ctx.rank`` from the global fp32 computation (see the module doc).

    ``dgathered``: gradient of all_gather_gemm's gathered A, when the caller used it too."""
    W, r = ctx.world, ctx.rank
    As = [t.requires_grad_() for t in _gather(ctx, a)]
    Bs = [t.requires_grad_() for t in _gather(ctx, b)]
    dCs = _gather(ctx, dc)
    if op == "gemm_all_scatter":
        c_all = [torch.cat([At @ Bt for At, Bt in zip(As, Bs)], dim=1)] * W
    elif op == "all_gather_gemm":
        a_full = torch.cat(As, dim=0)
        c_all = [a_full @ Bs_ for Bs_ in Bs]
    elif op == "gemm_reduce_scatter":
        total = sum(At @ Bt for At, Bt in zip(As, Bs))
        c_all = list(total.chunk(W, dim=0))
    elif op == "gemm_all_reduce":
        total = sum(At @ Bt for At, Bt in zip(As, Bs))
        c_all, dCs = [total], dCs[:1]  # replicated output: its gradient counts once
    else:
        raise ValueError(op)
    loss = sum((c * d).sum() for c, d in zip(c_all, dCs))
    if dgathered is not None:
        loss = loss + sum((torch.cat(As, dim=0) * g).sum() for g in _gather(ctx, dgathered))
    loss.backward()
    return c_all[min(r, len(c_all) - 1)].detach(), As[r].grad, Bs[r].grad


def check_grads(ctx, what, dtype, got, ref):
    K_tol = ctx.world * max(M, K, N)
    for name, g, rf in zip(("output", "grad of a", "grad of b"), got, ref):
        assert g is not None, f"{what}: no {name}"
        scale = max(1.0, float(rf.abs().max()))
        assert_matches(g, rf.to(dtype), dtype, K_tol, ctx.on_gpu, f"{what}: {name}", scale=scale)


def job_variants(ctx, op, dtype, names):
    fn = getattr(tilefuse, op)
    for i, v in enumerate(names):
        a, b, dc = make_inputs(ctx, op, dtype, seed=i)
        ref = reference(ctx, op, a, b, dc)
        a.requires_grad_()
        b.requires_grad_()
        c = fn(a, b, variant=v)
        assert c.grad_fn is not None, f"{op} {v}: output has no grad_fn"
        c.backward(dc)
        check_grads(ctx, f"rank {ctx.rank}/{ctx.world} {op} {v} {dtype}", dtype, (c.detach(), a.grad, b.grad), ref)
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("op", registry.OPS)
def test_grads_every_variant(pools, op):
    """W = 2, fp32: outputs and both gradients of every variant against the global fp32 computation."""
    assert all(pools.run(2, job_variants, op, torch.float32, variants(op)))


@pytest.mark.parametrize("op", registry.OPS)
def test_grads_world3_half(pools, op):
    """W = 3 (not a power of two), fp16, a fused variant (the formulas do not depend on the variant)."""
    assert all(pools.run(3, job_variants, op, torch.float16, ["fused_sequential"]))


def job_partial_and_gathered(ctx):
    """Only one operand requiring grad; the gathered A used downstream; the single-output op's own
    weight gradient; gemm_all_scatter's out= (not differentiable, like torch's out= functions)."""
    W = ctx.world
    dt = torch.float32
    who = f"rank {ctx.rank}/{W}"
    for op in registry.OPS:
        fn = getattr(tilefuse, op)
        a, b, dc = make_inputs(ctx, op, dt, seed=7)
        _, ref_da, ref_db = reference(ctx, op, a, b, dc)
        for need in ("a", "b"):
            x, y = a.clone().requires_grad_(need == "a"), b.clone().requires_grad_(need == "b")
            fn(x, y, variant="bulk_sync").backward(dc)
            got, ref, other = (x, ref_da, y) if need == "a" else (y, ref_db, x)
            assert other.grad is None
            assert_matches(got.grad, ref, dt, W * K, ctx.on_gpu, f"{who} {op}: grad of {need} alone")

    op = "all_gather_gemm"
    a, b, dc = make_inputs(ctx, op, dt, seed=8)
    dg = torch.randn(W * M, K, generator=torch.Generator().manual_seed(ctx.rank + 50)).to(ctx.device)
    ref = reference(ctx, op, a, b, dc, dgathered=dg)
    x, y = a.clone().requires_grad_(), b.clone().requires_grad_()
    c, gathered = tilefuse.all_gather_gemm(x, y, variant="producer_consumer", return_gathered=True)
    torch.autograd.backward([c, gathered], [dc, dg])
    check_grads(ctx, f"{who} all_gather_gemm with the gathered A in the loss", dt, (c.detach(), x.grad, y.grad), ref)
    # torch.ops.tilefuse.all_gather_gemm keeps no gathered A: its backward gathers a again for db.
    ref = reference(ctx, op, a, b, dc)
    x, y = a.clone().requires_grad_(), b.clone().requires_grad_()
    c = torch.ops.tilefuse.all_gather_gemm(x, y, "wg_specialized", None, None)
    c.backward(dc)
    check_grads(ctx, f"{who} torch.ops.tilefuse.all_gather_gemm", dt, (c.detach(), x.grad, y.grad), ref)

    op = "gemm_all_scatter"
    a, b, _ = make_inputs(ctx, op, dt, seed=9)
    out = tilefuse.empty(M, W * N, dtype=dt)
    with pytest.raises(RuntimeError, match=r"out=\.\.\. arguments don't support automatic differentiation"):
        tilefuse.gemm_all_scatter(a.clone().requires_grad_(), b, variant="bulk_sync", out=out)
    with torch.no_grad():
        got = tilefuse.gemm_all_scatter(a.clone().requires_grad_(), b, variant="bulk_sync", out=out)
    assert got is out
    ref_c = reference(ctx, op, a, b, torch.zeros(M, W * N, device=ctx.device))[0]
    assert_matches(out, ref_c, dt, K, ctx.on_gpu, f"{who} gemm_all_scatter out= under no_grad")
    tilefuse.barrier()
    return True


def test_partial_grads_gathered_output_and_out(pools):
    assert all(pools.run(2, job_partial_and_gathered))


def test_bad_arguments_are_named():
    from tilefuse.ops import library

    with pytest.raises(TypeError, match="config must be a tilefuse.Config or None, got dict"):
        library.encode_config({"BLOCK_M": 64})
    with pytest.raises(ValueError, match=f"expected {len(library._CONFIG_FIELDS)} ints"):
        library.decode_config([64, 64])
    with pytest.raises(TypeError, match="group must be a torch.distributed ProcessGroup"):
        library.group_name(3)
    cfg = tilefuse.Config(64, 32, 16, 8, 4, 1, 2, 1)
    assert library.decode_config(library.encode_config(cfg)) == cfg
    with pytest.raises(TypeError, match="variant must be a string"):
        tilefuse.gemm_reduce_scatter(torch.ones(2, 2), torch.ones(2, 2), variant=None)
    with pytest.raises(TypeError, match="gemm_reduce_scatter: a must be a torch.Tensor, got list"):
        tilefuse.gemm_reduce_scatter([[1.0]], torch.ones(2, 2), variant="plain")
