"""gemm_all_reduce: every variant against the reference, W = 1..4, ragged shapes, repeated calls, the
result bit-identical on every rank and across variants, fused bias, ragged K shards, bad input,
CUDA graph replay (GPU only)."""

import functools
import time

import pytest
import torch
from ophelpers import assert_matches, dtypes, flagged_first, poison_workspaces, randn, variant_world_matrix

import tilefuse
from tilefuse.ops import registry

OP = "gemm_all_reduce"
# Bits of kernel results are compared across tilings here: `.ci/run` runs these again under a
# second OpenBLAS core type (see harness.install_fixed_order_dot).
pytestmark = pytest.mark.bits
VARIANTS = ("bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized")
# (M, N, K_loc): ragged in every dimension; fewer rows than one block.
SHAPES = [(37, 72, 56), (5, 40, 24)]
# Small blocks (several tiles per program), several reduction programs, and one warp, so that the
# reduction works through a tile in two [16, 64] blocks.
SMALL_CFG = dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=16, GROUP_M=2, num_warps=1, num_stages=1,
                 GEMM_SMS=3, COMM_SMS=3)


def _ensure_registered():
    """Import the op (its import registers its entry points), until tilefuse/__init__.py does."""
    import tilefuse.ops.gemm_all_reduce as op_module

    return op_module


def _get(variant):
    _ensure_registered()
    return registry.get(OP, variant)


def _inputs(ctx, M, N, K, dtype, seed, b_transposed=False, bias=False):
    # Every rank holds a different K shard; A is scaled by (rank + 1), so a partial that is
    # dropped, doubled or summed twice shows.
    a = randn((M, K), dtype, ctx.device, seed=seed * 100 + ctx.rank + 1, scale=ctx.rank + 1)
    b = randn((K, N), dtype, ctx.device, seed=seed * 100 + 50 + ctx.rank)
    if b_transposed:
        b = b.t().contiguous().t()  # column-major [K, N]
    # The bias is the same on every rank (seeded without the rank).
    c_bias = randn((N,), dtype, ctx.device, seed=seed * 100 + 99, scale=4.0) if bias else None
    return a, b, c_bias


def _check(ctx, got, ref, dtype, K, what):
    # The sum of W partials, rank r's scaled by (r + 1): the error grows with the sum of the scales.
    scale = ctx.world * (ctx.world + 1) / 2
    assert_matches(got, ref, dtype, K, ctx.on_gpu, what, scale=scale)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of t (torch.equal alone would take -0.0 for +0.0 and fail on NaN)."""
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _same_bits_on_every_rank(results, what):
    """``results``: per rank, a list of tensors (one per call); rank 0's are compared to everyone's."""
    first = results[0]
    for rank, outs in enumerate(results[1:], start=1):
        assert len(outs) == len(first)
        for i, (x, y) in enumerate(zip(first, outs)):
            differ = (_bits(x) != _bits(y)).sum().item()
            assert differ == 0, f"{what}: call {i}: rank {rank} differs from rank 0 in {differ} of {x.numel()} elements"


def job_against_reference(ctx, variant, shapes, calls, config=None, late=False, b_transposed=False,
                          dtype_list=None, bias=False):
    """Returns every result, for the cross-rank bit comparison."""
    fn = _get(variant)
    cfg = tilefuse.Config(**config) if config else None
    seed, outs = 0, []
    for M, N, K in shapes:
        for dtype in dtype_list or dtypes(ctx.on_gpu):
            for call in range(calls):
                seed += 1
                a, b, c_bias = _inputs(ctx, M, N, K, dtype, seed, b_transposed, bias)
                ref = _get("reference")(a, b, bias=c_bias)
                poison_workspaces()
                if late and ctx.rank == call % ctx.world:
                    time.sleep(0.2)  # the others must wait for this rank's partials
                got = fn(a, b, config=cfg, bias=c_bias)
                tilefuse.synchronize()
                _check(ctx, got, ref, dtype, K, f"{variant} M={M} N={N} K={K} {dtype} call {call}")
                outs.append(got)
    tilefuse.barrier()
    return outs


def job_back_to_back(ctx, variant, M, N, K, calls):
    """Calls with different inputs and no host synchronisation between them: a rank that finishes
    call e early starts pushing call e+1's partials while its peers still sum call e's. The last
    call repeats the first one's inputs and must give the same bits (fixed summation order)."""
    dtype = torch.float32
    inputs = [_inputs(ctx, M, N, K, dtype, seed=200 + i)[:2] for i in range(calls - 1)]
    inputs.append(inputs[0])
    refs = [_get("reference")(a, b) for a, b in inputs]
    poison_workspaces()
    fn = _get(variant)
    outs = [fn(a, b) for a, b in inputs]
    tilefuse.synchronize()
    for i, (got, ref) in enumerate(zip(outs, refs)):
        _check(ctx, got, ref, dtype, K, f"{variant} back-to-back call {i}")
    assert torch.equal(_bits(outs[0]), _bits(outs[-1])), f"{variant}: two runs on the same inputs differ"
    tilefuse.barrier()
    return outs


