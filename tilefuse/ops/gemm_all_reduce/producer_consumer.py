"""gemm_all_reduce, producer-consumer: a GEMM kernel and a reduction kernel on two streams at once.

    stream 1: | GEMM (GEMM_SMS programs): tile t -> slot r of every rank, release flag (r, t) there | ...
    stream 2: | reduce (COMM_SMS programs): tile t: acquire flags (0, t) ... (W-1, t), sum (+ bias) -> c |
    stream 1:                                                                             | join |

Both kernels begin the call together (``P.enter``) and end it together (``P.exit`` over the programs
of both). A reduction program takes the tiles in the order they are produced, acquires each one's W
flags and sums the W slots in the order 0, 1, ..., W-1. GEMM_SMS + COMM_SMS must fit on the device
at once: the reduction spins.
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.launch import ForkedStreams, call_arg, collective, launched
from ._prepare import OP, prepare
from ._tiles import produce_tiles, reduce_kernel


@kernel
def _gemm_producer_kernel(
    a_ptr, b_ptr, scales, M, N, K, stride_a, stride_b,  # scales: common.scaled
    stage_ptr, flags_ptr, stride_s,  # stage [W, M, N] and flags [W, num_tiles] int64 (symmetric addresses)
    call, exit_programs,  # the call, begun and ended with ENTER; exit_programs: those of both kernels
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, ENTER: tl.constexpr,
):
    epoch, live = P.enter(call, ENTER)
    if live:
        # Release (r, t) on every rank: pairs with the reduction's acquire of source r's tile t.
        produce_tiles(a_ptr, b_ptr, scales, M, N, K, stride_a, stride_b, stage_ptr, flags_ptr, stride_s,
                      call, epoch, tl.program_id(0),
                      BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, USE_TMA, B_KMAJOR, RELEASE=True)
    P.exit(call, epoch, live, exit_programs, ENTER)


@collective(OP)
def producer_consumer(a, b, *, config=None, group=None, bias=None, scale_a=None, scale_b=None, out_dtype=None):
    """gemm_all_reduce, GEMM and reduction kernels on two streams; same contract as :func:`tilefuse.gemm_all_reduce`."""
    # The config's split, not capped by the tiles: every shape of a config launches one compiled kernel.
    p = prepare("producer_consumer", a, b, config, group, bias, (scale_a, scale_b, out_dtype), comm=True, flags=True,
                launch=lambda p: dict(gemm=dict(NUM_PROGRAMS=p.config.GEMM_SMS, ENTER=p.begins, **p.gemm_meta),
                                      reduce=p.reduce_meta(p.config.COMM_SMS, pull=False, wait=True, end=p.begins,
                                                           enter=p.begins)))
    a, b, c, entry = p.start(a, b)
    if p.empty:
        return c
    call = call_arg(p.heap, entry)
    gemm, reduce = p.launch["gemm"], p.launch["reduce"]
    total = gemm["NUM_PROGRAMS"] + reduce["NUM_PROGRAMS"]  # the programs that end the call together
    streams = ForkedStreams(p.heap.device)
    # The GEMM waits on nothing but the begin: launched first, it is not blocked behind the reduction.
    _gemm_producer_kernel[(gemm["NUM_PROGRAMS"],)](
        a, b, p.scales(scale_a, scale_b), p.M, p.N, p.K, p.stride_a, p.stride_b, p.stage, p.flags,
        p.stride_s, call, total, **gemm)
    with streams.side():
        reduce_kernel[(reduce["NUM_PROGRAMS"],)](
            p.stage, p.flags, p.stride_s, c, c if bias is None else bias.contiguous(), c.stride(), p.M, p.N,
            call, total, **reduce)
    streams.join()
    launched(entry)
    return c
