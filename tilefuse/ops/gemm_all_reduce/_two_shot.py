"""Device loops of the two-shot algorithm: reduce-scatter the partial tiles, then all-gather the sums.

Rows are split into W *owner blocks* of ``rows = cdiv(M, W)`` rows (owner o: rows
``o*rows ... min(M, (o+1)*rows)``; the last blocks may be short or empty). Owner o's tiles are the
``tiles_per_owner = cdiv(rows, BM) * cdiv(N, BN)`` tiles of its block (grouped swizzle inside the
block; tiles past a short block's end are skipped by producers and consumers alike).

``stage [W, M, N]`` (input dtype) as in the one-shot (:mod:`._tiles`), rows at their absolute
positions: in the push layout slot s of owner o holds source s's partial of o's rows; in the pull
layout (bulk_sync) rank s's slot s holds its whole partial. The owner sums its block's W partials in
fp32 in the order 0, 1, ..., W-1 (+ bias), rounds once, and stores the sum into its own ``c`` and,
in place, into its slot o (its own partial there is no longer needed); every other rank then copies
the sums from slot o of o's heap into its ``c``. The bits are those of the one-shot algorithm.

Flags ``flags [2, W, tiles_per_owner]`` int64 on every rank: ``flags[0, s, j]`` is released on owner
o by source s once its partial of o's tile j is in o's slot s; ``flags[1, o, j]`` is released on
every other rank by owner o once the sum of its tile j is in its slot o. Both carry the call's
sequence number.
"""

import triton
import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.config import side_warps
from ..common.flags import tile_acquire, tile_release
from ..common.reduce import block_offsets, owner_at, push_partial, slot_ptr
from ..common.tiles import gemm_operands, gemm_tile, tile_coords, tile_offsets
from ._tiles import load_partial


@triton.jit
def owner_rows(owner, M, world):
    """(first row, number of rows) of ``owner``'s block (the count may be 0)."""
    rows = tl.cdiv(M, world)
    first = owner * rows
    return first, tl.maximum(tl.minimum(rows, M - first), 0)


@triton.jit
def produce_owned(
    # GEMM operands (the order of GemmCall.gemm_args)
    a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    # stage [W, M, N] (input dtype) and flags [2, W, tiles_per_owner] int64 (symmetric addresses)
    stage_ptr, flags_ptr, stride_slot, stride_sm, stride_sn,
    # distributed
    heap_bases, cur_rank, world, epoch,
    # this program among NUM_PROGRAMS GEMM programs
    pid,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, RELEASE: tl.constexpr,
    WARP_SPEC: tl.constexpr = False,
):
    """Compute this rank's partial of every owner's tiles and store each into the owner's slot
    ``cur_rank`` (owners cur_rank + 1, cur_rank + 2, ..., itself last, so that at any moment the
    ranks push to different owners). With ``RELEASE`` the owner's ``flags[0, cur_rank, j]`` follows.
    Tiles past a short block's end multiply zeros and store nothing (masked; their flags, released
    all the same, are never waited for): the loop body has no branch, which warp specialization
    (``WARP_SPEC``, ``Config.WARP_SPEC``; never with ``RELEASE``) needs.
    """
    num_pid_m = tl.cdiv(tl.cdiv(M, world), BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tiles_per_owner = num_pid_m * num_pid_n
    my_slot = slot_ptr(stage_ptr, cur_rank, stride_slot)
    for step in range(0, world):
        owner = owner_at(cur_rank, step, world)
        first, count = owner_rows(owner, M, world)
        if count > 0:  # an owner without rows (M small against W): no descriptor of 0 rows
            # The owner's row block of A as an [count, K] matrix of its own.
            a_owner = a_ptr + tl.cast(first, tl.int64) * stride_am
            a_op, b_op = gemm_operands(a_owner, b_ptr, count, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                       BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR)
            block = my_slot + tl.cast(first, tl.int64) * stride_sm
            start = (pid + NUM_PROGRAMS - (step * tiles_per_owner) % NUM_PROGRAMS) % NUM_PROGRAMS
            for j in tl.range(start, tiles_per_owner, NUM_PROGRAMS, warp_specialize=WARP_SPEC):
                pid_m, pid_n = tile_coords(j, num_pid_m, num_pid_n, GROUP_M)
                acc = gemm_tile(a_op, b_op, pid_m, pid_n, count, N, K, stride_am, stride_ak, stride_bk,
                                stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR)  # [BM, BN] fp32
                offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N)
                push_partial(block, acc.to(stage_ptr.dtype.element_ty), offs_m, offs_n, count, N, stride_sm,
                             stride_sn, flags_ptr + cur_rank * tiles_per_owner + j, epoch, cur_rank, owner,
                             heap_bases, RELEASE)


