"""all_gather_gemm, fused sequential: one persistent GEMM that reads peers' A rows in its K loop.

    stream:    | publish: begin, copy a -> a_shard, barrier | fused kernel |
    program p: | local tiles: K loop on a_shard | source r+1 tiles: K loop on rank r+1's a_shard | ...

Each rank publishes its shard in its own heap (``a_shard``): the publish kernel's first program
begins the call (``call_enter``), its programs copy the rows, and its last program passes the
barrier with the other ranks (``call_exit`` with ``BARRIER``), so a call is two launches. After the
barrier every program computes its tiles source by source in ring order r, r+1, ..., loading A
straight from the source rank's heap through a translated pointer (TMA descriptors work on any
address). There is no flag: the barrier says every shard is in place. With ``return_gathered`` the
program that computes a row block's first column tile also copies those A rows into the caller's
``a_gathered``.

Cross-call safety: the shard is written after the begin, which every rank passes only once every
rank finished the previous call (the last one that read it). The fused kernel waits on nothing, so
the publish kernel's end of the call (``ctl[SEQ]``, the status words) is the call's.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.launch import collective, ctl, workspace
from ._setup import OP, finish, gemm_meta, is_degenerate, layout, new_output, setup, start
from ._tiles import first_tile, gemm_shard, launch_shard
from .bulk_sync import bulk_sync


@triton.jit
def _source(
    i, pid, s_ptr, stride_sm, stride_sk, b_ptr, stride_bk, stride_bn, c_ptr, stride_cm, stride_cn,
    g_ptr, stride_gm, stride_gk, M_loc, N, K, heap_bases, ctl_ptr, cur_rank, world,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, GATHER: tl.constexpr,
    FLATTEN: tl.constexpr,
):
    """Program pid's tiles of source step i: rank (cur_rank + i)'s shard, read in place."""
    src = (cur_rank + i) % world
    rows = tl.cast(src, tl.int64) * M_loc
    a_src = P.translate(s_ptr, cur_rank, src, heap_bases)
    tiles_per_source = tl.cdiv(M_loc, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    gemm_shard(a_src, stride_sm, stride_sk, b_ptr, stride_bk, stride_bn,
               c_ptr + rows * stride_cm, stride_cm, stride_cn,
               g_ptr + rows * stride_gm, stride_gm, stride_gk,
               # no flags (WAIT=False): the barrier published A
               s_ptr, 0, src, cur_rank, ctl_ptr, heap_bases, world,
               M_loc, N, K, first_tile(pid, i, tiles_per_source, NUM_PROGRAMS), NUM_PROGRAMS,
               BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA, B_KMAJOR, WAIT=False, GATHER=GATHER,
               FLATTEN=FLATTEN)


@kernel
def _fused_kernel(
    # this call's slot of a_shard [M_loc, K] (a symmetric address)
    s_ptr, stride_sm, stride_sk,
    b_ptr, stride_bk, stride_bn,
    # c [W*M_loc, N] and, with GATHER, a_gathered [W*M_loc, K]: ordinary local tensors
    c_ptr, stride_cm, stride_cn,
    g_ptr, stride_gm, stride_gk,
    M_loc, N, K,
    heap_bases, ctl_ptr, cur_rank, world,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, GATHER: tl.constexpr,
    FLATTEN: tl.constexpr,
):
    pid = tl.program_id(0)
    _, live = P.call_epoch(ctl_ptr)
    # The local source outside the loop over the peers: Triton flattens a tile loop only where no
    # other loop encloses it (nested in the loop over sources, the loop compiles unflattened).
    if live:
        _source(0, pid, s_ptr, stride_sm, stride_sk, b_ptr, stride_bk, stride_bn, c_ptr, stride_cm, stride_cn,
                g_ptr, stride_gm, stride_gk, M_loc, N, K, heap_bases, ctl_ptr, cur_rank, world,
                BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, USE_TMA, B_KMAJOR, GATHER, FLATTEN)
    for i in range(1, tl.where(live, world, 1)):
        _source(i, pid, s_ptr, stride_sm, stride_sk, b_ptr, stride_bk, stride_bn, c_ptr, stride_cm, stride_cn,
                g_ptr, stride_gm, stride_gk, M_loc, N, K, heap_bases, ctl_ptr, cur_rank, world,
                BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, USE_TMA, B_KMAJOR, GATHER, FLATTEN)


@collective(OP)
def fused_sequential(a, b, *, config=None, group=None, return_gathered=False):
    """all_gather_gemm as one persistent kernel reading remote A; same contract as
    :func:`tilefuse.all_gather_gemm`."""
    call = setup("fused_sequential", a, b, config, group, comm=False)
    if is_degenerate(call):
        return bulk_sync(a, b, config=config, group=group, return_gathered=return_gathered)
    heap, cfg = call.heap, call.config
    W, r, M_loc, N, K = heap.world_size, heap.rank, call.M, call.N, call.K
    shard = workspace(heap, (OP, "fused_sequential", M_loc, K, a.dtype),
                      lambda h: {"a_shard": h.empty((M_loc, K), dtype=a.dtype)}, M_loc * K * a.element_size()).a_shard
    lay = layout(call, shard)
    c = new_output((W * M_loc, N), a.dtype, a.device)
    ag = new_output((W * M_loc, K), a.dtype, a.device) if return_gathered else c
    entry = start(call, "fused_sequential", return_gathered, c, ag if return_gathered else None,
                  kernel_begins=True)
    # The copy comes after the begin: no peer still reads the previous call's shard. The fused kernel
    # waits on nothing, so this kernel's end of the call is the call's.
    launch_shard(call, a, shard, entry, every_rank=False, ends=True)
    programs = cfg.GEMM_SMS + cfg.COMM_SMS  # not capped by the tiles: one kernel per config
    _fused_kernel[(programs,)](
        shard, shard.stride(0), shard.stride(1), b, b.stride(0), b.stride(1),
        c, c.stride(0), c.stride(1), ag, ag.stride(0), ag.stride(1),
        M_loc, N, K, heap.heap_bases, ctl(heap), r, W,
        NUM_PROGRAMS=programs, GATHER=return_gathered, **gemm_meta(call, lay, flatten=not return_gathered),
    )
    return finish(call, c, ag if return_gathered else None, return_gathered)
