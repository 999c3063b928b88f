"""Workspaces stay bounded (LRU under a byte budget, the same on every rank), clear_workspaces() is
collective, and degenerate shapes (M, N or K = 0) give correct empty or zero results on every op x
variant."""

import pytest
import torch
from ophelpers import randn

import tilefuse
from tilefuse.ops import registry
from tilefuse.ops.common import arena

OPS = ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter")
VARIANTS = ("bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized")


def job_many_shapes(ctx, shapes, budget_fraction):
    """Hundreds of distinct shapes through a small heap: no HeapFullError, bounded bytes, same keys."""
    saved, arena.WORKSPACE_FRACTION = arena.WORKSPACE_FRACTION, budget_fraction
    try:
        heap = ctx.heap
        base_used = heap.bytes_used
        peak = 0
        for i, (rows, n, k) in enumerate(shapes):
            op = OPS[i % 3]
            m = rows * ctx.world if op == "gemm_reduce_scatter" else rows
            a = randn((m, k), torch.float16, ctx.device, seed=i)
            b = randn((k, n), torch.float16, ctx.device, seed=1000 + i + ctx.rank)
            out = registry.get(op, VARIANTS[i % 4])(a, b)
            if i % 50 == 0:
                ref = registry.get(op, "reference")(a, b)
                torch.testing.assert_close(out.float(), ref.float(), rtol=1e-2, atol=0.2)
            peak = max(peak, arena.workspace_bytes())
            assert arena.workspace_bytes() <= arena.workspace_budget(heap)
        keys = [str(k) for k in arena.workspace_keys()]
        del a, b, out
        tilefuse.clear_workspaces()
        assert arena.workspace_bytes() == 0
        assert heap.bytes_used <= base_used, (heap.bytes_used, base_used)
        return peak, keys
    finally:
        arena.WORKSPACE_FRACTION = saved


@pytest.mark.slow
def test_hundreds_of_shapes_stay_bounded(pools):
    g = torch.Generator().manual_seed(0)
    shapes = [tuple(int(x) for x in torch.randint(1, 48, (3,), generator=g)) for _ in range(24)]
    out = pools.run(2, job_many_shapes, shapes, 0.001, timeout=600)
    (peak0, keys0), (peak1, keys1) = out
    assert keys0 == keys1, "ranks evicted different workspaces"
    assert peak0 > 0


def job_degenerate(ctx, op, dims_list):
    for variant in VARIANTS:
        for rows, n, k in dims_list:
            m = rows * ctx.world if op == "gemm_reduce_scatter" else rows
            a = randn((m, k), torch.float32, ctx.device, seed=3)
            b = randn((k, n), torch.float32, ctx.device, seed=4 + ctx.rank)
            ref = registry.get(op, "reference")(a, b)
            got = registry.get(op, variant)(a, b)
            what = f"{op}/{variant} M={m} N={n} K={k}"
            assert got.shape == ref.shape, (what, got.shape, ref.shape)
            torch.testing.assert_close(got, ref, msg=lambda msg, what=what: f"{what}: {msg}")
            tilefuse.synchronize()
    return True


@pytest.mark.parametrize("op", OPS)
def test_degenerate_shapes(pools, op):
    """M = 0, N = 0 and K = 0 (an empty sum: zeros) on every variant."""
    assert all(pools.run(2, job_degenerate, op, [(0, 24, 16), (16, 0, 16), (16, 24, 0)]))
