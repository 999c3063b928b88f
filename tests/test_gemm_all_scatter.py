"""gemm_all_scatter: every variant against the reference, W = 1..4, ragged shapes, epochs."""

import time

import pytest
import torch
from ophelpers import assert_matches, dtypes, flagged_first, poison_workspaces, randn, variant_world_matrix

import tilefuse
from tilefuse.ops import registry

OP = "gemm_all_scatter"
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
                    time.sleep(0.2)  # the peers' consumers must wait for this rank
                cfg = tilefuse.Config(**config) if config else None
                got = fn(a, b, config=cfg, out=out)
                tilefuse.synchronize()
                if out is not None:
                    assert got is out
                assert_matches(got, ref, dtype, K, ctx.on_gpu, f"{variant} {M}x{N}x{K} {dtype} call {call}",
                               scale=ctx.world)
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("variant, world", variant_world_matrix(tilefuse.VARIANTS))
def test_variant_matches_reference(pools, variant, world):
    assert all(pools.run(world, job_against_reference, variant, SHAPES, calls=1))


@pytest.mark.parametrize("variant", flagged_first(tilefuse.VARIANTS))
def test_epochs_out_and_late_rank(pools, variant):
    """Three calls in a row into a caller-owned heap `out`, one rank starting late each time."""
    assert all(pools.run(3, job_against_reference, variant, [(100, 72, 56)], calls=3, use_out=True,
                         late_rank=2))


@pytest.mark.parametrize("variant", ["producer_consumer", "wg_specialized", "fused_sequential"])
def test_non_default_config(pools, variant, on_gpu):
    """Small blocks, several communication programs, a transposed (column-major) b."""
    cfg = dict(BLOCK_M=32, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=1,
               GEMM_SMS=3, COMM_SMS=3)
    assert all(pools.run(2, job_against_reference, variant, [(70, 40, 24)], calls=2, config=cfg,
                         b_transposed=True))


