"""gemm_reduce_scatter, producer-consumer: a GEMM kernel and a reduction kernel on two streams at once.

    stream 1: | GEMM (GEMM_SMS programs): tiles of owner r+1 -> its slot r, release | r+2 | ... |
    stream 2: | reduce (COMM_SMS programs): from r-1: acquire | from r-2: acquire, add | ... -> c |
    stream 1:                                                                         | join |

Both kernels begin the call together (``call_enter``: the first of their programs to run does the
begin, the others wait for it) and end it together (``call_exit`` over the programs of both: the
last writes the status words).

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
    # distributed; the call's begin and end (with ENTER; exit_programs: those of both kernels)
    heap_bases, ctl_ptr, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1, status_ptr, exit_programs,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, ENTER: tl.constexpr,
):
    epoch, live = P.call_enter(ctl_ptr, heap_bases, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1,
                               ENTER)
    if live:
        produce_partials(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                         stage_ptr, flags_ptr, stride_slot, stride_sm, stride_sn,
                         heap_bases, cur_rank, world, epoch, tl.program_id(0),
                         BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, USE_TMA, B_KMAJOR, RELEASE=True)
    P.call_exit(ctl_ptr, heap_bases, cur_rank, world, epoch, live, status_ptr, exit_programs, ENTER)


@collective(OP)
def producer_consumer(a, b, *, config=None, group=None):
    """gemm_reduce_scatter with GEMM and reduction kernels on two streams; same contract as
    :func:`tilefuse.gemm_reduce_scatter`."""
    call = setup("producer_consumer", a, b, config, group, comm=True, flags=True, kernel_begins=True)
    if call.empty:
        return call.c
    heap = call.heap
    gemm_programs, comm_programs = call.program_counts
    total = gemm_programs + comm_programs  # the programs that end the call together
    streams = ForkedStreams(heap.device)  # both kernels begin the call (or the begin kernel ran before)
    # The GEMM waits on nothing but the begin: launched first, it cannot be blocked behind the
    # spinning reduction.
    _gemm_producer_kernel[(gemm_programs,)](
        *call.gemm.gemm_args, call.stage, call.flags, *call.stage_args,
        heap.heap_bases, ctl(heap), heap.rank, heap.world_size, *call.enter_args, total,
        NUM_PROGRAMS=gemm_programs, ENTER=call.begins, **call.gemm.gemm_meta,
    )
    with streams.side():
        launch_reduce(call, comm_programs, pull=False, wait=True, enter=call.begins, end=call.begins,
                      exit_programs=total)
    streams.join()
    call.entered()
    return finish(call)
