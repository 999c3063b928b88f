"""gemm_reduce_scatter, producer-consumer: a GEMM kernel and a reduction kernel on two streams at once.

    stream 1: | GEMM (GEMM_SMS programs): tiles of owner r+1 -> its slot r, release | r+2 | ... |
    stream 2: | reduce (COMM_SMS programs): from r-1: acquire | from r-2: acquire, add | ... -> c |
    stream 1:                                                                         | join |

Both kernels begin the call together (``P.enter``) and end it together (``P.exit`` over the programs
of both). Rank r's reduction follows the arrivals: source by source (r-1, r-2, ..., r) it acquires
each tile's flag and adds the slot to an fp32 running sum. GEMM_SMS + COMM_SMS must fit on the
device at once: the reduction spins.
"""

from __future__ import annotations

from ..common.launch import ForkedStreams, call_arg, collective, launched
from ._prepare import OP, prepare
from ._tiles import launch_reduce, partials_kernel


@collective(OP)
def producer_consumer(a, b, *, config=None, group=None, scale_a=None, scale_b=None, out_dtype=None):
    """gemm_reduce_scatter, GEMM and reduction kernels on two streams; contract :func:`tilefuse.gemm_reduce_scatter`."""
    p = prepare("producer_consumer", a, b, config, group, (scale_a, scale_b, out_dtype), comm=True, flags=True)
    a, b, c, entry = p.start(a, b)
    if p.empty:
        return c
    call, begins = call_arg(p.heap, entry), entry is not None
    gemm_programs, comm_programs = p.config.GEMM_SMS, p.config.COMM_SMS  # not capped: one kernel per config
    total = gemm_programs + comm_programs  # the programs that end the call together
    streams = ForkedStreams(p.heap.device)
    # The GEMM waits on nothing but the begin: launched first, it is not blocked behind the reduction.
    partials_kernel[(gemm_programs,)](
        a, b, p.scales(scale_a, scale_b), *p.dims, p.stage, p.flags, *p.stage_strides, call, total,
        NUM_PROGRAMS=gemm_programs, ENTER=begins, RELEASE=True, BARRIER=False, WARP_SPEC=False, **p.meta)
    with streams.side():
        launch_reduce(p, call, c, comm_programs, pull=False, wait=True, enter=begins, end=begins, exit_programs=total)
    streams.join()
    launched(entry)
    return c
