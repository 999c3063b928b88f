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
from ..common.launch import collective, ctl, mid_barrier
from ._setup import OP, finish, setup
from ._tiles import launch_reduce, produce_partials


@kernel
def _fused_kernel(
    # GEMM operands (the order of GemmCall.gemm_args)
    a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    # stage [W, rows, N] in the input dtype (a symmetric address)
    stage_ptr, stride_slot, stride_sm, stride_sn,
    # distributed; the call's begin (this kernel begins the call, ENTER)
    heap_bases, ctl_ptr, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1, status_ptr,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, WARP_SPEC: tl.constexpr,
    ENTER: tl.constexpr,
):
    epoch, live = P.call_enter(ctl_ptr, heap_bases, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1,
                               ENTER)
    if live:
        produce_partials(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                         stage_ptr, stage_ptr, stride_slot, stride_sm, stride_sn,
                         heap_bases, cur_rank, world, 0, tl.program_id(0),
                         BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, USE_TMA, B_KMAJOR, RELEASE=False,
                         WARP_SPEC=WARP_SPEC)
    # With ENTER: ctl[SEQ] moves here, so the reduction reads the call's number, after the barrier
    # behind which every rank's partials have landed in their owners' slots.
    P.call_exit(ctl_ptr, heap_bases, cur_rank, world, epoch, live, status_ptr, NUM_PROGRAMS, ENTER, BARRIER=True)


@collective(OP)
def fused_sequential(a, b, *, config=None, group=None):
    """gemm_reduce_scatter as one fused persistent kernel and a local reduction (the module
    docstring); same contract as :func:`tilefuse.gemm_reduce_scatter`."""
    call = setup("fused_sequential", a, b, config, group, comm=False, flags=False, kernel_begins=True)
    if call.empty:
        return call.c
    cfg, heap = call.config, call.heap
    programs = cfg.GEMM_SMS + cfg.COMM_SMS  # not capped by the tiles: one kernel per config
    _fused_kernel[(programs,)](
        *call.gemm.gemm_args, call.stage, *call.stage_args,
        heap.heap_bases, ctl(heap), heap.rank, heap.world_size, *call.enter_args,
        NUM_PROGRAMS=programs, ENTER=call.begins, **call.gemm.gemm_meta_ws,
    )
    call.entered(ends=False)
    if not call.begins:
        mid_barrier(heap, 0)  # every rank's partials have landed in our slots
    launch_reduce(call, programs, pull=False, wait=False, end=call.begins)  # the barrier ordered the partials
    call.entered()  # the reduction ends the call
    return finish(call)
