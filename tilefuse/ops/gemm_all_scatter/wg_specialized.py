"""gemm_all_scatter, workgroup-specialized: one kernel whose programs split into producers and movers.

    programs 0 .. G-1        : | tile: K loop | store into the result, release flag | tile | ...
    programs G .. G+C-1      : | acquire flag | put tile to peers | ... | release done[r][c] on every rank |
    program  G+C-1 (last)    :                                          | acquire done[*][*] == seq |
    stream: | one kernel, which begins the call itself |

G = GEMM_SMS, C = COMM_SMS. The completion handshake (``done``) is inside the kernel: it ends only
after every peer's tiles have landed here. All G+C programs must be resident at once (checked).
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.flags import tile_acquire, tile_release
from ..common.launch import call_arg, collective, launched
from ._prepare import OP, begin, finish, prepare
from ._tiles import compute_tiles, push_ready_tiles


@kernel
def _wg_kernel(
    a_ptr, b_ptr, scales, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,  # scales: common.scaled
    # the result, c (a symmetric address), [M, W*N] strided alike; int64 flags per tile, [W, C]
    o_ptr, c_ptr, stride_cm, stride_cn, flags_ptr, done_ptr,
    call,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    GEMM_PROGRAMS: tl.constexpr, COMM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr,
    B_KMAJOR: tl.constexpr, ENTER: tl.constexpr,
):
    seq, live = P.enter(call, ENTER)
    if live:
        pid = tl.program_id(0)
        if pid < GEMM_PROGRAMS:
            compute_tiles(a_ptr, b_ptr, scales, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, o_ptr, c_ptr,
                          stride_cm, stride_cn, flags_ptr, call, seq, pid, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                          GEMM_PROGRAMS, USE_TMA, B_KMAJOR, PUSH=False, RELEASE=True)
        else:
            cid = pid - GEMM_PROGRAMS
            rank, world, bases = P.rank(call), P.world(call), P.bases(call)
            push_ready_tiles(o_ptr, c_ptr, flags_ptr, M, N, stride_cm, stride_cn, call, seq, cid,
                             BLOCK_M, BLOCK_N, GROUP_M, COMM_PROGRAMS)
            for i in range(0, world):
                # Release: pairs with the acquire of done[rank][cid] below, on rank `peer`.
                tile_release(done_ptr + rank * COMM_PROGRAMS + cid, seq, rank, (rank + i) % world, bases)
            if cid == COMM_PROGRAMS - 1:
                for j in range(0, world * COMM_PROGRAMS):
                    # Acquire: pairs with the release of done[j // C][j % C] by that rank's movement program.
                    tile_acquire(done_ptr + j, seq, rank, j // COMM_PROGRAMS, P.ctl(call), bases, world)
    P.exit(call, seq, live, GEMM_PROGRAMS + COMM_PROGRAMS, ENTER)


@collective(OP)
def wg_specialized(a, b, *, config=None, group=None, out=None, scale_a=None, scale_b=None, out_dtype=None):
    """gemm_all_scatter as one workgroup-specialized kernel; same contract as :func:`tilefuse.gemm_all_scatter`."""
    p = prepare("wg_specialized", a, b, config, group, out, (scale_a, scale_b, out_dtype), comm=True, flags=True)
    a, b, dest, c, entry = begin(p, a, b, out)
    if not p.empty:
        cfg = p.config  # the grid is not capped by the tiles: one kernel per config
        _wg_kernel[(cfg.GEMM_SMS + cfg.COMM_SMS,)](
            a, b, p.scales(scale_a, scale_b), p.M, p.N, p.K, *a.stride(), *b.stride(), dest, c,
            *c.stride(), p.flags, p.done, call_arg(p.heap, entry),
            GEMM_PROGRAMS=cfg.GEMM_SMS, COMM_PROGRAMS=cfg.COMM_SMS, ENTER=entry is not None, **p.meta)
        launched(entry)
    return finish(p, dest, c, out)
