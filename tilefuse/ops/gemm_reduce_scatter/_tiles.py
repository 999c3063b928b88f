"""Device loops shared by the gemm_reduce_scatter variants: produce partial tiles, reduce owned tiles.

Owner o's tiles are the ``tiles_per_owner`` tiles of its rows ``A[o*rows : (o+1)*rows]`` (``rows =
M / W``). Rank r walks the owners r+1, r+2, ..., r, so the ranks push to different owners. ``stage [W,
rows, N]`` (input dtype; fp32 for float8) on every heap: slot s of owner o holds source s's partial
of o's rows, rounded once (bulk_sync's pull layout: slot o of rank s). ``flags [W, tiles_per_owner]``
int64 on the owner: ``(s, j)`` = the call's sequence number once source s's tile j is there. Flagged
variants at W >= 3 sum into an fp32 ``run [rows, N]``.
"""

import triton
import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.flags import tile_acquire
from ..common.reduce import accumulate_slot, block_offsets, owner_at, push_partial, source_at, sum_slots
from ..common.tiles import gemm_operands, gemm_tile, scales_from_row, store_tile, tile_coords, tile_offsets


@triton.jit
def produce_partials(
    a_ptr, b_ptr, scales, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    # stage [W, rows, N] (input dtype; fp32 for float8) and the owner-side flags (symmetric addresses)
    stage_ptr, flags_ptr, stride_slot, stride_sm, stride_sn,
    call, epoch, pid,  # the call; its sequence number; this program among NUM_PROGRAMS
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, RELEASE: tl.constexpr,
    WARP_SPEC: tl.constexpr = False,
):
    """This rank's partial of every tile, rounded once, into the owner's slot ``rank``: tile j of owner
    ``owner_at(step)`` is program ``(step * tiles_per_owner + j) % NUM_PROGRAMS``'s. ``RELEASE``: then the
    owner's flag (rank, j) = ``epoch``. ``WARP_SPEC``: warp-specialized tile loops (never with RELEASE)."""
    rank, world = P.rank(call), P.world(call)
    rows = M // world
    num_pid_m = tl.cdiv(rows, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tiles_per_owner = num_pid_m * num_pid_n
    my_slot = stage_ptr + tl.cast(rank, tl.int64) * stride_slot
    for step in range(0, world):
        owner = owner_at(rank, step, world)
        # The owner's row block of A as an [rows, K] matrix (16-byte aligned for TMA: checked on the host).
        a_owner = a_ptr + tl.cast(owner, tl.int64) * rows * stride_am
        a_op, b_op = gemm_operands(a_owner, b_ptr, rows, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                   BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR)
        first = (pid + NUM_PROGRAMS - (step * tiles_per_owner) % NUM_PROGRAMS) % NUM_PROGRAMS
        for j in tl.range(first, tiles_per_owner, NUM_PROGRAMS, warp_specialize=WARP_SPEC):
            pid_m, pid_n = tile_coords(j, num_pid_m, num_pid_n, GROUP_M)
            acc = gemm_tile(a_op, b_op, scales_from_row(scales, owner * rows), pid_m, pid_n, rows, N, K,
                            stride_am, stride_ak, stride_bk, stride_bn,
                            BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR)  # [BM, BN] fp32
            offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N)
            # Release (with RELEASE): pairs with the acquire in reduce_owned (WAIT) on rank `owner`.
            push_partial(my_slot, acc.to(stage_ptr.dtype.element_ty), offs_m, offs_n, rows, N, stride_sm, stride_sn,
                         flags_ptr + rank * tiles_per_owner + j, epoch, rank, owner, P.bases(call), RELEASE)


@kernel
def partials_kernel(
    a_ptr, b_ptr, scales, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,  # scales: common.scaled
    # stage [W, rows, N] and, with RELEASE, flags [W, tiles_per_owner] int64 (symmetric addresses)
    stage_ptr, flags_ptr, stride_slot, stride_sm, stride_sn,
    call, exit_programs,  # the call (begun here with ENTER); the programs that end it together
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, ENTER: tl.constexpr,
    RELEASE: tl.constexpr, BARRIER: tl.constexpr, WARP_SPEC: tl.constexpr,
):
    """:func:`produce_partials` on its own programs: producer_consumer's GEMM (``RELEASE``) and
    fused_sequential's kernel (``BARRIER``: after it every rank's partials are in their owners' slots)."""
    seq, live = P.enter(call, ENTER)
    if live:
        produce_partials(a_ptr, b_ptr, scales, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                         stage_ptr, flags_ptr, stride_slot, stride_sm, stride_sn, call, seq, tl.program_id(0),
                         BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, USE_TMA, B_KMAJOR, RELEASE, WARP_SPEC)
    P.exit(call, seq, live, exit_programs, ENTER, BARRIER=BARRIER)