def job_result_buffers(ctx, variants):
    """Where the result lives without a heap ``out``: this rank's block is stored straight into it and
    the peers' blocks are copied from the heap. A default result is a fresh tensor off the heap that
    the next call leaves alone; an ordinary contiguous ``out`` is the result itself; a strided one
    (a transposed view) receives it. Ragged shape, NaN-poisoned outputs and workspaces."""
    M, N, K = 100, 72, 56
    dt = torch.float16 if ctx.on_gpu else torch.float32
    for vi, variant in enumerate(variants):
        fn = registry.get(OP, variant)
        a, b = _inputs(ctx, M, N, K, dt, seed=300 + vi)
        ref = registry.get(OP, "reference")(a, b)
        poison_workspaces()
        first = fn(a, b)
        assert not ctx.heap.is_on_heap(first), f"{variant}: the default result is on the heap"
        kept = first.clone()
        tilefuse.synchronize()
        assert_matches(first, ref, dt, K, ctx.on_gpu, f"{variant} default", scale=ctx.world)
        a2, b2 = _inputs(ctx, M, N, K, dt, seed=400 + vi)
        ref2 = registry.get(OP, "reference")(a2, b2)
        for form in ("contiguous", "strided"):
            if form == "contiguous":
                out = torch.full((M, ctx.world * N), float("nan"), dtype=dt, device=ctx.device)
            else:
                out = torch.full((ctx.world * N, M), float("nan"), dtype=dt, device=ctx.device).t()
            poison_workspaces()
            got = fn(a2, b2, out=out)
            tilefuse.synchronize()
            assert got is out, f"{variant} {form} out"
            assert_matches(out, ref2, dt, K, ctx.on_gpu, f"{variant} {form} out", scale=ctx.world)
        assert torch.equal(first, kept), f"{variant}: a later call changed an earlier default result"
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("world", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_result_off_the_heap(pools, world):
    assert all(pools.run(world, job_result_buffers, list(tilefuse.VARIANTS)))


def job_no_comm_programs(ctx):
    """The variants with communication programs refuse COMM_SMS = 0 on every rank, and a call after
    the refusals is right."""
    a, b = _inputs(ctx, 24, 8, 16, torch.float32, seed=9)
    cfg = tilefuse.Config(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, num_warps=4, num_stages=1,
                          GEMM_SMS=4, COMM_SMS=0)
    for variant in ("producer_consumer", "wg_specialized"):
        with pytest.raises(ValueError, match="COMM_SMS"):
            registry.get(OP, variant)(a, b, config=cfg)
    got = registry.get(OP, "producer_consumer")(a, b, config=cfg.replace(COMM_SMS=2))
    assert_matches(got, registry.get(OP, "reference")(a, b), torch.float32, 16, ctx.on_gpu, "after", scale=2)
    tilefuse.barrier()
    return True


def test_comm_variants_refuse_no_comm_programs(pools):
    assert all(pools.run(2, job_no_comm_programs))


def job_changing_split(ctx, splits):
    """One shape, calls with different COMM_SMS in turn: every call must wait for exactly its own
    communication programs (the completion counter must not mix splits)."""
    M, N, K = 40, 24, 16
    for call, comm_sms in enumerate(splits):
        a, b = _inputs(ctx, M, N, K, torch.float16, seed=50 + call)
        ref = registry.get(OP, "reference")(a, b)
        poison_workspaces()
        cfg = tilefuse.Config(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=1,
                              GEMM_SMS=2, COMM_SMS=comm_sms)
        got = registry.get(OP, "wg_specialized")(a, b, config=cfg)
        tilefuse.synchronize()
        assert_matches(got, ref, torch.float16, K, ctx.on_gpu, f"call {call} COMM_SMS={comm_sms}", scale=ctx.world)
    tilefuse.barrier()
    return True


def test_wg_split_changes_between_calls(pools):
    assert all(pools.run(2, job_changing_split, [2, 3, 1, 3]))


def job_mismatched_shards(ctx):
    """Rank 1 passes a wider shard: every rank must raise (no hang, no write past a buffer)."""
    N = 16 if ctx.rank == 1 else 8
    a, b = _inputs(ctx, 24, N, 16, torch.float16, seed=7)
    with pytest.raises(ValueError, match="ranks disagree"):
        registry.get(OP, "fused_sequential")(a, b)
    # The op still works afterwards with agreeing shapes.
    a, b = _inputs(ctx, 24, 8, 16, torch.float16, seed=8)
    got = registry.get(OP, "fused_sequential")(a, b)
    assert_matches(got, registry.get(OP, "reference")(a, b), torch.float16, 16, ctx.on_gpu, "after", scale=2)
    tilefuse.barrier()
    return True


def test_mismatched_shards_raise_on_every_rank(pools):
    assert all(pools.run(2, job_mismatched_shards))


def job_empty_k(ctx, variant):
    a = torch.zeros(12, 0, dtype=torch.float16, device=ctx.device)
    b = torch.zeros(0, 8, dtype=torch.float16, device=ctx.device)
    got = registry.get(OP, variant)(a, b)
    assert got.shape == (12, 8 * ctx.world) and torch.count_nonzero(got) == 0
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("variant", tilefuse.VARIANTS)
def test_empty_k_gives_zeros(pools, variant):
    assert all(pools.run(2, job_empty_k, variant))


def job_clear_workspaces(ctx):
    import gc

    tilefuse.clear_workspaces()
    gc.collect()
    before = ctx.heap.bytes_used
    a, b = _inputs(ctx, 64, 32, 16, torch.float16, seed=3)
    registry.get(OP, "wg_specialized")(a, b)
    tilefuse.barrier()
    grown = ctx.heap.bytes_used
    tilefuse.clear_workspaces()
    gc.collect()
    assert grown > before and ctx.heap.bytes_used == before, (before, grown, ctx.heap.bytes_used)
    return True


def test_clear_workspaces_gives_heap_back(pools):
    assert all(pools.run(2, job_clear_workspaces))


@pytest.mark.parametrize("world", [1, 2])
def test_plain_path_into_out(pools, world):
    """The plain path (what auto runs where the table says plain) writes ``out=`` like the variants."""
    assert all(pools.run(world, job_against_reference, "plain", SHAPES[:2], calls=1, use_out=True))


def job_plain_bad_out(ctx):
    a = randn((8, 16), torch.float16, ctx.device, seed=1)
    b = randn((16, 4), torch.float16, ctx.device, seed=2)
    plain = registry.get(OP, "plain")
    W = ctx.world
    with pytest.raises(ValueError, match=r"out has shape \(8, 4\), expected \(8, 8\)"):
        plain(a, b, out=torch.empty(8, 4, dtype=torch.float16, device=ctx.device))
    with pytest.raises(TypeError, match="out has dtype torch.float32"):
        plain(a, b, out=torch.empty(8, 4 * W, dtype=torch.float32, device=ctx.device))
    with pytest.raises(ValueError, match="out has shape"):  # would broadcast silently under copy_
        plain(a, b, out=torch.empty(1, 4 * W, dtype=torch.float16, device=ctx.device))
    return True


def test_plain_path_rejects_a_wrong_out(pools):
    assert all(pools.run(2, job_plain_bad_out))


def job_out_overlapping_an_operand(ctx, variant):
    """``out`` sharing memory with ``a`` (or ``b``) raises on every rank, also after calls of the same
    shapes and strides with an out of its own."""
    W, N = ctx.world, 8
    cfg = None if variant == "plain" else tilefuse.Config(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, num_warps=4,
                                                         num_stages=1, GEMM_SMS=4, COMM_SMS=0)
    kw = {} if cfg is None else {"config": cfg}
    fn, ref = registry.get(OP, variant), registry.get(OP, "reference")
    for i in range(3):
        a = randn((48, W * N), torch.float16, ctx.device, seed=10 + i)  # [M, K] with K = W * N: out's shape
        b = randn((W * N, N), torch.float16, ctx.device, seed=20 + i + ctx.rank)
        out = torch.empty_like(a)
        assert_matches(fn(a, b, out=out, **kw), ref(a, b), torch.float16, W * N, ctx.on_gpu, f"{variant} call {i}")
    with pytest.raises(ValueError, match="out overlaps a"):
        fn(a, b, out=a, **kw)
    big = torch.zeros(W * N + 48, W * N, dtype=torch.float16, device=ctx.device)
    b_in_big, out_in_big = big[:W * N, :N], big[W * N:]  # disjoint parts of one tensor: accepted
    b_in_big.copy_(b)
    assert_matches(fn(a, b_in_big, out=out_in_big, **kw), ref(a, b), torch.float16, W * N, ctx.on_gpu, "disjoint")
    with pytest.raises(ValueError, match="out overlaps b"):
        fn(a, big[:W * N, :N], out=big[:48], **kw)
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("variant", ["fused_sequential", "bulk_sync", "plain"])
def test_out_overlapping_an_operand_is_refused(pools, variant):
    assert all(pools.run(2, job_out_overlapping_an_operand, variant))
