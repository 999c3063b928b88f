"""gemm_all_reduce, bulk-synchronous: the whole GEMM into the rank's own slot, a barrier, a pull-and-sum kernel.

    rank r:  | GEMM (all SMs): a @ b -> stage[r] (own heap, input dtype); begins the call | barrier |
             | reduce: for each tile, stage[s] of rank s for s = 0, 1, ..., W-1, summed in fp32 (+ bias) -> c;
               ends the call |

No overlap: the baseline shape of the algorithm in the same runtime. Rank r's partial never leaves
its heap before the barrier; every rank then reads every partial (remote loads) and sums the W of
them in the fixed order 0, 1, ..., W-1, so the W copies of ``c`` have the same bits. The GEMM's first
program begins the call (``call_enter``) and the reduction's last one ends it (``call_exit``): no
begin kernel, no status copy.
"""

from __future__ import annotations

from ..common.launch import collective
from ._setup import OP, setup
from ._tiles import launch_reduce


@collective(OP)
def bulk_sync(a, b, *, config=None, group=None, bias=None):
    """gemm_all_reduce with no overlap; same contract as :func:`tilefuse.gemm_all_reduce`."""
    call = setup("bulk_sync", a, b, config, group, bias, comm=False, flags=False, kernel_begins=True)
    if call.empty:
        return call.c
    heap = call.heap
    # fp32 accumulator, stored in a's dtype. The GEMM begins the call and every rank's partial is
    # complete after it.
    call.first_gemm(heap, a, b, call.stage[heap.rank], call.config, barrier=True)
    launch_reduce(call, call.all_programs, pull=True, wait=False, end=call.begins)
    call.entered()  # the reduction ends the call
    return call.c
