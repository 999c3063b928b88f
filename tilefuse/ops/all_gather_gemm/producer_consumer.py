"""all_gather_gemm, producer-consumer: a push kernel and a GEMM kernel on two streams at once.

    stream 1: | push (COMM_SMS programs): chunk -> rank r-1, release its flag there, ...  |
    stream 2: | GEMM (GEMM_SMS programs): local shard from a | source r+1: acquire chunk
              | flag, K loop | source r+2 ... |
    stream 1:                                                          | join |

Both kernels begin the call together (``call_enter``: the first of their programs to run does the
begin, the others wait for it, so no row is pushed before every peer is done with the previous
call's) and end it together (``call_exit`` over the programs of both: the last writes the status
words); ``TILEFUSE_BEGIN_KERNEL=1``: a begin kernel first.

The push kernel writes this rank's shard, BLOCK_M rows at a time, into row block r of every rank's
``a_gathered`` and releases the per-(source, chunk) flag on the receiving rank (epoch-valued). The
GEMM walks its sources in ring order r, r+1, ... and acquires a chunk's flag before the K loop of a
tile that reads it; the local shard is read from ``a`` itself and waits for nothing (when ``a``
fits the same operand path as the heap buffer; otherwise it is pushed to this rank too and waited
for like a peer's). GEMM_SMS + COMM_SMS must fit on the device at once: the GEMM spins on flags.
In the interpreter the push kernel is launched first: it waits on nothing.

``COMM_SMS = 0`` moves the rows with the GPU's copy engines instead, so the GEMM keeps every SM::

    stream 1: | begin | a -> own row block of a_gathered | barrier | GEMM (all GEMM_SMS programs) ... |
    stream 2:                                             | copy rank r+1's rows (chunk) | release |
                                                          | next chunk ... | rank r+2 ... |

Each rank pulls every peer's row block out of the peer's ``a_gathered`` (a peer-to-peer copy of
mapped heap memory, done by a DMA engine), a few chunks per peer; after each chunk a one-program
kernel, stream-ordered behind the copy, releases that chunk's flags for the GEMM on stream 1.
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import hw
from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.gather import push_shard
from ..common.launch import ForkedStreams, collective, ctl, mid_barrier
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
def _gemm_kernel(
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


@kernel
def _release_rows_kernel(flags_ptr, first, count, heap_bases, ctl_ptr, cur_rank, world):
    """Release ``flags[first : first + count]`` on this rank, after the copy queued before it."""
    epoch, live = P.call_epoch(ctl_ptr)
    if live:
        for i in range(first, first + count):
            # Release: pairs with the acquire before the GEMM tiles of this chunk (_tiles.gemm_shard).
            P.signal(flags_ptr + i, epoch, cur_rank, cur_rank, heap_bases)


COPIES_PER_PEER = 4  # copy-engine chunks per peer: the GEMM starts on a peer's rows after the first


def _pull_with_copy_engines(call, p) -> None:
    """Stream 2 of the copy-engine form: every peer's rows, chunk by chunk, then their flags."""
    heap, cfg = call.heap, call.config
    W, r, M_loc = heap.world_size, heap.rank, call.M
    step = -(-p.num_chunks // COPIES_PER_PEER)
    for i in range(1, W):
        src = (r + i) % W
        theirs = heap.peer_view(p.ag, src)
        for lo in range(0, p.num_chunks, step):
            hi = min(lo + step, p.num_chunks)
            rows = slice(src * M_loc + lo * cfg.BLOCK_M, src * M_loc + min(hi * cfg.BLOCK_M, M_loc))
            p.ag[rows].copy_(theirs[rows], non_blocking=True)
            _release_rows_kernel[(1,)](p.flags, src * p.num_chunks + lo, hi - lo, heap.heap_bases, ctl(heap), r, W,
                                       num_warps=1)


@collective(OP)
def producer_consumer(a, b, *, config=None, group=None, return_gathered=False):
    """all_gather_gemm with push and GEMM kernels on two streams (or, with ``COMM_SMS = 0``, copy
    engines and a GEMM on every SM); same contract as :func:`tilefuse.all_gather_gemm`."""
    engines = config is not None and getattr(config, "COMM_SMS", None) == 0
    call = setup("producer_consumer", a, b, config, group, comm=not engines)
    if is_degenerate(call):
        return bulk_sync(a, b, config=config, group=group, return_gathered=return_gathered)
    heap, cfg = call.heap, call.config
    W, r, M_loc, N, K = heap.world_size, heap.rank, call.M, call.N, call.K
    # The SM-driven form's kernels begin the call (the copy-engine form's begin kernel runs here): no
    # row moves before every peer is done with a_gathered.
    p = plan_push(call, "producer_consumer", return_gathered, kernel_begins=not engines)
    if engines:
        p.own.copy_(a)  # the rows the peers' copy engines pull
        if not p.lay.local_direct:  # the GEMM reads the local rows from a_gathered too
            _release_rows_kernel[(1,)](p.flags, r * p.num_chunks, p.num_chunks, heap.heap_bases, ctl(heap), r, W,
                                       num_warps=1)
        mid_barrier(heap, 0)  # every rank's own rows are in place
        streams = ForkedStreams(heap.device)
        with streams.side():
            _pull_with_copy_engines(call, p)
        # One multiprocessor stays free for the release kernels: the GEMM programs spin on their flags.
        # Not capped by the tiles (programs without one exit): one compiled kernel per config.
        gemm_programs = min(cfg.GEMM_SMS, hw.num_sms(heap.device) - 1)
        _gemm_kernel[(gemm_programs,)](
            a, a.stride(0), a.stride(1), p.ag, p.ag.stride(0), p.ag.stride(1), b, b.stride(0), b.stride(1),
            p.c, p.c.stride(0), p.c.stride(1), p.flags, M_loc, N, K,
            heap.heap_bases, ctl(heap), r, W, *p.enter_args, gemm_programs,
            NUM_PROGRAMS=gemm_programs, LOCAL_DIRECT=p.lay.local_direct, ENTER=False, **gemm_meta(call, p.lay),
        )
        streams.join()
        return finish(call, p.c, p.ag.clone() if return_gathered else None, return_gathered)
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
        _gemm_kernel[(gemm_programs,)](
            a, a.stride(0), a.stride(1), p.ag, p.ag.stride(0), p.ag.stride(1), b, b.stride(0), b.stride(1),
            p.c, p.c.stride(0), p.c.stride(1), p.flags, M_loc, N, K,
            heap.heap_bases, ctl(heap), r, W, *p.enter_args, total,
            NUM_PROGRAMS=gemm_programs, LOCAL_DIRECT=p.lay.local_direct, ENTER=p.begins, **gemm_meta(call, p.lay),
        )
    streams.join()
    p.entered()
    return finish(call, p.c, p.ag.clone() if return_gathered else None, return_gathered)
