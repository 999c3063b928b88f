"""Device-side tile schedule shared by the all_gather_gemm variants.

The output ``c [W*M_loc, N]`` is cut into per-source row blocks: source rank s owns rows
``s*M_loc ... (s+1)*M_loc``. Tiles are numbered over (i, m-block, n-block) where i walks the sources
in ring order from this rank (source ``(r + i) % W``), so a tile's rows never straddle two ranks and
every program starts on the local shard. Within a source the usual grouped swizzle applies. Program
``pid`` of ``P`` takes global tiles ``pid, pid + P, ...``, the same persistent round-robin as the
plain GEMM, continued across sources.
"""

import triton
import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.flags import tile_acquire
from ..common.gather import copy_pieces, copy_rows, push_shard
from ..common.launch import ctl, enter_args, launched, mid_barrier
from ..common.tiles import claimed_tiles, gemm_operands, gemm_tile, store_tile, tile_coords, tile_offsets, whole_tiles


@kernel
def shard_kernel(
    # this rank's rows [M_loc, K] (any local tensor)
    a_ptr, stride_am, stride_ak,
    # where they go (a symmetric address): row block r of a_gathered, or a_shard
    dst_ptr, stride_dm, stride_dk,
    M_loc, K,
    # distributed; the call's begin (this kernel begins the call, ENTER)
    heap_bases, ctl_ptr, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1, status_ptr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, NUM_PROGRAMS: tl.constexpr, ENTER: tl.constexpr,
    EVERY_RANK: tl.constexpr,
):
    """The first kernel of bulk_sync and fused_sequential: begin the call (``ENTER``), copy this
    rank's rows into ``dst`` on every rank (``EVERY_RANK``, bulk_sync's push into a_gathered) or on
    this rank only (fused_sequential's a_shard, which the peers read in place), in tiles of BLOCK_M x
    BLOCK_K over every program; the last program passes the barrier after which every rank's rows
    are in place, and (with ENTER) moves ctl[SEQ], so the GEMM after it reads the call's number."""
    epoch, live = P.call_enter(ctl_ptr, heap_bases, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1,
                               ENTER)
    if live:
        if EVERY_RANK:
            # No flags (SIGNAL=False): the barrier below publishes the rows; dst_ptr stands in.
            push_shard(a_ptr, stride_am, stride_ak, dst_ptr, stride_dm, stride_dk, dst_ptr, 0, M_loc, K,
                       cur_rank, world, heap_bases, tl.program_id(0), NUM_PROGRAMS, BLOCK_M, BLOCK_K, FIRST=0,
                       SIGNAL=False)
        else:
            copy_pieces(dst_ptr, stride_dm, stride_dk, a_ptr, stride_am, stride_ak, M_loc, K, tl.program_id(0),
                        NUM_PROGRAMS, BLOCK_M, BLOCK_K)
    P.call_exit(ctl_ptr, heap_bases, cur_rank, world, epoch, live, status_ptr, NUM_PROGRAMS, ENTER, BARRIER=True)


def launch_shard(call, a, dst, entry, *, every_rank: bool, ends: bool) -> None:
    """Launch :func:`shard_kernel` for ``call`` (a checked GemmCall): ``a``'s rows into ``dst`` (a
    heap tensor) on every rank or on this one; ``entry``: the begin arguments of :func:`start` (None:
    a begin kernel began the call, and a barrier kernel follows this one); ``ends``: nothing after it
    ends the call."""
    heap, cfg = call.heap, call.config
    programs = cfg.GEMM_SMS + cfg.COMM_SMS  # not capped by the tiles: one kernel per config
    shard_kernel[(programs,)](
        a, a.stride(0), a.stride(1), dst, dst.stride(0), dst.stride(1), call.M, call.K,
        heap.heap_bases, ctl(heap), heap.rank, heap.world_size, *enter_args(entry),
        BLOCK_M=cfg.BLOCK_M, BLOCK_K=cfg.BLOCK_K, NUM_PROGRAMS=programs, ENTER=entry is not None,
        EVERY_RANK=every_rank, num_warps=4,
    )
    launched(entry, ends)
    if entry is None:
        mid_barrier(heap, 0)  # every rank's rows are in place


