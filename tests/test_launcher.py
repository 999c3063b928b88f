"""The fast launch path: arguments bound as Triton binds them, one compiled binary per argument
signature, Triton's own path for a new signature. (On GPUs every op test runs through it; here a
stand-in for a Triton kernel records what would be launched.)"""

import types

import pytest
import torch

import tilefuse
from tilefuse.runtime.launcher import FastKernel


class _Compiled:
    def __init__(self, log):
        self.log = log
        self.function, self.packed_metadata = "fn", "meta"

    def run(self, g0, g1, g2, stream, function, packed, meta, enter, leave, *values):
        self.log.append(("fast", (g0, g1, g2), values))

    def launch_metadata(self, grid, stream, *values):
        return None


def _jit_stand_in(fn, log):
    """What FastKernel reads of a JITFunction: fn, params (with is_constexpr) and [grid](...)."""
    import inspect

    params = [types.SimpleNamespace(is_constexpr=p.annotation == "constexpr")
              for p in inspect.signature(fn).parameters.values()]
    compiled = _Compiled(log)

    class Jit:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                log.append(("triton", grid, args, tuple(sorted(kwargs))))
                return compiled
            return launch

    jit = Jit()
    jit.fn, jit.params = fn, params
    return jit


def _kernel(x_ptr, n, seq, BLOCK: "constexpr", FLAG: "constexpr" = 3):  # noqa: F821
    pass


def test_fast_path_binds_and_caches_by_signature(monkeypatch):
    log = []
    k = FastKernel(_jit_stand_in(_kernel, log), do_not_specialize=["seq"])
    k._fast = True
    from tilefuse.runtime import launcher

    monkeypatch.setattr(launcher, "_current_stream", lambda: 7)
    x = torch.zeros(64)
    k[(4,)](x, 32, 5, BLOCK=16, num_warps=4)  # new signature: Triton's path
    k[(4,)](x, 32, 6, BLOCK=16, num_warps=4)  # same signature (seq is not specialised on): fast path
    k[(2, 3)](x, 48, 7, BLOCK=16, num_warps=4)  # 48 % 16 == 0 like 32: fast path, grid padded
    k[(4,)](x, 33, 8, BLOCK=16, num_warps=4)  # 33 is not a multiple of 16: Triton specialises, new binary
    k[(4,)](x, 32, 9, BLOCK=32, num_warps=4)  # another constexpr value: new binary
    k[(4,)](x, 32, 9, BLOCK=16, num_warps=8)  # another launch option: new binary
    kinds = [entry[0] for entry in log]
    assert kinds == ["triton", "fast", "fast", "triton", "triton", "triton"], kinds
    # The fast path passes every argument in signature order, defaults included (as Triton's binder).
    assert log[1][2] == (x, 32, 6, 16, 3) and log[2][1] == (2, 3, 1)


def _ws_kernel(x_ptr, n, BLOCK: "constexpr", WARP_SPEC: "constexpr" = False):  # noqa: F821
    pass


@pytest.mark.parametrize("compiled_warps, warns", [(12, False), (4, True)])
def test_a_launch_asking_warp_specialization_warns_when_triton_declined(monkeypatch, compiled_warps, warns):
    """The first launch of a signature with WARP_SPEC checks the compiled warps: a kernel Triton did
    not specialize has the launch's 4, and the user is told (once per signature); launches without
    WARP_SPEC are not checked."""
    import warnings

    from tilefuse.runtime import launcher

    log = []
    jit = _jit_stand_in(_ws_kernel, log)
    compiled = jit[(1,)]()  # the stand-in's binary
    compiled.metadata = types.SimpleNamespace(num_warps=compiled_warps)
    log.clear()
    k = FastKernel(jit)
    k._fast = True
    monkeypatch.setattr(launcher, "_current_stream", lambda: 7)
    x = torch.zeros(64)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        k[(4,)](x, 32, BLOCK=16, WARP_SPEC=True, num_warps=4)
        k[(4,)](x, 32, BLOCK=16, WARP_SPEC=True, num_warps=4)  # same signature: not checked again
        k[(4,)](x, 32, BLOCK=16, WARP_SPEC=False, num_warps=8)  # no WARP_SPEC: not checked
    said = [str(w.message) for w in seen if "did not warp-specialize" in str(w.message)]
    assert len(said) == (1 if warns else 0), said
    if warns:
        assert "_ws_kernel" in said[0] and "4 warps" in said[0]
    assert launcher.check_specialized("k", 4, types.SimpleNamespace()) is True  # nothing to read: no verdict


