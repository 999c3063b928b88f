"""all_gather_gemm, bulk-synchronous: gather all of A through the heap, then one plain GEMM.

    stream: | push own shard -> a_gathered on every rank; begins the call, ends with the barrier |
            | GEMM (a_gathered @ b); ends the call |

No overlap: the baseline. It also serves the other variants' empty calls.
"""

from __future__ import annotations

import torch

from ..common.launch import begin_call, call_arg, collective, ctl, gemm_call_args, launched, new_output
from ._prepare import OP, prepare
from ._tiles import launch_shard


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
    entry = begin_call(p.sig, c, kernel_begins=True)
    scales = p.scales(scale_a, scale_b)
    launch_shard(p, a, p.own, scales, call_arg(heap, entry), every_rank=True)  # then every shard is in a_gathered
    launched(entry, ends=False)
    call = gemm_call_args(heap, entry)
    p.gemm(p.ag, b, c, ends=call is not None).run(p.ag, b, c, ctl(heap), call=call, scales=p.gathered_scales(scales))
    launched(entry)
    return (c, p.ag.clone()) if return_gathered else c
