"""all_gather_gemm, producer-consumer: a push kernel and a GEMM kernel on two streams at once.

    stream 1: | push (COMM_SMS programs): chunk -> rank r-1, release its flag there, ...  |
    stream 2: | GEMM (GEMM_SMS programs): local shard from a | source r+1: acquire chunk
              | flag, K loop | source r+2 ... |
    stream 1:                                                          | join |

Both kernels begin the call together (``P.enter``) and end it together (``P.exit`` over both). The
local shard is read from ``a`` and waits for nothing (where ``a`` fits the heap buffer's operand
path; else it is pushed to this rank too). GEMM_SMS + COMM_SMS must fit on the device at once: the
GEMM spins. Its copy-engine form is :mod:`.copy_engine`.
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.launch import ForkedStreams, begin_call, call_arg, collective, launched, new_output
from ._prepare import OP, prepare
from ._tiles import gemm_gathered, shard_kernel
from .bulk_sync import bulk_sync


@kernel
def gemm_kernel(
    a_ptr, stride_am, stride_ak,
    ag_ptr, stride_gm, stride_gk, scales,
    b_ptr, stride_bk, stride_bn,
    c_ptr, stride_cm, stride_cn,
    flags_ptr,
    M_loc, N, K,
    call, exit_programs,  # the call protocol (ENTER: this kernel begins and ends the call)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr,
    LOCAL_DIRECT: tl.constexpr, ENTER: tl.constexpr, FLATTEN: tl.constexpr,
):
    seq, live = P.enter(call, ENTER)
    if live:
        gemm_gathered(a_ptr, stride_am, stride_ak, ag_ptr, stride_gm, stride_gk, scales, (b_ptr, stride_bk, stride_bn),
                      c_ptr, stride_cm, stride_cn, flags_ptr, M_loc, N, K, call, seq, tl.program_id(0),
                      NUM_PROGRAMS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA, B_KMAJOR, LOCAL_DIRECT, FLATTEN)
    P.exit(call, seq, live, exit_programs, ENTER)


@collective(OP)
def producer_consumer(a, b, *, config=None, group=None, return_gathered=False, scale_a=None, scale_b=None,
                      out_dtype=None):
    """all_gather_gemm with push and GEMM kernels on two streams; same contract as :func:`tilefuse.all_gather_gemm`."""
    scaling = (scale_a, scale_b, out_dtype)
    heap, p = prepare("producer_consumer", a, b, config, group, return_gathered, scaling, buffers="flagged", comm=True)
    if p.empty:
        return bulk_sync(a, b, config=config, group=group, return_gathered=return_gathered, scale_a=scale_a,
                         scale_b=scale_b, out_dtype=out_dtype)
    cfg, W = p.config, heap.world_size
    c = new_output((W * p.M, p.N), p.out_dtype, a.device)
    scales = p.scales(scale_a, scale_b)
    entry = begin_call(p.sig, c, kernel_begins=True)
    call = call_arg(heap, entry)
    streams = ForkedStreams(heap.device)
    pushes = W > p.first  # a world of one with the local rows read in place pushes nothing
    total = cfg.GEMM_SMS + (cfg.COMM_SMS if pushes else 0)  # the programs that end the call together
    if pushes:
        shard_kernel[(cfg.COMM_SMS,)](
            a, *a.stride(), p.own, *p.own.stride(), p.own_flags, p.M, p.K, scales, call, total, BLOCK_M=cfg.BLOCK_M,
            BLOCK_K=cfg.BLOCK_K, NUM_PROGRAMS=cfg.COMM_SMS, EVERY_RANK=True, SIGNAL=True, FIRST=p.first, BARRIER=False,
            num_warps=4)
    with streams.side():
        gemm_kernel[(cfg.GEMM_SMS,)](
            a, *a.stride(), p.ag, *p.ag.stride(), scales, b, *b.stride(), c, *c.stride(), p.flags, p.M, p.N, p.K, call,
            total, NUM_PROGRAMS=cfg.GEMM_SMS, LOCAL_DIRECT=p.local_direct, ENTER=True, **p.meta)
    streams.join()
    launched(entry)
    return (c, p.ag.clone()) if return_gathered else c
