"""gemm_all_reduce, fused sequential: each partial tile goes from registers into every rank's slot.

    program p:  | tile: K loop | store to slot r of ranks r+1, r+2, ..., r | tile: K loop | store | ...
    rank r:     | begin | fused kernel | barrier | reduce: sum slots 0, 1, ..., W-1 (+ bias) -> c |

Pushing a tile overlaps the K loops of the tiles other programs are computing. The partials need no
flags: the barrier after the kernel orders every rank's stores before the local reduction, which
reads only this rank's heap and sums the W slots in fp32 in the order 0, 1, ..., W-1 (the same bits
on every rank). A partial travels in the input dtype: the epilogue rounds the fp32 tile once.

Two-shot: each tile goes to its owner only; barrier; each owner sums its rows (into its c and its
own slot); barrier; every rank pulls the other owners' sums.
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.launch import collective, ctl, mid_barrier
from ._setup import OP, setup
from ._tiles import launch_reduce, produce_tiles
from ._two_shot import launch_barriered, produce_owned


@kernel
def _fused_kernel(
    # GEMM operands (the order of GemmCall.gemm_args)
    a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    # stage [W, M, N] in the input dtype (a symmetric address)
    stage_ptr, stride_slot, stride_sm, stride_sn,
    # distributed
    heap_bases, ctl_ptr, cur_rank, world,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, TWO_SHOT: tl.constexpr,
):
    _, live = P.call_epoch(ctl_ptr)
    if live:
        if TWO_SHOT:
            produce_owned(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                          stage_ptr, stage_ptr, stride_slot, stride_sm, stride_sn,
                          heap_bases, cur_rank, world, 0, tl.program_id(0),
                          BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, USE_TMA, B_KMAJOR, RELEASE=False)
        else:
            produce_tiles(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                          stage_ptr, stage_ptr, stride_slot, stride_sm, stride_sn,
                          heap_bases, cur_rank, world, 0, tl.program_id(0),
                          BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, USE_TMA, B_KMAJOR, RELEASE=False)


@collective(OP)
def fused_sequential(a, b, *, config=None, group=None, bias=None, two_shot=False):
    """gemm_all_reduce as one fused persistent kernel and a local reduction; same contract as
    :func:`tilefuse.gemm_all_reduce`."""
    call = setup("fused_sequential", a, b, config, group, bias, two_shot, comm=False, flags=False)
    if call.empty:
        return call.c
    heap, programs = call.heap, call.all_programs
    _fused_kernel[(programs,)](
        *call.gemm.gemm_args, call.stage, *call.stage_args,
        heap.heap_bases, ctl(heap), heap.rank, heap.world_size,
        NUM_PROGRAMS=programs, TWO_SHOT=call.two_shot, **call.gemm.gemm_meta,
    )
    if call.two_shot:  # barrier, owners sum their rows, barrier, everyone pulls the sums
        launch_barriered(call, programs, pull=False)
        return call.c
    mid_barrier(heap, 0)  # every rank's partials have landed in our slots
    launch_reduce(call, programs, pull=False, wait=False)
    return call.c
