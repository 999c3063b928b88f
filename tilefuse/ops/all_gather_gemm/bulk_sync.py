"""all_gather_gemm, bulk-synchronous: gather all of A through the heap, then one plain GEMM.

    stream: | push own shard -> a_gathered on every rank; begins the call, ends with the barrier |
            | GEMM (a_gathered @ b); ends the call |

No overlap: the baseline. It also serves the other variants' empty calls, and its push kernel is
fused_sequential's publish kernel (``EVERY_RANK=False``).
"""

from __future__ import annotations

import torch
import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.gather import copy_pieces, copy_scales
from ..common.gemm import matmul
from ..common.launch import begin_call, call_arg, collective, ctl, gemm_call_args, launched, new_output
from ..common.tiles import is_scaled
from ._prepare import OP, prepare
from ._tiles import push_shard, shard_scales


@kernel
def shard_kernel(
    a_ptr, stride_am, stride_ak,  # this rank's rows [M_loc, K] (any local tensor)
    dst_ptr, stride_dm, stride_dk,  # where they go (a symmetric address): row block r of a_gathered, or a_shard
    M_loc, K, scales,  # scales: a float8 call's (_tiles: the row scales go with the rows), else stand-ins
    call,  # the call protocol (runtime.primitives): this kernel begins the call
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, NUM_PROGRAMS: tl.constexpr, EVERY_RANK: tl.constexpr,
):
    """Begin the call, copy this rank's rows into ``dst`` on every rank (``EVERY_RANK``: a_gathered)
    or on this rank only (a_shard); the last program passes the barrier and ends the call."""
    seq, live = P.enter(call, True)
    if live:
        if EVERY_RANK:
            # No flags (SIGNAL=False): the barrier below publishes the rows; dst_ptr stands in.
            push_shard(a_ptr, stride_am, stride_ak, dst_ptr, stride_dm, stride_dk, dst_ptr, 0,
                       shard_scales(scales, P.rank(call) * M_loc), M_loc, K, call, tl.program_id(0), NUM_PROGRAMS,
                       BLOCK_M, BLOCK_K, FIRST=0, SIGNAL=False)
        else:
            copy_pieces(dst_ptr, stride_dm, stride_dk, a_ptr, stride_am, stride_ak, M_loc, K, tl.program_id(0),
                        NUM_PROGRAMS, BLOCK_M, BLOCK_K)
            if is_scaled(scales):  # and the rows' scales beside them
                for chunk in range(tl.program_id(0), tl.cdiv(M_loc, BLOCK_M), NUM_PROGRAMS):
                    copy_scales(scales[4], scales[0], scales[1], chunk, M_loc, BLOCK_M)
    P.exit(call, seq, live, NUM_PROGRAMS, END=True, BARRIER=True)


def launch_shard(p, a, dst, scales, call, *, every_rank: bool) -> None:
    """:func:`shard_kernel` on the config's programs (``scales``: :meth:`Prepared.scales`)."""
    cfg = p.config
    shard_kernel[(p.programs,)](
        a, a.stride(0), a.stride(1), dst, dst.stride(0), dst.stride(1), p.M, p.K, scales, call,
        BLOCK_M=cfg.BLOCK_M, BLOCK_K=cfg.BLOCK_K, NUM_PROGRAMS=p.programs, EVERY_RANK=every_rank, num_warps=4,
    )


@collective(OP)
def bulk_sync(a, b, *, config=None, group=None, return_gathered=False, scale_a=None, scale_b=None,
              out_dtype=None):
    """all_gather_gemm with no overlap; same contract as :func:`tilefuse.all_gather_gemm`."""
    heap, p = prepare("bulk_sync", a, b, config, group, return_gathered, (scale_a, scale_b, out_dtype),
                      buffers="gathered")
    W, M_loc = heap.world_size, p.M
    c = new_output((W * M_loc, p.N), p.out_dtype, a.device)
    if p.ag is None:  # M_loc or K zero: nothing moves
        begin_call(p.sig)
        c.zero_()
        gathered = torch.empty((W * M_loc, p.K), dtype=a.dtype, device=a.device)
        return (c, gathered) if return_gathered else c
    # The begin: every peer's GEMM of the previous call is done with a_gathered.
    entry = begin_call(p.sig, c, kernel_begins=True)
    scales = p.scales(scale_a, scale_b)
    launch_shard(p, a, p.own, scales, call_arg(heap, entry), every_rank=True)  # then every shard is in a_gathered
    launched(entry, ends=False)
    matmul(p.ag, b, c, p.config, ctl(heap), call=gemm_call_args(heap, entry), scales=p.gathered_scales(scales))
    launched(entry)
    return (c, p.ag.clone()) if return_gathered else c
