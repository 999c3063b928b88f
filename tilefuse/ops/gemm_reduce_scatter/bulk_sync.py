"""gemm_reduce_scatter, bulk-synchronous: the whole GEMM, a barrier, then a pull-and-sum kernel.

    rank r:  | GEMM (all SMs): a @ b -> stage [M, N] (input dtype); begins the call | barrier |
             | reduce: for each tile of r's rows, sum stage[r-th row block] of every rank -> c; ends the call |

No overlap: the baseline. The owner pulls its slot from every peer and sums them in fp32 in the
order r-1, r-2, ..., r.
"""

from __future__ import annotations

from ..common.launch import call_arg, collective, ctl, gemm_call_args, launched, mid_barrier
from ._prepare import OP, prepare
from ._tiles import launch_reduce


@collective(OP)
def bulk_sync(a, b, *, config=None, group=None, scale_a=None, scale_b=None, out_dtype=None):
    """gemm_reduce_scatter with no overlap; same contract as :func:`tilefuse.gemm_reduce_scatter`."""
    p = prepare("bulk_sync", a, b, config, group, (scale_a, scale_b, out_dtype))
    a, b, c, entry = p.start(a, b)
    if p.empty:
        return c
    heap, cfg = p.heap, p.config
    # The GEMM core begins the call; after its barrier every rank's partial is complete.
    own, call = p.partial, gemm_call_args(heap, entry)
    p.gemm(a, b, own, ends=call is not None, enter=True, barrier=True).run(
        a, b, own, ctl(heap), call=call, scales=p.scales(scale_a, scale_b))
    launched(entry, ends=False)
    if entry is None:
        mid_barrier(heap, 0)
    programs = cfg.GEMM_SMS + cfg.COMM_SMS  # not capped by the tiles: one kernel per config
    launch_reduce(p, call_arg(p.heap, entry), c, programs, pull=True, wait=False, end=entry is not None)
    launched(entry)  # the reduction ends the call
    return c
