"""gemm_all_scatter, fused sequential: one persistent kernel computes a tile and pushes it at once.

    program p: | tile p: K loop | store local + put to peers | tile p+P: K loop | store + put | ...
    stream:    | fused kernel: begins the call, ends with a barrier (all peers' tiles landed) |

No flag: the tile goes from registers to every peer's c. Program 0 begins the call while the others
run their first K loop (``P.enter_aside``), and the last program passes the closing barrier; a
warp-specialized loop has begin and barrier kernels instead.
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.launch import call_arg, collective, launched, mid_barrier
from ._prepare import OP, begin, finish, prepare
from ._tiles import compute_tiles


@kernel
def _fused_kernel(
    a_ptr, b_ptr, scales, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,  # scales: common.scaled
    o_ptr, c_ptr, stride_cm, stride_cn,  # the result, c (a symmetric address): [M, W*N] strided alike
    call,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, WARP_SPEC: tl.constexpr,
    ENTER: tl.constexpr,
):
    """``ENTER`` (never with ``WARP_SPEC``): program 0 begins the call, so tile t is program (t + 1)'s."""
    if ENTER:
        seq = P.enter_aside(call)
        first = (tl.program_id(0) + NUM_PROGRAMS - 1) % NUM_PROGRAMS
        live = True  # the tiles' stores wait for the begin (GATE)
    else:
        seq, live = P.enter(call, ENTER=False)
        first = tl.program_id(0)
    if live:
        compute_tiles(a_ptr, b_ptr, scales, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                      o_ptr, c_ptr, stride_cm, stride_cn, c_ptr,  # no flags
                      call, seq, first, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, USE_TMA, B_KMAJOR,
                      PUSH=True, RELEASE=False, WARP_SPEC=WARP_SPEC, GATE=ENTER)
    if ENTER:
        # The closing barrier needs the call's state on every program (one without a tile has not waited).
        live = P.ready(call, seq)
    P.exit(call, seq, live, NUM_PROGRAMS, ENTER, BARRIER=True)


@collective(OP)
def fused_sequential(a, b, *, config=None, group=None, out=None, scale_a=None, scale_b=None, out_dtype=None):
    """gemm_all_scatter as one fused persistent kernel; same contract as :func:`tilefuse.gemm_all_scatter`."""
    p = prepare("fused_sequential", a, b, config, group, out, (scale_a, scale_b, out_dtype), comm=False)
    a, b, dest, c, entry = begin(p, a, b, out)
    if not p.empty:
        programs = p.config.GEMM_SMS + p.config.COMM_SMS  # not capped by the tiles: one kernel per config
        _fused_kernel[(programs,)](
            a, b, p.scales(scale_a, scale_b), p.M, p.N, p.K, *a.stride(), *b.stride(), dest, c,
            *c.stride(), call_arg(p.heap, entry), NUM_PROGRAMS=programs,
            ENTER=entry is not None, **p.meta)
        launched(entry)
        if entry is None:
            mid_barrier(p.heap, 0)  # every peer's tiles have landed in c
    return finish(p, dest, c, out)
