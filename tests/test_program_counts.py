"""A new call shape costs no Triton compile and no full cyclic collection.

Workspaces: a new shape allocates without ``gc.collect()``; only when the ranks' new buffers land at
different heap offsets (a block held by a reference cycle on one rank) do all ranks collect and
allocate once more, together.
"""

import gc

import torch
from ophelpers import randn

from tilefuse.ops import registry
from tilefuse.ops.common import launch


class _CountingGc:
    """Stands in for the ``gc`` module inside launch.py: counts collections, still collects."""

    def __init__(self):
        self.calls = 0

    def collect(self, *args):
        self.calls += 1
        return gc.collect(*args)


class _Cycle:
    pass


def job_new_shape_gc(ctx):
    """Returns (collections for a new shape with no garbage, collections and correctness for a new
    shape while this rank (rank 1 only) holds a heap block in a reference cycle)."""
    counting = _CountingGc()
    saved = launch.gc
    launch.gc = counting
    gc.disable()  # the cyclic garbage below stays until launch.py collects it
    try:
        op, variant = "gemm_all_scatter", "bulk_sync"
        fn, ref = registry.get(op, variant), registry.get(op, "reference")
        a = randn((20, 24), torch.float32, ctx.device, seed=1)
        b = randn((24, 16), torch.float32, ctx.device, seed=2 + ctx.rank)
        torch.testing.assert_close(fn(a, b), ref(a, b))
        clean = counting.calls

        # A block that every rank frees: plainly on rank 0, only by the cyclic collector on rank 1.
        hold = ctx.heap.empty((1 << 16,), dtype=torch.float32)
        if ctx.rank == 1:
            c = _Cycle()
            c.me, c.t = c, hold
            del c
        del hold
        before = counting.calls
        a = randn((36, 24), torch.float32, ctx.device, seed=3)
        b = randn((24, 40), torch.float32, ctx.device, seed=4 + ctx.rank)
        torch.testing.assert_close(fn(a, b), ref(a, b))
        return clean, counting.calls - before
    finally:
        gc.enable()
        launch.gc = saved


def test_new_shape_does_not_collect_and_divergent_offsets_recover(pools):
    out = pools.run(2, job_new_shape_gc, timeout=300)
    for rank, (clean, diverged) in enumerate(out):
        assert clean == 0, f"rank {rank}: a new shape with no garbage ran gc.collect {clean} times"
        # Every rank (not only the one holding garbage) collects once, and the call then succeeds.
        assert diverged == 1, f"rank {rank}: {diverged} collections after diverged offsets (1 expected)"
