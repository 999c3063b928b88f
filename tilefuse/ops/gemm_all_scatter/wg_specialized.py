"""gemm_all_scatter, workgroup-specialized: one kernel whose programs split into producers and movers.

    programs 0 .. G-1        : | tile: K loop | store local, release flag | tile | ...
    programs G .. G+C-1      : | acquire flag | put tile to peers | ... | release "done" on every rank |
    program  G+C-1 (last)    :                                          | acquire done >= W*C*calls |
    stream: | barrier | one kernel |

G = GEMM_SMS, C = COMM_SMS. The completion handshake is inside the kernel: every movement program
adds 1 to a "done" counter on every rank once its puts are issued (release), and the last program
waits until its own counter shows all W*C of this epoch, so the kernel ends only after every peer's
tiles have landed here. All G+C programs must be resident at once (checked against the device).
"""

from __future__ import annotations

import torch
import triton.language as tl

from ...runtime import device_barrier
from ...runtime.primitives import kernel
from ..common.flags import tile_acquire, tile_release_add
from ..common.launch import ctl
from ._setup import finish, setup
from ._tiles import compute_tiles, push_ready_tiles
from .bulk_sync import bulk_sync


@kernel
def _wg_kernel(
    # GEMM operands (the order of GemmCall.gemm_args)
    a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    # output: this rank's column block of c; int32 flag per tile; int64 done counter
    c_ptr, stride_cm, stride_cn, flags_ptr, done_ptr,
    # distributed
    heap_bases, ctl_ptr, cur_rank, world, epoch, done_target,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    GEMM_PROGRAMS: tl.constexpr, COMM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr,
    B_KMAJOR: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < GEMM_PROGRAMS:
        compute_tiles(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                      c_ptr, stride_cm, stride_cn, flags_ptr, heap_bases, cur_rank, world, epoch, pid,
                      BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, GEMM_PROGRAMS, USE_TMA, B_KMAJOR, PUSH=False, RELEASE=True)
    else:
        cid = pid - GEMM_PROGRAMS
        push_ready_tiles(c_ptr, flags_ptr, M, N, stride_cm, stride_cn, heap_bases, ctl_ptr, cur_rank, world,
                         epoch, cid, BLOCK_M, BLOCK_N, GROUP_M, COMM_PROGRAMS)
        for i in range(0, world):
            # Release: pairs with the acquire of the done counter below, on rank `peer`.
            tile_release_add(done_ptr, 1, cur_rank, (cur_rank + i) % world, heap_bases)
        if cid == COMM_PROGRAMS - 1:
            # Acquire: pairs with the releases of the done counter by every rank's movement programs.
            # done_target = W * COMM_PROGRAMS * calls so far, kept on the host in 64 bits.
            tile_acquire(done_ptr, done_target, cur_rank, -1, ctl_ptr)


def wg_specialized(a, b, *, config=None, group=None, out=None):
    """gemm_all_scatter as one workgroup-specialized kernel; same contract as
    :func:`tilefuse.gemm_all_scatter`."""
    if isinstance(a, torch.Tensor) and a.dim() == 2 and a.shape[1] == 0:
        return bulk_sync(a, b, config=config, group=group, out=out)  # K = 0: nothing to multiply
    call, c, c_block, ws = setup("wg_specialized", a, b, config, group, out, comm=True)
    heap, cfg = call.heap, call.config
    epoch = ws.next_epoch()
    ws.extra["done_target"] = ws.extra.get("done_target", 0) + heap.world_size * cfg.COMM_SMS
    device_barrier()  # every peer is done reading the previous result out of c
    gemm_programs = max(1, min(cfg.GEMM_SMS, call.num_tiles))
    _wg_kernel[(gemm_programs + cfg.COMM_SMS,)](
        *call.gemm_args, c_block, c_block.stride(0), c_block.stride(1), ws.flags, ws.done,
        heap.heap_bases, ctl(heap), heap.rank, heap.world_size, epoch, ws.extra["done_target"],
        GEMM_PROGRAMS=gemm_programs, COMM_PROGRAMS=cfg.COMM_SMS, **call.gemm_meta,
    )
    return finish(call, c, out)
