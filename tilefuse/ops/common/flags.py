"""Tile-level flags on the runtime's signal/wait (protocol: runtime.primitives): int64 heap words
holding the sequence number of the call that last released them. The CTA barrier in each orders all
threads' stores with the one thread's release, and the acquired flag with every thread's loads.
"""

import triton
import triton.language as tl

from ...runtime import primitives as P


@triton.jit
def tile_release(flag_ptr, epoch, cur_rank, peer, heap_bases):
    """All threads' earlier stores, then ``peer``'s copy of the flag := epoch (release, sys scope)."""
    tl.debug_barrier()
    P.signal(flag_ptr, epoch, cur_rank, peer, heap_bases)


@triton.jit
def tile_acquire(flag_ptr, epoch, cur_rank, src_rank, ctl_ptr, heap_bases, world):
    """Wait (bounded) until the local flag equals ``epoch``, then let every thread read; ok (False: gave up)."""
    ok = P.wait(flag_ptr, epoch, cur_rank, src_rank, ctl_ptr, heap_bases, world)
    tl.debug_barrier()
    return ok
