"""gemm_all_scatter, producer-consumer: a GEMM kernel and a scatter kernel on two streams at once.

    stream 1: | GEMM (GEMM_SMS programs): tile -> own block of the result, release tile flag |
    stream 2: | scatter (COMM_SMS programs): acquire tile flag, put tile to peers ... barrier |
    stream 1:                                                                       | join |

Flags are per tile, local to the rank, and carry the call's sequence number. GEMM_SMS + COMM_SMS
must fit on the device at once: the consumer spins. Both kernels begin the call together
(``P.enter``) and end it together (``P.exit`` over both: the last program passes the closing barrier).
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.launch import ForkedStreams, call_arg, collective, launched, mid_barrier
from ._prepare import OP, begin, finish, prepare
from ._tiles import compute_tiles, scatter_kernel


@kernel
def _gemm_producer_kernel(
    a_ptr, b_ptr, scales, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,  # scales: common.scaled
    # the result, c (a symmetric address), both [M, W*N] strided alike; one int64 flag per tile
    o_ptr, c_ptr, stride_cm, stride_cn, flags_ptr,
    call, exit_programs,  # the call; the programs of both kernels, which end it together
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, ENTER: tl.constexpr,
):
    seq, live = P.enter(call, ENTER)
    if live:
        compute_tiles(a_ptr, b_ptr, scales, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                      o_ptr, c_ptr, stride_cm, stride_cn, flags_ptr, call, seq, tl.program_id(0),
                      BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, USE_TMA, B_KMAJOR, PUSH=False, RELEASE=True)
    P.exit(call, seq, live, exit_programs, ENTER, BARRIER=True)


@collective(OP)
def producer_consumer(a, b, *, config=None, group=None, out=None, scale_a=None, scale_b=None, out_dtype=None):
    """gemm_all_scatter, GEMM and scatter kernels on two streams; same contract as :func:`tilefuse.gemm_all_scatter`."""
    p = prepare("producer_consumer", a, b, config, group, out, (scale_a, scale_b, out_dtype), comm=True, flags=True)
    a, b, dest, c, entry = begin(p, a, b, out)
    if not p.empty:
        cfg, call = p.config, call_arg(p.heap, entry)
        total = cfg.GEMM_SMS + cfg.COMM_SMS  # the programs that end the call together (not capped by the tiles)
        streams = ForkedStreams(p.heap.device)
        _gemm_producer_kernel[(cfg.GEMM_SMS,)](
            a, b, p.scales(scale_a, scale_b), p.M, p.N, p.K, *a.stride(), *b.stride(), dest, c,
            *c.stride(), p.flags, call, total, NUM_PROGRAMS=cfg.GEMM_SMS,
            ENTER=entry is not None, **p.meta)
        with streams.side():
            scatter_kernel[(cfg.COMM_SMS,)](
                dest, c, p.flags, p.M, p.N, *c.stride(), call, total, BLOCK_M=cfg.BLOCK_M,
                BLOCK_N=cfg.BLOCK_N, GROUP_M=cfg.GROUP_M, NUM_PROGRAMS=cfg.COMM_SMS, ENTER=entry is not None,
                END=entry is not None, WAIT=True, num_warps=4)
        streams.join()
        launched(entry)
        if entry is None:
            mid_barrier(p.heap, 0)  # every peer's tiles have landed in c
    return finish(p, dest, c, out)