def job_variants_bit_identical(ctx, M, N, K, dtype_list, config, bias):
    """Every variant gives the very bits of every other (one summation
    order, one rounding of the partials, the bias added in fp32 after the sum); returns them all."""
    cfg = tilefuse.Config(**config)
    outs = []
    for dtype in dtype_list:
        a, b, c_bias = _inputs(ctx, M, N, K, dtype, seed=31, bias=bias)
        ref = _get("reference")(a, b, bias=c_bias)
        got = {}
        for variant in VARIANTS:
            poison_workspaces()
            got[variant] = _get(variant)(a, b, config=cfg, bias=c_bias)
            tilefuse.synchronize()
            _check(ctx, got[variant], ref, dtype, K, f"{variant} {dtype}")
        first = VARIANTS[0]
        for key, value in got.items():
            differ = (_bits(value) != _bits(got[first])).sum().item()
            assert differ == 0, f"{dtype}: {key} and {first} differ in {differ} of {ref.numel()} elements"
        outs.extend(got.values())
    tilefuse.barrier()
    return outs


# fused_sequential splitting K within one wave: 2x2 tiles x 2 slices on 8 programs (one slice each;
# 4 steps of 16 over K = 56: slices of 2 steps), and 1x2 tiles x 3 slices on 7 programs (2 steps over
# K = 24: one slice of each tile is empty; one program without a slice). Two warps: a 32x64 fp32 sum
# fits (BLOCK_M x BLOCK_N <= 1024 x warps).
SPLIT_CFGS = (dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=16, GROUP_M=2, num_warps=2, num_stages=1, GEMM_SMS=8,
                   COMM_SMS=0, SPLIT_K=2),
              dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=1, num_warps=1, num_stages=1, GEMM_SMS=7,
                   COMM_SMS=0, SPLIT_K=3))


