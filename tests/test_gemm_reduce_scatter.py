"""gemm_reduce_scatter: every variant against the reference, W = 1..4, ragged shapes, epochs, determinism,
bit-identical results across variants, staging in the input dtype."""

import time

import pytest
import torch
from ophelpers import assert_matches, dtypes, flagged_first, poison_workspaces, randn, variant_world_matrix

import tilefuse
from tilefuse.ops import registry
from tilefuse.ops.common import arena

OP = "gemm_reduce_scatter"
# Bits of kernel results are compared across tilings here: `.ci/run` runs these again under a
# second OpenBLAS core type (see harness.install_fixed_order_dot).
pytestmark = pytest.mark.bits
# (rows per rank, N, K_loc), M = W * rows: ragged in every dimension; rows smaller than one block;
# block-aligned.
SHAPES = [(37, 72, 56), (5, 40, 24), (64, 64, 64)]
# Small blocks (several tiles per owner and per program), several reduction programs, and one warp,
# so that the reduction works through a tile in two [16, 64] blocks.
SMALL_CFG = dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=16, GROUP_M=2, num_warps=1, num_stages=1,
                 GEMM_SMS=3, COMM_SMS=3)


def _inputs(ctx, M, N, K, dtype, seed, b_transposed=False):
    # Every rank holds a different K shard; A is scaled by (rank + 1), so a partial that is
    # dropped, doubled or routed to the wrong owner shows.
    a = randn((M, K), dtype, ctx.device, seed=seed * 100 + ctx.rank + 1, scale=ctx.rank + 1)
    b = randn((K, N), dtype, ctx.device, seed=seed * 100 + 50 + ctx.rank)
    if b_transposed:
        b = b.t().contiguous().t()  # column-major [K, N]
    return a, b


def _check(ctx, got, ref, dtype, K, what):
    # The sum of W partials, rank r's scaled by (r + 1): the error grows with the sum of the scales.
    scale = ctx.world * (ctx.world + 1) / 2
    assert_matches(got, ref, dtype, K, ctx.on_gpu, what, scale=scale)


def job_against_reference(ctx, variant, shapes, calls, config=None, late=False, b_transposed=False,
                          dtype_list=None):
    fn = registry.get(OP, variant)
    cfg = tilefuse.Config(**config) if config else None
    seed = 0
    for rows, N, K in shapes:
        M = ctx.world * rows
        for dtype in dtype_list or dtypes(ctx.on_gpu):
            for call in range(calls):
                seed += 1
                a, b = _inputs(ctx, M, N, K, dtype, seed, b_transposed)
                ref = registry.get(OP, "reference")(a, b)
                poison_workspaces()
                if late and ctx.rank == call % ctx.world:
                    time.sleep(0.2)  # the others must wait for this rank's partials
                got = fn(a, b, config=cfg)
                tilefuse.synchronize()
                _check(ctx, got, ref, dtype, K, f"{variant} M={M} N={N} K={K} {dtype} call {call}")
    tilefuse.barrier()
    return True


def job_back_to_back(ctx, variant, rows, N, K, calls):
    """Calls with different inputs and no host synchronisation between them: a rank that finishes
    call e early starts pushing call e+1's partials while its peers still sum call e's. The last
    call repeats the first one's inputs and must give the same bits (fixed summation order)."""
    dtype = torch.float32
    M = ctx.world * rows
    inputs = [_inputs(ctx, M, N, K, dtype, seed=200 + i) for i in range(calls - 1)]
    inputs.append(inputs[0])
    refs = [registry.get(OP, "reference")(a, b) for a, b in inputs]
    poison_workspaces()
    fn = registry.get(OP, variant)
    outs = [fn(a, b) for a, b in inputs]
    tilefuse.synchronize()
    for i, (got, ref) in enumerate(zip(outs, refs)):
        _check(ctx, got, ref, dtype, K, f"{variant} back-to-back call {i}")
    assert torch.equal(outs[0], outs[-1]), f"{variant}: two runs on the same inputs differ"
    tilefuse.barrier()
    return True


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of t (torch.equal alone would take -0.0 for +0.0)."""
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _workspace_buffer(kind: str, key: tuple) -> torch.Tensor:
    """This op's cached ``kind`` buffer ("stage" or "run") whose workspace key ends with ``key``."""
    found = [ws.buffers[kind] for k, ws in zip(arena.workspace_keys(), arena.workspaces()) if k == (OP, kind) + key]
    assert len(found) == 1, f"{kind} workspace {key}: {len(found)} found, keys {arena.workspace_keys()}"
    return found[0]


