"""gemm_reduce_scatter, fused sequential: each partial tile goes from registers to its owner's slot.

    program p:  | tile (owner r+1): K loop | store to owner's slot r | tile: K loop | store | ...
    rank r:     | fused kernel: begin ... barrier | reduce: sum the W slots of r's tiles -> c |

Pushing a tile overlaps the K loops of the tiles other programs are computing. The partials need no
flags: the barrier after the kernel orders every rank's stores before the owner's local reduction,
which sums slots r-1, r-2, ..., r in fp32 (the same bits on every run). A partial travels in the
input dtype: the epilogue rounds the fp32 tile when it stores it.
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.launch import call_arg, collective, launched, mid_barrier
from ..common.scaled import kernel_scales
from ._prepare import OP, prepare
from ._tiles import launch_reduce, produce_partials


@kernel
def _fused_kernel(
    a_ptr, b_ptr, scales, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,  # scales: common.scaled
    stage_ptr, stride_slot, stride_sm, stride_sn,  # stage [W, rows, N] in the input dtype (a symmetric address)
    call,  # this kernel begins it with ENTER
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, WARP_SPEC: tl.constexpr,
    ENTER: tl.constexpr,
):
    seq, live = P.enter(call, ENTER)
    if live:
        produce_partials(a_ptr, b_ptr, scales, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                         stage_ptr, stage_ptr, stride_slot, stride_sm, stride_sn,
                         call, 0, tl.program_id(0),
                         BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, USE_TMA, B_KMAJOR, RELEASE=False,
                         WARP_SPEC=WARP_SPEC)
    # With ENTER: ctl[SEQ] moves here, so the reduction reads the call's number, after the barrier
    # behind which every rank's partials have landed in their owners' slots.
    P.exit(call, seq, live, NUM_PROGRAMS, ENTER, BARRIER=True)


@collective(OP)
def fused_sequential(a, b, *, config=None, group=None, scale_a=None, scale_b=None, out_dtype=None):
    """gemm_reduce_scatter as one fused persistent kernel and a local reduction; same contract as
    :func:`tilefuse.gemm_reduce_scatter`."""
    p = prepare("fused_sequential", a, b, config, group, (scale_a, scale_b, out_dtype))
    a, b, c, entry = p.start(a, b)
    if p.empty:
        return c
    call = call_arg(p.heap, entry)
    cfg = p.config
    programs = cfg.GEMM_SMS + cfg.COMM_SMS  # not capped by the tiles: one kernel per config
    _fused_kernel[(programs,)](
        a, b, kernel_scales(scale_a, scale_b, a.device), *p.dims, p.stage, *p.stage_strides, call,
        NUM_PROGRAMS=programs, ENTER=entry is not None, WARP_SPEC=p.warp_spec, **p.meta,
    )
    launched(entry, ends=False)
    if entry is None:
        mid_barrier(p.heap, 0)  # every rank's partials have landed in our slots
    launch_reduce(p, call, c, programs, pull=False, wait=False, end=entry is not None)  # ordered by the barrier
    launched(entry)  # the reduction ends the call
    return c
