"""all_gather_gemm, bulk-synchronous: gather all of A through the heap, then one plain GEMM.

    stream: | push own shard -> a_gathered on every rank; begins the call, ends with the barrier |
            | GEMM (a_gathered @ b); ends the call |

No overlap: the baseline shape of the algorithm in the same runtime. The begin (the push kernel's
first program: ``call_enter``) keeps peers from pushing the next call's rows while this rank's GEMM
still reads the previous ones; the barrier (the push kernel's last program: ``call_exit`` with
``BARRIER``) makes every peer's rows visible before the GEMM, whose last program ends the call
(``call_exit``): two launches, no begin kernel, no status copy. This variant also serves the other
variants' degenerate calls (``M_loc``, ``N`` or ``K`` zero).
"""

from __future__ import annotations

import torch

from ..common.gemm import matmul
from ..common.launch import collective, ctl, gemm_call_args, launched
from ._setup import OP, finish, gathered_workspace, new_output, setup, start
from ._tiles import launch_shard


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
    launch_shard(call, a, own, entry, every_rank=True, ends=False)  # then every shard is in a_gathered
    # Nothing if the call was aborted; the GEMM ends the call.
    matmul(ag, b, c, cfg, ctl(heap), call=gemm_call_args(heap, entry))
    launched(entry)
    return finish(call, c, ag.clone() if return_gathered else None, return_gathered)
