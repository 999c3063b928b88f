"""gemm_all_scatter, producer-consumer: a GEMM kernel and a scatter kernel on two streams at once.

    stream 1: | barrier | GEMM (GEMM_SMS programs): tile -> own block of c, release tile flag ... |
    stream 2:           | scatter (COMM_SMS programs): acquire tile flag, put tile to peers ...   |
    stream 1:                                                              | join | barrier |

Flags are per tile, local to the rank (the producer and consumer run on the same GPU) and carry
the call's epoch. GEMM_SMS + COMM_SMS must fit on the device at once: the consumer spins.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...runtime import device_barrier
from ..common.comm import push_tile
from ..common.flags import tile_acquire, tile_release
from ..common.gemm import gemm_operands, gemm_tile, load_tile, store_tile, tile_coords, tile_offsets
from ..common.launch import ForkedStreams, ctl
from ._setup import finish, setup


@triton.jit
def _gemm_producer_kernel(
    # GEMM operands (the order of GemmCall.gemm_args)
    a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    # output: this rank's column block of c; one int32 flag per tile
    c_ptr, stride_cm, stride_cn, flags_ptr,
    # distributed
    heap_bases, cur_rank, epoch,
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
        # Release: pairs with the acquire in _scatter_consumer_kernel on this rank.
        tile_release(flags_ptr + tile_id, epoch, cur_rank, cur_rank, heap_bases)


@triton.jit
def _scatter_consumer_kernel(
    c_ptr, flags_ptr,
    M, N,
    stride_cm, stride_cn,
    heap_bases, ctl_ptr, cur_rank, world, epoch,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
):
    """Tiles in the producer's order (same swizzle), so the first tiles made are the first moved."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    for tile_id in range(pid, num_pid_m * num_pid_n, NUM_PROGRAMS):
        # Acquire: pairs with the release in _gemm_producer_kernel on this rank.
        if tile_acquire(flags_ptr + tile_id, epoch, cur_rank, cur_rank, ctl_ptr):
            pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
            offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N)
            tile = load_tile(c_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn)  # [BM, BN]
            push_tile(c_ptr, tile, offs_m, offs_n, M, N, stride_cm, stride_cn, cur_rank, world,
                      heap_bases, FIRST=1)


def producer_consumer(a, b, *, config=None, group=None, out=None):
    """gemm_all_scatter with GEMM and scatter kernels on two streams; same contract as
    :func:`tilefuse.gemm_all_scatter`."""
    call, c, c_block, ws = setup("producer_consumer", a, b, config, group, out, comm=True)
    heap, cfg = call.heap, call.config
    epoch = ws.next_epoch()
    device_barrier()  # every peer is done reading the previous result out of c
    if call.num_tiles > 0:
        gemm_programs = min(cfg.GEMM_SMS, call.num_tiles)
        comm_programs = min(cfg.COMM_SMS, call.num_tiles)
        streams = ForkedStreams(heap.device)  # the consumer's stream starts after the barrier
        _gemm_producer_kernel[(gemm_programs,)](
            *call.gemm_args, c_block, c_block.stride(0), c_block.stride(1), ws.flags,
            heap.heap_bases, heap.rank, epoch,
            NUM_PROGRAMS=gemm_programs, **call.gemm_meta,
        )
        with streams.side():
            _scatter_consumer_kernel[(comm_programs,)](
                c_block, ws.flags, call.M, call.N, c_block.stride(0), c_block.stride(1),
                heap.heap_bases, ctl(heap), heap.rank, heap.world_size, epoch,
                BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, GROUP_M=cfg.GROUP_M,
                NUM_PROGRAMS=comm_programs, num_warps=4,
            )
        streams.join()
    device_barrier()  # every peer's tiles have landed in c
    return finish(call, c, out)
