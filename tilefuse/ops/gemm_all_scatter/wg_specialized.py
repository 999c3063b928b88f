"""gemm_all_scatter, workgroup-specialized: one kernel whose programs split into producers and movers.

    programs 0 .. G-1        : | tile: K loop | store local, release flag | tile | ...
    programs G .. G+C-1      : | acquire flag | put tile to peers | ... | release "done" on every rank |
    program  G+C-1 (last)    :                                          | acquire done = W*C*epoch |
    stream: | barrier | one kernel |

G = GEMM_SMS, C = COMM_SMS. The completion handshake is inside the kernel: every movement program
adds 1 to a "done" counter on every rank once its puts are issued (release), and the last program
waits until its own counter shows all W*C of this epoch, so the kernel ends only after every peer's
tiles have landed here. All G+C programs must be resident at once (checked against the device).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...runtime import device_barrier
from ..common.comm import push_tile
from ..common.flags import tile_acquire, tile_release, tile_release_add
from ..common.gemm import gemm_operands, gemm_tile, load_tile, store_tile, tile_coords, tile_offsets
from ..common.launch import ctl
from ._setup import finish, setup


@triton.jit
def _wg_kernel(
    # GEMM operands (the order of GemmCall.gemm_args)
    a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    # output: this rank's column block of c; int32 flag per tile; int32 done counter
    c_ptr, stride_cm, stride_cn, flags_ptr, done_ptr,
    # distributed
    heap_bases, ctl_ptr, cur_rank, world, epoch,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    GEMM_PROGRAMS: tl.constexpr, COMM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr,
    B_KMAJOR: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    if pid < GEMM_PROGRAMS:
        a_op, b_op = gemm_operands(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                   BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR)
        for tile_id in range(pid, num_tiles, GEMM_PROGRAMS):
            pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
            acc = gemm_tile(a_op, b_op, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk,
                            stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR)  # [BM, BN] fp32
            offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N)
            store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn)
            # Release: pairs with the acquire by the movement programs below, on this rank.
            tile_release(flags_ptr + tile_id, epoch, cur_rank, cur_rank, heap_bases)
    else:
        cid = pid - GEMM_PROGRAMS
        for tile_id in range(cid, num_tiles, COMM_PROGRAMS):
            # Acquire: pairs with the release by the GEMM programs above, on this rank.
            if tile_acquire(flags_ptr + tile_id, epoch, cur_rank, cur_rank, ctl_ptr):
                pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
                offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N)
                tile = load_tile(c_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn)  # [BM, BN]
                push_tile(c_ptr, tile, offs_m, offs_n, M, N, stride_cm, stride_cn, cur_rank, world,
                          heap_bases, FIRST=1)
        for i in range(0, world):
            # Release: pairs with the acquire of the done counter below, on rank `peer`.
            tile_release_add(done_ptr, 1, cur_rank, (cur_rank + i) % world, heap_bases)
        if cid == COMM_PROGRAMS - 1:
            # Acquire: pairs with the releases of the done counter by every rank's movement programs.
            tile_acquire(done_ptr, epoch * world * COMM_PROGRAMS, cur_rank, -1, ctl_ptr)


def wg_specialized(a, b, *, config=None, group=None, out=None):
    """gemm_all_scatter as one workgroup-specialized kernel; same contract as
    :func:`tilefuse.gemm_all_scatter`."""
    call, c, c_block, ws = setup("wg_specialized", a, b, config, group, out, comm=True)
    heap, cfg = call.heap, call.config
    epoch = ws.next_epoch()
    device_barrier()  # every peer is done reading the previous result out of c
    gemm_programs = max(1, min(cfg.GEMM_SMS, call.num_tiles))
    _wg_kernel[(gemm_programs + cfg.COMM_SMS,)](
        *call.gemm_args, c_block, c_block.stride(0), c_block.stride(1), ws.flags, ws.done,
        heap.heap_bases, ctl(heap), heap.rank, heap.world_size, epoch,
        GEMM_PROGRAMS=gemm_programs, COMM_PROGRAMS=cfg.COMM_SMS, **call.gemm_meta,
    )
    return finish(call, c, out)
