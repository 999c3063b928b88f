"""gemm_all_reduce, producer-consumer: a GEMM kernel and a reduction kernel on two streams at once.

    stream 1: | GEMM (GEMM_SMS programs): tile t -> slot r of every rank, release flag (r, t) there | ...
    stream 2: | reduce (COMM_SMS programs): tile t: acquire flags (0, t) ... (W-1, t), sum (+ bias) -> c |
    stream 1:                                                                             | join |

One-shot: both kernels begin the call together (``call_enter``: the first of their programs to run
does the begin, the others wait for it) and end it together (``call_exit`` over the programs of
both: the last writes the status words).

A reduction program takes the tiles in the order the GEMM programs produce them; for each it
acquires the W sources' flags in source order, then sums the W slots in fp32 in the order 0, 1, ...,
W-1 (the bits of every other variant, on every rank). Partials travel in the input dtype. Flags are
per (source, tile) on every rank and carry the call's sequence number. GEMM_SMS + COMM_SMS must fit
on the device at once: the reduction spins.
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.launch import ForkedStreams, collective, ctl
from ._setup import OP, setup
from ._tiles import launch_reduce, produce_tiles


@kernel
def _gemm_producer_kernel(
    # GEMM operands (the order of GemmCall.gemm_args)
    a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    # stage [W, M, N] (input dtype) and flags [W, num_tiles] int64 (symmetric addresses)
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
        # Release (r, t) on every rank: pairs with the reduction's acquire of source r's tile t.
        produce_tiles(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                      stage_ptr, flags_ptr, stride_slot, stride_sm, stride_sn,
                      heap_bases, cur_rank, world, epoch, tl.program_id(0),
                      BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, USE_TMA, B_KMAJOR, RELEASE=True)
    P.call_exit(ctl_ptr, heap_bases, cur_rank, world, epoch, live, status_ptr, exit_programs, ENTER)


@collective(OP)
def producer_consumer(a, b, *, config=None, group=None, bias=None):
    """gemm_all_reduce with GEMM and reduction kernels on two streams; same contract as
    :func:`tilefuse.gemm_all_reduce`."""
    call = setup("producer_consumer", a, b, config, group, bias, comm=True, flags=True, kernel_begins=True)
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
    return call.c
