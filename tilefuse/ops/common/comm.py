"""Tile movement helpers shared by the ops: push a tile to peers, tile decode."""

import triton
import triton.language as tl

from ...runtime import primitives as P


@triton.jit
def push_tile(c_ptr, tile, offs_m, offs_n, M, N, stride_cm, stride_cn, cur_rank, world, heap_bases,
              FIRST: tl.constexpr):
    """Store ``tile`` [BM, BN] at (offs_m, offs_n) of C on ranks cur_rank + FIRST, ... in ring order."""
    ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn  # [BM, BN]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)  # [BM, BN]
    value = tile.to(c_ptr.dtype.element_ty)
    for i in range(FIRST, world):
        P.store(ptrs, value, cur_rank, (cur_rank + i) % world, heap_bases, mask=mask)


@triton.jit
def row_major_tile(tile_id, num_pid_n):
    """Plain row-major tile decode (communication kernels, where L2 reuse does not matter)."""
    return tile_id // num_pid_n, tile_id % num_pid_n
