"""all_gather_gemm, copy-engine form of producer_consumer: the GPU's copy engines move the rows, the
GEMM keeps every SM but one.

    stream 1: | begin | a -> own row block of a_gathered | barrier | GEMM (all programs) ...         |
    stream 2:                                             | copy rank r+1's rows (chunk) | release |
                                                          | next chunk ... | rank r+2 ... |
    stream 1:                                                                             | join |

Each rank pulls every peer's row block out of the peer's ``a_gathered`` (a peer-to-peer copy of
mapped heap memory, done by a DMA engine), ``COPIES_PER_PEER`` chunks per peer; after each chunk a
one-program kernel, stream-ordered behind the copy, releases that chunk's flags for the GEMM on
stream 1, which is producer_consumer's GEMM kernel (:func:`.producer_consumer.gemm_kernel`): it
acquires a chunk's flag before the K loop of a tile that reads it. One multiprocessor stays free for
the release kernels, since the GEMM programs spin on their flags. The barrier before the copies
orders every rank's own rows in its ``a_gathered`` before any peer pulls them; the begin before it
keeps the copies from overwriting rows a peer still reads from the previous call.
"""

from __future__ import annotations

from ...runtime import hw
from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.launch import ForkedStreams, collective, ctl, mid_barrier
from ._setup import OP, finish, gemm_meta, is_degenerate, plan_push, setup
from .bulk_sync import bulk_sync
from .producer_consumer import gemm_kernel

COPIES_PER_PEER = 4  # chunks per peer: the GEMM starts on a peer's rows after the first


@kernel
def _release_rows_kernel(flags_ptr, first, count, heap_bases, ctl_ptr, cur_rank, world):
    """Release ``flags[first : first + count]`` on this rank, after the copy queued before it."""
    epoch, live = P.call_epoch(ctl_ptr)
    if live:
        for i in range(first, first + count):
            # Release: pairs with the acquire before the GEMM tiles of this chunk (_tiles.gemm_shard).
            P.signal(flags_ptr + i, epoch, cur_rank, cur_rank, heap_bases)


def _pull_rows(call, p) -> None:
    """Stream 2: every peer's rows, chunk by chunk, each chunk's flags released behind its copy."""
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
def copy_engine(a, b, *, config=None, group=None, return_gathered=False):
    """all_gather_gemm with the rows pulled by copy engines and the GEMM on every SM but one; same
    contract as :func:`tilefuse.all_gather_gemm`. All ``GEMM_SMS + COMM_SMS`` programs of the config
    compute (at most the device's multiprocessors less one)."""
    call = setup("copy_engine", a, b, config, group, comm=False)
    if is_degenerate(call):
        return bulk_sync(a, b, config=config, group=group, return_gathered=return_gathered)
    heap, cfg = call.heap, call.config
    W, r, M_loc, N, K = heap.world_size, heap.rank, call.M, call.N, call.K
    p = plan_push(call, "copy_engine", return_gathered)  # begins the call
    p.own.copy_(a)  # the rows the peers' copy engines pull
    if not p.lay.local_direct:  # the GEMM reads the local rows from a_gathered too
        _release_rows_kernel[(1,)](p.flags, r * p.num_chunks, p.num_chunks, heap.heap_bases, ctl(heap), r, W,
                                   num_warps=1)
    mid_barrier(heap, 0)  # every rank's own rows are in place
    streams = ForkedStreams(heap.device)
    with streams.side():
        _pull_rows(call, p)
    # Not capped by the tiles (programs without one exit): one compiled kernel per config.
    gemm_programs = min(cfg.GEMM_SMS + cfg.COMM_SMS, hw.num_sms(heap.device) - 1)
    gemm_kernel[(gemm_programs,)](
        a, a.stride(0), a.stride(1), p.ag, p.ag.stride(0), p.ag.stride(1), b, b.stride(0), b.stride(1),
        p.c, p.c.stride(0), p.c.stride(1), p.flags, M_loc, N, K,
        heap.heap_bases, ctl(heap), r, W, *p.enter_args, gemm_programs,
        NUM_PROGRAMS=gemm_programs, LOCAL_DIRECT=p.lay.local_direct, ENTER=False, **gemm_meta(call, p.lay),
    )
    streams.join()
    return finish(call, p.c, p.ag.clone() if return_gathered else None, return_gathered)
