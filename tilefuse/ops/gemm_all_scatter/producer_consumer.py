"""gemm_all_scatter, producer-consumer: a GEMM kernel and a scatter kernel on two streams at once.

    stream 1: | begin | GEMM (GEMM_SMS programs): tile -> own block of c, release tile flag ... |
    stream 2:         | scatter (COMM_SMS programs): acquire tile flag, put tile to peers ...   |
    stream 1:                                                              | join | barrier |

Flags are per tile, local to the rank (the producer and consumer run on the same GPU) and carry
the call's sequence number. GEMM_SMS + COMM_SMS must fit on the device at once: the consumer spins.
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.launch import ForkedStreams, collective, ctl, mid_barrier
from ._setup import OP, setup
from ._tiles import compute_tiles, push_ready_tiles


@kernel
def _gemm_producer_kernel(
    # GEMM operands (the order of GemmCall.gemm_args)
    a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    # output: this rank's column block of c; one int64 flag per tile
    c_ptr, stride_cm, stride_cn, flags_ptr,
    # distributed
    heap_bases, ctl_ptr, cur_rank, world,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr,
):
    epoch, live = P.call_epoch(ctl_ptr)
    if live:
        compute_tiles(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                      c_ptr, stride_cm, stride_cn, flags_ptr, heap_bases, cur_rank, world, epoch, tl.program_id(0),
                      BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, USE_TMA, B_KMAJOR, PUSH=False, RELEASE=True)


@kernel
def _scatter_consumer_kernel(
    c_ptr, flags_ptr,
    M, N,
    stride_cm, stride_cn,
    heap_bases, ctl_ptr, cur_rank, world,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
):
    epoch, live = P.call_epoch(ctl_ptr)
    if live:
        push_ready_tiles(c_ptr, flags_ptr, M, N, stride_cm, stride_cn, heap_bases, ctl_ptr, cur_rank, world,
                         epoch, tl.program_id(0), BLOCK_M, BLOCK_N, GROUP_M, NUM_PROGRAMS)


@collective(OP)
def producer_consumer(a, b, *, config=None, group=None, out=None):
    """gemm_all_scatter with GEMM and scatter kernels on two streams; same contract as
    :func:`tilefuse.gemm_all_scatter`."""
    call = setup("producer_consumer", a, b, config, group, out, comm=True, flags=True)
    if call.empty:
        return call.result()
    g, cfg = call.gemm, call.gemm.config
    heap, c_block = g.heap, call.c_block
    # Not capped by the tiles (programs without one exit): one compiled kernel per config, not per shape.
    gemm_programs, comm_programs = cfg.GEMM_SMS, cfg.COMM_SMS
    streams = ForkedStreams(heap.device)  # the consumer's stream starts after the begin kernel
    _gemm_producer_kernel[(gemm_programs,)](
        *g.gemm_args, c_block, c_block.stride(0), c_block.stride(1), call.flags,
        heap.heap_bases, ctl(heap), heap.rank, heap.world_size,
        NUM_PROGRAMS=gemm_programs, **g.gemm_meta,
    )
    with streams.side():
        _scatter_consumer_kernel[(comm_programs,)](
            c_block, call.flags, g.M, g.N, c_block.stride(0), c_block.stride(1),
            heap.heap_bases, ctl(heap), heap.rank, heap.world_size,
            BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, GROUP_M=cfg.GROUP_M,
            NUM_PROGRAMS=comm_programs, num_warps=4,
        )
    streams.join()
    mid_barrier(heap, 0)  # every peer's tiles have landed in c
    return call.result()
