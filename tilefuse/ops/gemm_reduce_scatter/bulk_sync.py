"""gemm_reduce_scatter, bulk-synchronous: the whole GEMM, a barrier, then a pull-and-sum kernel.

    rank r:  | GEMM (all SMs): a @ b -> stage [M, N] (input dtype); begins the call | barrier |
             | reduce: for each tile of r's rows, sum stage[r-th row block] of every rank -> c; ends the call |

No overlap: the baseline shape of the algorithm in the same runtime. Each rank's stage holds its
whole partial, accumulated in fp32 and stored in the input dtype (slot o = owner o's rows); the owner
pulls its slot from every peer and sums the W partials in fp32 in a fixed order (r-1, r-2, ..., r),
so the result is the same on every run. The GEMM's first program begins the call (``call_enter``)
and the reduction's last one ends it (``call_exit``): no begin kernel, no status copy.
"""

from __future__ import annotations

from ..common.launch import collective
from ._setup import OP, finish, setup
from ._tiles import launch_reduce


@collective(OP)
def bulk_sync(a, b, *, config=None, group=None):
    """gemm_reduce_scatter with no overlap; same contract as :func:`tilefuse.gemm_reduce_scatter`."""
    call = setup("bulk_sync", a, b, config, group, comm=False, flags=False, kernel_begins=True)
    if call.empty:
        return call.c
    cfg, heap = call.config, call.heap
    # fp32 accumulator, stored in a's dtype; the GEMM begins the call and every rank's partial is
    # complete after it
    call.first_gemm(heap, a, b, call.stage.view(call.gemm.M, call.gemm.N), cfg, barrier=True)
    programs = cfg.GEMM_SMS + cfg.COMM_SMS  # not capped by the tiles: one kernel per config
    launch_reduce(call, programs, pull=True, wait=False, end=call.begins)  # the barrier ordered the partials
    call.entered()  # the reduction ends the call
    return finish(call)