def job_split_k(ctx, shapes, calls):
    """gemm_all_reduce's fused_sequential with K split into slices (one a program), with a bias and a
    late rank each call: the reference's result, and the bits of bulk_sync on the same config (whose
    GEMM core splits K alike). Calls follow each other on the same split-K scratch: a slice count left
    behind would make the next call's tiles wrong. Then K shards of different sizes, a call aborted
    on every rank and the calls after it, and the configs it refuses, on every rank alike."""
    dtype = torch.float32  # exact in the interpreter: a change of summation order shows
    outs = []
    for config, (M, N, K) in zip(SPLIT_CFGS, shapes):
        cfg = tilefuse.Config(**config)
        for call in range(calls):
            a, b, c_bias = _inputs(ctx, M, N, K, dtype, seed=300 + call, bias=True)
            poison_workspaces()
            if ctx.rank == call % ctx.world:
                time.sleep(0.2)
            got = _get("fused_sequential")(a, b, config=cfg, bias=c_bias)
            want = _get("bulk_sync")(a, b, config=cfg, bias=c_bias)
            tilefuse.synchronize()
            what = f"split {config['SPLIT_K']} M={M} N={N} K={K} call {call}"
            _check(ctx, got, _get("reference")(a, b, bias=c_bias), dtype, K, what)
            differ = (_bits(got) != _bits(want)).sum().item()
            assert differ == 0, f"{what}: differs from bulk_sync in {differ} of {got.numel()} elements"
            outs.append(got)
    # K shards of different sizes (as the GPU default's slices, which follow M and N only, meet them):
    # 4 steps over 2 slices, 1 step (one slice empty), none.
    cfg = tilefuse.Config(**SPLIT_CFGS[0])
    k_here = (56, 9, 0)[ctx.rank % 3]
    a, b, c_bias = _inputs(ctx, 37, 72, k_here, dtype, seed=310, bias=True)
    poison_workspaces()
    got = _get("fused_sequential")(a, b, config=cfg, bias=c_bias)
    want = _get("bulk_sync")(a, b, config=cfg, bias=c_bias)
    tilefuse.synchronize()
    _check(ctx, got, _get("reference")(a, b, bias=c_bias), dtype, 56, "split K over ragged K shards")
    assert torch.equal(_bits(got), _bits(want)), "split K over ragged K shards: differs from bulk_sync"
    outs.append(got)
    # A split call aborted on every rank (a mismatch: bulk_sync on the odd ranks): its slices are still
    # handed in and summed, so the scratch's counts are back at zero and the next calls are right.
    a, b, _ = _inputs(ctx, 37, 72, 56, dtype, seed=320)
    with pytest.raises(tilefuse.CallMismatchError):
        _get("bulk_sync" if ctx.rank % 2 else "fused_sequential")(a, b, config=cfg)
    for call in range(2):
        a, b, _ = _inputs(ctx, 37, 72, 56, dtype, seed=321 + call)
        got = _get("fused_sequential")(a, b, config=cfg)
        tilefuse.synchronize()
        _check(ctx, got, _get("reference")(a, b), dtype, 56, f"split call {call} after an aborted one")
    a, b, _ = _inputs(ctx, 37, 72, 56, dtype, seed=9)
    with pytest.raises(ValueError, match=r"4 tiles x 3 slices exceed GEMM_SMS \+ COMM_SMS = 8"):
        _get("fused_sequential")(a, b, config=cfg.replace(SPLIT_K=3))
    with pytest.raises(ValueError, match=r"at most 1024 x num_warps = 1024"):
        _get("fused_sequential")(a, b, config=cfg.replace(num_warps=1))
    for variant in ("producer_consumer", "wg_specialized"):
        with pytest.raises(ValueError, match=r"computes whole tiles"):
            _get(variant)(a, b, config=cfg.replace(GEMM_SMS=6, COMM_SMS=2))
    got = _get("fused_sequential")(a, b, config=cfg)  # the refusals left nothing behind
    tilefuse.synchronize()
    _check(ctx, got, _get("reference")(a, b), dtype, 56, "after the refused configs")
    tilefuse.barrier()
    return outs




