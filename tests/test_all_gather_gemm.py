"""all_gather_gemm: every variant against the reference, W = 1..4, ragged shapes, epochs, bad input."""

import contextlib
import importlib
import time

import pytest
import torch
from ophelpers import assert_matches, dtypes, flagged_first, poison_workspaces, randn, variant_world_matrix

import tilefuse
from tilefuse.ops import registry

OP = "all_gather_gemm"
# Bits of kernel results are compared across tilings here: `.ci/run` runs these again under a
# second OpenBLAS core type (see harness.install_fixed_order_dot).
pytestmark = pytest.mark.bits
# (M_loc, N, K): ragged everywhere (K = 52 in fp16 takes the pointer path: its rows are not
# 16-byte multiples), a shard smaller than one block, block-aligned.
SHAPES = [(50, 72, 52), (7, 40, 32), (64, 64, 64)]


def _inputs(ctx, M_loc, N, K, dtype, seed):
    # Each rank's shard scaled by (rank + 1): a misrouted row block shows.
    a = randn((M_loc, K), dtype, ctx.device, seed=seed * 100 + ctx.rank + 1, scale=ctx.rank + 1)
    b = randn((K, N), dtype, ctx.device, seed=seed)  # the same on every rank
    return a, b


@contextlib.contextmanager
def straggling(variant, late: bool, delay: float = 0.2):
    """On a late rank: sleep before the call, and again after its begin kernel (the pairing barrier).

    The begin kernel would otherwise line the ranks up again; a rank that is also late after it
    makes the peers' consumers wait for its pushes.
    """
    if not late:
        yield
        return
    group_cls = importlib.import_module("tilefuse.runtime.group").Group
    real = group_cls.launch_begin

    def slow_begin(self, *args, **kwargs):
        real(self, *args, **kwargs)
        time.sleep(delay)

    group_cls.launch_begin = slow_begin
    try:
        time.sleep(delay)
        yield
    finally:
        group_cls.launch_begin = real


def job_against_reference(ctx, variant, shapes, calls, config=None, late_rank=None, b_transposed=False,
                          a_column_major=False, only_dtype=None):
    fn = registry.get(OP, variant)
    cfg = tilefuse.Config(**config) if config else None
    seed = 0
    for M_loc, N, K in shapes:
        for dtype in [only_dtype] if only_dtype else dtypes(ctx.on_gpu):
            for call in range(calls):
                seed += 1
                a, b = _inputs(ctx, M_loc, N, K, dtype, seed)
                if b_transposed:
                    b = b.t().contiguous().t()
                if a_column_major:
                    a = a.t().contiguous().t()
                ref_c, ref_ag = registry.get(OP, "reference")(a, b, return_gathered=True)
                poison_workspaces()
                gathered = seed % 2 == 0  # alternate: the variants skip work when nobody wants a_gathered
                with straggling(variant, ctx.rank == late_rank):
                    got = fn(a, b, config=cfg, return_gathered=gathered)
                tilefuse.synchronize()
                what = f"{variant} {M_loc}x{N}x{K} {dtype} call {call}"
                if gathered:
                    got, got_ag = got
                    assert not tilefuse.is_on_heap(got_ag), f"{what}: a_gathered is a heap buffer"
                    assert torch.equal(got_ag, ref_ag), f"{what}: a_gathered differs from the all-gather"
                assert isinstance(got, torch.Tensor) and not tilefuse.is_on_heap(got), what
                assert_matches(got, ref_c, dtype, K, ctx.on_gpu, what, scale=ctx.world)
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("variant, world", variant_world_matrix(tilefuse.VARIANTS))
def test_variant_matches_reference(pools, variant, world):
    assert all(pools.run(world, job_against_reference, variant, SHAPES, calls=1))


@pytest.mark.parametrize("variant", flagged_first(tilefuse.VARIANTS))
def test_epochs_and_late_rank(pools, variant):
    """Five calls in a row on poisoned workspaces, one rank starting late each time."""
    assert all(pools.run(3, job_against_reference, variant, [(50, 72, 52)], calls=5, late_rank=2,
                         only_dtype=torch.float16))


