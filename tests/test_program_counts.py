"""A new call shape costs no Triton compile and no full cyclic collection.

Workspaces: a new shape allocates without ``gc.collect()``; only when the ranks' new buffers land at
different heap offsets (a block held by a reference cycle on one rank) do all ranks collect and
allocate once more, together.
"""

import gc

import pytest
import torch
from ophelpers import assert_matches, randn

from tilefuse.ops import registry
from tilefuse.ops.common import arena


class _CountingGc:
    """Stands in for the ``gc`` module inside arena.py: counts collections, still collects."""

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
    saved = arena.gc
    arena.gc = counting
    gc.disable()  # the cyclic garbage below stays until arena.py collects it
    try:
        op, variant = "gemm_all_scatter", "bulk_sync"
        fn, ref = registry.get(op, variant), registry.get(op, "reference")
        a = randn((20, 24), torch.float32, ctx.device, seed=1)
        b = randn((24, 16), torch.float32, ctx.device, seed=2 + ctx.rank)
        assert_matches(fn(a, b), ref(a, b), torch.float32, 24, ctx.on_gpu, "first shape")  # tf32 on a GPU
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
        assert_matches(fn(a, b), ref(a, b), torch.float32, 24, ctx.on_gpu, "second shape")
        return clean, counting.calls - before
    finally:
        gc.enable()
        arena.gc = saved


def test_new_shape_does_not_collect_and_divergent_offsets_recover(pools):
    out = pools.run(2, job_new_shape_gc, timeout=300)
    for rank, (clean, diverged) in enumerate(out):
        assert clean == 0, f"rank {rank}: a new shape with no garbage ran gc.collect {clean} times"
        # Every rank (not only the one holding garbage) collects once, and the call then succeeds.
        assert diverged == 1, f"rank {rank}: {diverged} collections after diverged offsets (1 expected)"


# ----------------------------------------------------------------------------- program counts
OPS = ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce")
VARIANTS = ("bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized")
# Two ragged shapes (rows per rank, N; rows of b 16-byte aligned in both, so that both take the same
# operand path), K = 24: 16x16 tiles give 2 and 3 tiles per block, fewer than
# the 4 + 2 programs of the config (and than the GEMM programs alone).
SHAPES = ((5, 20), (13, 36))


def _spy_launches():
    """Record every kernel launch as (kernel, grid, keyword arguments): the keyword arguments are the
    constexprs and launch options, what a compiled kernel is specialised on."""
    from tilefuse.runtime.launcher import FastKernel

    log = []
    real = FastKernel.__getitem__

    def spy(self, grid):
        launch = real(self, grid)
        fn = self.jit_fn.fn
        name = f"{fn.__module__}.{fn.__qualname__}"

        def run(*args, **kwargs):
            log.append((name, tuple(grid), tuple(sorted(kwargs.items()))))
            return launch(*args, **kwargs)

        return run

    FastKernel.__getitem__ = spy
    return log, lambda: setattr(FastKernel, "__getitem__", real)


def _forms(op):
    """(variant or named form, COMM_SMS) of every launch form of ``op``."""
    forms = [(v, 2) for v in VARIANTS]
    if op == "all_gather_gemm":
        forms.append(("copy_engine", 0))
    return forms


def job_one_kernel_per_config(ctx, ops):
    """Each op x launch form: the two shapes with one config, poisoned workspaces and outputs checked
    against the reference; returns {(op, form): {shape: {kernel: set of (grid, constexprs)}}} for the
    kernels tilefuse launches (the GEMM core takes its program count at run time: only its constexprs)."""
    from ophelpers import assert_matches, poison_workspaces

    from tilefuse import Config
    from tilefuse.runtime import hw

    gemm_sms = min(4, hw.num_sms(ctx.device) - 2)
    seen = {}
    log, restore = _spy_launches()
    try:
        for op in ops:
            ref_fn = registry.get(op, "reference")
            for variant, comm in _forms(op):
                cfg = Config(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=8, num_warps=4, num_stages=1,
                             GEMM_SMS=gemm_sms, COMM_SMS=comm)
                fn = registry.get(op, variant)
                kernels = seen.setdefault((op, variant, comm), {})
                for i, (rows, n) in enumerate(SHAPES):
                    m = rows * ctx.world if op == "gemm_reduce_scatter" else rows
                    a = randn((m, 24), torch.float32, ctx.device, seed=10 * i + ctx.rank)
                    b = randn((24, n), torch.float32, ctx.device, seed=10 * i + 5 + ctx.rank)
                    poison_workspaces()
                    log.clear()
                    got = fn(a, b, config=cfg)
                    ref = ref_fn(a, b)
                    assert_matches(got, ref, torch.float32, 24, ctx.on_gpu,
                                   f"{op}/{variant} COMM_SMS={comm} rows={rows} N={n}", scale=ctx.world)
                    launched = {}
                    for name, grid, meta in log:
                        core = name.endswith(".matmul_kernel")
                        launched.setdefault(name, set()).add(meta if core else (grid, meta))
                    kernels[rows, n] = launched
    finally:
        restore()
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_new_shapes_of_a_config_launch_the_same_kernels(pools, world):
    """Below one wave of tiles, every launch of two shapes of one config passes the same constexprs
    (one compiled kernel per variant, not one per shape) and the same grid (programs without a tile
    exit), and the results stay right with tiles < programs."""
    ops = OPS if world == 2 else ("gemm_all_scatter", "gemm_reduce_scatter", "gemm_all_reduce")
    for rank_report in pools.run(world, job_one_kernel_per_config, ops, timeout=1200):
        for form, kernels in rank_report.items():
            first, second = (kernels[shape] for shape in SHAPES)
            assert first, f"{form}: no kernel launch was seen"
            assert first.keys() == second.keys(), (form, sorted(first), sorted(second))
            for name, specs in first.items():
                assert specs == second[name], f"{form}: {name} was launched {specs} and {second[name]}"
