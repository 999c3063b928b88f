"""Launch plans replayed as one CUDA graph launch (tilefuse.runtime.relaunch): which addresses a call
rewrites, which plans get a graph form, and on a GPU, every op x variant relaunched with new tensors
every call against the reference and, bit for bit, against the plan replayed launch by launch."""

import pytest
import torch

import tilefuse
from tilefuse.runtime import relaunch

OPS = ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce")
VARIANTS = ("bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized")
ENV = "TILEFUSE_GRAPH_RELAUNCH"


def test_addresses_are_found_by_range_and_offset():
    # slots 0, 1: the call's arguments; 2: a tensor the plan made (its output), 3: a view of it
    ranges = [(0, 1000, 100), (1, 2000, 64), (2, 5000, 400), (3, 5100, 50)]
    words = [1000, 1099, 1100, 2032, 5000, 5120, 5399, 7, 1 << 40]
    found = relaunch.find_addresses(words, ranges, 2)
    # the end of a range is outside it; inside two ranges the lower slot wins (a view's base); others skipped
    assert found == [(0, 0, 0), (1, 0, 99), (3, 1, 32), (4, 2, 0), (5, 2, 120), (6, 2, 399)], found


def test_overlapping_arguments_give_no_form():
    assert relaunch.find_addresses([1000], [(0, 1000, 100), (1, 1050, 100)], 2) is None
    assert relaunch.find_addresses([1000], [(0, 1000, 100), (1, 900, 101)], 2) is None
    # touching, not overlapping; and a made tensor inside an argument (a view of it) is no conflict
    assert relaunch.find_addresses([1100], [(0, 1000, 100), (1, 1100, 10)], 2) == [(0, 1, 0)]
    assert relaunch.find_addresses([1010], [(0, 1000, 100), (1, 5000, 8), (2, 1008, 8)], 2) == [(0, 0, 10)]
    # an empty tensor has no range
    assert relaunch.find_addresses([1000], [(0, 1000, 0), (1, 1000, 8)], 2) == [(0, 1, 0)]


def test_span_covers_strided_views():
    from tilefuse.runtime.heap import span_bytes

    t = torch.empty(6, 8)
    assert span_bytes(t) == 6 * 8 * 4
    assert span_bytes(t.t()) == 6 * 8 * 4
    assert span_bytes(t[:, 2:4]) == (5 * 8 + 1 + 1) * 4
    assert span_bytes(t[1:1]) == 0
    assert span_bytes(t[::2]) == (2 * 16 + 7 + 1) * 4
    assert span_bytes(torch.empty(3, 1).expand(3, 5)) == 3 * 4


def test_which_plans_get_a_form():
    from tilefuse.runtime.plans import Plan

    none, one, two = (Plan([], 2, 2, None, str(n), n) for n in (0, 1, 2))
    for on in (None, "", "1"):  # on by default: every plan with a launch
        assert [relaunch.wanted(p, on) for p in (none, one, two)] == [False, True, True]
    assert [relaunch.wanted(p, "0") for p in (none, one, two)] == [False, False, False]
    two.graph = False  # tried, and it could not have one
    assert not relaunch.wanted(two, "1")


def _operands(ctx, op, rows, n, k, seed, shift=False):
    """The op's operands (gemm_all_scatter's ``a`` the same on every rank); with ``shift``, ``a``
    is a view one row into a larger tensor (another address, a storage offset)."""
    from ophelpers import randn

    M = rows * ctx.world if op == "gemm_reduce_scatter" else rows
    a = randn((M, k), torch.float32, ctx.device, seed=seed * 10 + (0 if op == "gemm_all_scatter" else ctx.rank))
    b = randn((k, n), torch.float32, ctx.device, seed=seed * 10 + 5 + ctx.rank)
    if shift:
        big = torch.empty((M + 1, k), device=ctx.device)
        big[1:] = a
        a = big[1:]
    return a, b