def job_split_decode_default(ctx, replays):
    """GPU: without a caller's config fused_sequential takes the GEMM core's split-K tiles at M <= 64
    (one K slice a program: at M = 1 and 16 two slices of 16 x 64 tiles, pointer loads on a Linear
    weight and descriptors on a row-major b; at M = 48 seven slices of 64 x 64 tiles): the reference's
    result, bulk_sync's bits on the same config, then CUDA graph replays on fresh inputs."""
    from tilefuse.ops.common.config import decode_split_config
    from tilefuse.runtime import hw

    N, K, dtype = 1024, 2048, torch.bfloat16
    fn = _get("fused_sequential")
    outs = []
    for M in (1, 16, 48):
        cfg = decode_split_config(M, N, K, dtype, num_sms=hw.num_sms(ctx.device), interpreter=False)
        assert cfg is not None and cfg.SPLIT_K > 1, cfg
        for linear in (True, False):
            inputs = functools.partial(_inputs, ctx, M, N, K, dtype, b_transposed=linear, bias=True)
            a, b, c_bias = inputs(40)
            poison_workspaces()
            got = fn(a, b, bias=c_bias)
            want = _get("bulk_sync")(a, b, config=cfg, bias=c_bias)
            tilefuse.synchronize()
            what = f"split decode M={M} linear={linear}"
            _check(ctx, got, _get("reference")(a, b, bias=c_bias), dtype, K, what)
            assert torch.equal(_bits(got), _bits(want)), f"{what}: differs from bulk_sync on the same config"
            static = [x.clone() for x in (a, b, c_bias)]
            fn(*static[:2], bias=static[2])
            torch.cuda.synchronize()
            tilefuse.barrier()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                static_out = fn(*static[:2], bias=static[2])
            tilefuse.barrier()
            for i in range(replays):
                fresh = inputs(50 + i)
                for x, y in zip(static, fresh):
                    x.copy_(y)
                g.replay()
                torch.cuda.synchronize()
                _check(ctx, static_out, _get("reference")(fresh[0], fresh[1], bias=fresh[2]), dtype, K,
                       f"{what} replay {i}")
                outs.append(static_out.clone())
            tilefuse.synchronize()
            tilefuse.barrier()
            del g
    return outs


def job_ragged_k_shards(ctx, k_per_rank, M, N):
    """K shards of different sizes per rank (one of them empty), an empty M and N, plain, the public
    entry point with a named variant; then variant="auto" (equal K shards)."""
    op_module = _ensure_registered()
    dtype = torch.float16
    K = k_per_rank[ctx.rank]
    a, b, c_bias = _inputs(ctx, M, N, K, dtype, seed=11, bias=True)
    ref = _get("reference")(a, b)
    ref_bias = _get("reference")(a, b, bias=c_bias)
    for variant in VARIANTS:
        fn = _get(variant)
        poison_workspaces()
        got = fn(a, b)
        tilefuse.synchronize()
        _check(ctx, got, ref, dtype, max(k_per_rank), f"{variant} K shards {k_per_rank}")
        nothing = fn(torch.zeros((0, K), dtype=dtype, device=ctx.device), b)
        assert nothing.shape == (0, N) and nothing.dtype == dtype
        nothing = fn(a, b[:, :0])
        assert nothing.shape == (M, 0) and nothing.dtype == dtype
    for variant, kwargs in (("plain", {}), ("plain", {"bias": c_bias})):
        got = _get(variant)(a, b, **kwargs)
        _check(ctx, got, ref_bias if kwargs else ref, dtype, max(k_per_rank), f"plain {sorted(kwargs)}")
    got = op_module.gemm_all_reduce(a, b, variant="wg_specialized", bias=c_bias)
    tilefuse.synchronize()
    _check(ctx, got, ref_bias, dtype, max(k_per_rank), "public wg_specialized")
    # variant="auto" decides per shape with one exchange between the ranks: equal K shards (the
    # dispatcher's documented contract).
    K = k_per_rank[-1]
    a, b, c_bias = _inputs(ctx, M, N, K, dtype, seed=12, bias=True)
    for kwargs in ({}, {"bias": c_bias}):
        got = op_module.gemm_all_reduce(a, b, **kwargs)
        tilefuse.synchronize()
        _check(ctx, got, _get("reference")(a, b, **kwargs), dtype, K, f"public auto {sorted(kwargs)}")
    tilefuse.barrier()
    return True