# ---------------------------------------------------------------------------------------------
# Launch plans: the recorder on its own (no ranks)
# ---------------------------------------------------------------------------------------------


def _record(fn, inputs, constant_ok=lambda t: True):
    from tilefuse.runtime.plans import Recorder

    rec = Recorder(inputs, constant_ok, "test")
    with rec:
        out = fn(*inputs)
    return rec, out


def test_recorder_replays_torch_ops_and_launches_with_new_tensors(monkeypatch):
    """Views of constants fold; the call's own tensors are substituted; outputs are fresh."""
    from tilefuse.runtime import launcher, plans

    log = []
    k = FastKernel(_jit_stand_in(_kernel, log), do_not_specialize=["seq"])
    k._fast = True
    monkeypatch.setattr(launcher, "_current_stream", lambda: 7)
    ws = torch.zeros(4, 8)  # a constant (a workspace in real calls)

    def call(a, b):
        row = ws[1]  # a view of a constant: folded
        c = torch.empty(a.shape)  # a fresh output per call
        c.copy_(a + b)
        k[(2,)](c, a.shape[0], 5, BLOCK=16)
        k[(2,)](row, 8, 5, BLOCK=16)
        return c, row

    a0, b0 = torch.randn(3, 8), torch.randn(3, 8)
    k[(2,)](a0, 3, 1, BLOCK=16)  # compiles the signatures first (the recorded call is never the first)
    k[(2,)](ws[1], 8, 1, BLOCK=16)
    rec, (c0, _) = _record(call, [a0, b0])
    assert rec.failure is None, rec.failure
    plan = rec.plan((c0, ws[1]))
    assert plan.launches == 2
    log.clear()
    a1, b1 = torch.randn(3, 8), torch.randn(3, 8)
    c1, row = plan.run([a1, b1], plans.Replay(None, 7, False))
    torch.testing.assert_close(c1, a1 + b1)
    assert c1.data_ptr() != c0.data_ptr(), "the output must be allocated again for each call"
    assert row.data_ptr() == ws[1].data_ptr()
    assert [entry[0] for entry in log] == ["fast", "fast"]
    assert log[0][2][0] is c1 and log[1][2][0].data_ptr() == ws[1].data_ptr()


def test_tensors_made_from_nothing_are_the_only_steps_that_may_run_first():
    """A plan's graph form makes the tensors made from no tensor (``torch.empty``, ``torch.full``)
    before its graph launch; an operation reading a tensor (a call's, or a constant that a launch
    before it may write) or writing one keeps its place."""
    ws = torch.zeros(4, 8)

    def call(a):
        c = torch.full(a.shape, float("nan"))  # made from nothing: fresh
        d = torch.empty(2)  # fresh
        e = ws.clone()  # reads a constant
        f = a * 2  # reads the call's tensor
        c.copy_(f)  # writes
        ws.zero_()  # writes a constant
        return c, d, e

    a0 = torch.randn(3, 8)
    rec, out = _record(call, [a0])
    assert rec.failure is None, rec.failure
    plan = rec.plan(out)
    got = [(step.label.split()[-1], step.fresh) for step in plan.steps]
    assert got == [("full", True), ("empty", True), ("clone", False), ("mul", False), ("copy_", False),
                   ("zero_", False)], got


