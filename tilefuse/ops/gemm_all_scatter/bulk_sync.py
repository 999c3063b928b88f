"""gemm_all_scatter, bulk-synchronous: the whole GEMM, then a scatter kernel, stream-ordered.

    stream:  |barrier| GEMM (all SMs) -> own block of c |scatter: own block -> every peer| barrier|

No overlap: the baseline shape of the algorithm in the same runtime.
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import device_barrier
from ...runtime.primitives import kernel
from ..common.comm import push_tile, row_major_tile
from ..common.gemm import load_tile, matmul, tile_offsets
from ._setup import finish, setup


@kernel
def _scatter_kernel(
    c_ptr,  # this rank's column block of c (a symmetric address)
    M, N,
    stride_cm, stride_cn,
    heap_bases, cur_rank, world,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
):
    """Copy this rank's [M, N] block of c into the same place on every peer, tile by tile."""
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = tl.cdiv(M, BLOCK_M) * num_pid_n
    for tile_id in range(pid, num_tiles, NUM_PROGRAMS):
        pid_m, pid_n = row_major_tile(tile_id, num_pid_n)
        offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N)
        tile = load_tile(c_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn)  # [BM, BN]
        push_tile(c_ptr, tile, offs_m, offs_n, M, N, stride_cm, stride_cn, cur_rank, world, heap_bases,
                  FIRST=1)


def bulk_sync(a, b, *, config=None, group=None, out=None):
    """gemm_all_scatter with no overlap; same contract as :func:`tilefuse.gemm_all_scatter`."""
    call, c, c_block, _ = setup("bulk_sync", a, b, config, group, out, comm=False)
    heap, cfg = call.heap, call.config
    device_barrier()  # every peer is done reading the previous result out of c
    matmul(a, b, c_block, cfg)
    if heap.world_size > 1 and call.num_tiles > 0:
        programs = min(cfg.GEMM_SMS + cfg.COMM_SMS, call.num_tiles)
        _scatter_kernel[(programs,)](
            c_block, call.M, call.N, c_block.stride(0), c_block.stride(1),
            heap.heap_bases, heap.rank, heap.world_size,
            BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, NUM_PROGRAMS=programs, num_warps=4,
        )
    device_barrier()  # every peer's block has landed in c
    return finish(call, c, out)
