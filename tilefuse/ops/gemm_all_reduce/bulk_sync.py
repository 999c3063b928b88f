"""gemm_all_reduce, bulk-synchronous: the whole GEMM into the rank's own slot, a barrier, a pull-and-sum kernel.

    rank r:  | GEMM (all SMs): a @ b -> stage[r] (own heap, input dtype); begins the call | barrier |
             | reduce: for each tile, stage[s] of rank s for s = 0, 1, ..., W-1, summed in fp32 (+ bias) -> c;
               ends the call |

No overlap: the baseline. The GEMM core's first program begins the call (``P.enter``),
``_tiles.reduce_kernel``'s last ends it.
"""

from __future__ import annotations

from ..common.launch import call_arg, collective, ctl, gemm_call_args, launched, mid_barrier
from ._prepare import OP, prepare
from ._tiles import reduce_kernel


@collective(OP)
def bulk_sync(a, b, *, config=None, group=None, bias=None, scale_a=None, scale_b=None, out_dtype=None):
    """gemm_all_reduce with no overlap; same contract as :func:`tilefuse.gemm_all_reduce`."""
    # The reduction on all the config's programs (not capped by the tiles: one compiled kernel per config).
    p = prepare("bulk_sync", a, b, config, group, bias, (scale_a, scale_b, out_dtype), comm=False, flags=False,
                launch=lambda p: dict(own_slot=p.stage[p.heap.rank], reduce=p.reduce_meta(
                    p.config.GEMM_SMS + p.config.COMM_SMS, pull=True, wait=False, end=p.begins)))
    a, b, c, entry = p.start(a, b)
    if p.empty:
        return c
    heap, reduce = p.heap, p.launch["reduce"]
    # The GEMM begins the call; every rank's partial is complete after its barrier (or a barrier kernel).
    own, call = p.launch["own_slot"], gemm_call_args(heap, entry)
    p.gemm(a, b, own, ends=call is not None, enter=True, barrier=True).run(
        a, b, own, ctl(heap), call=call, scales=p.scales(scale_a, scale_b))
    launched(entry, ends=False)
    if entry is None:
        mid_barrier(heap, 0)
    reduce_kernel[(reduce["NUM_PROGRAMS"],)](
        p.stage, p.stage, p.stride_s, c, c if bias is None else bias.contiguous(), c.stride(), p.M, p.N,
        call_arg(heap, entry), reduce["NUM_PROGRAMS"], **reduce)
    launched(entry)  # the reduction ends the call
    return c
