"""gemm_all_scatter, producer-consumer: a GEMM kernel and a scatter kernel on two streams at once.

    stream 1: | GEMM (GEMM_SMS programs): tile -> own block of the result, release tile flag |
    stream 2: | scatter (COMM_SMS programs): acquire tile flag, put tile to peers ... barrier |
    stream 1:                                                                       | join |

Flags are per tile, local to the rank (the producer and consumer run on the same GPU) and carry
the call's sequence number. GEMM_SMS + COMM_SMS must fit on the device at once: the consumer spins.
Both kernels begin the call together (``call_enter``: the first of their programs to run does the
begin, the others wait for it) and end it together (``call_exit`` over the programs of both): the
last program to finish passes the closing barrier and writes the status words, so a call is two
launches and two stream switches.
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
    # output: this rank's column block of the result, of c; one int64 flag per tile
    o_ptr, c_ptr, stride_cm, stride_cn, flags_ptr,
    # distributed; the call's begin and end (with ENTER; exit_programs: those of both kernels)
    heap_bases, ctl_ptr, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1, status_ptr, exit_programs,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, ENTER: tl.constexpr,
):
    epoch, live = P.call_enter(ctl_ptr, heap_bases, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1,
                               ENTER)
    if live:
        compute_tiles(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                      o_ptr, c_ptr, stride_cm, stride_cn, flags_ptr, heap_bases, cur_rank, world, epoch,
                      tl.program_id(0),
                      BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, USE_TMA, B_KMAJOR, PUSH=False, RELEASE=True)
    P.call_exit(ctl_ptr, heap_bases, cur_rank, world, epoch, live, status_ptr, exit_programs, ENTER, BARRIER=True)


@kernel
def _scatter_consumer_kernel(
    o_ptr, c_ptr, flags_ptr,
    M, N,
    stride_cm, stride_cn,
    heap_bases, ctl_ptr, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1, status_ptr, exit_programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
    ENTER: tl.constexpr,
):
    epoch, live = P.call_enter(ctl_ptr, heap_bases, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1,
                               ENTER)
    if live:
        push_ready_tiles(o_ptr, c_ptr, flags_ptr, M, N, stride_cm, stride_cn, heap_bases, ctl_ptr, cur_rank, world,
                         epoch, tl.program_id(0), BLOCK_M, BLOCK_N, GROUP_M, NUM_PROGRAMS)
    # The last program of either kernel passes the closing barrier: every peer's tiles are in c.
    P.call_exit(ctl_ptr, heap_bases, cur_rank, world, epoch, live, status_ptr, exit_programs, ENTER, BARRIER=True)


@collective(OP)
def producer_consumer(a, b, *, config=None, group=None, out=None):
    """gemm_all_scatter with GEMM and scatter kernels on two streams; same contract as
    :func:`tilefuse.gemm_all_scatter`."""
    call = setup("producer_consumer", a, b, config, group, out, comm=True, flags=True, kernel_begins=True)
    if call.empty:
        return call.result()
    g, cfg = call.gemm, call.gemm.config
    heap, c_block = g.heap, call.c_block
    # Not capped by the tiles (programs without one exit): one compiled kernel per config, not per shape.
    gemm_programs, comm_programs = cfg.GEMM_SMS, cfg.COMM_SMS
    total = gemm_programs + comm_programs  # the programs that end the call together
    streams = ForkedStreams(heap.device)  # both kernels begin the call (or the begin kernel ran before)
    _gemm_producer_kernel[(gemm_programs,)](
        *g.gemm_args, call.own, c_block, c_block.stride(0), c_block.stride(1), call.flags,
        heap.heap_bases, ctl(heap), heap.rank, heap.world_size, *call.enter_args, total,
        NUM_PROGRAMS=gemm_programs, ENTER=call.begins, **g.gemm_meta,
    )
    with streams.side():
        _scatter_consumer_kernel[(comm_programs,)](
            call.own, c_block, call.flags, g.M, g.N, c_block.stride(0), c_block.stride(1),
            heap.heap_bases, ctl(heap), heap.rank, heap.world_size, *call.enter_args, total,
            BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, GROUP_M=cfg.GROUP_M,
            NUM_PROGRAMS=comm_programs, ENTER=call.begins, num_warps=4,
        )
    streams.join()
    call.entered()
    if not call.begins:
        mid_barrier(heap, 0)  # every peer's tiles have landed in c
    return call.result()
