"""Row-chunk movement for all-gather style ops: copy a chunk of rows, push a shard to every rank.

A *chunk* is ``BLOCK_M`` consecutive rows of a row shard ``[rows, K]`` (the last chunk may be
shorter); chunk ``c`` covers rows ``c*BLOCK_M ... min((c+1)*BLOCK_M, rows)``, all ``K`` columns.
Chunks match the GEMM's row blocks, so one flag per chunk tells a GEMM tile that its A rows landed.

Push order: the shard goes first to the current rank (when asked), then to ``cur_rank - 1``,
``cur_rank - 2``, ... (:func:`push_target`). A consumer walks its sources in ring order ``r, r+1,
r+2, ...``; rank ``s`` is the ``i``-th source of rank ``s - i``, so pushing to ``s - 1`` first delivers
each consumer's next source first, and at every step the W ranks push to W different targets.
"""

import triton
import triton.language as tl

from ...runtime import primitives as P
from .flags import tile_release


@triton.jit
def copy_tile(
    dst_ptr, stride_dm, stride_dk,
    src_ptr, stride_sm, stride_sk,
    chunk, kt, rows, K,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """``dst[chunk rows, kt-th BLOCK_K columns] = src[...]``: one tile of a chunk (pointers as in
    :func:`copy_rows`)."""
    offs_m = tl.cast(chunk, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    offs_k = tl.cast(kt, tl.int64) * BLOCK_K + tl.arange(0, BLOCK_K)  # [BK]
    mask = (offs_m < rows)[:, None] & (offs_k < K)[None, :]  # [BM, BK]
    src = tl.load(src_ptr + offs_m[:, None] * stride_sm + offs_k[None, :] * stride_sk, mask=mask)
    tl.store(dst_ptr + offs_m[:, None] * stride_dm + offs_k[None, :] * stride_dk, src, mask=mask)


@triton.jit
def copy_pieces(
    dst_ptr, stride_dm, stride_dk,
    src_ptr, stride_sm, stride_sk,
    rows, K, prog, NUM_PROGRAMS,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """``dst[:rows, :K] = src[:rows, :K]``, program ``prog`` of ``NUM_PROGRAMS`` taking every
    NUM_PROGRAMS-th tile of BLOCK_M x BLOCK_K: a few rows still keep every program busy."""
    k_tiles = tl.cdiv(K, BLOCK_K)
    for unit in range(prog, tl.cdiv(rows, BLOCK_M) * k_tiles, NUM_PROGRAMS):
        copy_tile(dst_ptr, stride_dm, stride_dk, src_ptr, stride_sm, stride_sk, unit // k_tiles, unit % k_tiles,
                  rows, K, BLOCK_M, BLOCK_K)


@triton.jit
def copy_rows(
    dst_ptr, stride_dm, stride_dk,
    src_ptr, stride_sm, stride_sk,
    chunk, rows, K,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """``dst[chunk rows, :K] = src[chunk rows, :K]``; both pointers already point where they should
    (a local tensor, or a pointer translated into a peer's heap)."""
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        copy_tile(dst_ptr, stride_dm, stride_dk, src_ptr, stride_sm, stride_sk, chunk, kt, rows, K,
                  BLOCK_M, BLOCK_K)


@triton.jit
def push_target(cur_rank, i, world):
    """The i-th rank this rank pushes its shard to: ``cur_rank - i`` (i = 0 is ``cur_rank`` itself)."""
    return (cur_rank + world - i) % world


@triton.jit
def push_shard(
    # this rank's shard [rows, K]: any local tensor
    src_ptr, stride_sm, stride_sk,
    # where it goes: a symmetric address (the same rows on every rank)
    dst_ptr, stride_dm, stride_dk,
    # per-chunk int32 flags of this source (symmetric address; unused unless SIGNAL)
    flags_ptr, epoch,
    rows, K,
    cur_rank, world, heap_bases,
    prog, NUM_PROGRAMS,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, FIRST: tl.constexpr, SIGNAL: tl.constexpr,
):
    """Program ``prog`` of ``NUM_PROGRAMS`` copies its share of the (target, chunk) pairs into ranks
    ``push_target(cur_rank, FIRST .. world-1)``, target-major (all chunks for the first target, then
    the next); with SIGNAL it releases ``flags[chunk] = epoch`` on the receiving rank after each
    chunk. ``FIRST = 0`` includes the current rank. Without SIGNAL the units are the chunks' tiles of
    BLOCK_K columns (nothing waits for a whole chunk): a shard of few chunks still keeps every program
    busy."""
    num_chunks = tl.cdiv(rows, BLOCK_M)
    if SIGNAL:
        for unit in range(prog, (world - FIRST) * num_chunks, NUM_PROGRAMS):
            peer = push_target(cur_rank, FIRST + unit // num_chunks, world)
            chunk = unit % num_chunks
            peer_dst = P.translate(dst_ptr, cur_rank, peer, heap_bases)
            copy_rows(peer_dst, stride_dm, stride_dk, src_ptr, stride_sm, stride_sk, chunk, rows, K,
                      BLOCK_M, BLOCK_K)
            # Release: pairs with the acquire before the GEMM tiles of this chunk on rank `peer`
            # (all_gather_gemm._tiles.gemm_shard).
            tile_release(flags_ptr + chunk, epoch, cur_rank, peer, heap_bases)
    else:
        k_tiles = tl.cdiv(K, BLOCK_K)
        pieces = num_chunks * k_tiles
        for unit in range(prog, (world - FIRST) * pieces, NUM_PROGRAMS):
            peer = push_target(cur_rank, FIRST + unit // pieces, world)
            piece = unit % pieces
            peer_dst = P.translate(dst_ptr, cur_rank, peer, heap_bases)
            copy_tile(peer_dst, stride_dm, stride_dk, src_ptr, stride_sm, stride_sk, piece // k_tiles,
                      piece % k_tiles, rows, K, BLOCK_M, BLOCK_K)
