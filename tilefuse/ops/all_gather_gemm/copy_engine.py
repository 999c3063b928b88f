"""all_gather_gemm, producer_consumer's copy-engine form: copy engines move the rows, the GEMM runs on the SMs.

    stream 1: | begin | a -> own row block of a_gathered | barrier | GEMM (all programs) ...         |
    stream 2:                                             | copy rank r+1's rows (chunk) | release |
                                                          | next chunk ... | rank r+2 ... |
    stream 1:                                                                             | join |

Every peer's row block is pulled by DMA, ``COPIES_PER_PEER`` chunks a peer; a one-program kernel behind
each copy releases the chunk's flags for producer_consumer's GEMM (one SM stays free for them).
"""

from __future__ import annotations

from ...runtime import hw
from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.launch import ForkedStreams, begin_call, call_arg, collective, mid_barrier, new_output
from ._prepare import OP, prepare
from .bulk_sync import bulk_sync
from .producer_consumer import gemm_kernel

COPIES_PER_PEER = 4  # chunks per peer: the GEMM starts on a peer's rows after the first


@kernel
def _release_rows_kernel(flags_ptr, first, count, call):
    """Release ``flags[first : first + count]`` on this rank, after the copy queued before it."""
    seq, live = P.call_epoch(P.ctl(call))
    if live:
        for i in range(first, first + count):
            # Release: pairs with the acquire before the GEMM tiles of this chunk (_tiles.gemm_shard).
            P.signal(flags_ptr + i, seq, P.rank(call), P.rank(call), P.bases(call))


def _pull_rows(heap, p, call) -> None:
    """Stream 2: every peer's rows, chunk by chunk, each chunk's flags released behind its copy."""
    W, r, M_loc, n = heap.world_size, heap.rank, p.M, p.num_chunks
    step = -(-n // COPIES_PER_PEER)
    for i in range(1, W):
        src = (r + i) % W
        theirs = heap.peer_view(p.ag, src)
        for lo in range(0, n, step):
            hi = min(lo + step, n)
            rows = slice(src * M_loc + lo * p.config.BLOCK_M, src * M_loc + min(hi * p.config.BLOCK_M, M_loc))
            p.ag[rows].copy_(theirs[rows], non_blocking=True)
            if p.sg is not None:  # a float8 call's row scales
                p.sg[rows].copy_(heap.peer_view(p.sg, src)[rows], non_blocking=True)
            _release_rows_kernel[(1,)](p.flags, src * n + lo, hi - lo, call, num_warps=1)


@collective(OP)
def copy_engine(a, b, *, config=None, group=None, return_gathered=False, scale_a=None, scale_b=None,
                out_dtype=None):
    """all_gather_gemm, rows pulled by copy engines, the GEMM on the SMs; contract :func:`tilefuse.all_gather_gemm`."""
    scaling = (scale_a, scale_b, out_dtype)
    heap, p = prepare("copy_engine", a, b, config, group, return_gathered, scaling, buffers="flagged")
    if p.empty:
        return bulk_sync(a, b, config=config, group=group, return_gathered=return_gathered, scale_a=scale_a,
                         scale_b=scale_b, out_dtype=out_dtype)
    c = new_output((heap.world_size * p.M, p.N), p.out_dtype, a.device)
    begin_call(p.sig, c)  # the begin kernel: a copy engine cannot begin a call
    call = call_arg(heap, None)
    p.own.copy_(a)  # the rows the peers' copy engines pull
    if p.sg is not None:
        p.own_sg.copy_(scale_a.reshape(-1).expand(p.M))  # and their scales
    if not p.local_direct:  # the GEMM reads the local rows from a_gathered too
        _release_rows_kernel[(1,)](p.flags, heap.rank * p.num_chunks, p.num_chunks, call, num_warps=1)
    mid_barrier(heap, 0)  # every rank's own rows are in place
    streams = ForkedStreams(heap.device)
    with streams.side():
        _pull_rows(heap, p, call)
    programs = min(p.programs, hw.num_sms(heap.device) - 1)
    gemm_kernel[(programs,)](
        a, *a.stride(), p.ag, *p.ag.stride(), p.scales(scale_a, scale_b), b, *b.stride(), c, *c.stride(), p.flags,
        p.M, p.N, p.K, call, programs, NUM_PROGRAMS=programs,
        LOCAL_DIRECT=p.local_direct, ENTER=False, **p.meta)
    streams.join()
    return (c, p.ag.clone()) if return_gathered else c