@triton.jit
def reduce_owned(
    # stage [W, M, N] (input dtype), flags [2, W, tiles_per_owner], output c [M, N], bias [N]
    stage_ptr, flags_ptr, c_ptr, bias_ptr,
    M, N,
    stride_slot, stride_sm, stride_sn, stride_cm, stride_cn,
    # distributed
    heap_bases, ctl_ptr, cur_rank, world, epoch,
    # this program among NUM_PROGRAMS reduction programs
    cid,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUB_M: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, PULL: tl.constexpr, WAIT: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    """Sum the W partials of this rank's tiles cid, cid + NUM_PROGRAMS, ...: ``((s_0 + s_1) + ...) + bias``
    in fp32, rounded once; store into c and into this rank's slot ``cur_rank``.

    ``PULL``: source s's partial is read from slot s of rank s's heap; else from this rank's slot s.
    ``WAIT``: acquire ``flags[0, s, j]`` for s = 0..W-1 first, and release ``flags[1, cur_rank, j]`` on
    every other rank after the store.
    """
    first, count = owner_rows(cur_rank, M, world)
    num_pid_m = tl.cdiv(tl.cdiv(M, world), BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tiles_per_owner = num_pid_m * num_pid_n
    block = stage_ptr + tl.cast(first, tl.int64) * stride_sm  # row `first` of slot 0
    own = slot_ptr(block, cur_rank, stride_slot)
    c_block = c_ptr + tl.cast(first, tl.int64) * stride_cm
    for j in range(cid, tiles_per_owner, NUM_PROGRAMS):
        pid_m, pid_n = tile_coords(j, num_pid_m, num_pid_n, GROUP_M)
        if pid_m * BLOCK_M < count:
            if WAIT:
                for src in range(0, world):
                    # Acquire: pairs with the release in produce_owned on rank `src`.
                    tile_acquire(flags_ptr + src * tiles_per_owner + j, epoch, cur_rank, src, ctl_ptr, heap_bases,
                                 world)
            for sub in range(0, tl.cdiv(tl.minimum(BLOCK_M, count - pid_m * BLOCK_M), SUB_M)):
                offs_m, offs_n = block_offsets(pid_m, pid_n, sub, BLOCK_M, BLOCK_N, SUB_M)  # [SUB_M], [BN]
                offs = offs_m[:, None] * stride_sm + offs_n[None, :] * stride_sn  # [SUB_M, BN] int32
                mask = (offs_m[:, None] < count) & (offs_n[None, :] < N)  # [SUB_M, BN]
                acc = load_partial(block, 0, offs, mask, heap_bases, cur_rank, stride_slot, PULL)  # [SUB_M, BN]
                for src in range(1, world):
                    acc += load_partial(block, src, offs, mask, heap_bases, cur_rank, stride_slot, PULL)
                if HAS_BIAS:
                    acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
                total = acc.to(c_ptr.dtype.element_ty)  # [SUB_M, BN], rounded once
                tl.store(c_block + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, total, mask=mask)
                # In place of this rank's own partial (read above, by this program only).
                tl.store(own + offs, total, mask=mask)
            if WAIT:
                for i in range(1, world):
                    dst = (cur_rank + i) % world
                    # Release: pairs with the acquire in gather_rows (WAIT) on rank `dst`.
                    tile_release(flags_ptr + (world + cur_rank) * tiles_per_owner + j, epoch, cur_rank, dst,
                                 heap_bases)


@triton.jit
def gather_rows(
    # stage [W, M, N] (input dtype), flags [2, W, tiles_per_owner], output c [M, N]
    stage_ptr, flags_ptr, c_ptr,
    M, N,
    stride_slot, stride_sm, stride_sn, stride_cm, stride_cn,
    # distributed
    heap_bases, ctl_ptr, cur_rank, world, epoch,
    # this program among NUM_PROGRAMS gathering programs
    cid,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUB_M: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, WAIT: tl.constexpr,
):
    """Copy every other owner's sums (slot o of rank o's heap) into this rank's c: owners
    cur_rank + 1, cur_rank + 2, ...; ``WAIT``: acquire ``flags[1, o, j]`` before each tile."""
    num_pid_m = tl.cdiv(tl.cdiv(M, world), BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tiles_per_owner = num_pid_m * num_pid_n
    for step in range(0, world - 1):
        owner = owner_at(cur_rank, step, world)
        first, count = owner_rows(owner, M, world)
        src = slot_ptr(stage_ptr + tl.cast(first, tl.int64) * stride_sm, owner, stride_slot)
        c_block = c_ptr + tl.cast(first, tl.int64) * stride_cm
        for j in range(cid, tiles_per_owner, NUM_PROGRAMS):
            pid_m, pid_n = tile_coords(j, num_pid_m, num_pid_n, GROUP_M)
            if pid_m * BLOCK_M < count:
                if WAIT:
                    # Acquire: pairs with the release at the end of reduce_owned on rank `owner`.
                    tile_acquire(flags_ptr + (world + owner) * tiles_per_owner + j, epoch, cur_rank, owner, ctl_ptr,
                                 heap_bases, world)
                for sub in range(0, tl.cdiv(tl.minimum(BLOCK_M, count - pid_m * BLOCK_M), SUB_M)):
                    offs_m, offs_n = block_offsets(pid_m, pid_n, sub, BLOCK_M, BLOCK_N, SUB_M)  # [SUB_M], [BN]
                    mask = (offs_m[:, None] < count) & (offs_n[None, :] < N)  # [SUB_M, BN]
                    total = P.load(src + offs_m[:, None] * stride_sm + offs_n[None, :] * stride_sn, cur_rank, owner,
                                   heap_bases, mask=mask)  # [SUB_M, BN]
                    tl.store(c_block + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, total, mask=mask)


@triton.jit
def comm_two_shot(
    stage_ptr, flags_ptr, c_ptr, bias_ptr,
    M, N,
    stride_slot, stride_sm, stride_sn, stride_cm, stride_cn,
    heap_bases, ctl_ptr, cur_rank, world, epoch,
    # this program among REDUCERS + GATHERERS communication programs
    cid,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUB_M: tl.constexpr, GROUP_M: tl.constexpr,
    REDUCERS: tl.constexpr, GATHERERS: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    """Flagged communication programs: ``cid < REDUCERS`` sum this rank's tiles, the others gather.

    Separate programs, gatherers last: a gatherer waits only on other ranks' reducers, a reducer only
    on producers, so no program waits on a program that runs after it (the interpreter's order).
    """
    if cid < REDUCERS:
        reduce_owned(stage_ptr, flags_ptr, c_ptr, bias_ptr, M, N,
                     stride_slot, stride_sm, stride_sn, stride_cm, stride_cn,
                     heap_bases, ctl_ptr, cur_rank, world, epoch, cid,
                     BLOCK_M, BLOCK_N, SUB_M, GROUP_M, REDUCERS, PULL=False, WAIT=True, HAS_BIAS=HAS_BIAS)
    else:
        gather_rows(stage_ptr, flags_ptr, c_ptr, M, N,
                    stride_slot, stride_sm, stride_sn, stride_cm, stride_cn,
                    heap_bases, ctl_ptr, cur_rank, world, epoch, cid - REDUCERS,
                    BLOCK_M, BLOCK_N, SUB_M, GROUP_M, GATHERERS, WAIT=True)


@kernel
def reduce_owned_kernel(
    stage_ptr, flags_ptr, c_ptr, bias_ptr, stride_cm, stride_cn,
    M, N,
    stride_slot, stride_sm, stride_sn,
    heap_bases, ctl_ptr, cur_rank, world,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUB_M: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, PULL: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    """Standalone sum of this rank's rows (every partial in place: after a barrier)."""
    epoch, live = P.call_epoch(ctl_ptr)
    if live:
        reduce_owned(stage_ptr, flags_ptr, c_ptr, bias_ptr, M, N,
                     stride_slot, stride_sm, stride_sn, stride_cm, stride_cn,
                     heap_bases, ctl_ptr, cur_rank, world, epoch, tl.program_id(0),
                     BLOCK_M, BLOCK_N, SUB_M, GROUP_M, NUM_PROGRAMS, PULL, WAIT=False, HAS_BIAS=HAS_BIAS)


@kernel
def gather_kernel(
    stage_ptr, flags_ptr, c_ptr, stride_cm, stride_cn,
    M, N,
    stride_slot, stride_sm, stride_sn,
    heap_bases, ctl_ptr, cur_rank, world,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUB_M: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
):
    """Standalone copy of the other owners' sums into c (every sum in place: after a barrier)."""
    epoch, live = P.call_epoch(ctl_ptr)
    if live:
        gather_rows(stage_ptr, flags_ptr, c_ptr, M, N,
                    stride_slot, stride_sm, stride_sn, stride_cm, stride_cn,
                    heap_bases, ctl_ptr, cur_rank, world, epoch, tl.program_id(0),
                    BLOCK_M, BLOCK_N, SUB_M, GROUP_M, NUM_PROGRAMS, WAIT=False)


@kernel
def comm_two_shot_kernel(
    stage_ptr, flags_ptr, c_ptr, bias_ptr, stride_cm, stride_cn,
    M, N,
    stride_slot, stride_sm, stride_sn,
    heap_bases, ctl_ptr, cur_rank, world,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUB_M: tl.constexpr, GROUP_M: tl.constexpr,
    REDUCERS: tl.constexpr, GATHERERS: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    """Standalone :func:`comm_two_shot` (producer_consumer's second stream)."""
    epoch, live = P.call_epoch(ctl_ptr)
    if live:
        comm_two_shot(stage_ptr, flags_ptr, c_ptr, bias_ptr, M, N,
                      stride_slot, stride_sm, stride_sn, stride_cm, stride_cn,
                      heap_bases, ctl_ptr, cur_rank, world, epoch, tl.program_id(0),
                      BLOCK_M, BLOCK_N, SUB_M, GROUP_M, REDUCERS, GATHERERS, HAS_BIAS)


def launch_barriered(call, programs: int, *, pull: bool) -> None:
    """bulk_sync and fused_sequential after their GEMM: barrier, sums, barrier, gather."""
    from ..common.launch import mid_barrier

    cfg, heap = call.config, call.heap
    mid_barrier(heap, 0)  # every partial is in place
    common = dict(BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, SUB_M=call.sub_m, GROUP_M=cfg.GROUP_M,
                  NUM_PROGRAMS=programs, num_warps=side_warps(cfg))
    reduce_owned_kernel[(programs,)](
        call.stage, call.stage, *call.out_args, call.gemm.M, call.gemm.N, *call.stage_args, *call.dist_args,
        PULL=pull, HAS_BIAS=call.bias is not None, **common,
    )
    if heap.world_size > 1:
        mid_barrier(heap, 1)  # every owner's sums are in place
        c = call.c
        gather_kernel[(programs,)](
            call.stage, call.stage, c, c.stride(0), c.stride(1), call.gemm.M, call.gemm.N, *call.stage_args,
            *call.dist_args, **common,
        )


def launch_comm(call, reducers: int, gatherers: int) -> None:
    """producer_consumer's communication kernel."""
    cfg = call.config
    comm_two_shot_kernel[(reducers + gatherers,)](
        call.stage, call.flags, *call.out_args, call.gemm.M, call.gemm.N, *call.stage_args, *call.dist_args,
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, SUB_M=call.sub_m, GROUP_M=cfg.GROUP_M, REDUCERS=reducers,
        GATHERERS=gatherers, HAS_BIAS=call.bias is not None, num_warps=side_warps(cfg),
    )
