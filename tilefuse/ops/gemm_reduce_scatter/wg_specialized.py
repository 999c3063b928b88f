"""gemm_reduce_scatter, workgroup-specialized: one kernel whose programs split into producers and reducers.

    programs 0 .. G-1      : | tile: K loop | store to owner's slot r, release owner's flag | tile | ...
    programs G .. G+C-1    : | from r-1: acquire | from r-2: acquire, add | ... | own: acquire, add -> c |
    stream: | one kernel, which begins the call itself |

G = GEMM_SMS, C = COMM_SMS. No completion handshake: the reducers sum every partial of this rank's
rows. All G+C programs must be resident at once (checked against the device).
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.launch import call_arg, collective, launched
from ._prepare import OP, prepare
from ._tiles import produce_partials, reduce_owned


@kernel
def _wg_kernel(
    a_ptr, b_ptr, scales, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,  # scales: common.scaled
    # stage [W, rows, N], flags [W, tiles_per_owner] int64 (symmetric); run [rows, N] fp32 (W >= 3), c (local)
    stage_ptr, flags_ptr, stride_slot, stride_sm, stride_sn, run_ptr, c_ptr, stride_cm, stride_cn,
    call,  # this kernel begins it with ENTER
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    GEMM_PROGRAMS: tl.constexpr, COMM_PROGRAMS: tl.constexpr, SUB_M: tl.constexpr, USE_TMA: tl.constexpr,
    B_KMAJOR: tl.constexpr, ENTER: tl.constexpr,
):
    seq, live = P.enter(call, ENTER)
    pid = tl.program_id(0)
    if live:
        if pid < GEMM_PROGRAMS:  # producers wait on nothing
            produce_partials(a_ptr, b_ptr, scales, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stage_ptr,
                             flags_ptr, stride_slot, stride_sm, stride_sn, call, seq, pid, BLOCK_M, BLOCK_N, BLOCK_K,
                             GROUP_M, GEMM_PROGRAMS, USE_TMA, B_KMAJOR, RELEASE=True)
        else:  # reducers wait only on producers: lower program ids here, or other ranks
            reduce_owned(stage_ptr, flags_ptr, run_ptr, c_ptr, M // P.world(call), N, stride_slot, stride_sm, stride_sn,
                         stride_cm, stride_cn, call, seq, pid - GEMM_PROGRAMS, BLOCK_M, BLOCK_N, SUB_M, GROUP_M,
                         COMM_PROGRAMS, PULL=False, WAIT=True)
    P.exit(call, seq, live, GEMM_PROGRAMS + COMM_PROGRAMS, ENTER)


@collective(OP)
def wg_specialized(a, b, *, config=None, group=None, scale_a=None, scale_b=None, out_dtype=None):
    """gemm_reduce_scatter as one workgroup-specialized kernel; contract: :func:`tilefuse.gemm_reduce_scatter`."""
    p = prepare("wg_specialized", a, b, config, group, (scale_a, scale_b, out_dtype), comm=True, flags=True)
    a, b, c, entry = p.start(a, b)
    if p.empty:
        return c
    cfg = p.config
    _wg_kernel[(cfg.GEMM_SMS + cfg.COMM_SMS,)](  # not capped by the tiles: one kernel per config
        a, b, p.scales(scale_a, scale_b), *p.dims, p.stage, p.flags, *p.stage_strides, p.run, c,
        *c.stride(), call_arg(p.heap, entry),
        GEMM_PROGRAMS=cfg.GEMM_SMS, COMM_PROGRAMS=cfg.COMM_SMS, SUB_M=p.sub_m, ENTER=entry is not None,
        **p.meta,
    )
    launched(entry)
    return c
