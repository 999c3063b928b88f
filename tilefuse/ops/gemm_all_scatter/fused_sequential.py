"""gemm_all_scatter, fused sequential: one persistent kernel computes a tile and pushes it at once.

    program p: | tile p: K loop | store local + put to peers | tile p+P: K loop | store + put | ...
    stream:    | barrier | fused kernel | barrier (all peers' tiles landed) |

Communication of tile i overlaps the K loops of the tiles other programs are computing; there is no
flag: the tile goes from registers straight to every peer's c.
"""

from __future__ import annotations

import torch
import triton.language as tl

from ...runtime import device_barrier
from ...runtime.primitives import kernel
from ._setup import finish, setup
from ._tiles import compute_tiles
from .bulk_sync import bulk_sync


@kernel
def _fused_kernel(
    # GEMM operands (the order of GemmCall.gemm_args)
    a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    # output: this rank's column block of c (a symmetric address)
    c_ptr, stride_cm, stride_cn,
    # distributed
    heap_bases, cur_rank, world,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr,
):
    compute_tiles(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                  c_ptr, stride_cm, stride_cn, c_ptr,  # no flags
                  heap_bases, cur_rank, world, 0, tl.program_id(0),
                  BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, USE_TMA, B_KMAJOR, PUSH=True, RELEASE=False)


def fused_sequential(a, b, *, config=None, group=None, out=None):
    """gemm_all_scatter as one fused persistent kernel; same contract as :func:`tilefuse.gemm_all_scatter`."""
    if isinstance(a, torch.Tensor) and a.dim() == 2 and a.shape[1] == 0:
        return bulk_sync(a, b, config=config, group=group, out=out)  # K = 0: nothing to multiply
    call, c, c_block, _ = setup("fused_sequential", a, b, config, group, out, comm=False)
    heap, cfg = call.heap, call.config
    device_barrier()  # every peer is done reading the previous result out of c
    if call.num_tiles > 0:
        programs = min(cfg.GEMM_SMS + cfg.COMM_SMS, call.num_tiles)
        _fused_kernel[(programs,)](
            *call.gemm_args, c_block, c_block.stride(0), c_block.stride(1),
            heap.heap_bases, heap.rank, heap.world_size,
            NUM_PROGRAMS=programs, **call.gemm_meta,
        )
    device_barrier()  # every peer's tiles have landed in c
    return finish(call, c, out)
