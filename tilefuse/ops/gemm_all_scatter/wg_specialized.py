"""gemm_all_scatter, workgroup-specialized: one kernel whose programs split into producers and movers.

    programs 0 .. G-1        : | tile: K loop | store into the result, release flag | tile | ...
    programs G .. G+C-1      : | acquire flag | put tile to peers | ... | release done[r][c] on every rank |
    program  G+C-1 (last)    :                                          | acquire done[*][*] == seq |
    stream: | one kernel, which begins the call itself |

G = GEMM_SMS, C = COMM_SMS. The completion handshake is inside the kernel: every movement program c
of rank r releases flag ``done[r][c] = seq`` on every rank once its puts are issued, and the last
program acquires all W*C of them, so the kernel ends only after every peer's tiles have landed
here. All G+C programs must be resident at once (checked against the device).
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.flags import tile_acquire, tile_release
from ..common.launch import collective, ctl
from ._setup import OP, setup
from ._tiles import compute_tiles, push_ready_tiles


@kernel
def _wg_kernel(
    # GEMM operands (the order of GemmCall.gemm_args)
    a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    # output: this rank's column block of the result, of c; int64 flag per tile; int64 done flags [W, C]
    o_ptr, c_ptr, stride_cm, stride_cn, flags_ptr, done_ptr,
    # distributed; the call's begin (this kernel begins the call)
    heap_bases, ctl_ptr, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1, status_ptr,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    GEMM_PROGRAMS: tl.constexpr, COMM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr,
    B_KMAJOR: tl.constexpr, ENTER: tl.constexpr,
):
    epoch, live = P.call_enter(ctl_ptr, heap_bases, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1,
                               ENTER)
    if live:
        pid = tl.program_id(0)
        if pid < GEMM_PROGRAMS:
            compute_tiles(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                          o_ptr, c_ptr, stride_cm, stride_cn, flags_ptr, heap_bases, cur_rank, world, epoch, pid,
                          BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, GEMM_PROGRAMS, USE_TMA, B_KMAJOR,
                          PUSH=False, RELEASE=True)
        else:
            cid = pid - GEMM_PROGRAMS
            push_ready_tiles(o_ptr, c_ptr, flags_ptr, M, N, stride_cm, stride_cn, heap_bases, ctl_ptr, cur_rank, world,
                             epoch, cid, BLOCK_M, BLOCK_N, GROUP_M, COMM_PROGRAMS)
            for i in range(0, world):
                # Release: pairs with the acquire of done[cur_rank][cid] below, on rank `peer`.
                tile_release(done_ptr + cur_rank * COMM_PROGRAMS + cid, epoch, cur_rank, (cur_rank + i) % world,
                             heap_bases)
            if cid == COMM_PROGRAMS - 1:
                for j in range(0, world * COMM_PROGRAMS):
                    # Acquire: pairs with the release of done[j // C][j % C] by that rank's movement program.
                    tile_acquire(done_ptr + j, epoch, cur_rank, j // COMM_PROGRAMS, ctl_ptr, heap_bases, world)
    P.call_exit(ctl_ptr, heap_bases, cur_rank, world, epoch, live, status_ptr, GEMM_PROGRAMS + COMM_PROGRAMS, ENTER)


@collective(OP)
def wg_specialized(a, b, *, config=None, group=None, out=None):
    """gemm_all_scatter as one workgroup-specialized kernel; same contract as
    :func:`tilefuse.gemm_all_scatter`."""
    call = setup("wg_specialized", a, b, config, group, out, comm=True, flags=True, kernel_begins=True)
    if call.empty:
        return call.result()
    g, cfg = call.gemm, call.gemm.config
    heap, c_block = g.heap, call.c_block
    gemm_programs = cfg.GEMM_SMS  # not capped by the tiles: one kernel per config
    _wg_kernel[(gemm_programs + cfg.COMM_SMS,)](
        *g.gemm_args, call.own, c_block, c_block.stride(0), c_block.stride(1), call.flags, call.done,
        heap.heap_bases, ctl(heap), heap.rank, heap.world_size, *call.enter_args,
        GEMM_PROGRAMS=gemm_programs, COMM_PROGRAMS=cfg.COMM_SMS, ENTER=call.begins, **g.gemm_meta,
    )
    call.entered()
    return call.result()
