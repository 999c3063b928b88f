"""all_gather_gemm, workgroup-specialized: one kernel whose programs split into pushers and GEMM programs.

    programs 0 .. C-1     : | push chunk -> rank r-1, release its flag there | chunk -> r-2 | ... |
                            | local shard tiles left (from a), taken one by one |
    programs C .. C+G-1   : | local shard tiles (from a): a dealt share, then taken one by one |
                            | source r+1: acquire chunk flag, K loop | ...
    stream: | one kernel, which begins the call itself |

C = COMM_SMS, G = GEMM_SMS. The pushers copy this rank's shard, BLOCK_M rows at a time, into row
block r of every rank's ``a_gathered`` and release the per-(source, chunk) flag on the receiver
(epoch-valued); the GEMM programs walk the sources in ring order r, r+1, ... and acquire a chunk's
flag before a tile's K loop. The local shard's tiles, read from ``a`` where it fits the GEMM's
operand path, wait for nothing, and all C + G programs share them (``_tiles.claim_local_tiles``):
each GEMM program first computes an even share of them (``tiles // (C + G)``) dealt out beforehand,
on the GEMM core's flattened loop where the core's would be; then every program takes the rest one
at a time from a counter, the GEMM programs once their share is done, the pushers once their pushes
are. So the pushers' SMs join the GEMM when the shard is out and take only tiles nobody has started
(at world 1, where nothing is pushed, the GEMM has every program; where the pushes take long, the
GEMM programs have taken every local tile by then). The peers' tiles go to the G GEMM programs,
dealt out as the local ones are. (Where ``a`` is pushed to this rank as well and its tiles wait on flags, only
the GEMM programs compute.) Only the dealt share's loop is flattened: two flattened 128x256 loops
in one kernel can each get shared memory of their own (Triton 3.6 gave two 295 KB, over the H200's
227 KB; this kernel compiles to 180 KB with Triton 3.7, 152 KB with 3.6). No completion handshake
is needed: a rank's kernel ends only after its GEMM programs acquired every chunk of every source,
and its own pushes are done when it ends.

Why the pushers have the LOWER program ids: Triton's interpreter runs the programs of a launch one
after another in pid order, and a GEMM program waits on flags released by *other ranks'* pushers.
With GEMM programs first, every rank would sit in its first GEMM program waiting for a peer whose
pushers only run after that peer's own GEMM programs: all ranks deadlock. With pushers first, each
rank finishes all its pushes before any of its GEMM programs waits. On a GPU the order does not
matter, since all C + G programs are resident at once (checked against the device).
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.gather import push_shard
from ..common.launch import collective, ctl
from ._setup import OP, finish, gemm_meta, is_degenerate, plan_push, setup
from ._tiles import claim_local_tiles, gemm_gathered
from .bulk_sync import bulk_sync


@kernel
def _wg_kernel(
    # this rank's shard [M_loc, K] (any local tensor)
    a_ptr, stride_am, stride_ak,
    # a_gathered [W*M_loc, K] and this rank's row block of it (symmetric addresses)
    ag_ptr, stride_gm, stride_gk, own_ptr,
    b_ptr, stride_bk, stride_bn,
    c_ptr, stride_cm, stride_cn,
    # int64 flags [W, num_chunks] and this rank's row of them (symmetric addresses); int32 [1] count
    # of local tiles taken (LOCAL_DIRECT)
    flags_ptr, own_flags_ptr, claims_ptr,
    M_loc, N, K,
    # distributed; the call's begin (this kernel begins the call)
    heap_bases, ctl_ptr, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1, status_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    COMM_PROGRAMS: tl.constexpr, GEMM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr,
    B_KMAJOR: tl.constexpr, LOCAL_DIRECT: tl.constexpr, FIRST: tl.constexpr, ENTER: tl.constexpr,
    FLATTEN: tl.constexpr,
):
    epoch, live = P.call_enter(ctl_ptr, heap_bases, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1,
                               ENTER)
    pid = tl.program_id(0)
    if live:
        if pid < COMM_PROGRAMS:
            push_shard(a_ptr, stride_am, stride_ak, own_ptr, stride_gm, stride_gk, own_flags_ptr, epoch,
                       M_loc, K, cur_rank, world, heap_bases, pid, COMM_PROGRAMS, BLOCK_M, BLOCK_K, FIRST,
                       SIGNAL=True)
        if LOCAL_DIRECT:
            # The local shard's tiles wait for nothing: a GEMM program computes its dealt share, then
            # every program takes the rest from a counter, the pushers once their pushes are done.
            claim_local_tiles(a_ptr, stride_am, stride_ak, b_ptr, stride_bk, stride_bn, c_ptr, stride_cm,
                              stride_cn, claims_ptr, COMM_PROGRAMS + GEMM_PROGRAMS, pid - COMM_PROGRAMS,
                              GEMM_PROGRAMS, M_loc, N, K, cur_rank, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA,
                              B_KMAJOR, FLATTEN)
        if pid >= COMM_PROGRAMS:
            gemm_gathered(a_ptr, stride_am, stride_ak, ag_ptr, stride_gm, stride_gk, b_ptr, stride_bk,
                          stride_bn, c_ptr, stride_cm, stride_cn, flags_ptr, M_loc, N, K, heap_bases, ctl_ptr,
                          cur_rank, world, epoch, pid - COMM_PROGRAMS, GEMM_PROGRAMS, BLOCK_M, BLOCK_N, BLOCK_K,
                          GROUP_M, USE_TMA, B_KMAJOR, LOCAL_DIRECT, FLATTEN, WITH_LOCAL=not LOCAL_DIRECT)
    P.call_exit(ctl_ptr, heap_bases, cur_rank, world, epoch, live, status_ptr, COMM_PROGRAMS + GEMM_PROGRAMS, ENTER)


@collective(OP)
def wg_specialized(a, b, *, config=None, group=None, return_gathered=False):
    """all_gather_gemm as one workgroup-specialized kernel; same contract as
    :func:`tilefuse.all_gather_gemm`."""
    call = setup("wg_specialized", a, b, config, group, comm=True)
    if is_degenerate(call):
        return bulk_sync(a, b, config=config, group=group, return_gathered=return_gathered)
    heap, cfg = call.heap, call.config
    W, r, M_loc, N, K = heap.world_size, heap.rank, call.M, call.N, call.K
    # The kernel begins the call: every peer is done with a_gathered before anything is pushed.
    p = plan_push(call, "wg_specialized", return_gathered, kernel_begins=True)
    # Not capped by the chunks or tiles (programs without one exit): one compiled kernel per config.
    comm_programs, gemm_programs = cfg.COMM_SMS, cfg.GEMM_SMS
    _wg_kernel[(comm_programs + gemm_programs,)](
        a, a.stride(0), a.stride(1), p.ag, p.ag.stride(0), p.ag.stride(1), p.own,
        b, b.stride(0), b.stride(1), p.c, p.c.stride(0), p.c.stride(1), p.flags, p.flags[r * p.num_chunks:],
        p.claims,
        M_loc, N, K, heap.heap_bases, ctl(heap), r, W, *p.enter_args,
        COMM_PROGRAMS=comm_programs, GEMM_PROGRAMS=gemm_programs, LOCAL_DIRECT=p.lay.local_direct,
        FIRST=p.first, ENTER=p.begins, **gemm_meta(call, p.lay),  # the GEMM programs' dealt local tiles
    )
    p.entered()
    return finish(call, p.c, p.ag.clone() if return_gathered else None, return_gathered)
