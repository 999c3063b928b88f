"""gemm_all_reduce, workgroup-specialized: one kernel whose programs split into producers and reducers.

    programs 0 .. G-1      : | tile t: K loop | store to slot r of every rank, release flag (r, t) there | ...
    programs G .. G+C-1    : | tile t: acquire flags (0, t) ... (W-1, t), sum (+ bias) -> c | ...
    stream: | one kernel, which begins the call itself |

G = GEMM_SMS, C = COMM_SMS. No completion handshake: the reducers sum every partial. Reducers wait
only on producers (lower program ids); all G+C programs must be resident at once (checked).
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.config import sum_rows
from ..common.launch import call_arg, collective, launched
from ._prepare import OP, prepare
from ._tiles import produce_tiles, reduce_tiles


@kernel
def _wg_kernel(
    a_ptr, b_ptr, scales, M, N, K, stride_a, stride_b,  # scales: common.scaled
    # stage [W, M, N] (input dtype), flags [W, num_tiles] int64 (symmetric); c [M, N], bias [N] (local)
    stage_ptr, flags_ptr, stride_s, c_ptr, bias_ptr, stride_c,
    call,  # the call (this kernel begins it with ENTER)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    GEMM_PROGRAMS: tl.constexpr, COMM_PROGRAMS: tl.constexpr, SUB_M: tl.constexpr, USE_TMA: tl.constexpr,
    B_KMAJOR: tl.constexpr, HAS_BIAS: tl.constexpr, ENTER: tl.constexpr,
):
    """``ENTER``: program 0 begins the call while the other producers run their first K loop
    (``P.enter_aside``); the reducers wait for the begin before their first flag."""
    pid = tl.program_id(0)
    if ENTER:
        epoch = P.enter_aside(call)
        if pid < GEMM_PROGRAMS:
            live = produce_tiles(a_ptr, b_ptr, scales, M, N, K, stride_a, stride_b, stage_ptr, flags_ptr, stride_s,
                                 call, epoch, (pid + GEMM_PROGRAMS - 1) % GEMM_PROGRAMS, BLOCK_M, BLOCK_N, BLOCK_K,
                                 GROUP_M, GEMM_PROGRAMS, USE_TMA, B_KMAJOR, RELEASE=True, GATE=True)
        else:  # an aborted call's flags never come: the reducers learn the call's state first
            live = P.ready(call, epoch)
    else:  # the begin kernel began the call
        epoch, live = P.enter(call, False)
    if live:
        if pid < GEMM_PROGRAMS:
            if not ENTER:  # (with ENTER the producers are done); producers wait on nothing
                produce_tiles(a_ptr, b_ptr, scales, M, N, K, stride_a, stride_b, stage_ptr, flags_ptr, stride_s,
                              call, epoch, pid,
                              BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, GEMM_PROGRAMS, USE_TMA, B_KMAJOR, RELEASE=True)
        else:  # reducers wait only on producers: lower program ids here, or other ranks
            reduce_tiles(stage_ptr, flags_ptr, stride_s, c_ptr, bias_ptr, stride_c, M, N, call, epoch,
                         pid - GEMM_PROGRAMS, BLOCK_M, BLOCK_N, SUB_M, GROUP_M, COMM_PROGRAMS, PULL=False, WAIT=True,
                         HAS_BIAS=HAS_BIAS)
    P.exit(call, epoch, live, GEMM_PROGRAMS + COMM_PROGRAMS, ENTER)


@collective(OP)
def wg_specialized(a, b, *, config=None, group=None, bias=None, scale_a=None, scale_b=None, out_dtype=None):
    """gemm_all_reduce as one workgroup-specialized kernel; same contract as :func:`tilefuse.gemm_all_reduce`."""
    # The config's split, not capped by the tiles: one compiled kernel per config.
    p = prepare("wg_specialized", a, b, config, group, bias, (scale_a, scale_b, out_dtype), comm=True, flags=True,
                launch=lambda p: dict(GEMM_PROGRAMS=p.config.GEMM_SMS, COMM_PROGRAMS=p.config.COMM_SMS,
                                      SUB_M=sum_rows(p.config), HAS_BIAS=p.has_bias, ENTER=p.begins, **p.gemm_meta))
    a, b, c, entry = p.start(a, b)
    if p.empty:
        return c
    _wg_kernel[(p.launch["GEMM_PROGRAMS"] + p.launch["COMM_PROGRAMS"],)](
        a, b, p.scales(scale_a, scale_b), p.M, p.N, p.K, p.stride_a, p.stride_b, p.stage, p.flags,
        p.stride_s, c, c if bias is None else bias.contiguous(), c.stride(), call_arg(p.heap, entry), **p.launch)
    launched(entry)
    return c
