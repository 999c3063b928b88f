"""gemm_all_scatter, fused sequential: one persistent kernel computes a tile and pushes it at once.

    program p: | tile p: K loop | store local + put to peers | tile p+P: K loop | store + put | ...
    stream:    | barrier | fused kernel | barrier (all peers' tiles landed) |

Communication of tile i overlaps the K loops of the tiles other programs are computing; there is no
flag: the tile goes from registers straight to every peer's c.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...runtime import device_barrier
from ..common.comm import push_tile
from ..common.gemm import gemm_operands, gemm_tile, store_tile, tile_coords, tile_offsets
from ._setup import finish, setup


@triton.jit
def _fused_kernel(
    # GEMM operands (the order of GemmCall.gemm_args)
    a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    # output: this rank's column block of c (a symmetric address)
    c_ptr, stride_cm, stride_cn,
    # distributed
    heap_bases, cur_rank, world,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    a_op, b_op = gemm_operands(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                               BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR)
    for tile_id in range(pid, num_pid_m * num_pid_n, NUM_PROGRAMS):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        acc = gemm_tile(a_op, b_op, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                        BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR)  # [BM, BN] fp32
        offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N)
        store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn)
        push_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn, cur_rank, world, heap_bases,
                  FIRST=1)


def fused_sequential(a, b, *, config=None, group=None, out=None):
    """gemm_all_scatter as one fused persistent kernel; same contract as :func:`tilefuse.gemm_all_scatter`."""
    call, c, c_block, _ = setup("fused_sequential", a, b, config, group, out, comm=False)
    heap, cfg = call.heap, call.config
    device_barrier()  # every peer is done reading the previous result out of c
    if call.num_tiles > 0:
        programs = min(cfg.GEMM_SMS + cfg.COMM_SMS, call.num_tiles)
        _fused_kernel[(programs,)](
            *call.gemm_args, c_block, c_block.stride(0), c_block.stride(1),
            heap.heap_bases, heap.rank, heap.world_size,
            NUM_PROGRAMS=programs, **call.gemm_meta,
        )
    device_barrier()  # every peer's tiles have landed in c
    return finish(call, c, out)
