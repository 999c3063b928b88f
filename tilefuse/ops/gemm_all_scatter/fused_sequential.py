"""gemm_all_scatter, fused sequential: one persistent kernel computes a tile and pushes it at once.

    program p: | tile p: K loop | store local + put to peers | tile p+P: K loop | store + put | ...
    stream:    | fused kernel: begins the call, ends with a barrier (all peers' tiles landed) |

Communication of tile i overlaps the K loops of the tiles other programs are computing; there is no
flag: the tile goes from registers straight to every peer's c. One launch: the kernel's program 0
begins the call while the others run their first K loop, waiting for the begin only before their
first store (``call_enter_aside``; with a warp-specialized tile loop the first program to run begins
it and the others wait first, ``call_enter``), and its last program passes the closing barrier with
the other ranks (``call_exit`` with ``BARRIER``): no begin or barrier kernel around it.
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.launch import collective, ctl, mid_barrier
from ._setup import OP, setup
from ._tiles import compute_tiles


@kernel
def _fused_kernel(
    # GEMM operands (the order of GemmCall.gemm_args)
    a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    # output: this rank's column block of the result, of c (a symmetric address), strided alike
    o_ptr, c_ptr, stride_cm, stride_cn,
    # distributed; the call's begin (this kernel begins the call, ENTER)
    heap_bases, ctl_ptr, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1, status_ptr,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, WARP_SPEC: tl.constexpr,
    ENTER: tl.constexpr, ASIDE: tl.constexpr = False,
):
    """``ASIDE`` (with ``ENTER``, without ``WARP_SPEC``): program 0 begins the call while the others
    run their first K loop (``call_enter_aside``); tile t goes to program ``(t + 1) % NUM_PROGRAMS``,
    so program 0 has none while the tiles do not fill the programs."""
    if ASIDE:
        epoch = P.call_enter_aside(ctl_ptr, heap_bases, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr,
                                   n_out1)
        compute_tiles(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                      o_ptr, c_ptr, stride_cm, stride_cn, c_ptr,  # no flags
                      heap_bases, cur_rank, world, epoch, (tl.program_id(0) + NUM_PROGRAMS - 1) % NUM_PROGRAMS,
                      BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, USE_TMA, B_KMAJOR, PUSH=True,
                      RELEASE=False, ctl_ptr=ctl_ptr, GATE=True)
        # The closing barrier needs the call's state on every program, also one without a tile (it
        # has not waited for the begin): ranks pass it only for a call that runs.
        live = P.call_ready(ctl_ptr, heap_bases, cur_rank, world, epoch)
    else:
        epoch, live = P.call_enter(ctl_ptr, heap_bases, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr,
                                   n_out1, ENTER)
        if live:
            compute_tiles(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                          o_ptr, c_ptr, stride_cm, stride_cn, c_ptr,  # no flags
                          heap_bases, cur_rank, world, 0, tl.program_id(0),
                          BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, USE_TMA, B_KMAJOR, PUSH=True,
                          RELEASE=False, WARP_SPEC=WARP_SPEC)
    # With ENTER the closing barrier (every peer's tiles have landed in c) is the last program's.
    P.call_exit(ctl_ptr, heap_bases, cur_rank, world, epoch, live, status_ptr, NUM_PROGRAMS, ENTER, BARRIER=True)


@collective(OP)
def fused_sequential(a, b, *, config=None, group=None, out=None):
    """gemm_all_scatter as one fused persistent kernel; same contract as :func:`tilefuse.gemm_all_scatter`."""
    call = setup("fused_sequential", a, b, config, group, out, comm=False, kernel_begins=True)
    if call.empty:
        return call.result()
    g, cfg = call.gemm, call.gemm.config
    heap = g.heap
    programs = cfg.GEMM_SMS + cfg.COMM_SMS  # not capped by the tiles: one kernel per config
    _fused_kernel[(programs,)](
        *g.gemm_args, call.own, call.c_block, call.c_block.stride(0), call.c_block.stride(1),
        heap.heap_bases, ctl(heap), heap.rank, heap.world_size, *call.enter_args,
        NUM_PROGRAMS=programs, ENTER=call.begins, ASIDE=call.begins and not g.warp_spec,
        **g.gemm_meta_ws,
    )
    call.entered()
    if not call.begins:
        mid_barrier(heap, 0)  # every peer's tiles have landed in c
    return call.result()
