"""Device code shared by the all_gather_gemm variants: the push of a shard and the per-source tiles.

A *chunk* is ``BLOCK_M`` rows of a shard ``[M_loc, K]``, the GEMM's row block: one flag per (source,
chunk) tells a GEMM tile that its A rows landed. A rank pushes to ``r - 1``, ``r - 2``, ...
(:func:`push_target`) while its consumers walk their sources ``r, r+1, ...``: each consumer's next
source arrives first. Tiles of ``c [W*M_loc, N]`` are numbered over (i, m-block, n-block) of source
``(r + i) % W``; program ``pid`` of ``P`` takes tiles ``pid, pid + P, ...`` across sources.

Float8 calls move each chunk's row scales with its rows, before the chunk's flag: ``scales`` is
``(scale_a, row stride, scale_b, column stride, gathered row scales)`` (``common.scaled``), the last a
heap buffer of ``W*M_loc`` (``a_gathered``'s rows) or ``M_loc`` (``a_shard``'s) float32 values.
"""

import triton
import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.flags import tile_acquire, tile_release
from ..common.gather import copy_pieces, copy_rows, copy_scales, copy_tile
from ..common.tiles import gemm_operands, gemm_tile, is_scaled, store_tile, tile_coords, tile_offsets, whole_tiles


@triton.jit
def shard_scales(scales, row):
    """``(scale_a, its row stride, where this rank's row scales go: the gathered ones from row)``."""
    return scales[0], scales[1], scales[4] + row


@triton.jit
def source_scales(scales, row, src_base):
    """``scales`` of one source's rows, their row scales read at ``src_base + row``."""
    return src_base + row, 1, scales[2], scales[3], scales[4]


@triton.jit
def push_target(cur_rank, i, world):
    """The i-th rank this rank pushes its shard to: ``cur_rank - i`` (i = 0 is this rank)."""
    return (cur_rank + world - i) % world


