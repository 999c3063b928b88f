"""Row-chunk movement for all-gather style ops: copy a chunk (``BLOCK_M`` rows of a shard ``[rows,
K]``, all K columns), or a matrix tile by tile."""

import triton
import triton.language as tl


@triton.jit
def copy_tile(
    dst_ptr, stride_dm, stride_dk,
    src_ptr, stride_sm, stride_sk,
    chunk, kt, rows, K,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """``dst[chunk rows, kt-th BLOCK_K columns] = src[...]``: one tile of a chunk."""
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
    """``dst[:rows, :K] = src[:rows, :K]``, program ``prog`` taking every NUM_PROGRAMS-th tile."""
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
    """``dst[chunk rows, :K] = src[chunk rows, :K]`` (either pointer may be translated into a peer's heap)."""
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        copy_tile(dst_ptr, stride_dm, stride_dk, src_ptr, stride_sm, stride_sk, chunk, kt, rows, K,
                  BLOCK_M, BLOCK_K)


@triton.jit
def copy_scales(dst_ptr, src_ptr, stride_src, chunk, rows, BLOCK_M: tl.constexpr):
    """``dst[chunk rows] = src[chunk rows]`` of row scales (stride 0: tensor-wise); nothing unscaled."""
    if src_ptr.dtype.element_ty == tl.float32:
        offs = tl.cast(chunk, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs * stride_src, mask=offs < rows), mask=offs < rows)
