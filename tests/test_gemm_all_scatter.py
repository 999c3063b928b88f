"""gemm_all_scatter: every variant against the reference, W = 1..4, ragged shapes, epochs."""

import time

import pytest
from ophelpers import assert_matches, dtypes, poison_workspaces, randn

import tilefuse
from tilefuse.ops import registry

OP = "gemm_all_scatter"
WORLDS = [1, 2, 3, 4]
# (M, N_loc, K): ragged in every dimension; M smaller than one block; block-aligned.
SHAPES = [(100, 72, 56), (10, 40, 32), (64, 64, 64)]


def _inputs(ctx, M, N, K, dtype, seed):
    a = randn((M, K), dtype, ctx.device, seed=seed)  # the same on every rank
    # Each rank's shard scaled by (rank + 1): a misrouted block shows.
    b = randn((K, N), dtype, ctx.device, seed=seed * 100 + ctx.rank + 1, scale=ctx.rank + 1)
    return a, b


def job_against_reference(ctx, variant, shapes, calls, config=None, use_out=False, late_rank=None,
                          b_transposed=False):
    fn = registry.get(OP, variant)
    seed = 0
    for M, N, K in shapes:
        for dtype in dtypes(ctx.on_gpu):
            out = tilefuse.empty(M, ctx.world * N, dtype=dtype) if use_out else None
            for call in range(calls):
                seed += 1
                a, b = _inputs(ctx, M, N, K, dtype, seed)
                if b_transposed:
                    b = b.t().contiguous().t()
                ref = registry.get(OP, "reference")(a, b)
                poison_workspaces()
                if out is not None:
                    out.fill_(float("nan"))
                    tilefuse.barrier()
                if late_rank is not None and ctx.rank == late_rank:
                    time.sleep(0.5)
                cfg = tilefuse.Config(**config) if config else None
                got = fn(a, b, config=cfg, out=out)
                tilefuse.synchronize()
                if out is not None:
                    assert got is out
                assert_matches(got, ref, dtype, K, ctx.on_gpu, f"{variant} {M}x{N}x{K} {dtype} call {call}",
                               scale=ctx.world)
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("variant", tilefuse.VARIANTS)
def test_variant_matches_reference(pools, variant, world):
    assert all(pools.run(world, job_against_reference, variant, SHAPES, calls=1))


@pytest.mark.parametrize("variant", tilefuse.VARIANTS)
def test_epochs_out_and_late_rank(pools, variant):
    """Five calls in a row into a caller-owned heap `out`, one rank starting late each time."""
    assert all(pools.run(3, job_against_reference, variant, [(100, 72, 56)], calls=5, use_out=True,
                         late_rank=2))


@pytest.mark.parametrize("variant", ["producer_consumer", "wg_specialized", "fused_sequential"])
def test_non_default_config(pools, variant, on_gpu):
    """Small blocks, several communication programs, a transposed (column-major) b."""
    cfg = dict(BLOCK_M=32, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=1,
               GEMM_SMS=3, COMM_SMS=3)
    assert all(pools.run(2, job_against_reference, variant, [(70, 40, 24)], calls=2, config=cfg,
                         b_transposed=True))