def job_relaunch_every_variant(ctx, ops, variants, calls):
    """Every op x variant, ``calls`` calls with new operands (every other one a view at an offset),
    poisoned workspaces, graph forms for every plan: each result against the reference, and from the
    fourth call on, bit for bit against the same call replayed launch by launch."""
    from ophelpers import assert_matches, environment, poison_workspaces

    from tilefuse.ops import registry
    from tilefuse.runtime import plans

    tilefuse.clear_workspaces()  # and every plan
    report = {}
    # The harness's NaN outputs (TILEFUSE_DEBUG_POISON): made before each graph launch, so a tile the
    # graph leaves unwritten shows; workspaces are poisoned below.
    with environment(**{ENV: "1", "TILEFUSE_DEBUG_POISON": "1"}):
        for op in ops:
            for variant in variants:
                fn, ref = registry.get(op, variant), registry.get(op, "reference")
                before = plans.STATS["relaunches"]
                for i in range(calls):
                    a, b = _operands(ctx, op, 24, 40, 32, seed=800 + i, shift=i % 2 == 1)
                    poison_workspaces()
                    got = fn(a, b)
                    what = f"{op}/{variant} call {i}"
                    assert_matches(got, ref(a, b), torch.float32, 32, ctx.on_gpu, what, scale=ctx.world)
                    if i >= 3:
                        with environment(**{ENV: "0"}):
                            again = fn(a, b)
                        assert torch.equal(got, again), f"{what}: the graph form and the plan's launches differ"
                plan = fn.plan_for((a, b), {})
                form = None if plan is None else plan.graph
                report[(op, variant)] = (plans.STATS["relaunches"] - before, type(form).__name__,
                                         relaunch.LAST_REFUSAL[0])
    tilefuse.clear_workspaces()
    return report


@pytest.mark.parametrize("world", [2, 3])
def test_every_variant_relaunched_as_a_graph(pools, on_gpu, world):
    if not on_gpu:
        pytest.skip("CUDA graphs need a GPU")
    for report in pools.run(world, job_relaunch_every_variant, OPS, VARIANTS, 6, timeout=900):
        print("\n".join(f"{op}/{variant}: {form}, {n} relaunches ({why})" for (op, variant), (n, form, why)
                        in report.items()))
        problems = []
        for (op, variant), (relaunches, form, why) in report.items():
            # every plan has a form (gemm_all_scatter's copy of the peers' blocks out of the heap is a
            # launch of its own); calls 2-5 replay it
            if form != "GraphForm" or relaunches != 4:
                problems.append((op, variant, form, relaunches, why))
        assert not problems, problems


def job_relaunch_overlapping_and_out(ctx):
    """Arguments that overlap one another: no graph form, still correct. gemm_all_scatter into a
    new ordinary ``out`` every call, relaunched (world 1: the result is ``out`` itself, no copy):
    every result correct and in ``out``."""
    from ophelpers import assert_matches, environment

    from tilefuse.ops import registry

    tilefuse.clear_workspaces()
    with environment(**{ENV: "1"}):
        op = "gemm_all_reduce"
        fn, ref = registry.get(op, "bulk_sync"), registry.get(op, "reference")
        forms = []
        for i in range(5):
            g = torch.Generator().manual_seed(900 + i + ctx.rank)
            buf = torch.randn(40 * 32, generator=g).to(ctx.device)
            a, b = buf[: 24 * 32].view(24, 32), buf[: 32 * 40].view(32, 40)  # the same memory, read twice
            assert_matches(fn(a, b), ref(a, b), torch.float32, 32, ctx.on_gpu, f"overlapping call {i}",
                           scale=ctx.world)
            plan = fn.plan_for((a, b), {})
            forms.append(None if plan is None else plan.graph)
        op = "gemm_all_scatter"
        fn, ref = registry.get(op, "producer_consumer"), registry.get(op, "reference")
        for i in range(5):
            a, b = _operands(ctx, op, 24, 40, 32, seed=950 + i)
            out = torch.full((24, 40 * ctx.world), float("nan"), device=ctx.device)
            got = fn(a, b, out=out)
            assert got is out
            assert_matches(out, ref(a, b), torch.float32, 32, ctx.on_gpu, f"{op} out call {i}")
        plan = fn.plan_for((a, b), {"out": out})
        form = None if plan is None else type(plan.graph).__name__
    tilefuse.clear_workspaces()
    return forms, form


def test_overlapping_arguments_and_new_outputs(pools, on_gpu):
    if not on_gpu:
        pytest.skip("CUDA graphs need a GPU")
    for forms, out_form in pools.run(1, job_relaunch_overlapping_and_out, timeout=600):
        assert forms[:2] == [None, None] and forms[2:] == [False] * 3, forms  # replays, without a form
        assert out_form == "GraphForm", out_form


class _FakeGraph:
    def raw_cuda_graph_exec(self):
        return 0


class _FakeDriver:
    """Stands in for the driver: records what a relaunch writes and launches."""

    def __init__(self, set_error: int = 0):
        self.set_error, self.set_calls, self.launched = set_error, [], 0

    def set_params(self, exec_, handle, ref):
        self.set_calls.append(handle.value)
        return self.set_error

    def launch(self, exec_, stream):
        self.launched += 1
        return 0