def job_variants_bit_identical(ctx, variants, rows, N, K, dtype_list, config):
    """Every variant gives the very bits of every other (one summation order, one rounding of the
    partials, the running sum in fp32), and stages its partials in the input dtype."""
    cfg = tilefuse.Config(**config)
    M = ctx.world * rows
    for dtype in dtype_list:
        a, b = _inputs(ctx, M, N, K, dtype, seed=31)
        ref = registry.get(OP, "reference")(a, b)
        outs = {}
        for variant in variants:
            poison_workspaces()
            outs[variant] = registry.get(OP, variant)(a, b, config=cfg)
            tilefuse.synchronize()
            _check(ctx, outs[variant], ref, dtype, K, f"{variant} {dtype}")
        first = variants[0]
        for variant in variants[1:]:
            differ = (_bits(outs[variant]) != _bits(outs[first])).sum().item()
            assert differ == 0, f"{dtype}: {variant} and {first} differ in {differ} of {ref.numel()} elements"
        stage = _workspace_buffer("stage", (dtype, ctx.world, rows, N))
        assert stage.dtype == dtype and tuple(stage.shape) == (ctx.world, rows, N), (stage.dtype, stage.shape)
    # One stage per dtype, and one fp32 running sum (W >= 3) whatever the dtype.
    assert len({_workspace_buffer("stage", (d, ctx.world, rows, N)).data_ptr() for d in dtype_list}) == len(dtype_list)
    if ctx.world >= 3:
        assert _workspace_buffer("run", (ctx.world, rows, N)).dtype == torch.float32
    tilefuse.barrier()
    return True


def job_ragged_k_shards(ctx, variants, rows, N, k_per_rank):
    """K shards of different sizes per rank (one of them empty), an empty M, the public entry point."""
    dtype = torch.float16
    K = k_per_rank[ctx.rank]
    a, b = _inputs(ctx, ctx.world * rows, N, K, dtype, seed=11)
    ref = registry.get(OP, "reference")(a, b)
    empty_a = torch.zeros((0, K), dtype=dtype, device=ctx.device)
    for variant in variants:
        fn = registry.get(OP, variant)
        poison_workspaces()
        got = fn(a, b)
        tilefuse.synchronize()
        _check(ctx, got, ref, dtype, max(k_per_rank), f"{variant} K shards {k_per_rank}")
        nothing = fn(empty_a, b)
        assert nothing.shape == (0, N) and nothing.dtype == dtype
    got = tilefuse.gemm_reduce_scatter(a, b)  # variant="auto"
    tilefuse.synchronize()
    _check(ctx, got, ref, dtype, max(k_per_rank), "auto")
    tilefuse.barrier()
    return True


def job_bad_input(ctx, variants):
    """Every rank raises a clear error before any communication."""
    dev = ctx.device
    a = torch.zeros((ctx.world * 5 + 1, 8), dtype=torch.float16, device=dev)
    b = torch.zeros((8, 16), dtype=torch.float16, device=dev)
    for variant in variants + ["reference"]:
        fn = registry.get(OP, variant)
        with pytest.raises(ValueError, match=r"divisible by the world size"):
            fn(a, b)
        if variant == "reference":
            continue
        good_a = a[: ctx.world * 5]
        with pytest.raises(ValueError, match=r"K must match"):
            fn(good_a, b[:4])
        with pytest.raises(TypeError, match=r"dtype"):
            fn(good_a, b.float())
        with pytest.raises(ValueError, match=r"2-D"):
            fn(good_a[0], b)
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("variant, world", variant_world_matrix(tilefuse.VARIANTS))
def test_variant_matches_reference(pools, variant, world):
    assert all(pools.run(world, job_against_reference, variant, SHAPES, calls=1))


@pytest.mark.parametrize("variant", flagged_first(tilefuse.VARIANTS))
def test_epochs_and_late_rank(pools, variant, on_gpu):
    """Five calls in a row (stale flags below the epoch, NaN staging), a different rank late each time."""
    assert all(pools.run(3, job_against_reference, variant, [SHAPES[0]], calls=5, late=True,
                         dtype_list=dtypes(on_gpu)[:1]))


@pytest.mark.parametrize("variant", flagged_first(tilefuse.VARIANTS))
def test_back_to_back_calls_deterministic(pools, variant):
    assert all(pools.run(3, job_back_to_back, variant, 37, 40, 24, calls=4))


@pytest.mark.parametrize("variant", flagged_first(tilefuse.VARIANTS))
def test_non_default_config(pools, variant):
    """Small blocks, several communication programs, a transposed (column-major) b."""
    assert all(pools.run(2, job_against_reference, variant, [(37, 72, 24)], calls=1, config=SMALL_CFG,
                         b_transposed=True))


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_variants_bit_identical(pools, world, on_gpu):
    """At W = 3 the running sum takes an intermediate step (s0 + s1 into the fp32 buffer, then + s2):
    keeping it in fp16 rounds twice and changes bits; fp32 shows a change of summation order."""
    assert all(pools.run(world, job_variants_bit_identical, list(tilefuse.VARIANTS), 37, 72, 56,
                         dtypes(on_gpu), SMALL_CFG))


def test_ragged_k_shards_and_empty(pools):
    assert all(pools.run(3, job_ragged_k_shards, list(tilefuse.VARIANTS), 21, 40, [0, 24, 40]))


def test_bad_input_raises_on_every_rank(pools):
    assert all(pools.run(3, job_bad_input, list(tilefuse.VARIANTS)))


def test_registered():
    assert set(tilefuse.VARIANTS) <= set(registry.variants(OP))
