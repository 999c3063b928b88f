"""all_gather_gemm, workgroup-specialized: one kernel whose programs split into pushers and GEMM programs.

    programs 0 .. C-1     : | push chunk -> rank r-1, release its flag there | chunk -> r-2 | ... |
                            | local shard tiles left (from a), taken one by one |
    programs C .. C+G-1   : | local shard tiles (from a): a dealt share, then taken one by one |
                            | source r+1: acquire chunk flag, K loop | ...
    stream: | one kernel, which begins the call itself |

C = COMM_SMS, G = GEMM_SMS, with producer_consumer's flags. All C + G programs share the local shard's
tiles (``common.tiles.claimed_tiles``; only this dealt loop is flattened: two flattened 128x256 loops can
exceed the H200's shared memory). No completion handshake: the GEMM programs acquire every chunk. The
pushers have the LOWER program ids (the interpreter runs programs in pid order), and all must be resident.
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.launch import begin_call, call_arg, collective, launched, new_output
from ..common.tiles import claimed_tiles, gemm_operands
from ._prepare import OP, prepare
from ._tiles import gemm_gathered, push_shard, shard_scales
from .bulk_sync import bulk_sync


@kernel
def _wg_kernel(
    a_ptr, stride_am, stride_ak,  # this rank's shard [M_loc, K] (any local tensor)
    # a_gathered [W*M_loc, K] (a symmetric address); a float8 call's scales (_tiles), else stand-ins
    ag_ptr, stride_gm, stride_gk, scales,
    b_ptr, stride_bk, stride_bn,
    c_ptr, stride_cm, stride_cn,
    # int64 flags [W, num_chunks] (a symmetric address); int32 [1] count of local tiles taken (LOCAL_DIRECT)
    flags_ptr, claims_ptr,
    M_loc, N, K,
    call,  # the call protocol: this kernel begins and ends the call
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    COMM_PROGRAMS: tl.constexpr, GEMM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr,
    B_KMAJOR: tl.constexpr, LOCAL_DIRECT: tl.constexpr, FIRST: tl.constexpr, FLATTEN: tl.constexpr,
):
    seq, live = P.enter(call, True)
    pid = tl.program_id(0)
    if live:
        rows = tl.cast(P.rank(call), tl.int64) * M_loc  # this rank's row block of a_gathered and of c
        if pid < COMM_PROGRAMS:
            push_shard(a_ptr, stride_am, stride_ak, ag_ptr + rows * stride_gm, stride_gm, stride_gk,
                       flags_ptr + P.rank(call) * tl.cdiv(M_loc, BLOCK_M), seq, shard_scales(scales, rows), M_loc, K,
                       call, pid, COMM_PROGRAMS, BLOCK_M, BLOCK_K, FIRST, SIGNAL=True)
        if LOCAL_DIRECT:
            # A GEMM program's dealt share (pid among the GEMM programs; < 0 for a pusher), then the rest.
            a_op, b_op = gemm_operands(a_ptr, b_ptr, M_loc, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                       BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR)
            claimed_tiles(a_op, b_op, scales, c_ptr + rows * stride_cm, M_loc, N, K, stride_am, stride_ak, stride_bk,
                          stride_bn, stride_cm, stride_cn, claims_ptr, COMM_PROGRAMS + GEMM_PROGRAMS,
                          pid - COMM_PROGRAMS, GEMM_PROGRAMS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA, B_KMAJOR,
                          FLATTEN)
        if pid >= COMM_PROGRAMS:
            gemm_gathered(a_ptr, stride_am, stride_ak, ag_ptr, stride_gm, stride_gk, scales, (b_ptr, stride_bk,
                          stride_bn), c_ptr, stride_cm, stride_cn, flags_ptr, M_loc, N, K, call, seq,
                          pid - COMM_PROGRAMS, GEMM_PROGRAMS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA,
                          B_KMAJOR, LOCAL_DIRECT, FLATTEN, WITH_LOCAL=not LOCAL_DIRECT)
    P.exit(call, seq, live, COMM_PROGRAMS + GEMM_PROGRAMS, END=True)


@collective(OP)
def wg_specialized(a, b, *, config=None, group=None, return_gathered=False, scale_a=None, scale_b=None,
                   out_dtype=None):
    """all_gather_gemm as one workgroup-specialized kernel; same contract as :func:`tilefuse.all_gather_gemm`."""
    scaling = (scale_a, scale_b, out_dtype)
    heap, p = prepare("wg_specialized", a, b, config, group, return_gathered, scaling, buffers="flagged", comm=True)
    if p.empty:
        return bulk_sync(a, b, config=config, group=group, return_gathered=return_gathered, scale_a=scale_a,
                         scale_b=scale_b, out_dtype=out_dtype)
    cfg = p.config
    c = new_output((heap.world_size * p.M, p.N), p.out_dtype, a.device)
    entry = begin_call(p.sig, c, kernel_begins=True)
    _wg_kernel[(p.programs,)](
        a, *a.stride(), p.ag, *p.ag.stride(), p.scales(scale_a, scale_b), b, *b.stride(), c, *c.stride(), p.flags,
        p.claims, p.M, p.N, p.K, call_arg(heap, entry),
        COMM_PROGRAMS=cfg.COMM_SMS, GEMM_PROGRAMS=cfg.GEMM_SMS, LOCAL_DIRECT=p.local_direct, FIRST=p.first, **p.meta)
    launched(entry)
    return (c, p.ag.clone()) if return_gathered else c