@triton.jit
def reduce_owned(
    # stage [W, rows, N], the flags, the fp32 running sum run [rows, N] (WAIT, W >= 3), this rank's c [rows, N]
    stage_ptr, flags_ptr, run_ptr, c_ptr,
    rows, N,
    stride_slot, stride_sm, stride_sn, stride_cm, stride_cn,
    call, epoch, cid,  # the call; its sequence number; this program among NUM_PROGRAMS
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUB_M: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, PULL: tl.constexpr, WAIT: tl.constexpr,
):
    """Sum the W contributions to tiles cid, cid + NUM_PROGRAMS, ... of this rank's rows into c in fp32, in
    the fixed source order: without ``WAIT`` the W slots in registers; with ``WAIT`` source by source,
    after each tile's flag, into the running sum ``run`` (the same bits)."""
    rank, world, heap_bases = P.rank(call), P.world(call), P.bases(call)
    num_pid_m = tl.cdiv(rows, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tiles_per_owner = num_pid_m * num_pid_n
    if WAIT:
        for i in range(0, world):
            src = source_at(rank, i, world)
            for j in range(cid, tiles_per_owner, NUM_PROGRAMS):
                # Acquire: pairs with the release in produce_partials on rank `src`.
                tile_acquire(flags_ptr + src * tiles_per_owner + j, epoch, rank, src, P.ctl(call), heap_bases, world)
                pid_m, pid_n = tile_coords(j, num_pid_m, num_pid_n, GROUP_M)
                for sub in range(0, tl.cdiv(tl.minimum(BLOCK_M, rows - pid_m * BLOCK_M), SUB_M)):
                    offs_m, offs_n = block_offsets(pid_m, pid_n, sub, BLOCK_M, BLOCK_N, SUB_M)
                    accumulate_slot(stage_ptr, run_ptr, c_ptr, offs_m, offs_n, rows, N, stride_slot, stride_sm,
                                    stride_sn, stride_cm, stride_cn, rank, world, i)
    else:
        for j in range(cid, tiles_per_owner, NUM_PROGRAMS):
            pid_m, pid_n = tile_coords(j, num_pid_m, num_pid_n, GROUP_M)
            for sub in range(0, tl.cdiv(tl.minimum(BLOCK_M, rows - pid_m * BLOCK_M), SUB_M)):
                offs_m, offs_n = block_offsets(pid_m, pid_n, sub, BLOCK_M, BLOCK_N, SUB_M)
                acc = sum_slots(stage_ptr, offs_m, offs_n, rows, N, stride_slot, stride_sm, stride_sn,
                                heap_bases, rank, world, PULL)  # [SUB_M, BN] fp32
                store_tile(c_ptr, acc, offs_m, offs_n, rows, N, stride_cm, stride_cn)


@kernel
def reduce_kernel(
    stage_ptr, flags_ptr, run_ptr, c_ptr,
    rows, N,
    stride_slot, stride_sm, stride_sn, stride_cm, stride_cn,
    call, exit_programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUB_M: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, PULL: tl.constexpr, WAIT: tl.constexpr, END: tl.constexpr = False,
    ENTER: tl.constexpr = False,
):
    """One persistent launch of :func:`reduce_owned`; ``END``: the call's last kernel (``P.exit`` over
    ``exit_programs``), ``ENTER``: also one that begins it (beside a GEMM kernel that does too)."""
    seq, live = P.enter(call, ENTER)
    if live:
        reduce_owned(stage_ptr, flags_ptr, run_ptr, c_ptr, rows, N, stride_slot, stride_sm, stride_sn, stride_cm,
                     stride_cn, call, seq, tl.program_id(0), BLOCK_M, BLOCK_N, SUB_M, GROUP_M, NUM_PROGRAMS, PULL, WAIT)
    P.exit(call, seq, live, exit_programs, END)


def launch_reduce(p, call: tuple, c, programs: int, *, pull: bool, wait: bool, end: bool = False,
                  enter: bool = False, exit_programs: int | None = None) -> None:
    """:func:`reduce_kernel` on ``programs`` programs into ``c``: ``pull`` the peers' partials or sum those
    pushed here, ``wait`` on the flags (else a barrier ordered them); ``end``, ``enter``: ``END``, ``ENTER``."""
    cfg = p.config
    reduce_kernel[(programs,)](  # without wait the stage stands in for the flags (never read)
        p.stage, p.flags if wait else p.stage, p.run, c, p.rows, p.N, *p.stage_strides, *c.stride(),
        call, programs if exit_programs is None else exit_programs, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
        SUB_M=p.sub_m, GROUP_M=cfg.GROUP_M, NUM_PROGRAMS=programs, PULL=pull, WAIT=wait, END=end, ENTER=enter,
        num_warps=p.side_warps)