def job_bad_input(ctx):
    """Every rank raises a clear error before any communication."""
    dev = ctx.device
    a = torch.zeros((5, 8), dtype=torch.float16, device=dev)
    b = torch.zeros((8, 16), dtype=torch.float16, device=dev)
    bias = torch.zeros((16,), dtype=torch.float16, device=dev)
    for variant in VARIANTS + ("plain",):
        fn = _get(variant)
        with pytest.raises(ValueError, match=r"K must match"):
            fn(a, b[:4])
        with pytest.raises(TypeError, match=r"dtype"):
            fn(a, b.float())
        with pytest.raises(TypeError, match=r"dtype"):
            fn(a.to(torch.int32), b.to(torch.int32))
        with pytest.raises(ValueError, match=r"2-D"):
            fn(a[0], b)
        with pytest.raises(ValueError, match=r"bias must have shape \(16,\)"):
            fn(a, b, bias=bias[:8])
        with pytest.raises(TypeError, match=r"bias has dtype"):
            fn(a, b, bias=bias.float())
    with pytest.raises(ValueError, match=r"bias must have shape"):
        _get("reference")(a, b, bias=bias[None])
    tilefuse.barrier()
    return True


def job_one_sided_error(ctx, variant):
    """Rank 0's call fails its checks, the peers' copies raise PeerCallError; later calls are correct."""
    M, N, K = 24, 40, 32
    dtype = torch.float32
    good = _inputs(ctx, M, N, K, dtype, seed=5)[:2]
    _check(ctx, _get(variant)(*good), _get("reference")(*good), dtype, K, "warm-up")
    a, b = _inputs(ctx, M, N, K, dtype, seed=6)[:2]
    if ctx.rank == 0:
        b = b.half()  # a dtype mismatch on one rank only
    with pytest.raises((TypeError, tilefuse.PeerCallError)) as info:
        _get(variant)(a, b)
    kind = type(info.value).__name__
    for seed in (7, 8):
        a, b = _inputs(ctx, M, N, K, dtype, seed=seed)[:2]
        _check(ctx, _get(variant)(a, b), _get("reference")(a, b), dtype, K, f"after the error, seed {seed}")
    tilefuse.barrier()
    return kind


def job_graph_replay(ctx, variant, replays):
    """Capture one call after an eager one; replay with new inputs copied into the static ones."""
    fn = _get(variant)
    M, N, K = 72, 136, 96
    dtype = torch.bfloat16
    a, b, c_bias = _inputs(ctx, M, N, K, dtype, seed=1, bias=True)
    static = [a.clone(), b.clone(), c_bias.clone()]
    fn(static[0], static[1], bias=static[2])  # eager: creates the workspaces
    torch.cuda.synchronize()
    tilefuse.barrier()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = fn(static[0], static[1], bias=static[2])
    tilefuse.barrier()
    outs = []
    for i in range(replays):
        fresh = _inputs(ctx, M, N, K, dtype, seed=100 + i, bias=True)
        for s, x in zip(static, fresh):
            s.copy_(x)
        g.replay()
        torch.cuda.synchronize()
        _check(ctx, static_out, _get("reference")(fresh[0], fresh[1], bias=fresh[2]), dtype, K, f"replay {i}")
        outs.append(static_out.clone())
    tilefuse.synchronize()
    tilefuse.barrier()
    del g
    return outs


@pytest.mark.parametrize("variant, world", variant_world_matrix(VARIANTS))
def test_variant_matches_reference(pools, variant, world):
    # The smallest shape at W = 2 only (the ragged-K tests cover small M elsewhere).
    results = pools.run(world, job_against_reference, variant, SHAPES if world == 2 else SHAPES[:1], calls=1)
    _same_bits_on_every_rank(results, f"{variant} W={world}")


@pytest.mark.parametrize("variant", flagged_first(VARIANTS))
def test_repeated_calls_and_late_rank(pools, variant, on_gpu):
    """Four calls in a row (stale flags below the epoch, NaN staging), a different rank late each time."""
    results = pools.run(3, job_against_reference, variant, [SHAPES[0]], calls=4, late=True,
                        dtype_list=dtypes(on_gpu)[:1])
    _same_bits_on_every_rank(results, variant)