def _fake_form(driver, words):
    """A graph form of a plan that returns its first argument, with one kernel node whose 16 bytes of
    parameters hold the rewritten ``words`` ``(offset, slot, delta)``."""
    import ctypes

    from tilefuse.runtime import plans

    plan = plans.Plan([], 2, 2, plans._Ref(0), "fake", 1)
    buf = ctypes.create_string_buffer(16)
    node = relaunch._Node(ctypes.c_void_p(7), relaunch._KernelNodeParams(), [(0, 8), (8, 8)], buf, words)
    form = relaunch.GraphForm(plan, _FakeGraph(), [node], driver)
    plan.graph = form
    return plan, form, buf


def test_a_relaunch_writes_the_call_addresses_then_launches():
    import struct

    from tilefuse.runtime import plans

    drv = _FakeDriver()
    plan, form, buf = _fake_form(drv, [(0, 1, 16), (8, 0, 0)])
    a, b = torch.arange(4.0), torch.arange(8.0)
    got = form.run([a, b], plans.Replay(None, 0, False))
    assert got is a
    assert struct.unpack_from("QQ", buf, 0) == (b.data_ptr() + 16, a.data_ptr())
    assert drv.set_calls == [7] and drv.launched == 1


def test_a_failed_relaunch_replays_the_plan_instead():
    from tilefuse.runtime import plans

    drv = _FakeDriver(set_error=999)
    live, retired = relaunch.LIVE[0], list(relaunch._RETIRED)
    try:
        plan, form, _ = _fake_form(drv, [(0, 0, 0)])
        a, b = torch.zeros(2), torch.ones(2)
        replays = plans.STATS["replays"]
        assert form.run([a, b], plans.Replay(None, 0, False)) is a  # the plan's own replay
        assert drv.launched == 0 and plan.graph is False and plans.STATS["replays"] == replays + 1
        assert "error 999" in relaunch.LAST_REFUSAL[0]
        # retired: it keeps its graph until the next device synchronization, none of the plan's steps
        assert relaunch._RETIRED[-1] is form and form.plan is None and not (form.before or form.after)
        assert not relaunch.wanted(plan, "1")  # not asked again
    finally:
        relaunch.LIVE[0] = live
        relaunch._RETIRED[:] = retired


def test_a_failed_capture_leaves_the_plan_its_launches_but_a_runtime_verdict_raises(monkeypatch):
    from tilefuse.ops.common import launch
    from tilefuse.runtime import plans, world

    def failing(err):
        def capture(plan, inputs, call):
            raise err
        return capture

    plan = plans.Plan([], 1, 1, None, "fake", 1)
    monkeypatch.setattr(relaunch, "capture", failing(RuntimeError("the capture broke")))
    assert launch._graph_form(plan, [], None) is None and plan.graph is False
    assert "the capture broke" in launch.plan_stats()["last_graph_refusal"]
    plan = plans.Plan([], 1, 1, None, "fake", 1)
    monkeypatch.setattr(relaunch, "capture", failing(world.PeerExitedError("rank 1 exited")))
    with pytest.raises(world.PeerExitedError):  # not swallowed: the call fails as any call would
        launch._graph_form(plan, [], None)


def test_a_kernel_node_is_read_word_by_word():
    """read_node: the node's parameters copied at the layout's offsets, and every 8-byte-aligned word
    inside them (a 4-byte parameter holds none; a 16-byte structure two)."""
    import ctypes
    import struct

    values = [ctypes.c_uint64(0x1000), ctypes.c_int32(7), (ctypes.c_uint64 * 2)(0x2000, 0x3000)]
    layout = [(0, 8), (8, 4), (16, 16)]
    ptrs = (ctypes.c_void_p * 3)(*[ctypes.addressof(v) for v in values])

    class Driver:
        def get_params(self, handle, ref):
            p = ctypes.cast(ref, ctypes.POINTER(relaunch._KernelNodeParams)).contents
            p.func, p.kernelParams = 1, ctypes.cast(ptrs, ctypes.POINTER(ctypes.c_void_p))
            return 0

        def func_param(self, func, i, off, size):
            if i >= len(layout):
                return 1
            size_t = ctypes.POINTER(ctypes.c_size_t)
            ctypes.cast(off, size_t)[0], ctypes.cast(size, size_t)[0] = layout[i]
            return 0

    p, got_layout, buf, at, words = relaunch.read_node(Driver(), ctypes.c_void_p(5))
    assert got_layout == layout and at == [0, 16, 24] and words == [0x1000, 0x2000, 0x3000]
    assert struct.unpack_from("i", buf, 8)[0] == 7
