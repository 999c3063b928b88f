"""all_gather_gemm, bulk-synchronous: gather all of A through the heap, then one plain GEMM.

    stream: | push own shard -> a_gathered on every rank; begins the call, ends with the barrier |
            | GEMM (a_gathered @ b); ends the call |

No overlap: the baseline shape of the algorithm in the same runtime. The begin (the push kernel's
first program: ``call_enter``) keeps peers from pushing the next call's rows while this rank's GEMM
still reads the previous ones; the barrier (the push kernel's last program: ``call_exit`` with
``BARRIER``) makes every peer's rows visible before the GEMM, whose last program ends the call
(``call_exit``): two launches, no begin kernel, no status copy (``TILEFUSE_BEGIN_KERNEL=1`` brings
the begin and barrier kernels back). This variant also serves the other
variants' degenerate calls (``M_loc``, ``N`` or ``K`` zero).
"""

from __future__ import annotations

import torch
import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.gather import push_shard
from ..common.gemm import matmul
from ..common.launch import collective, ctl, enter_args, gemm_call_args, launched, mid_barrier
from ._setup import OP, finish, gathered_workspace, new_output, setup, start


@kernel
def _all_gather_kernel(
    # this rank's shard [M_loc, K] (any local tensor)
    a_ptr, stride_am, stride_ak,
    # this rank's row block of a_gathered (a symmetric address)
    ag_ptr, stride_gm, stride_gk,
    M_loc, K,
    # distributed; the call's begin (this kernel begins the call, ENTER)
    heap_bases, ctl_ptr, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1, status_ptr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, NUM_PROGRAMS: tl.constexpr, ENTER: tl.constexpr,
):
    """Copy this rank's shard into its row block of a_gathered on every rank (itself first)."""
    epoch, live = P.call_enter(ctl_ptr, heap_bases, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1,
                               ENTER)
    if live:
        pid = tl.program_id(0)
        # No flags (SIGNAL=False): the barrier after this kernel publishes the rows; ag_ptr stands in.
        push_shard(a_ptr, stride_am, stride_ak, ag_ptr, stride_gm, stride_gk, ag_ptr, 0, M_loc, K,
                   cur_rank, world, heap_bases, pid, NUM_PROGRAMS, BLOCK_M, BLOCK_K, FIRST=0, SIGNAL=False)
    # With ENTER: ctl[SEQ] moves here, so the GEMM reads the call's number, after the barrier behind
    # which every rank's rows have landed.
    P.call_exit(ctl_ptr, heap_bases, cur_rank, world, epoch, live, status_ptr, NUM_PROGRAMS, ENTER, BARRIER=True)


@collective(OP)
def bulk_sync(a, b, *, config=None, group=None, return_gathered=False):
    """all_gather_gemm with no overlap; same contract as :func:`tilefuse.all_gather_gemm`."""
    call = setup("bulk_sync", a, b, config, group, comm=False)
    heap, cfg = call.heap, call.config
    W, r, M_loc, N, K = heap.world_size, heap.rank, call.M, call.N, call.K
    c = new_output((W * M_loc, N), a.dtype, a.device)
    if M_loc == 0 or K == 0:
        start(call, "bulk_sync", return_gathered)
        c.zero_()
        return finish(call, c, torch.empty((W * M_loc, K), dtype=a.dtype, device=a.device), return_gathered)
    ag = gathered_workspace(call, "bulk_sync", flags=False).a_gathered
    own = ag[r * M_loc:(r + 1) * M_loc]
    # The begin: every peer's GEMM of the previous call is done with a_gathered.
    entry = start(call, "bulk_sync", return_gathered, c, kernel_begins=True)
    args = enter_args(entry)
    programs = cfg.GEMM_SMS + cfg.COMM_SMS  # not capped by the tiles: one kernel per config
    _all_gather_kernel[(programs,)](
        a, a.stride(0), a.stride(1), own, own.stride(0), own.stride(1), M_loc, K,
        heap.heap_bases, ctl(heap), r, W, *args,
        BLOCK_M=cfg.BLOCK_M, BLOCK_K=cfg.BLOCK_K, NUM_PROGRAMS=programs, ENTER=entry is not None, num_warps=4,
    )
    launched(entry, ends=False)
    if entry is None:
        mid_barrier(heap, 0)  # every peer's shard has landed in a_gathered
    # Nothing if the call was aborted; the GEMM ends the call.
    matmul(ag, b, c, cfg, ctl(heap), call=gemm_call_args(heap, entry))
    launched(entry)
    return finish(call, c, ag.clone() if return_gathered else None, return_gathered)
