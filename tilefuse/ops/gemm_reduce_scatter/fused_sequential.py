"""gemm_reduce_scatter, fused sequential: each partial tile goes from registers to its owner's slot.

    program p:  | tile (owner r+1): K loop | store to owner's slot r | tile: K loop | store | ...
    rank r:     | fused kernel: begin ... barrier | reduce: sum the W slots of r's tiles -> c |

Pushing a tile overlaps the K loops of the tiles other programs are computing. The partials need no
flags: the barrier after the kernel orders every rank's stores before the owner's local reduction,
which sums slots r-1, r-2, ..., r in fp32 (the same bits on every run). A partial travels in the
input dtype: the epilogue rounds the fp32 tile when it stores it.

The epilogue-sum form (``Config.EPILOGUE_SUM = 1``; :func:`fused_sequential_epilogue` on the
default config) sums in the kernel instead::

    program p:  | peers' tiles: K loop | push to owner's slot r, release | ... | own tile j: K loop |
                | acquire (r-1, j), ..., (r+1, j) | s_0 + ... + own -> c | ...
    rank r:     | fused kernel: begin ... |

Rank r computes its own tiles last, about (W-1)/W of the kernel after its peers pushed their
partials of them, and adds those partials in the epilogue of each own tile: the own partial never
goes through the stage, and neither the reduction kernel (a read of W slots, a write of c) nor the
barrier before it runs: one launch, whose first program to run begins the call. Same bits as the
staged form. Per (source, tile) flags on the owner, as producer_consumer's; so its tile loops are
not warp-specialized. At world 1 the call is the GEMM and the store of c.
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.launch import collective, ctl, mid_barrier
from ._setup import OP, finish, setup
from ._tiles import launch_reduce, produce_and_sum, produce_partials


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
    """gemm_reduce_scatter as one fused persistent kernel and a local reduction, or with
    ``config.EPILOGUE_SUM`` one kernel that sums in the epilogue of the own tiles (the module
    docstring); same contract as :func:`tilefuse.gemm_reduce_scatter`."""
    return _fused_sequential(a, b, config, group, epilogue_sum=False)


@collective(OP)
def fused_sequential_epilogue(a, b, *, config=None, group=None):
    """:func:`fused_sequential` in its epilogue-sum form on any config (without one: the default
    tiles with ``EPILOGUE_SUM = 1``)."""
    return _fused_sequential(a, b, config, group, epilogue_sum=True)


def _fused_sequential(a, b, config, group, *, epilogue_sum: bool):
    call = setup("fused_sequential", a, b, config, group, comm=False, flags=False, kernel_begins=True,
                 epilogue_sum=epilogue_sum)
    if call.empty:
        return call.c
    cfg, heap = call.config, call.heap
    programs = cfg.GEMM_SMS + cfg.COMM_SMS  # not capped by the tiles: one kernel per config
    if cfg.EPILOGUE_SUM:
        # Its programs wait on other ranks' programs: all of them must be resident at once (at most
        # one per multiprocessor, checked against the device), as with the flagged variants.
        _fused_sum_kernel[(programs,)](
            *call.gemm.gemm_args, call.stage, call.flags, *call.stage_args, call.c, call.c.stride(0),
            call.c.stride(1), heap.heap_bases, ctl(heap), heap.rank, heap.world_size, *call.enter_args,
            NUM_PROGRAMS=programs, SUB_M=call.sub_m, ENTER=call.begins, **call.gemm.gemm_meta,
        )
        call.entered()
        return finish(call)
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


@kernel
def _fused_sum_kernel(
    # GEMM operands (the order of GemmCall.gemm_args)
    a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    # stage [W, rows, N] (input dtype) and flags [W, tiles_per_owner] int64 (symmetric addresses);
    # output c [rows, N] (local)
    stage_ptr, flags_ptr, stride_slot, stride_sm, stride_sn, c_ptr, stride_cm, stride_cn,
    # distributed; the call's begin (this kernel begins the call, ENTER)
    heap_bases, ctl_ptr, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1, status_ptr,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, SUB_M: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr,
    ENTER: tl.constexpr,
):
    epoch, live = P.call_enter(ctl_ptr, heap_bases, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1,
                               ENTER)
    if live:
        produce_and_sum(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                        stage_ptr, flags_ptr, stride_slot, stride_sm, stride_sn, c_ptr, stride_cm, stride_cn,
                        heap_bases, ctl_ptr, cur_rank, world, epoch, tl.program_id(0),
                        BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, SUB_M, USE_TMA, B_KMAJOR)
    P.call_exit(ctl_ptr, heap_bases, cur_rank, world, epoch, live, status_ptr, NUM_PROGRAMS, ENTER)
