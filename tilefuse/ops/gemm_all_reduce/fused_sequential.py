"""gemm_all_reduce, fused sequential: each partial tile goes from registers into every rank's slot,
and the program that made it then sums the W partials of that tile.

    program p:  | tile t: K loop | store to slot r of ranks r+1, ..., r, release flag (r, t) there | tile t + P ... |
                | tile t: acquire flags (0, t) ... (W-1, t), sum slots 0 .. W-1 (+ bias) -> c | tile t + P ... |
    rank r:     | fused kernel: program 0 begins the call while the others run their first K loop |

Pushing a tile overlaps the K loops of the tiles other programs are computing. Every program sums
the tiles it computed, once their W partials have landed: the same tile of the same program id on
every rank, so a program waits only on programs of other ranks (and the interpreter, which runs a
rank's programs one after another, makes progress). The sum reads only this rank's heap, in fp32 in
the order 0, 1, ..., W-1 (the same bits on every rank). A partial travels in the input dtype: the
epilogue rounds the fp32 tile once. One kernel, no barrier and no separate reduction launch; where
every program has at most one tile, the sum follows each push and takes this rank's own partial from
registers (no own staging).
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.launch import collective, ctl
from ._setup import OP, setup
from ._tiles import produce_tiles, reduce_tiles


@kernel
def _fused_kernel(
    # GEMM operands (the order of GemmCall.gemm_args)
    a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    # stage [W, M, N] in the input dtype and flags [W, num_tiles] int64 (symmetric addresses); output
    # c [M, N] and bias [N], both local
    stage_ptr, flags_ptr, stride_slot, stride_sm, stride_sn, c_ptr, bias_ptr, stride_cm, stride_cn,
    # distributed; the call's begin (this kernel begins the call, ENTER)
    heap_bases, ctl_ptr, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1, status_ptr,
    # with SPLIT: K slices per tile and the split-K scratch (fp32 slots, int32 counts), else never read
    split_k, partial_ptr, count_ptr,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, SUB_M: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr,
    HAS_BIAS: tl.constexpr, SUM: tl.constexpr = True, ENTER: tl.constexpr = False, ASIDE: tl.constexpr = False,
    OWN_SUM: tl.constexpr = False, SPLIT: tl.constexpr = False, ALIGN: tl.constexpr = 1,
):
    """``SUM=False``: the GEMM and the partial stores only, no flags (``benchmarks.breakdown`` times the
    parts). ``ASIDE`` (with ``ENTER``): program 0 begins the call while the others run
    their first K loop (``call_enter_aside``); tile t goes to program ``(t + 1) % NUM_PROGRAMS``, so
    program 0 has none while the tiles do not fill the programs. ``OWN_SUM`` (one work item a
    program): each tile is summed right after it is pushed, this rank's partial taken from registers
    (``produce_tiles`` with ``SUM_HERE``). ``SPLIT`` (with ``OWN_SUM``): each
    tile's K steps are split into ``split_k`` slices, and the program that hands in a tile's last
    slice sums them, pushes the tile and sums it (``produce_tiles`` with ``SPLIT``)."""
    pid = tl.program_id(0)
    if ASIDE:
        epoch = P.call_enter_aside(ctl_ptr, heap_bases, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr,
                                   n_out1)
        first = (pid + NUM_PROGRAMS - 1) % NUM_PROGRAMS  # the same on every rank: the sum's waits pair up
        live = produce_tiles(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                             stage_ptr, flags_ptr, stride_slot, stride_sm, stride_sn,
                             heap_bases, cur_rank, world, epoch, first,
                             BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, USE_TMA, B_KMAJOR, RELEASE=True,
                             ctl_ptr=ctl_ptr, GATE=True, c_ptr=c_ptr, bias_ptr=bias_ptr, stride_cm=stride_cm,
                             stride_cn=stride_cn, HAS_BIAS=HAS_BIAS, SUM_HERE=OWN_SUM, split_k=split_k,
                             partial_ptr=partial_ptr, count_ptr=count_ptr, SPLIT=SPLIT, ALIGN=ALIGN)
        if not OWN_SUM:
            if live:
                reduce_tiles(stage_ptr, flags_ptr, c_ptr, bias_ptr, M, N,
                             stride_slot, stride_sm, stride_sn, stride_cm, stride_cn,
                             heap_bases, ctl_ptr, cur_rank, world, epoch, first,
                             BLOCK_M, BLOCK_N, SUB_M, GROUP_M, NUM_PROGRAMS, PULL=False, WAIT=True,
                             HAS_BIAS=HAS_BIAS)
    else:
        epoch, live = P.call_enter(ctl_ptr, heap_bases, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr,
                                   n_out1, ENTER)
        if live:
            produce_tiles(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                          stage_ptr, flags_ptr, stride_slot, stride_sm, stride_sn,
                          heap_bases, cur_rank, world, epoch, pid,
                          BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, USE_TMA, B_KMAJOR, RELEASE=SUM,
                          ctl_ptr=ctl_ptr, c_ptr=c_ptr, bias_ptr=bias_ptr, stride_cm=stride_cm,
                          stride_cn=stride_cn, HAS_BIAS=HAS_BIAS, SUM_HERE=SUM and OWN_SUM, split_k=split_k,
                          partial_ptr=partial_ptr, count_ptr=count_ptr, SPLIT=SPLIT, ALIGN=ALIGN)
            if SUM and not OWN_SUM:  # the tiles this program produced (the same ids on every rank)
                reduce_tiles(stage_ptr, flags_ptr, c_ptr, bias_ptr, M, N,
                             stride_slot, stride_sm, stride_sn, stride_cm, stride_cn,
                             heap_bases, ctl_ptr, cur_rank, world, epoch, pid,
                             BLOCK_M, BLOCK_N, SUB_M, GROUP_M, NUM_PROGRAMS, PULL=False, WAIT=True,
                             HAS_BIAS=HAS_BIAS)
    P.call_exit(ctl_ptr, heap_bases, cur_rank, world, epoch, live, status_ptr, NUM_PROGRAMS, ENTER)


@collective(OP)
def fused_sequential(a, b, *, config=None, group=None, bias=None):
    """gemm_all_reduce as one fused persistent kernel (its programs push their partial tiles, then sum
    them once every rank's have landed); same contract as :func:`tilefuse.gemm_all_reduce`."""
    call = setup("fused_sequential", a, b, config, group, bias, comm=False, flags=True, kernel_begins=True)
    if call.empty:
        return call.c
    heap, programs = call.heap, call.all_programs
    aside = call.begins
    _fused_kernel[(programs,)](
        *call.gemm.gemm_args, call.stage, call.flags, *call.stage_args,
        *call.out_args, heap.heap_bases, ctl(heap), heap.rank, heap.world_size, *call.enter_args, *call.split_args,
        NUM_PROGRAMS=programs, SUB_M=call.sub_m, HAS_BIAS=call.bias is not None,
        ENTER=call.begins, ASIDE=aside, OWN_SUM=call.own_sum(programs), **call.split_meta, **call.gemm.gemm_meta,
    )
    call.entered()
    return call.c