@pytest.mark.parametrize("variant", flagged_first(VARIANTS))
def test_back_to_back_calls_deterministic(pools, variant):
    results = pools.run(3, job_back_to_back, variant, 37, 40, 24, calls=4)
    _same_bits_on_every_rank(results, variant)


@pytest.mark.parametrize("variant", flagged_first(VARIANTS))
def test_bias_and_non_default_config(pools, variant):
    """A fused bias; small blocks, several communication programs, a transposed (column-major) b."""
    results = pools.run(2, job_against_reference, variant, [(37, 72, 24)], calls=1, config=SMALL_CFG,
                        b_transposed=True, bias=True)
    _same_bits_on_every_rank(results, variant)


@pytest.mark.parametrize("world", [2, 3])
def test_variants_bit_identical(pools, world, on_gpu):
    """W = 2: every dtype; W = 3 (with a bias): fp32, where a change of summation order shows."""
    dtype_list = dtypes(on_gpu) if world == 2 else [torch.float32]
    results = pools.run(world, job_variants_bit_identical, 37, 72, 56, dtype_list, SMALL_CFG, world == 3)
    _same_bits_on_every_rank(results, f"W={world}")


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_fused_sequential_splits_k(pools, world):
    results = pools.run(world, job_split_k, [(37, 72, 56), (5, 40, 24)], 2)
    _same_bits_on_every_rank(results, f"split K, W={world}")




def test_split_decode_default_and_graphs(pools, on_gpu):
    if not on_gpu:
        pytest.skip("the split decode tiles are a GPU default (the interpreter's tiles split nothing)")
    results = pools.run(2, job_split_decode_default, 3)
    _same_bits_on_every_rank(results, "split decode tiles")


