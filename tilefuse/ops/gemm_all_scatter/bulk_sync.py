"""gemm_all_scatter, bulk-synchronous: the whole GEMM, then a scatter kernel, stream-ordered.

    stream:  | GEMM (all SMs) -> own block of the result; begins the call | scatter: own block -> every peer;
             ends with a barrier (all peers' blocks landed) |

No overlap: the baseline shape of the algorithm in the same runtime. Two launches: the GEMM's first
program begins the call (``call_enter``) and the scatter kernel's last one passes the closing
barrier (``call_exit`` with ``BARRIER``); at world 1 the GEMM is the whole call.
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.comm import push_tile, row_major_tile
from ..common.launch import collective, ctl, mid_barrier
from ..common.tiles import load_tile, tile_offsets
from ._setup import OP, setup


@kernel
def _scatter_kernel(
    o_ptr, c_ptr,  # this rank's column block of the result, of c (a symmetric address), strided alike
    M, N,
    stride_cm, stride_cn,
    heap_bases, ctl_ptr, cur_rank, world, status_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_PROGRAMS: tl.constexpr, END: tl.constexpr,
):
    """Copy this rank's [M, N] block of the result into its place in every peer's c, tile by tile; with
    ``END`` the call ends here, after a barrier (every peer's block has landed in c)."""
    seq, live = P.call_epoch(ctl_ptr)
    if live:
        pid = tl.program_id(0)
        num_pid_n = tl.cdiv(N, BLOCK_N)
        num_tiles = tl.cdiv(M, BLOCK_M) * num_pid_n
        for tile_id in range(pid, num_tiles, NUM_PROGRAMS):
            pid_m, pid_n = row_major_tile(tile_id, num_pid_n)
            offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N)
            tile = load_tile(o_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn)  # [BM, BN]
            push_tile(c_ptr, tile, offs_m, offs_n, M, N, stride_cm, stride_cn, cur_rank, world, heap_bases,
                      FIRST=1)
    P.call_exit(ctl_ptr, heap_bases, cur_rank, world, seq, live, status_ptr, NUM_PROGRAMS, END, BARRIER=True)


@collective(OP)
def bulk_sync(a, b, *, config=None, group=None, out=None):
    """gemm_all_scatter with no overlap; same contract as :func:`tilefuse.gemm_all_scatter`."""
    call = setup("bulk_sync", a, b, config, group, out, comm=False, kernel_begins=True)
    if call.empty:
        return call.result()
    g, cfg = call.gemm, call.gemm.config
    heap = g.heap
    last = heap.world_size == 1
    call.first_gemm(heap, a, b, call.own, cfg, barrier=False, ends=last)
    if not last:
        programs = cfg.GEMM_SMS + cfg.COMM_SMS  # not capped by the tiles: one kernel per config
        _scatter_kernel[(programs,)](
            call.own, call.c_block, g.M, g.N, call.c_block.stride(0), call.c_block.stride(1),
            heap.heap_bases, ctl(heap), heap.rank, heap.world_size, call.status,
            BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, NUM_PROGRAMS=programs, END=call.begins, num_warps=4,
        )
        call.entered()
        if not call.begins:
            mid_barrier(heap, 0)  # every peer's block has landed in c
    return call.result()