def job_back_to_back(ctx, variant, M_loc, N, K, calls):
    """``calls`` calls with no host synchronisation between them, a different rank held back before
    each: a rank may start call e+1 while a peer still works on call e."""
    fn = registry.get(OP, variant)
    dtype = torch.float16
    inputs = [_inputs(ctx, M_loc, N, K, dtype, seed=50 + e) for e in range(calls)]
    refs = [registry.get(OP, "reference")(a, b, return_gathered=True) for a, b in inputs]
    poison_workspaces()
    got = []
    for e, (a, b) in enumerate(inputs):
        if ctx.rank == e % ctx.world:
            time.sleep(0.15)
        got.append(fn(a, b, return_gathered=True))
    tilefuse.synchronize()
    for e, ((c, ag), (ref_c, ref_ag)) in enumerate(zip(got, refs)):
        assert torch.equal(ag, ref_ag), f"{variant} call {e}: a_gathered differs from the all-gather"
        assert_matches(c, ref_c, dtype, K, ctx.on_gpu, f"{variant} call {e}", scale=ctx.world)
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("variant", flagged_first(tilefuse.VARIANTS))
def test_back_to_back_calls(pools, variant):
    assert all(pools.run(3, job_back_to_back, variant, 50, 72, 52, calls=4))


@pytest.mark.parametrize("variant", flagged_first(tilefuse.VARIANTS))
def test_non_default_config(pools, variant):
    """Small blocks (several chunks per shard), several communication programs, a column-major b and
    a column-major a (the local shard then cannot be read in place on the descriptor path)."""
    cfg = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=1,
               GEMM_SMS=3, COMM_SMS=3)
    assert all(pools.run(2, job_against_reference, variant, [(40, 24, 24)], calls=2, config=cfg,
                         b_transposed=True, a_column_major=True))


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow)])
@pytest.mark.parametrize("a_column_major", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_copy_engine_form(pools, world, a_column_major):
    """The copy_engine form: peers' rows come by copy engine, chunk by chunk, while the GEMM waits on
    each chunk's flag; a late rank; a_gathered returned on alternate calls; its default config too."""
    cfg = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=1,
               GEMM_SMS=4, COMM_SMS=0)
    assert all(pools.run(world, job_against_reference, "copy_engine", [(70, 24, 40)], calls=3, config=cfg,
                         late_rank=world - 1, a_column_major=a_column_major, only_dtype=torch.float32))
    assert all(pools.run(world, job_against_reference, "copy_engine", [(40, 24, 24)], calls=1,
                         only_dtype=torch.float32))


def job_flattened_local_tiles(ctx, variant):
    """128-row tiles on the descriptor path: the tile loops without flags (fused_sequential's,
    producer_consumer's local shard read from ``a``) run on the GEMM core's flattened loop,
    fused_sequential's not where it also copies rows into a_gathered; the same bits as the loops not
    flattened. (wg_specialized's local tiles: test_local_tiles_claimed.)"""
    from unittest import mock

    from tilefuse.ops.all_gather_gemm import _prepare, _tiles

    cfg = tilefuse.Config(BLOCK_M=128, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=1,
                          GEMM_SMS=3, COMM_SMS=2)
    fn = registry.get(OP, variant)
    a, b = _inputs(ctx, 160, 72, 64, torch.float16, seed=21)  # two chunks, the second ragged
    buffers = "shard" if variant == "fused_sequential" else "flagged"

    def prepared(config, gathered=False):
        return _prepare.prepare(variant, a, b, config, None, gathered, buffers=buffers,
                                comm=variant != "fused_sequential")[1]

    p = prepared(cfg)
    assert p.meta["USE_TMA"] and p.local_direct, "the interpreter and sm_90 take the descriptor path here"
    assert p.meta["FLATTEN"]
    assert prepared(cfg, True).meta["FLATTEN"] == (variant != "fused_sequential")
    assert not _prepare.flattened_loop(cfg, False, 2)  # pointer path
    # 128x256 tiles of 4-byte results: not flattened (their store would not fit beside the stages on sm_90)
    assert _prepare.flattened_loop(cfg.replace(BLOCK_M=128, BLOCK_N=256), True, 2)
    assert not _prepare.flattened_loop(cfg.replace(BLOCK_M=128, BLOCK_N=256), True, 4)
    assert not prepared(cfg.replace(BLOCK_M=64)).meta["FLATTEN"]
    ref_c, ref_ag = registry.get(OP, "reference")(a, b, return_gathered=True)
    rule, real = _prepare.flattened_loop, _tiles.whole_tiles
    runs = {}
    for flat in (False, True):
        calls = []

        def counted(*args, _calls=calls, **kwargs):
            _calls.append(1)
            return real(*args, **kwargs)

        with contextlib.ExitStack() as stack:
            stack.enter_context(mock.patch.object(_prepare, "flattened_loop",
                                                  lambda c, t, s, _flat=flat: _flat and rule(c, t, s)))
            tilefuse.clear_workspaces()  # and what the calls prepared: prepared again under the patch
            if not ctx.on_gpu:  # the interpreter runs the kernels' Python: count the flattened loops
                stack.enter_context(mock.patch.object(_tiles, "whole_tiles", counted))
            poison_workspaces()
            c = fn(a, b, config=cfg)
            tilefuse.synchronize()
            plain_calls = len(calls)
            c2, ag = fn(a, b, config=cfg, return_gathered=True)
            tilefuse.synchronize()
        runs[flat] = (c, c2)
        assert torch.equal(ag, ref_ag), f"{variant} flatten={flat}: a_gathered differs from the all-gather"
        assert_matches(c, ref_c, torch.float16, 64, ctx.on_gpu, f"{variant} flatten={flat}", scale=ctx.world)
        if not ctx.on_gpu:
            gathered_calls = len(calls) - plain_calls
            assert (plain_calls > 0) == flat, (variant, flat, plain_calls)
            # fused_sequential copying rows into a_gathered keeps its loop; the push variants' local
            # tiles (read from `a` in both calls) are flattened
            assert (gathered_calls > 0) == (flat and variant != "fused_sequential"), (variant, flat, gathered_calls)
    assert torch.equal(runs[True][0], runs[False][0]), f"{variant}: the flattened loop changed the bits"
    assert torch.equal(runs[True][1], runs[False][1]), f"{variant}: the flattened loop changed the bits"
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("variant", ["fused_sequential", "producer_consumer"])
def test_flattened_local_tiles(pools, variant):
    assert all(pools.run(2, job_flattened_local_tiles, variant))


