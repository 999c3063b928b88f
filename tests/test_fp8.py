"""Float8 operands with scales (``scale_a=``, ``scale_b=``, ``out_dtype=``): every op and variant
against the fp32 reference of the dequantized operands, tensor-wise and row-wise, ragged shapes; the
errors of bad scales; forward only; torch.compile of a float8 call.

On the CPU the kernels run in Triton's interpreter (float16 and float32 results: it computes bfloat16
wrong); on GPUs (``TILEFUSE_TEST_DEVICE=cuda``, ranks sharing one GPU) the results are bfloat16.
"""

import pytest
import torch
from ophelpers import assert_matches, poison_workspaces

import tilefuse
from tilefuse.ops import registry

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
OPS = ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce")


def _quantized(shape, seed, dtype=E4M3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 2).to(dtype)


def _scale(shape, seed) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) + 0.5).float()


def _operands(ctx, op: str, rowwise: bool, seed: int, b_dtype=E4M3) -> tuple:
    """``(a, b, scale_a, scale_b)`` of rank ``ctx.rank`` for ``op``, ragged: replicated operands (and
    their scales) the same on every rank, sharded ones differing by rank (K shards of differing sizes
    for gemm_all_reduce)."""
    W, r = ctx.world, ctx.rank
    mine = seed * 100 + r + 1
    if op == "gemm_all_scatter":  # a replicated, b a column shard
        (M, K, N), a_seed, b_seed = (20, 40, 24), seed, mine
    elif op == "all_gather_gemm":  # a a row shard, b replicated
        (M, K, N), a_seed, b_seed = (12, 40, 24), mine, seed
    elif op == "gemm_reduce_scatter":  # K shards
        (M, K, N), a_seed, b_seed = (10 * W, 40, 24), mine, mine + 50
    else:
        (M, K, N), a_seed, b_seed = (20, 24 + 8 * r, 40), mine, mine + 50
    a, b = _quantized((M, K), a_seed), _quantized((K, N), b_seed, b_dtype)
    if rowwise:
        scale_a, scale_b = _scale((M, 1), a_seed + 7), _scale((1, N), b_seed + 7)
    else:
        scale_a, scale_b = _scale((), a_seed + 7), _scale((), b_seed + 7)
    return a.to(ctx.device), b.to(ctx.device), scale_a.to(ctx.device), scale_b.to(ctx.device)


def _out_dtypes(ctx) -> tuple:
    return (torch.bfloat16,) if ctx.on_gpu else (torch.float32, torch.float16)


def job_against_reference(ctx, cases) -> int:
    """Each ``(op, variant, rowwise)`` of ``cases`` on this rank against the reference; the number
    checked."""
    seed = 0
    for op, variant, rowwise in cases:
        for out_dtype in _out_dtypes(ctx):
            seed += 1
            b_dtype = E5M2 if seed % 3 == 0 else E4M3  # one operand may be e5m2
            a, b, sa, sb = _operands(ctx, op, rowwise, seed, b_dtype)
            kw = dict(scale_a=sa, scale_b=sb, out_dtype=out_dtype)
            ref = registry.get(op, "reference")(a, b, **kw)
            poison_workspaces()
            got = registry.get(op, variant)(a, b, **kw)
            tilefuse.synchronize()
            mode = "row-wise" if rowwise else "tensor-wise"
            what = f"{op} {variant} {mode} {tuple(a.shape)}x{tuple(b.shape)} {b_dtype} -> {out_dtype}"
            assert_matches(got, ref, out_dtype, a.shape[1], ctx.on_gpu, what, scale=8 * ctx.world)
            if op == "gemm_all_reduce":  # the same bits on every rank
                every = [torch.empty_like(got) for _ in range(ctx.world)]
                torch.distributed.all_gather(every, got.contiguous(), group=ctx.heap.group)
                assert all(torch.equal(x, got) for x in every), f"{what}: ranks differ"
    tilefuse.barrier()
    return len(cases)


def _cases(variants, modes=(False, True)) -> list:
    return [(op, v, rw) for op in OPS for v in variants(op) for rw in modes]


def _all_variants(op):
    return tuple(v for v in registry.variants(op) if v != "reference")


# make test: every op at W = 2, one fused variant each, both scalings (one rank launch).
QUICK = [(op, v, rw) for op, v in (("gemm_all_scatter", "fused_sequential"), ("all_gather_gemm", "producer_consumer"),
                                   ("gemm_reduce_scatter", "wg_specialized"), ("gemm_all_reduce", "fused_sequential"))
         for rw in (False, True)]


def test_every_op_matches_reference_quick(pools):
    assert pools.run(2, job_against_reference, QUICK) == [len(QUICK)] * 2


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_every_variant_matches_reference(pools, world):
    cases = _cases(_all_variants)
    assert pools.run(world, job_against_reference, cases) == [len(cases)] * world
