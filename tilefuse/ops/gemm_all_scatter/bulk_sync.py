"""gemm_all_scatter, bulk-synchronous: the whole GEMM, then a scatter kernel, stream-ordered.

    stream:  | GEMM (all SMs) -> own block of the result; begins the call | scatter: own block -> every peer;
             ends with a barrier (all peers' blocks landed) |

No overlap: the baseline. The GEMM's first program begins the call (``P.enter``), the scatter
kernel's last passes the closing barrier (``P.exit`` with ``BARRIER``); at world 1 the GEMM is all.
"""

from __future__ import annotations

from ..common.launch import call_arg, collective, ctl, gemm_call_args, launched, mid_barrier
from ._prepare import OP, begin, finish, prepare
from ._tiles import scatter_kernel


@collective(OP)
def bulk_sync(a, b, *, config=None, group=None, out=None, scale_a=None, scale_b=None, out_dtype=None):
    """gemm_all_scatter with no overlap; same contract as :func:`tilefuse.gemm_all_scatter`."""
    p = prepare("bulk_sync", a, b, config, group, out, (scale_a, scale_b, out_dtype), comm=False)
    a, b, dest, c, entry = begin(p, a, b, out)
    if not p.empty:
        heap, cfg = p.heap, p.config
        last = heap.world_size == 1
        own = dest[:, heap.rank * p.N:(heap.rank + 1) * p.N]
        call = gemm_call_args(heap, entry)
        p.gemm(a, b, own, ends=call is not None, enter=True).run(  # begins the call
            a, b, own, ctl(heap), call=call, scales=p.scales(scale_a, scale_b))
        launched(entry, ends=last)
        if not last:
            programs = cfg.GEMM_SMS + cfg.COMM_SMS  # not capped by the tiles: one kernel per config
            # Row-major (GROUP_M 1), no flags: the GEMM is done.
            scatter_kernel[(programs,)](
                dest, c, c, p.M, p.N, *c.stride(), call_arg(heap, entry), programs, BLOCK_M=cfg.BLOCK_M,
                BLOCK_N=cfg.BLOCK_N, GROUP_M=1, NUM_PROGRAMS=programs, ENTER=False, END=entry is not None, WAIT=False,
                num_warps=4)
            launched(entry)
            if entry is None:
                mid_barrier(heap, 0)  # every peer's block has landed in c
    return finish(p, dest, c, out)