def job_large_tiles(ctx, variant):
    """The 128x256 tiles the variants take at thousands of rows (8 warps, 3 stages), against the
    reference: on a GPU the kernels compile as for a real shape (shared memory and registers within
    the device's), every program with work (local tiles for the pushers too)."""
    cfg = tilefuse.Config(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3,
                          GEMM_SMS=3, COMM_SMS=2)
    a, b = _inputs(ctx, 300, 520, 128, torch.bfloat16 if ctx.on_gpu else torch.float32, seed=41)
    ref_c, ref_ag = registry.get(OP, "reference")(a, b, return_gathered=True)
    for gathered in (False, True):
        poison_workspaces()
        got = registry.get(OP, variant)(a, b, config=cfg, return_gathered=gathered)
        tilefuse.synchronize()
        if gathered:
            got, ag = got
            assert torch.equal(ag, ref_ag), f"{variant}: a_gathered differs from the all-gather"
        assert_matches(got, ref_c, a.dtype, 128, ctx.on_gpu, f"{variant} 128x256 tiles", scale=ctx.world)
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("variant", flagged_first(tilefuse.VARIANTS))
def test_large_tiles(pools, variant):
    assert all(pools.run(2, job_large_tiles, variant))


def job_local_tiles_claimed(ctx):
    """wg_specialized shares the local shard's tiles among every program: each GEMM program's dealt
    share (flattened with 128-row tiles), then the rest from a counter, the pushers after pushing.
    The counter is back at zero after every call, and calls are right at world 1, 2 and 3 with more
    tiles than programs (some dealt, some claimed) and fewer (all claimed)."""
    from tilefuse.ops.all_gather_gemm import _prepare

    fn = registry.get(OP, "wg_specialized")
    small = tilefuse.Config(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=1,
                            GEMM_SMS=3, COMM_SMS=2)
    wide = small.replace(BLOCK_M=128)
    # 20 local tiles for 5 programs (12 dealt); one tile; 9 tiles of 128 rows, the last row block
    # ragged (3 dealt, flattened)
    for cfg, (M_loc, N, K) in ((small, (70, 40, 24)), (small, (10, 16, 16)), (wide, (300, 40, 24))):
        for call in range(3):
            a, b = _inputs(ctx, M_loc, N, K, torch.float32, seed=60 + call)
            ref_c, ref_ag = registry.get(OP, "reference")(a, b, return_gathered=True)
            poison_workspaces()
            gathered = call == 1
            got = fn(a, b, config=cfg, return_gathered=gathered)
            tilefuse.synchronize()
            if gathered:
                got, ag = got
                assert torch.equal(ag, ref_ag)
            assert_matches(got, ref_c, torch.float32, K, ctx.on_gpu, f"{M_loc}x{N}x{K} call {call}",
                           scale=ctx.world)
            p = _prepare.prepare("wg_specialized", a, b, cfg, None, gathered, buffers="flagged", comm=True)[1]
            assert p.meta["FLATTEN"] == (cfg is wide and p.meta["USE_TMA"])
            assert p.claims.item() == 0, f"call {call}: the claim counter was left at {p.claims.item()}"
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("world", [1, 2, pytest.param(3, marks=pytest.mark.slow)])
def test_local_tiles_claimed(pools, world):
    assert all(pools.run(world, job_local_tiles_claimed))


