"""gemm_reduce_scatter, fused sequential: each partial tile goes from registers to its owner's slot.

    program p:  | tile (owner r+1): K loop | store to owner's slot r | tile: K loop | store | ...
    rank r:     | fused kernel: begin ... barrier | reduce: sum the W slots of r's tiles -> c |

No flags: the barrier after the kernel orders every rank's stores before the owner's local
reduction, which sums slots r-1, r-2, ..., r in fp32.
"""

from __future__ import annotations

from ..common.launch import call_arg, collective, launched, mid_barrier
from ._prepare import OP, prepare
from ._tiles import launch_reduce, partials_kernel


@collective(OP)
def fused_sequential(a, b, *, config=None, group=None, scale_a=None, scale_b=None, out_dtype=None):
    """gemm_reduce_scatter, a fused kernel, then a local reduction; contract: :func:`tilefuse.gemm_reduce_scatter`."""
    p = prepare("fused_sequential", a, b, config, group, (scale_a, scale_b, out_dtype))
    a, b, c, entry = p.start(a, b)
    if p.empty:
        return c
    call = call_arg(p.heap, entry)
    cfg = p.config
    programs = cfg.GEMM_SMS + cfg.COMM_SMS  # not capped by the tiles: one kernel per config
    # No flags (the stage stands in); the kernel's barrier orders every rank's partials before the reduction.
    partials_kernel[(programs,)](
        a, b, p.scales(scale_a, scale_b), *p.dims, p.stage, p.stage, *p.stage_strides, call, programs,
        NUM_PROGRAMS=programs, ENTER=entry is not None, RELEASE=False, BARRIER=True, WARP_SPEC=p.warp_spec, **p.meta)
    launched(entry, ends=False)
    if entry is None:
        mid_barrier(p.heap, 0)  # every rank's partials have landed in our slots
    launch_reduce(p, call, c, programs, pull=False, wait=False, end=entry is not None)  # ordered by the barrier
    launched(entry)  # the reduction ends the call
    return c