def test_replayed_launches_pass_device_tensors_as_addresses(monkeypatch):
    """A replay hands Triton's launcher device tensors as their addresses (no per-launch pointer
    query): the constants' recorded ones, the new call's own; other tensors stay tensors."""
    from tilefuse.runtime import launcher, plans

    log = []
    k = FastKernel(_jit_stand_in(_kernel, log), do_not_specialize=["seq"])
    k._fast = True
    monkeypatch.setattr(launcher, "_current_stream", lambda: 7)
    ws, host = torch.zeros(8), torch.zeros(2)
    monkeypatch.setattr(plans, "_device_memory", lambda v: isinstance(v, torch.Tensor) and v is not host)

    def call(a):
        c = torch.empty(a.shape)
        k[(2,)](c, a.shape[0], 5, BLOCK=16)
        k[(2,)](ws, 8, 5, BLOCK=16)
        k[(2,)](host, 2, 5, BLOCK=16)
        return c

    k[(2,)](torch.zeros(3), 3, 1, BLOCK=16)  # compiles the signature first
    rec, c0 = _record(call, [torch.randn(3)])
    assert rec.failure is None, rec.failure
    plan = rec.plan(c0)
    log.clear()
    c1 = plan.run([torch.randn(3)], plans.Replay(None, 7, False))
    assert [entry[0] for entry in log] == ["fast", "fast", "fast"]
    assert log[0][2][0] == c1.data_ptr() and type(log[0][2][0]) is int and c1.data_ptr() != c0.data_ptr()
    assert log[1][2][0] == ws.data_ptr() and type(log[1][2][0]) is int
    assert log[2][2][0] is host


def test_recorder_refuses_host_reads_and_unknown_tensors():
    rec, _ = _record(lambda a: a.sum().item(), [torch.randn(4)])
    assert rec.failure and "item" in rec.failure
    stray = torch.randn(4)
    rec, _ = _record(lambda a: a + stray, [torch.randn(4)], constant_ok=lambda t: False)
    assert rec.failure and "neither the call's nor a constant" in rec.failure
    rec, out = _record(lambda a: a * 2, [torch.randn(4)])
    assert rec.failure is None and rec.plan(out) is not None


# ---------------------------------------------------------------------------------------------
# Launch plans in op calls (rank pools)
# ---------------------------------------------------------------------------------------------

OPS = ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce")
VARIANTS = ("bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized")


def _operands(ctx, op, rows, n, k, seed, dtype=torch.float32):
    from ophelpers import randn

    M = rows * ctx.world if op == "gemm_reduce_scatter" else rows
    a = randn((M, k), dtype, ctx.device, seed=seed * 10 + (0 if op == "gemm_all_scatter" else ctx.rank))
    b = randn((k, n), dtype, ctx.device, seed=seed * 10 + 5 + ctx.rank)
    return a, b


