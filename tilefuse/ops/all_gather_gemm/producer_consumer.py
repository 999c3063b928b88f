"""all_gather_gemm, producer-consumer: a push kernel and a GEMM kernel on two streams at once.

    stream 1: | push (COMM_SMS programs): chunk -> rank r-1, release its flag there, ...  |
    stream 2: | GEMM (GEMM_SMS programs): local shard from a | source r+1: acquire chunk
              | flag, K loop | source r+2 ... |
    stream 1:                                                          | join |

Both kernels begin the call together (``call_enter``: the first of their programs to run does the
begin, the others wait for it, so no row is pushed before every peer is done with the previous
call's) and end it together (``call_exit`` over the programs of both: the last writes the status
words).

The push kernel writes this rank's shard, BLOCK_M rows at a time, into row block r of every rank's
``a_gathered`` and releases the per-(source, chunk) flag on the receiving rank (epoch-valued). The
GEMM walks its sources in ring order r, r+1, ... and acquires a chunk's flag before the K loop of a
tile that reads it; the local shard is read from ``a`` itself and waits for nothing (when ``a``
fits the same operand path as the heap buffer; otherwise it is pushed to this rank too and waited
for like a peer's). GEMM_SMS + COMM_SMS must fit on the device at once: the GEMM spins on flags.
In the interpreter the push kernel is launched first: it waits on nothing.

Its copy-engine form (the rows moved by DMA, the GEMM on every SM but one) is :mod:`.copy_engine`.
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.gather import push_shard
from ..common.launch import ForkedStreams, collective, ctl
from ._setup import OP, finish, gemm_meta, is_degenerate, plan_push, setup
from ._tiles import gemm_gathered
from .bulk_sync import bulk_sync


@kernel
def _push_kernel(
    # this rank's shard [M_loc, K] (any local tensor)
    a_ptr, stride_am, stride_ak,
    # this rank's row block of a_gathered and its row of flags (symmetric addresses)
    ag_ptr, stride_gm, stride_gk, flags_ptr,
    M_loc, K,
    # distributed; the call's begin and end (with ENTER; exit_programs: those of both kernels)
    heap_bases, ctl_ptr, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1, status_ptr, exit_programs,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, NUM_PROGRAMS: tl.constexpr, FIRST: tl.constexpr,
    ENTER: tl.constexpr,
):
    epoch, live = P.call_enter(ctl_ptr, heap_bases, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1,
                               ENTER)
    if live:
        push_shard(a_ptr, stride_am, stride_ak, ag_ptr, stride_gm, stride_gk, flags_ptr, epoch, M_loc, K,
                   cur_rank, world, heap_bases, tl.program_id(0), NUM_PROGRAMS, BLOCK_M, BLOCK_K, FIRST, SIGNAL=True)
    P.call_exit(ctl_ptr, heap_bases, cur_rank, world, epoch, live, status_ptr, exit_programs, ENTER)


@kernel
def gemm_kernel(
    a_ptr, stride_am, stride_ak,
    ag_ptr, stride_gm, stride_gk,
    b_ptr, stride_bk, stride_bn,
    c_ptr, stride_cm, stride_cn,
    flags_ptr,
    M_loc, N, K,
    heap_bases, ctl_ptr, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1, status_ptr, exit_programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr,
    LOCAL_DIRECT: tl.constexpr, ENTER: tl.constexpr, FLATTEN: tl.constexpr,
):
    epoch, live = P.call_enter(ctl_ptr, heap_bases, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1,
                               ENTER)
    if live:
        gemm_gathered(a_ptr, stride_am, stride_ak, ag_ptr, stride_gm, stride_gk, b_ptr, stride_bk, stride_bn,
                      c_ptr, stride_cm, stride_cn, flags_ptr, M_loc, N, K, heap_bases, ctl_ptr, cur_rank, world,
                      epoch, tl.program_id(0), NUM_PROGRAMS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA, B_KMAJOR,
                      LOCAL_DIRECT, FLATTEN)
    P.call_exit(ctl_ptr, heap_bases, cur_rank, world, epoch, live, status_ptr, exit_programs, ENTER)


@collective(OP)
def producer_consumer(a, b, *, config=None, group=None, return_gathered=False):
    """all_gather_gemm with push and GEMM kernels on two streams; same contract as
    :func:`tilefuse.all_gather_gemm`."""
    call = setup("producer_consumer", a, b, config, group, comm=True)
    if is_degenerate(call):
        return bulk_sync(a, b, config=config, group=group, return_gathered=return_gathered)
    heap, cfg = call.heap, call.config
    W, r, M_loc, N, K = heap.world_size, heap.rank, call.M, call.N, call.K
    # The kernels begin the call: no row moves before every peer is done with a_gathered.
    p = plan_push(call, "producer_consumer", return_gathered, kernel_begins=True)
    streams = ForkedStreams(heap.device)  # both kernels begin the call (or the begin kernel ran before)
    # Not capped by the chunks or tiles (programs without one exit): one compiled kernel per config.
    push_programs, gemm_programs = cfg.COMM_SMS, cfg.GEMM_SMS
    pushes = W > p.first  # a world of one with the local rows read in place pushes nothing
    total = gemm_programs + (push_programs if pushes else 0)  # the programs that end the call together
    if pushes:
        _push_kernel[(push_programs,)](
            a, a.stride(0), a.stride(1), p.own, p.own.stride(0), p.own.stride(1), p.flags[r * p.num_chunks:],
            M_loc, K, heap.heap_bases, ctl(heap), r, W, *p.enter_args, total,
            BLOCK_M=cfg.BLOCK_M, BLOCK_K=cfg.BLOCK_K, NUM_PROGRAMS=push_programs, FIRST=p.first,
            ENTER=p.begins, num_warps=4,
        )
    with streams.side():
        gemm_kernel[(gemm_programs,)](
            a, a.stride(0), a.stride(1), p.ag, p.ag.stride(0), p.ag.stride(1), b, b.stride(0), b.stride(1),
            p.c, p.c.stride(0), p.c.stride(1), p.flags, M_loc, N, K,
            heap.heap_bases, ctl(heap), r, W, *p.enter_args, total,
            NUM_PROGRAMS=gemm_programs, LOCAL_DIRECT=p.lay.local_direct, ENTER=p.begins, **gemm_meta(call, p.lay),
        )
    streams.join()
    p.entered()
    return finish(call, p.c, p.ag.clone() if return_gathered else None, return_gathered)
