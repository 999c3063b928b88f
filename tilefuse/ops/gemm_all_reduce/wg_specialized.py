"""gemm_all_reduce, workgroup-specialized: one kernel whose programs split into producers and reducers.

    programs 0 .. G-1      : | tile t: K loop | store to slot r of every rank, release flag (r, t) there | ...
    programs G .. G+C-1    : | tile t: acquire flags (0, t) ... (W-1, t), sum (+ bias) -> c | ...
    stream: | one kernel, which begins the call itself |

G = GEMM_SMS, C = COMM_SMS. The reducers finish only when every source's partial of every tile has
been summed, so the kernel's end is the op's end: no completion handshake. All G+C programs must be
resident at once (checked against the device): the reducers spin. Reducers wait only on producers,
which have lower program ids (or run on other ranks), as the interpreter requires.
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.launch import collective
from ._setup import OP, setup
from ._tiles import produce_tiles, reduce_tiles


@kernel
def _wg_kernel(
    # GEMM operands (the order of GemmCall.gemm_args)
    a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    # stage [W, M, N] (input dtype), flags [W, num_tiles] int64 (symmetric); output c [M, N] and
    # bias [N], both local
    stage_ptr, flags_ptr, stride_slot, stride_sm, stride_sn, c_ptr, bias_ptr, stride_cm, stride_cn,
    # distributed; the call's begin (this kernel begins the call)
    heap_bases, ctl_ptr, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1, status_ptr,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    GEMM_PROGRAMS: tl.constexpr, COMM_PROGRAMS: tl.constexpr, SUB_M: tl.constexpr, USE_TMA: tl.constexpr,
    B_KMAJOR: tl.constexpr, HAS_BIAS: tl.constexpr, ENTER: tl.constexpr, ASIDE: tl.constexpr = False,
):
    """``ASIDE`` (with ``ENTER``): program 0 begins the call while the other producers run
    their first K loop (``call_enter_aside``; tile t goes to producer ``(t + 1) % GEMM_PROGRAMS``, so
    program 0 has none while the tiles do not fill the producers); the reducers wait for the begin
    before their first flag."""
    pid = tl.program_id(0)
    if ASIDE:
        epoch = P.call_enter_aside(ctl_ptr, heap_bases, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr,
                                   n_out1)
        if pid < GEMM_PROGRAMS:
            live = produce_tiles(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                 stage_ptr, flags_ptr, stride_slot, stride_sm, stride_sn,
                                 heap_bases, cur_rank, world, epoch, (pid + GEMM_PROGRAMS - 1) % GEMM_PROGRAMS,
                                 BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, GEMM_PROGRAMS, USE_TMA, B_KMAJOR, RELEASE=True,
                                 ctl_ptr=ctl_ptr, GATE=True)
        else:  # an aborted call's flags never come: the reducers learn the call's state first
            live = P.call_ready(ctl_ptr, heap_bases, cur_rank, world, epoch)
    else:
        epoch, live = P.call_enter(ctl_ptr, heap_bases, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr,
                                   n_out1, ENTER)
    if live:
        if pid < GEMM_PROGRAMS:
            if not ASIDE:  # (aside, the producers are done)
                # Producers wait on nothing.
                produce_tiles(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                              stage_ptr, flags_ptr, stride_slot, stride_sm, stride_sn,
                              heap_bases, cur_rank, world, epoch, pid,
                              BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, GEMM_PROGRAMS, USE_TMA, B_KMAJOR, RELEASE=True)
        else:
            # Reducers wait only on producers: lower program ids here, or other ranks.
            reduce_tiles(stage_ptr, flags_ptr, c_ptr, bias_ptr, M, N,
                         stride_slot, stride_sm, stride_sn, stride_cm, stride_cn,
                         heap_bases, ctl_ptr, cur_rank, world, epoch, pid - GEMM_PROGRAMS,
                         BLOCK_M, BLOCK_N, SUB_M, GROUP_M, COMM_PROGRAMS, PULL=False, WAIT=True, HAS_BIAS=HAS_BIAS)
    P.call_exit(ctl_ptr, heap_bases, cur_rank, world, epoch, live, status_ptr, GEMM_PROGRAMS + COMM_PROGRAMS, ENTER)


@collective(OP)
def wg_specialized(a, b, *, config=None, group=None, bias=None):
    """gemm_all_reduce as one workgroup-specialized kernel; same contract as
    :func:`tilefuse.gemm_all_reduce`."""
    call = setup("wg_specialized", a, b, config, group, bias, comm=True, flags=True, kernel_begins=True)
    if call.empty:
        return call.c
    gemm_programs, comm_programs = call.program_counts
    _wg_kernel[(gemm_programs + comm_programs,)](
        *call.gemm.gemm_args, call.stage, call.flags, *call.stage_args, *call.out_args,
        *call.dist_args, *call.enter_args,
        GEMM_PROGRAMS=gemm_programs, COMM_PROGRAMS=comm_programs, SUB_M=call.sub_m, HAS_BIAS=call.bias is not None,
        ENTER=call.begins, ASIDE=call.begins, **call.gemm.gemm_meta,
    )
    call.entered()
    return call.c
