"""Faults between ranks: every disagreement ends in the same error on every rank, within seconds."""

import pytest
import torch

import tilefuse
from tilefuse.ops import registry


def job_first_call_mismatch(ctx, op, what):
    """Each rank's first call of a new shape, the ranks disagreeing on M or on the variant: every
    rank raises CallMismatchError (not a plain ValueError); a call they agree on then works. (Each
    case has a K of its own: a first call on some ranks against a warm call on others is another
    case.)"""
    gen = torch.Generator().manual_seed(7 + ctx.rank)
    k = {"shape": 24, "variant": 40}[what]
    m = 8 + (ctx.rank if what == "shape" else 0)
    variant = ("bulk_sync", "fused_sequential")[ctx.rank % 2] if what == "variant" else "fused_sequential"
    a = torch.randn(m, k, generator=gen).to(ctx.device)
    b = torch.randn(k, 16, generator=gen).to(ctx.device)
    with pytest.raises(tilefuse.CallMismatchError):
        registry.get(op, variant)(a, b)
        tilefuse.synchronize()
    a = torch.randn(8, k, generator=gen).to(ctx.device)
    got = registry.get(op, "fused_sequential")(a, b)
    tilefuse.synchronize()
    return got.shape[0] == 8 * ctx.world


@pytest.mark.parametrize("what", ["shape", "variant"])
def test_first_call_mismatch_is_call_mismatch_error(pools, what):
    assert all(pools.run(2, job_first_call_mismatch, "all_gather_gemm", what))


def job_requires_grad_on_one_rank(ctx, op):
    """``requires_grad`` on one rank only is the same call: autograd's view of a call is local."""
    gen = torch.Generator().manual_seed(11 + ctx.rank)
    a = torch.randn(8, 32, generator=gen).to(ctx.device).requires_grad_(ctx.rank == 0)
    b = torch.randn(32, 16, generator=gen).to(ctx.device)
    out = getattr(tilefuse, op)(a, b, variant="fused_sequential")
    tilefuse.synchronize()
    return tuple(out.shape)


def test_requires_grad_on_one_rank_is_the_same_call(pools):
    assert len(set(pools.run(2, job_requires_grad_on_one_rank, "all_gather_gemm"))) == 1