def test_fused_sequential_takes_the_split_decode_tiles():
    """On a GPU, up to M = 64 in 16-bit dtypes, fused_sequential takes the GEMM core's split-K tiles
    where they split K, one slice a program, and a tile's sum fits in registers; elsewhere none. The
    tiles and slices follow M and N only, so that ranks with K shards of different sizes agree on
    them (K sets BLOCK_K)."""
    from tilefuse.ops.common.config import decode_split_config

    cases = {(1, 4096, 4096): (16, 64, 256, 3, 2), (16, 4096, 8192): (16, 64, 256, 3, 2),
             (1, 4096, 2048): (16, 64, 256, 3, 2), (48, 4096, 8192): (64, 64, 64, 6, 2),
             (33, 4096, 4096): (64, 64, 64, 6, 2), (1, 1024, 2048): (16, 64, 256, 3, 8),
             (1, 4096, 4099): (16, 64, 256, 3, 2), (1, 4096, 100): (16, 64, 128, 3, 2)}
    for (M, N, K), tiles in cases.items():
        cfg = decode_split_config(M, N, K, torch.bfloat16, num_sms=132, interpreter=False)
        assert (cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K, cfg.num_stages, cfg.SPLIT_K) == tiles, (M, N, K, cfg)
        assert -(-M // cfg.BLOCK_M) * -(-N // cfg.BLOCK_N) * cfg.SPLIT_K <= cfg.GEMM_SMS + cfg.COMM_SMS == 132
        assert cfg.BLOCK_M * cfg.BLOCK_N <= 1024 * cfg.num_warps
    assert decode_split_config(1, 8192, 4096, torch.bfloat16, num_sms=132, interpreter=False) is None  # 128 tiles
    assert decode_split_config(64, 4096, 4096, torch.bfloat16, num_sms=132, interpreter=False) is None  # whole K
    for M in (17, 32):  # the 32-row split tiles measured slower than the whole-K ones
        assert decode_split_config(M, 4096, 4096, torch.bfloat16, num_sms=132, interpreter=False) is None
    assert decode_split_config(65, 4096, 4096, torch.bfloat16, num_sms=132, interpreter=False) is None
    assert decode_split_config(1, 4096, 4096, torch.float32, num_sms=132, interpreter=False) is None
    assert decode_split_config(1, 4096, 4096, torch.bfloat16, num_sms=132, interpreter=True) is None


def test_ragged_k_shards_empty_plain_and_public(pools):
    assert all(pools.run(3, job_ragged_k_shards, [0, 24, 40], 21, 40))


def test_bad_input_raises_on_every_rank(pools):
    assert all(pools.run(2, job_bad_input))


def test_one_sided_error(pools):
    kinds = pools.run(2, job_one_sided_error, "producer_consumer")
    assert kinds == ["TypeError", "PeerCallError"], kinds


@pytest.mark.parametrize("variant", VARIANTS)
def test_graph_replay(pools, on_gpu, variant):
    if not on_gpu:
        pytest.skip("CUDA graphs need a GPU")
    results = pools.run(2, job_graph_replay, variant, 20)
    _same_bits_on_every_rank(results, f"{variant} graph replays")


def test_default_config_fills_the_device():
    """Without a caller's config, BLOCK_N halves (not below 32) while tiles would leave GEMM programs idle."""
    from tilefuse.ops.gemm_all_reduce._prepare import fill_device

    base = tilefuse.Config(BLOCK_M=16, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3,
                           GEMM_SMS=116, COMM_SMS=16)
    assert fill_device(base, 1, 8192, comm=True).BLOCK_N == 64  # 64 tiles < 116 programs; 128 tiles are enough
    assert fill_device(base, 1, 8192, comm=False).BLOCK_N == 32  # 128 < 132 programs
    assert fill_device(base, 1, 64, comm=True).BLOCK_N == 32  # never below 32
    assert fill_device(base, 4096, 8192, comm=True) is base  # enough tiles: unchanged


def test_default_tiles_keep_the_narrow_decode_tiles():
    """On a GPU, M <= 256 in a 16-bit dtype takes default_config's swept tiles as they are (the
    sweeps measured their BLOCK_N best); fp32, larger M and the interpreter's tiles still fill the device."""
    from tilefuse.ops.common.config import default_config
    from tilefuse.ops.gemm_all_reduce._prepare import default_tiles, fill_device

    for M in (1, 16, 64):
        cfg = default_config(M, 8192, 4096, torch.bfloat16, num_sms=132, interpreter=False, comm=False)
        assert cfg.BLOCK_N == 64 and cfg.GEMM_SMS == 132, cfg  # 128 tiles: 70 % of a wave
        assert fill_device(cfg, M, 8192, comm=False).BLOCK_N == 32  # what the old path did
        assert default_tiles(cfg, M, 8192, torch.bfloat16, comm=False, interpreter=False) is cfg
    for M in (65, 128, 256):
        cfg = default_config(M, 8192, 4096, torch.bfloat16, num_sms=132, interpreter=False, comm=False)
        assert default_tiles(cfg, M, 8192, torch.bfloat16, comm=False, interpreter=False) is cfg
    cfg = default_config(257, 1024, 4096, torch.bfloat16, num_sms=132, interpreter=False, comm=False)
    got = default_tiles(cfg, 257, 1024, torch.bfloat16, comm=False, interpreter=False)
    assert got == fill_device(cfg, 257, 1024, comm=False) and got.BLOCK_N < cfg.BLOCK_N, got
    cfg = default_config(1, 8192, 4096, torch.float32, num_sms=132, interpreter=False, comm=False)
    got = default_tiles(cfg, 1, 8192, torch.float32, comm=False, interpreter=False)
    assert got == fill_device(cfg, 1, 8192, comm=False), got
    cfg = default_config(1, 8192, 4096, torch.bfloat16, num_sms=132, interpreter=True, comm=False)
    got = default_tiles(cfg, 1, 8192, torch.bfloat16, comm=False, interpreter=True)
    assert got == fill_device(cfg, 1, 8192, comm=False), got


def test_registered():
    _ensure_registered()
    assert set(VARIANTS) | {"reference", "plain"} <= set(registry.variants(OP))
