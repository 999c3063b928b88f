"""gemm_reduce_scatter, producer-consumer: a GEMM kernel and a reduction kernel on two streams at once.

    stream 1: | begin | GEMM (GEMM_SMS programs): tiles of owner r+1 -> its slot r, release | r+2 | ... |
    stream 2:           | reduce (COMM_SMS programs): from r-1: acquire | from r-2: acquire, add | ... -> c |
    stream 1:                                                                                   | join |

Rank r's reduction follows the arrivals: source by source (r-1, r-2, ..., r) it acquires the
source's flag of each of its tiles and adds the slot to an fp32 running sum (in its own buffer),
while the GEMM keeps producing other owners' tiles. Partials travel in the input dtype. Flags are
per (source, tile) on the owner and carry the call's sequence number. GEMM_SMS + COMM_SMS must fit on the
device at once: the reduction spins.
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.launch import ForkedStreams, collective, ctl
from ._setup import OP, finish, setup
from ._tiles import launch_reduce, produce_partials


@kernel
def _gemm_producer_kernel(
    # GEMM operands (the order of GemmCall.gemm_args)
    a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    # stage [W, rows, N] (input dtype) and flags [W, tiles_per_owner] int64 (symmetric addresses)
    stage_ptr, flags_ptr, stride_slot, stride_sm, stride_sn,
    # distributed
    heap_bases, ctl_ptr, cur_rank, world,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr,
):
    epoch, live = P.call_epoch(ctl_ptr)
    if live:
        produce_partials(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                         stage_ptr, flags_ptr, stride_slot, stride_sm, stride_sn,
                         heap_bases, cur_rank, world, epoch, tl.program_id(0),
                         BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, USE_TMA, B_KMAJOR, RELEASE=True)


@collective(OP)
def producer_consumer(a, b, *, config=None, group=None):
    """gemm_reduce_scatter with GEMM and reduction kernels on two streams; same contract as
    :func:`tilefuse.gemm_reduce_scatter`."""
    call = setup("producer_consumer", a, b, config, group, comm=True, flags=True)
    if call.empty:
        return call.c
    heap = call.heap
    gemm_programs, comm_programs = call.program_counts
    streams = ForkedStreams(heap.device)  # the reduction's stream starts after the barrier
    # The GEMM waits on nothing: launched first, it cannot be blocked behind the spinning reduction.
    _gemm_producer_kernel[(gemm_programs,)](
        *call.gemm.gemm_args, call.stage, call.flags, *call.stage_args,
        heap.heap_bases, ctl(heap), heap.rank, heap.world_size,
        NUM_PROGRAMS=gemm_programs, **call.gemm.gemm_meta,
    )
    with streams.side():
        launch_reduce(call, comm_programs, pull=False, wait=True)
    streams.join()
    return finish(call)