@triton.jit
def first_tile(pid, i, tiles_per_source, NUM_PROGRAMS):
    """The first tile of source step i that program pid computes (continues the round-robin)."""
    skipped = (i * tiles_per_source) % NUM_PROGRAMS
    return (pid + NUM_PROGRAMS - skipped) % NUM_PROGRAMS


@triton.jit
def gemm_shard(
    # A rows of this source [M_loc, K]: a local tensor, the gathered buffer, or a peer's heap
    a_ptr, stride_am, stride_ak,
    b_ptr, stride_bk, stride_bn,
    # C rows of this source [M_loc, N]
    c_ptr, stride_cm, stride_cn,
    # GATHER: the A rows are also copied here (the row block with n-block 0 does it)
    g_ptr, stride_gm, stride_gk,
    # WAIT: acquire flags_ptr[m-block] == epoch (released by rank src_rank) before a tile's K loop
    flags_ptr, epoch, src_rank, cur_rank, ctl_ptr, heap_bases, world,
    M_loc, N, K,
    first, NUM_PROGRAMS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, WAIT: tl.constexpr, GATHER: tl.constexpr,
    FLATTEN: tl.constexpr = False,
):
    """Tiles first, first + NUM_PROGRAMS, ... of one source's [M_loc, N] block of C.

    ``FLATTEN`` (only where neither ``WAIT`` nor ``GATHER``: a loop with nothing but the GEMM in it)
    runs the tiles on the GEMM core's flattened loop (``common.gemm.whole_tiles``): the next tile's
    first loads are issued before this tile's epilogue. The sums are the same."""
    num_pid_m = tl.cdiv(M_loc, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    a_op, b_op = gemm_operands(a_ptr, b_ptr, M_loc, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                               BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR)
    if FLATTEN:
        whole_tiles(a_op, b_op, c_ptr, M_loc, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                    first, num_pid_m * num_pid_n, NUM_PROGRAMS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA,
                    B_KMAJOR, 1, True, False)
    else:
        for t in range(first, num_pid_m * num_pid_n, NUM_PROGRAMS):
            pid_m, pid_n = tile_coords(t, num_pid_m, num_pid_n, GROUP_M)
            ok = True
            if WAIT:
                # Acquire: pairs with the release after chunk pid_m in push_shard (common.gather) on
                # rank src_rank.
                ok = tile_acquire(flags_ptr + pid_m, epoch, cur_rank, src_rank, ctl_ptr, heap_bases, world)
            if ok:
                acc = gemm_tile(a_op, b_op, pid_m, pid_n, M_loc, N, K, stride_am, stride_ak, stride_bk,
                                stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR)  # [BM, BN] fp32
                offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N)
                store_tile(c_ptr, acc, offs_m, offs_n, M_loc, N, stride_cm, stride_cn)
                if GATHER:
                    if pid_n == 0:
                        copy_rows(g_ptr, stride_gm, stride_gk, a_ptr, stride_am, stride_ak, pid_m, M_loc, K,
                                  BLOCK_M, BLOCK_K)


@triton.jit
def _gemm_source(
    i,
    a_ptr, stride_am, stride_ak, ag_ptr, stride_gm, stride_gk, b_ptr, stride_bk, stride_bn,
    c_ptr, stride_cm, stride_cn, flags_ptr,
    M_loc, N, K, heap_bases, ctl_ptr, cur_rank, world, epoch, pid, NUM_PROGRAMS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, DIRECT: tl.constexpr, FLATTEN: tl.constexpr,
):
    """Source step i of gemm_gathered: from ``a`` without waiting (DIRECT; flattened with
    ``FLATTEN``), else from the gathered buffer after each chunk's flag."""
    num_chunks = tl.cdiv(M_loc, BLOCK_M)
    src = (cur_rank + i) % world
    rows = tl.cast(src, tl.int64) * M_loc
    first = first_tile(pid, i, num_chunks * tl.cdiv(N, BLOCK_N), NUM_PROGRAMS)
    c_src = c_ptr + rows * stride_cm
    flags_src = flags_ptr + src * num_chunks
    if DIRECT:
        gemm_shard(a_ptr, stride_am, stride_ak, b_ptr, stride_bk, stride_bn, c_src, stride_cm, stride_cn,
                   a_ptr, stride_am, stride_ak, flags_src, epoch, src, cur_rank, ctl_ptr, heap_bases, world,
                   M_loc, N, K, first, NUM_PROGRAMS,
                   BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA, B_KMAJOR, WAIT=False, GATHER=False,
                   FLATTEN=FLATTEN)
    else:
        gemm_shard(ag_ptr + rows * stride_gm, stride_gm, stride_gk, b_ptr, stride_bk, stride_bn,
                   c_src, stride_cm, stride_cn, ag_ptr, stride_gm, stride_gk,
                   flags_src, epoch, src, cur_rank, ctl_ptr, heap_bases, world,
                   M_loc, N, K, first, NUM_PROGRAMS,
                   BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA, B_KMAJOR, WAIT=True, GATHER=False)