def job_mismatched_m_loc(ctx, variant):
    M_loc = 20 + ctx.rank  # a shape no rank has verified before
    a, b = _inputs(ctx, M_loc, 16, 16, torch.float32, seed=7)
    with pytest.raises(ValueError) as err:  # CallMismatchError, or the workspace check's ValueError
        registry.get(OP, variant)(a, b)
    msg = str(err.value)
    assert "disagree" in msg or "differs between ranks" in msg, msg
    assert f"{20 + ctx.rank}" in msg, msg
    # The op still works afterwards (no rank is left inside a collective).
    a, b = _inputs(ctx, 9, 16, 16, torch.float32, seed=8)
    ref = registry.get(OP, "reference")(a, b)
    assert_matches(registry.get(OP, variant)(a, b), ref, torch.float32, 16, ctx.on_gpu, variant,
                   scale=ctx.world)
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("variant", tilefuse.VARIANTS)
def test_mismatched_m_loc_raises_everywhere(pools, variant):
    assert all(pools.run(3, job_mismatched_m_loc, variant))


def job_bad_input(ctx):
    fn = tilefuse.all_gather_gemm
    a, b = _inputs(ctx, 8, 16, 16, torch.float32, seed=3)
    with pytest.raises(ValueError, match="K must match"):
        fn(a, b[:8], variant="fused_sequential")
    with pytest.raises(TypeError, match="dtype"):
        fn(a, b.half(), variant="producer_consumer")
    with pytest.raises(TypeError, match="supported dtypes"):
        fn(a.double(), b.double(), variant="bulk_sync")
    with pytest.raises(ValueError, match="2-D"):
        fn(a[0], b, variant="wg_specialized")
    cfg = tilefuse.Config(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, num_warps=4, num_stages=1,
                          GEMM_SMS=4, COMM_SMS=0)
    for variant in ("producer_consumer", "wg_specialized"):  # the copy engines are a form of their own
        with pytest.raises(ValueError, match="COMM_SMS"):
            fn(a, b, variant=variant, config=cfg)
    with pytest.raises(ValueError, match="exceeds"):
        fn(a, b, variant="producer_consumer", config=cfg.replace(GEMM_SMS=10_000, COMM_SMS=1))
    with pytest.raises(TypeError, match="Config"):
        fn(a, b, variant="bulk_sync", config={"BLOCK_M": 16})
    with pytest.raises(ValueError, match="unknown variant"):
        fn(a, b, variant="nope")
    if ctx.on_gpu:
        with pytest.raises(ValueError, match=" is on "):
            fn(a.cpu(), b, variant="bulk_sync")
    tilefuse.barrier()
    return True


def test_bad_input(pools):
    assert all(pools.run(2, job_bad_input))


def job_degenerate_and_auto(ctx):
    fn = tilefuse.all_gather_gemm
    for variant in tilefuse.VARIANTS:
        for M_loc, N, K in ((0, 8, 16), (5, 0, 16), (5, 8, 0)):
            a, b = _inputs(ctx, M_loc, N, K, torch.float16, seed=5)
            ref_c, ref_ag = registry.get(OP, "reference")(a, b, return_gathered=True)
            c, ag = fn(a, b, variant=variant, return_gathered=True)
            assert torch.equal(ag, ref_ag), (variant, M_loc, N, K)
            assert torch.equal(c, ref_c), (variant, M_loc, N, K)
    a, b = _inputs(ctx, 12, 24, 16, torch.float16, seed=6)
    c, ag = fn(a, b, return_gathered=True)  # variant="auto"
    ref_c, ref_ag = registry.get(OP, "reference")(a, b, return_gathered=True)
    assert torch.equal(ag, ref_ag)
    assert_matches(c, ref_c, torch.float16, 16, ctx.on_gpu, "auto", scale=ctx.world)
    tilefuse.barrier()
    return True


def test_degenerate_shapes_and_auto(pools):
    assert all(pools.run(2, job_degenerate_and_auto))