def _full_path_counter(modules):
    """Counts calls of ``prepare_gemm``: one per call through a launcher's full host path."""
    from tilefuse.ops.common import launch

    count = [0]
    real = launch.prepare_gemm

    def counting(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    for module in modules:
        module.prepare_gemm = counting
    return count, lambda: [setattr(m, "prepare_gemm", real) for m in modules]


def job_plans_replay(ctx, ops, variants, calls):
    """Each op x variant: ``calls`` calls, fresh operands and poisoned workspaces each time; the third
    call on replays the plan recorded by the second, the full host path does not run."""
    import importlib

    from ophelpers import assert_matches, poison_workspaces

    from tilefuse.ops import registry
    from tilefuse.ops.common import launch

    setups = [importlib.import_module(f"tilefuse.ops.{op}._setup") for op in ops] + [launch]
    full, restore = _full_path_counter([m for m in setups if hasattr(m, "prepare_gemm")])
    tilefuse.clear_workspaces()  # and every plan: earlier tests in this pool may have made these signatures
    try:
        report = {}
        for op in ops:
            for variant in variants:
                fn = registry.get(op, variant)
                before = launch.plan_stats()
                full[0] = 0
                for i in range(calls):
                    a, b = _operands(ctx, op, 24, 40, 32, seed=100 + i)
                    poison_workspaces()
                    got = fn(a, b)
                    ref = registry.get(op, "reference")(a, b)
                    assert_matches(got, ref, torch.float32, 32, ctx.on_gpu, f"{op}/{variant} call {i}",
                                   scale=ctx.world)
                after = launch.plan_stats()
                plan = fn.plan_for((a, b), {})
                report[(op, variant)] = (after["recorded"] - before["recorded"], after["replays"] - before["replays"],
                                         full[0], plan is not None and plan.launches, after["last_failure"])
        return report
    finally:
        restore()


# Launches of a call at world 2-3 whose own kernels begin and end it (no begin kernel, no status
# copy): one kernel, or the op's kernels (a barrier between them passed in the first one's last program).
# gemm_all_scatter's default call (no heap `out`) adds one: the peers' blocks copied out of the heap.
KERNEL_LAUNCHES = {
    **{(op, "wg_specialized"): 1 for op in ("all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce")},
    ("gemm_all_scatter", "wg_specialized"): 2, ("gemm_all_scatter", "fused_sequential"): 2,
    ("gemm_all_reduce", "fused_sequential"): 1,
    # Two launches, the first ending with the barrier between them (call_exit BARRIER):
    ("gemm_reduce_scatter", "fused_sequential"): 2,  # the fused GEMM, the reduction
    ("gemm_all_scatter", "bulk_sync"): 3,  # the GEMM, the scatter (which ends with the closing barrier), the copy
    ("all_gather_gemm", "bulk_sync"): 2,  # the push, the GEMM
    ("all_gather_gemm", "fused_sequential"): 2,  # the publish (which ends with the barrier), the fused GEMM
    ("gemm_reduce_scatter", "bulk_sync"): 2, ("gemm_all_reduce", "bulk_sync"): 2,  # the GEMM, the reduction
    # Two kernels on two streams that begin and end the call together:
    **{(op, "producer_consumer"): 2 for op in ("all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce")},
    ("gemm_all_scatter", "producer_consumer"): 3,
}


@pytest.mark.parametrize("world", [2, 3])
def test_repeat_calls_replay_their_plan(pools, world):
    ops = OPS if world == 2 else ("gemm_all_scatter", "gemm_all_reduce")
    variants = VARIANTS if world == 2 else ("producer_consumer", "wg_specialized")
    for rank_report in pools.run(world, job_plans_replay, ops, variants, 4, timeout=900):
        for (op, variant), (recorded, replays, full, launches, why) in rank_report.items():
            assert recorded == 1 and replays == 2, (op, variant, recorded, replays, why)
            assert full == 2, f"{op}/{variant}: the full host path ran {full} times in 4 calls (2 expected)"
            if (op, variant) in KERNEL_LAUNCHES:
                assert launches == KERNEL_LAUNCHES[op, variant], (op, variant, launches)
            else:
                assert launches and launches >= 2, (op, variant, launches)  # the begin kernel and the op's own


def job_plan_invalidation(ctx):
    """A plan is dropped, and the calls stay correct, after clear_workspaces, an eviction and reset."""
    import os

    from ophelpers import assert_matches

    from tilefuse.ops import registry
    from tilefuse.ops.common import launch

    op, variant = "gemm_reduce_scatter", "wg_specialized"
    fn, ref = registry.get(op, variant), registry.get(op, "reference")

    def check(rows, seed):
        a, b = _operands(ctx, op, rows, 40, 32, seed=seed)
        assert_matches(fn(a, b), ref(a, b), torch.float32, 32, ctx.on_gpu, f"{op}/{variant} rows={rows}",
                       scale=ctx.world)
        return a, b

    def warm(rows, seed):
        for i in range(3):
            a, b = check(rows, seed + i)
        assert fn.plan_for((a, b), {}) is not None, launch.plan_stats()
        return a, b

    seen = []
    a, b = warm(24, 1)
    tilefuse.clear_workspaces()
    seen.append(fn.plan_for((a, b), {}) is None)
    a, b = warm(24, 5)
    tilefuse.reset()
    seen.append(fn.plan_for((a, b), {}) is None)
    a, b = warm(24, 9)
    # Eviction: a budget that holds either shape's workspaces, not both (the second's are 5/3 the first's).
    os.environ["TILEFUSE_WORKSPACE_FRACTION"] = str(2.2 * launch.workspace_bytes() / ctx.heap.size)
    try:
        check(40, 13)  # another shape: evicts the first shape's workspaces, and with them every plan
        seen.append(fn.plan_for((a, b), {}) is None)
        a, b = warm(24, 14)  # the first shape again: its workspaces come back, it records again
        check(40, 17)
    finally:
        os.environ.pop("TILEFUSE_WORKSPACE_FRACTION", None)
    tilefuse.clear_workspaces()
    return seen


def test_plans_dropped_on_clear_reset_and_eviction(pools):
    for seen in pools.run(2, job_plan_invalidation, timeout=600):
        assert seen == [True, True, True], seen


def job_out_pointers(ctx):
    """gemm_all_scatter into caller tensors that change every call: ordinary ones (filled with NaN
    first) and heap tensors at two offsets (written in place); every result correct."""
    from ophelpers import assert_matches

    from tilefuse.ops import registry
    from tilefuse.ops.common import launch

    op = "gemm_all_scatter"
    fn, ref = registry.get(op, "wg_specialized"), registry.get(op, "reference")
    tilefuse.clear_workspaces()  # and every plan: earlier tests in this pool may have made these signatures
    heap_outs = [tilefuse.empty((24, 40 * ctx.world), dtype=torch.float32) for _ in range(2)]
    before = launch.plan_stats()
    for i in range(8):
        a, b = _operands(ctx, op, 24, 40, 32, seed=200 + i)
        out = heap_outs[i % 2] if i >= 4 else torch.empty((24, 40 * ctx.world), device=ctx.device)
        out.fill_(float("nan"))
        got = fn(a, b, out=out)
        assert got is out
        assert_matches(out, ref(a, b), torch.float32, 32, ctx.on_gpu, f"{op} out call {i}")
    after = launch.plan_stats()
    del heap_outs, out, got
    tilefuse.clear_workspaces()
    # Ordinary out: records on call 2, replays 3 and 4. Each heap offset: records on its second call.
    return after["recorded"] - before["recorded"], after["replays"] - before["replays"]


def test_output_pointers_are_substituted(pools):
    for recorded, replays in pools.run(2, job_out_pointers, timeout=600):
        assert (recorded, replays) == (3, 2), (recorded, replays)


def job_auto_fast_path(ctx, op, variant):
    """auto, its bucket decided as ``variant``: after the first calls of a signature, a call neither
    resolves nor decides again (one lookup), replays the variant's plan, and stays correct."""
    from ophelpers import assert_matches

    from tilefuse.ops import dispatch, registry
    from tilefuse.ops.common import launch
    from tilefuse.runtime import hw
    from tilefuse.tuning import tables

    dispatch.clear()
    tilefuse.clear_workspaces()  # and every plan: earlier tests in this pool may have made this signature
    a, b = _operands(ctx, op, 24, 40, 32, seed=300)
    heap = ctx.heap
    bkey = dispatch._bucket_key(op, hw.arch_name(heap.device), ctx.world, dispatch._dtype_name(a.dtype),
                                a.shape[0], b.shape[1], a.shape[1], heap.group, heap)
    dispatch._BUCKETS[bkey] = tables.Choice(variant, None, "set by the test")
    public, ref = getattr(tilefuse, op), registry.get(op, "reference")
    real = dispatch._resolve
    resolved = [0]

    def counting(*args, **kwargs):
        resolved[0] += 1
        return real(*args, **kwargs)

    dispatch._resolve = counting
    try:
        before = launch.plan_stats()
        for i in range(6):
            a, b = _operands(ctx, op, 24, 40, 32, seed=300 + i)
            assert_matches(public(a, b), ref(a, b), torch.float32, 32, ctx.on_gpu, f"auto {op} call {i}",
                           scale=ctx.world)
        after = launch.plan_stats()
    finally:
        dispatch._resolve = real
        dispatch.clear()
    return resolved[0], after["replays"] - before["replays"]


@pytest.mark.parametrize("op, variant", [("gemm_all_reduce", "wg_specialized"), ("all_gather_gemm", "plain")])
def test_auto_maps_a_seen_signature_to_its_plan(pools, op, variant):
    for resolved, replays in pools.run(2, job_auto_fast_path, op, variant, timeout=600):
        # Resolved on the first call only; a fused choice then records on the second call and replays.
        assert (resolved, replays) == (1, 0 if variant == "plain" else 4), (resolved, replays)


def job_strided_operands(ctx, op, variant):
    """Operands that change layout and alignment from call to call: a column-major ``b`` and an
    ``a`` that is a column slice of a wider matrix starting at element 0 or 1 (another 16-byte
    alignment: another signature). Each signature records on its second call and replays after;
    every result (and all_gather_gemm's gathered A) is correct."""
    from ophelpers import assert_matches, randn

    from tilefuse.ops import registry

    fn, ref = registry.get(op, variant), registry.get(op, "reference")
    kw = {"return_gathered": True} if op == "all_gather_gemm" else {}
    for i in range(8):
        rows = 24 * ctx.world if op == "gemm_reduce_scatter" else 24
        wide = randn((rows, 40), torch.float32, ctx.device, seed=400 + 10 * i + ctx.rank)
        a = wide[:, i % 2:i % 2 + 32]  # [rows, 32], leading stride 40
        b = randn((40, 32), torch.float32, ctx.device, seed=401 + 10 * i + ctx.rank).t()  # column-major
        got, want = fn(a, b, **kw), ref(a, b, **kw)
        for g, w, what in zip(got if kw else (got,), want if kw else (want,), ("c", "gathered a")):
            assert_matches(g, w, torch.float32, 32, ctx.on_gpu, f"{op}/{variant} call {i}: {what}", scale=ctx.world)
    return True


@pytest.mark.parametrize("op, variant", [("all_gather_gemm", "producer_consumer"),
                                         ("gemm_reduce_scatter", "fused_sequential")])
def test_strided_and_misaligned_operands(pools, op, variant):
    assert all(pools.run(2, job_strided_operands, op, variant, timeout=600))


def job_copy_engine_replay(ctx):
    """all_gather_gemm's copy_engine form (rows pulled from the peers' heaps, then their flags
    released) records and replays like the others; results and the gathered A correct."""
    from ophelpers import assert_matches, poison_workspaces

    from tilefuse.ops import registry
    from tilefuse.ops.common import launch
    from tilefuse.ops.common.config import Config

    op = "all_gather_gemm"
    fn, ref = registry.get(op, "copy_engine"), registry.get(op, "reference")
    cfg = Config(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=1, GEMM_SMS=4, COMM_SMS=0)
    tilefuse.clear_workspaces()
    before = launch.plan_stats()
    for i in range(4):
        a, b = _operands(ctx, op, 40, 24, 32, seed=500 + i)
        poison_workspaces()
        (c, ag), (ref_c, ref_ag) = fn(a, b, config=cfg, return_gathered=True), ref(a, b, return_gathered=True)
        assert torch.equal(ag, ref_ag), f"call {i}: a_gathered differs from the all-gather"
        assert_matches(c, ref_c, torch.float32, 32, ctx.on_gpu, f"copy engines call {i}", scale=ctx.world)
    after = launch.plan_stats()
    return after["recorded"] - before["recorded"], after["replays"] - before["replays"], after["last_failure"]


def test_copy_engine_form_replays(pools):
    for recorded, replays, why in pools.run(2, job_copy_engine_replay, timeout=600):
        assert (recorded, replays) == (1, 2), (recorded, replays, why)


def job_raw_stream_forks(ctx, ops, calls):
    """A replayed producer_consumer call forks its side stream and joins it back by raw handles (two
    event records and two waits per call, no stream switch in torch), with correct results; the first
    two calls (full path, recording) go through torch's streams and events."""
    from ophelpers import assert_matches, environment, poison_workspaces

    from tilefuse.ops import registry
    from tilefuse.runtime import cudart

    counts = {"record": 0, "wait": 0, "set_stream": 0}
    real = {"record": cudart.record, "wait": cudart.wait, "set_stream": torch.cuda.set_stream}

    def counting(name):
        def fn(*args):
            counts[name] += 1
            return real[name](*args)
        return fn

    tilefuse.clear_workspaces()
    report = {}
    # the plan's launches, not its graph form (the default; said here so a run with the switch set holds)
    with environment(TILEFUSE_GRAPH_RELAUNCH="0"):
        try:
            cudart.record, cudart.wait = counting("record"), counting("wait")
            torch.cuda.set_stream = counting("set_stream")
            for op in ops:
                fn, ref = registry.get(op, "producer_consumer"), registry.get(op, "reference")
                seen = []
                for i in range(calls):
                    a, b = _operands(ctx, op, 24, 40, 32, seed=700 + i)
                    poison_workspaces()
                    before = dict(counts)
                    got = fn(a, b)
                    seen.append(tuple(counts[k] - before[k] for k in ("record", "wait", "set_stream")))
                    assert_matches(got, ref(a, b), torch.float32, 32, ctx.on_gpu, f"{op} call {i}",
                                   scale=ctx.world)
                report[op] = seen
        finally:
            cudart.record, cudart.wait, torch.cuda.set_stream = real["record"], real["wait"], real["set_stream"]
    return report


def test_producer_consumer_replays_fork_by_raw_handles(pools, on_gpu):
    if not on_gpu:
        pytest.skip("CPU launches are synchronous: producer_consumer has no second stream to fork")
    for report in pools.run(2, job_raw_stream_forks, OPS, 5, timeout=600):
        for op, seen in report.items():
            assert seen[0][:2] == (0, 0) and seen[0][2] >= 2, (op, seen)  # full path: torch's streams
            assert seen[2:] == [(2, 2, 0)] * 3, (op, seen)  # replays: fork and join by raw handles


def test_recorder_says_whether_a_block_holds_only_fast_launches():
    """What a producer_consumer recording asks of its side block before its replays may fork by raw
    handles: only launches through a compiled launcher since the mark (a torch operation, a host step
    or a launch without a compiled binary runs on torch's current stream)."""
    from tilefuse.runtime.plans import Recorder

    rec = Recorder([], lambda t: True, "test")
    rec.steps.append(("torch", None, set(), False, []))
    start = rec.mark()
    assert rec.fast_launches_since(start)  # nothing since the mark
    rec.steps.append(("launch", ("kernel", (1,), None, ("compiled", None, set())), set(), False, []))
    assert rec.fast_launches_since(start) and not rec.fast_launches_since(0)
    for other in (("launch", ("kernel", (1,), None, None)), ("torch", None), ("host", None), ("call", None)):
        rec.steps.append(other + (set(), False, []))
        assert not rec.fast_launches_since(start), other
        rec.steps.pop()


def test_environment_switches_read_as_strings(monkeypatch):
    """The launchers' per-call switches read the environment's raw mapping (bytes on POSIX): they
    must still compare as os.environ's strings, so that ``=0`` turns a switch off."""
    from tilefuse.ops.common import launch

    read = launch.env_reader("TILEFUSE_TEST_SWITCH", "TILEFUSE_TEST_UNSET")
    monkeypatch.delenv("TILEFUSE_TEST_UNSET", raising=False)
    monkeypatch.delenv("TILEFUSE_TEST_SWITCH", raising=False)
    assert read() == (None, None)
    for value in ("0", "1", ""):
        monkeypatch.setenv("TILEFUSE_TEST_SWITCH", value)
        assert read() == (value, None)
    monkeypatch.setenv("TILEFUSE_BEGIN_BEFORE_GEMM", "0")
    assert launch.begin_aside()
    monkeypatch.setenv("TILEFUSE_BEGIN_BEFORE_GEMM", "1")
    assert not launch.begin_aside()
