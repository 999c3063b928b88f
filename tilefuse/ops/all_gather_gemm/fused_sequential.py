"""all_gather_gemm, fused sequential: one persistent GEMM that reads peers' A rows in its K loop.

    stream:    | publish: begin, copy a -> a_shard, barrier | fused kernel |
    program p: | local tiles: K loop on a_shard | source r+1 tiles: K loop on rank r+1's a_shard | ...

The publish kernel begins the call (every rank is done with the previous call's shard) and ends it
with a barrier, after which every shard is in place: no flags. With ``return_gathered`` the program
that computes a row block's first column tile also copies its A rows into ``a_gathered``.
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.launch import begin_call, call_arg, collective, launched, new_output
from ._prepare import OP, prepare
from ._tiles import gemm_gathered, launch_shard
from .bulk_sync import bulk_sync


@kernel
def _fused_kernel(
    # this rank's a_shard [M_loc, K] (a symmetric address); a float8 call's scales (_tiles), else stand-ins
    s_ptr, stride_sm, stride_sk, scales,
    b_ptr, stride_bk, stride_bn,
    # c [W*M_loc, N] and, with GATHER, a_gathered [W*M_loc, K]: ordinary local tensors
    c_ptr, stride_cm, stride_cn, g_ptr, stride_gm, stride_gk,
    M_loc, N, K, call,  # call: begun and ended by the publish kernel
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, GATHER: tl.constexpr,
    FLATTEN: tl.constexpr,
):
    _, live = P.call_epoch(P.ctl(call))
    if live:  # every source's a_shard read in place (REMOTE), no flag (s_ptr stands in)
        gemm_gathered(s_ptr, stride_sm, stride_sk, g_ptr, stride_gm, stride_gk, scales, (b_ptr, stride_bk, stride_bn),
                      c_ptr, stride_cm, stride_cn, s_ptr, M_loc, N, K, call, 0, tl.program_id(0), NUM_PROGRAMS, BLOCK_M,
                      BLOCK_N, BLOCK_K, GROUP_M, USE_TMA, B_KMAJOR, False, FLATTEN, REMOTE=True, GATHER=GATHER)


@collective(OP)
def fused_sequential(a, b, *, config=None, group=None, return_gathered=False, scale_a=None, scale_b=None,
                     out_dtype=None):
    """all_gather_gemm as one persistent kernel reading remote A; same contract as :func:`tilefuse.all_gather_gemm`."""
    scaling = (scale_a, scale_b, out_dtype)
    heap, p = prepare("fused_sequential", a, b, config, group, return_gathered, scaling, buffers="shard")
    if p.empty:
        return bulk_sync(a, b, config=config, group=group, return_gathered=return_gathered, scale_a=scale_a,
                         scale_b=scale_b, out_dtype=out_dtype)
    W = heap.world_size
    c = new_output((W * p.M, p.N), p.out_dtype, a.device)
    ag = new_output((W * p.M, p.K), a.dtype, a.device) if return_gathered else c
    entry = begin_call(p.sig, c, ag if return_gathered else None, kernel_begins=True)
    call = call_arg(heap, entry)
    # The copy comes after the begin (no peer still reads the previous call's shard) and ends the call.
    scales = p.scales(scale_a, scale_b)
    launch_shard(p, a, p.own, scales, call, every_rank=False)
    launched(entry)
    _fused_kernel[(p.programs,)](
        p.own, *p.own.stride(), scales, b, *b.stride(), c, *c.stride(), ag, *ag.stride(), p.M, p.N, p.K, call,
        NUM_PROGRAMS=p.programs, GATHER=return_gathered, **p.meta)
    return (c, ag) if return_gathered else c