@triton.jit
def push_shard(
    src_ptr, stride_sm, stride_sk,  # this rank's shard [M_loc, K]: any local tensor
    dst_ptr, stride_dm, stride_dk,  # where it goes: this rank's row block of a_gathered (a symmetric address)
    flags_ptr, epoch,  # this source's int64 flags [num_chunks] (a symmetric address; unused unless SIGNAL)
    row_scales,  # a float8 call's shard_scales
    M_loc, K, call, prog, NUM_PROGRAMS,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, FIRST: tl.constexpr, SIGNAL: tl.constexpr,
):
    """Program ``prog``'s share of the (target, chunk) pairs, into ranks ``push_target(r, FIRST .. W-1)``;
    SIGNAL: then ``flags[chunk] = epoch`` on the receiver. Without SIGNAL the units are [BLOCK_M, BLOCK_K]
    tiles, so a shard of few chunks still keeps every program busy."""
    cur_rank, world, heap_bases = P.rank(call), P.world(call), P.bases(call)
    num_chunks = tl.cdiv(M_loc, BLOCK_M)
    if SIGNAL:
        for unit in range(prog, (world - FIRST) * num_chunks, NUM_PROGRAMS):
            peer = push_target(cur_rank, FIRST + unit // num_chunks, world)
            chunk = unit % num_chunks
            peer_dst = P.translate(dst_ptr, cur_rank, peer, heap_bases)
            copy_rows(peer_dst, stride_dm, stride_dk, src_ptr, stride_sm, stride_sk, chunk, M_loc, K, BLOCK_M, BLOCK_K)
            copy_scales(P.translate(row_scales[2], cur_rank, peer, heap_bases), row_scales[0], row_scales[1], chunk,
                        M_loc, BLOCK_M)
            # Release: pairs with the acquire before the GEMM tiles of this chunk in gemm_shard on rank `peer`.
            tile_release(flags_ptr + chunk, epoch, cur_rank, peer, heap_bases)
    else:
        k_tiles = tl.cdiv(K, BLOCK_K)
        pieces = num_chunks * k_tiles
        for unit in range(prog, (world - FIRST) * pieces, NUM_PROGRAMS):
            peer = push_target(cur_rank, FIRST + unit // pieces, world)
            piece = unit % pieces
            peer_dst = P.translate(dst_ptr, cur_rank, peer, heap_bases)
            copy_tile(peer_dst, stride_dm, stride_dk, src_ptr, stride_sm, stride_sk, piece // k_tiles,
                      piece % k_tiles, M_loc, K, BLOCK_M, BLOCK_K)
            if piece % k_tiles == 0:
                copy_scales(P.translate(row_scales[2], cur_rank, peer, heap_bases), row_scales[0], row_scales[1],
                            piece // k_tiles, M_loc, BLOCK_M)


@kernel
def shard_kernel(
    a_ptr, stride_am, stride_ak,  # this rank's rows [M_loc, K] (any local tensor)
    dst_ptr, stride_dm, stride_dk,  # where they go (a symmetric address): row block r of a_gathered, or a_shard
    flags_ptr,  # SIGNAL: this rank's row of flags (a symmetric address)
    M_loc, K, scales,  # scales: a float8 call's (the row scales go with the rows), else stand-ins
    call, exit_programs,  # this kernel begins the call; the programs that end it together
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, NUM_PROGRAMS: tl.constexpr, EVERY_RANK: tl.constexpr,
    SIGNAL: tl.constexpr, FIRST: tl.constexpr, BARRIER: tl.constexpr,
):
    """Begin the call and copy this rank's rows into ``dst`` on every rank (``EVERY_RANK``: :func:`push_shard`)
    or on this rank only (a_shard); ``BARRIER``: the last program passes the barrier (all rows in place)."""
    seq, live = P.enter(call, True)
    if live:
        if EVERY_RANK:
            push_shard(a_ptr, stride_am, stride_ak, dst_ptr, stride_dm, stride_dk, flags_ptr, seq,
                       shard_scales(scales, P.rank(call) * M_loc), M_loc, K, call, tl.program_id(0), NUM_PROGRAMS,
                       BLOCK_M, BLOCK_K, FIRST, SIGNAL)
        else:
            copy_pieces(dst_ptr, stride_dm, stride_dk, a_ptr, stride_am, stride_ak, M_loc, K, tl.program_id(0),
                        NUM_PROGRAMS, BLOCK_M, BLOCK_K)
            if is_scaled(scales):  # and the rows' scales beside them
                for chunk in range(tl.program_id(0), tl.cdiv(M_loc, BLOCK_M), NUM_PROGRAMS):
                    copy_scales(scales[4], scales[0], scales[1], chunk, M_loc, BLOCK_M)
    P.exit(call, seq, live, exit_programs, END=True, BARRIER=BARRIER)


def launch_shard(p, a, dst, scales, call, *, every_rank: bool) -> None:
    """:func:`shard_kernel` on the config's programs, with the barrier (``scales``: ``Prepared.scales``)."""
    cfg = p.config
    shard_kernel[(p.programs,)](
        a, *a.stride(), dst, *dst.stride(), dst, p.M, p.K, scales, call, p.programs,
        BLOCK_M=cfg.BLOCK_M, BLOCK_K=cfg.BLOCK_K, NUM_PROGRAMS=p.programs, EVERY_RANK=every_rank, SIGNAL=False, FIRST=0,
        BARRIER=True, num_warps=4)


@triton.jit
def gemm_shard(
    # A rows of this source [M_loc, K]: a local tensor, the gathered buffer, or a peer's heap; their scales
    a_ptr, stride_am, stride_ak, scales,
    b_ptr, stride_bk, stride_bn,
    c_ptr, stride_cm, stride_cn,  # C rows of this source [M_loc, N]
    gather_to,  # GATHER: (g_ptr, stride_gm, stride_gk): the A rows are also copied there (by the n-block 0 tile)
    flags_ptr, epoch, src, call,  # WAIT: acquire flags_ptr[m-block] == epoch (released by rank src) first
    M_loc, N, K, first, NUM_PROGRAMS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, WAIT: tl.constexpr, GATHER: tl.constexpr,
    FLATTEN: tl.constexpr = False,
):
    """Tiles first, first + NUM_PROGRAMS, ... of one source's [M_loc, N] block of C; ``FLATTEN``
    (neither ``WAIT`` nor ``GATHER``): on the GEMM core's flattened loop (``whole_tiles``), the same sums."""
    num_pid_m = tl.cdiv(M_loc, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    a_op, b_op = gemm_operands(a_ptr, b_ptr, M_loc, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                               BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR)
    if FLATTEN:
        whole_tiles(a_op, b_op, scales, c_ptr, M_loc, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                    stride_cn, first, num_pid_m * num_pid_n, NUM_PROGRAMS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                    USE_TMA, B_KMAJOR, 1, True, False)
    else:
        for t in range(first, num_pid_m * num_pid_n, NUM_PROGRAMS):
            pid_m, pid_n = tile_coords(t, num_pid_m, num_pid_n, GROUP_M)
            ok = True
            if WAIT:
                # Acquire: pairs with the release after chunk pid_m in push_shard on rank src.
                ok = tile_acquire(flags_ptr + pid_m, epoch, P.rank(call), src, P.ctl(call), P.bases(call),
                                  P.world(call))
            if ok:
                acc = gemm_tile(a_op, b_op, scales, pid_m, pid_n, M_loc, N, K, stride_am, stride_ak, stride_bk,
                                stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR)  # [BM, BN] fp32
                offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N)
                store_tile(c_ptr, acc, offs_m, offs_n, M_loc, N, stride_cm, stride_cn)
                if GATHER:
                    if pid_n == 0:
                        copy_rows(gather_to[0], gather_to[1], gather_to[2], a_ptr, stride_am, stride_ak, pid_m,
                                  M_loc, K, BLOCK_M, BLOCK_K)


@triton.jit
def _gemm_source(
    i,
    a_ptr, stride_am, stride_ak, ag_ptr, stride_gm, stride_gk, scales, b,  # b: (b_ptr, stride_bk, stride_bn)
    c_ptr, stride_cm, stride_cn, flags_ptr,
    M_loc, N, K, call, epoch, pid, NUM_PROGRAMS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, DIRECT: tl.constexpr, FLATTEN: tl.constexpr,
    REMOTE: tl.constexpr, GATHER: tl.constexpr,
):
    """Source step i of :func:`gemm_gathered`: rank (r + i)'s rows."""
    b_ptr, stride_bk, stride_bn = b
    num_chunks = tl.cdiv(M_loc, BLOCK_M)
    cur_rank = P.rank(call)
    src = (cur_rank + i) % P.world(call)
    rows = tl.cast(src, tl.int64) * M_loc
    # The round-robin over every source's tiles goes on where step i - 1 left it.
    first = (pid + NUM_PROGRAMS - (i * num_chunks * tl.cdiv(N, BLOCK_N)) % NUM_PROGRAMS) % NUM_PROGRAMS
    c_src = c_ptr + rows * stride_cm
    flags_src = flags_ptr + src * num_chunks
    if REMOTE:
        # The source's a_shard and row scales in its heap, read in place (stand-in scales are never read).
        scales_src = source_scales(scales, 0, P.translate(scales[4], cur_rank, src, P.bases(call)))
        gemm_shard(P.translate(a_ptr, cur_rank, src, P.bases(call)), stride_am, stride_ak, scales_src,
                   b_ptr, stride_bk, stride_bn, c_src, stride_cm, stride_cn, (ag_ptr + rows * stride_gm, stride_gm,
                   stride_gk), flags_src, epoch, src, call, M_loc, N, K, first, NUM_PROGRAMS,
                   BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA, B_KMAJOR, WAIT=False, GATHER=GATHER, FLATTEN=FLATTEN)
    elif DIRECT:
        gemm_shard(a_ptr, stride_am, stride_ak, scales, b_ptr, stride_bk, stride_bn, c_src, stride_cm, stride_cn,
                   (a_ptr, stride_am, stride_ak), flags_src, epoch, src, call, M_loc, N, K, first, NUM_PROGRAMS,
                   BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA, B_KMAJOR, WAIT=False, GATHER=False, FLATTEN=FLATTEN)
    else:
        gemm_shard(ag_ptr + rows * stride_gm, stride_gm, stride_gk, source_scales(scales, rows, scales[4]),
                   b_ptr, stride_bk, stride_bn, c_src, stride_cm, stride_cn, (ag_ptr, stride_gm, stride_gk),
                   flags_src, epoch, src, call, M_loc, N, K, first, NUM_PROGRAMS,
                   BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA, B_KMAJOR, WAIT=True, GATHER=False)


@triton.jit
def gemm_gathered(
    a_ptr, stride_am, stride_ak,  # this rank's shard [M_loc, K]: `a`, or with REMOTE its a_shard (symmetric)
    # the gathered buffer [W*M_loc, K] on this heap (with REMOTE: GATHER's a_gathered, local); the scales
    ag_ptr, stride_gm, stride_gk, scales,
    b,  # (b_ptr, stride_bk, stride_bn)
    c_ptr, stride_cm, stride_cn,
    flags_ptr,  # int64 [W, cdiv(M_loc, BLOCK_M)]: (source, chunk) -> sequence number of its last arrival
    M_loc, N, K, call, epoch, pid, NUM_PROGRAMS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, LOCAL_DIRECT: tl.constexpr, FLATTEN: tl.constexpr,
    WITH_LOCAL: tl.constexpr = True, REMOTE: tl.constexpr = False, GATHER: tl.constexpr = False,
):
    """Program pid's share of C = gathered A @ B, sources in ring order r, r+1, ..., each tile after its A
    chunk's flag; LOCAL_DIRECT: the local shard's tiles read ``a``; REMOTE: every source's read its a_shard
    (a barrier published them). Without ``WITH_LOCAL`` the local source is the caller's; it sits outside
    the loop over the peers: Triton flattens (``FLATTEN``) a tile loop only where no loop encloses it."""
    if WITH_LOCAL:
        _gemm_source(0, a_ptr, stride_am, stride_ak, ag_ptr, stride_gm, stride_gk, scales, b, c_ptr, stride_cm,
                     stride_cn, flags_ptr, M_loc, N, K, call, epoch, pid, NUM_PROGRAMS, BLOCK_M, BLOCK_N, BLOCK_K,
                     GROUP_M, USE_TMA, B_KMAJOR, LOCAL_DIRECT, FLATTEN, REMOTE, GATHER)
    for i in range(1, P.world(call)):
        _gemm_source(i, a_ptr, stride_am, stride_ak, ag_ptr, stride_gm, stride_gk, scales, b, c_ptr, stride_cm,
                     stride_cn, flags_ptr, M_loc, N, K, call, epoch, pid, NUM_PROGRAMS, BLOCK_M, BLOCK_N, BLOCK_K,
                     GROUP_M, USE_TMA, B_KMAJOR, False, FLATTEN, REMOTE, GATHER)