@triton.jit
def gemm_gathered(
    # this rank's shard [M_loc, K] (read directly when LOCAL_DIRECT)
    a_ptr, stride_am, stride_ak,
    # the gathered buffer [W*M_loc, K] on this rank's heap, filled by the peers' pushes
    ag_ptr, stride_gm, stride_gk,
    b_ptr, stride_bk, stride_bn,
    c_ptr, stride_cm, stride_cn,
    # int64 flags [W, cdiv(M_loc, BLOCK_M)]: (source, chunk) -> sequence number of its last arrival
    flags_ptr,
    M_loc, N, K,
    heap_bases, ctl_ptr, cur_rank, world, epoch,
    pid, NUM_PROGRAMS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, LOCAL_DIRECT: tl.constexpr, FLATTEN: tl.constexpr,
    WITH_LOCAL: tl.constexpr = True,
):
    """Program pid's share of C = gathered A @ B, each tile after its A chunk's flag (consumer side).

    Sources in ring order r, r+1, ...; with LOCAL_DIRECT the local shard's tiles read ``a`` itself
    and wait for nothing (on the flattened loop with ``FLATTEN``: :func:`gemm_shard`). Without
    ``WITH_LOCAL`` the local source is left to the caller (wg_specialized's programs take its tiles
    from a counter, the pushers too: :func:`claim_local_tiles`).
    """
    if WITH_LOCAL:
        _gemm_source(0, a_ptr, stride_am, stride_ak, ag_ptr, stride_gm, stride_gk, b_ptr, stride_bk, stride_bn,
                     c_ptr, stride_cm, stride_cn, flags_ptr, M_loc, N, K, heap_bases, ctl_ptr, cur_rank, world,
                     epoch, pid, NUM_PROGRAMS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA, B_KMAJOR, LOCAL_DIRECT,
                     FLATTEN)
    for i in range(1, world):
        _gemm_source(i, a_ptr, stride_am, stride_ak, ag_ptr, stride_gm, stride_gk, b_ptr, stride_bk,
                     stride_bn, c_ptr, stride_cm, stride_cn, flags_ptr, M_loc, N, K, heap_bases, ctl_ptr,
                     cur_rank, world, epoch, pid, NUM_PROGRAMS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA,
                     B_KMAJOR, False, False)


@triton.jit
def claim_local_tiles(
    a_ptr, stride_am, stride_ak, b_ptr, stride_bk, stride_bn, c_ptr, stride_cm, stride_cn,
    # int32 [1] on this rank: local tiles taken so far in this call (0 between calls)
    claims_ptr, num_claimers,
    # this program among the dealt_programs that start on the tiles at once (< 0: one that joins late)
    dealt_pid, dealt_programs,
    M_loc, N, K, cur_rank,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, FLATTEN: tl.constexpr,
):
    """The local shard's row block of C, read from ``a`` (no flag), shared by ``num_claimers``
    programs (``common.gemm.claimed_tiles``): each of the ``dealt_programs`` that start at once
    (wg_specialized's GEMM programs) computes an even share dealt out beforehand (flattened with
    ``FLATTEN``), then every program takes the rest tile after tile from a counter, so that programs
    that join late (the pushers, once their pushes are done) take only what nobody has started."""
    c_src = c_ptr + tl.cast(cur_rank, tl.int64) * M_loc * stride_cm
    a_op, b_op = gemm_operands(a_ptr, b_ptr, M_loc, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                               BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR)
    claimed_tiles(a_op, b_op, c_src, M_loc, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  claims_ptr, num_claimers, dealt_pid, dealt_programs, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA,
                  B_KMAJOR, FLATTEN)
