"""The fast launch path: arguments bound as Triton binds them, one compiled binary per argument
signature, Triton's own path for a new signature. (On GPUs every op test runs through it; here a
stand-in for a Triton kernel records what would be launched.) Then op calls through the launchers:
repeated calls, changing pointers and layouts, cleared and evicted workspaces."""

import contextlib
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
    k[(2, 3)](x[16:], 32, 7, BLOCK=16, num_warps=4)  # another tensor, as aligned: fast path, grid padded
    k[(4,)](x, 48, 8, BLOCK=16, num_warps=4)  # a specialised int's new value: Triton's path once, then fast
    k[(4,)](x, 48, 8, BLOCK=16, num_warps=4)
    k[(4,)](x, 33, 8, BLOCK=16, num_warps=4)  # 33 is not a multiple of 16: Triton specialises, new binary
    k[(4,)](x, 32, 9, BLOCK=32, num_warps=4)  # another constexpr value: new binary
    k[(4,)](x, 32, 9, BLOCK=16, num_warps=8)  # another launch option: new binary
    kinds = [entry[0] for entry in log]
    assert kinds == ["triton", "fast", "fast", "triton", "fast", "triton", "triton", "triton"], kinds
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
# Op calls through the launchers (rank pools)
# ---------------------------------------------------------------------------------------------

OPS = ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce")
VARIANTS = ("bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized")


def _operands(ctx, op, rows, n, k, seed, dtype=torch.float32):
    from ophelpers import randn

    M = rows * ctx.world if op == "gemm_reduce_scatter" else rows
    a = randn((M, k), dtype, ctx.device, seed=seed * 10 + (0 if op == "gemm_all_scatter" else ctx.rank))
    b = randn((k, n), dtype, ctx.device, seed=seed * 10 + 5 + ctx.rank)
    return a, b


@contextlib.contextmanager
def _counting_launches():
    """Counts the launches of tilefuse's kernels (every one goes through FastKernel); ``count[1:]``
    are their launcher keys (what picks the binary on a GPU)."""
    count = [0]
    real = FastKernel.__getitem__

    def counting(self, grid):
        count[0] += 1
        launch = real(self, grid)

        def keyed(*args, **kwargs):
            count.append((self.jit_fn.fn.__name__, self._signature(*self._bind(args, kwargs))))
            return launch(*args, **kwargs)

        return keyed

    FastKernel.__getitem__ = counting
    try:
        yield count
    finally:
        FastKernel.__getitem__ = real


def job_repeat_calls(ctx, ops, variants, calls):
    """Each op x variant: ``calls`` calls, fresh operands and poisoned workspaces each time, every
    result correct; the kernel launches of each call after the first (which creates the workspaces),
    and whether those calls' launcher keys were the same (a key that changes from call to call would
    send every launch on a GPU through Triton's slow path)."""
    from ophelpers import assert_matches, poison_workspaces

    from tilefuse.ops import registry

    tilefuse.clear_workspaces()  # earlier tests in this pool may have made these shapes' workspaces
    report = {}
    for op in ops:
        for variant in variants:
            fn = registry.get(op, variant)
            launches, keys = [], []
            for i in range(calls):
                a, b = _operands(ctx, op, 24, 40, 32, seed=100 + i)
                poison_workspaces()
                with _counting_launches() as count:
                    got = fn(a, b)
                launches.append(count[0])
                keys.append(count[1:])
                ref = registry.get(op, "reference")(a, b)
                assert_matches(got, ref, torch.float32, 32, ctx.on_gpu, f"{op}/{variant} call {i}", scale=ctx.world)
            report[(op, variant)] = launches[1:] + [all(k == keys[1] for k in keys[2:])]
    return report


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


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_repeat_calls_run_the_kernels_of_their_variant(pools, world):
    ops = OPS if world == 2 else ("gemm_all_scatter", "gemm_all_reduce")
    variants = VARIANTS if world == 2 else ("producer_consumer", "wg_specialized")
    for rank_report in pools.run(world, job_repeat_calls, ops, variants, 3, timeout=900):
        for (op, variant), (*launches, same_keys) in rank_report.items():
            assert launches[0] == launches[1], (op, variant, launches)
            assert same_keys, f"{op}/{variant}: a launcher key changed between calls of one signature"
            if (op, variant) in KERNEL_LAUNCHES:
                assert launches[0] == KERNEL_LAUNCHES[op, variant], (op, variant, launches)
            else:
                assert launches[0] >= 2, (op, variant, launches)  # the begin kernel and the op's own


def job_cleared_state(ctx):
    """Calls stay correct after clear_workspaces, reset and an eviction of their workspaces."""
    from ophelpers import assert_matches

    from tilefuse.ops import registry
    from tilefuse.ops.common import arena

    op, variant = "gemm_reduce_scatter", "wg_specialized"
    fn, ref = registry.get(op, variant), registry.get(op, "reference")

    def check(rows, seed, calls=1):
        for i in range(calls):
            a, b = _operands(ctx, op, rows, 40, 32, seed=seed + i)
            assert_matches(fn(a, b), ref(a, b), torch.float32, 32, ctx.on_gpu, f"{op}/{variant} rows={rows}",
                           scale=ctx.world)

    check(24, 1, calls=3)
    tilefuse.clear_workspaces()
    check(24, 5, calls=3)
    tilefuse.reset()
    check(24, 9, calls=3)
    keys = arena.workspace_keys()
    # Eviction: a budget that holds either shape's workspaces, not both (the second's are 5/3 the first's).
    saved, arena.WORKSPACE_FRACTION = arena.WORKSPACE_FRACTION, 2.2 * arena.workspace_bytes() / ctx.heap.size
    try:
        check(40, 13)  # another shape: evicts (some of) the first shape's workspaces
        evicted = any(k not in arena.workspace_keys() for k in keys)
        check(24, 14, calls=3)  # the first shape again: its workspaces come back
        check(40, 17)
    finally:
        arena.WORKSPACE_FRACTION = saved
    tilefuse.clear_workspaces()
    return evicted


def test_calls_after_clear_reset_and_eviction(pools):
    assert all(pools.run(2, job_cleared_state, timeout=600))


def job_out_pointers(ctx):
    """gemm_all_scatter into caller tensors that change every call: ordinary ones (filled with NaN
    first) and heap tensors at two offsets (written in place); every result correct."""
    from ophelpers import assert_matches

    from tilefuse.ops import registry

    op = "gemm_all_scatter"
    fn, ref = registry.get(op, "wg_specialized"), registry.get(op, "reference")
    tilefuse.clear_workspaces()
    heap_outs = [tilefuse.empty((24, 40 * ctx.world), dtype=torch.float32) for _ in range(2)]
    for i in range(8):
        a, b = _operands(ctx, op, 24, 40, 32, seed=200 + i)
        out = heap_outs[i % 2] if i >= 4 else torch.empty((24, 40 * ctx.world), device=ctx.device)
        out.fill_(float("nan"))
        got = fn(a, b, out=out)
        assert got is out
        assert_matches(out, ref(a, b), torch.float32, 32, ctx.on_gpu, f"{op} out call {i}")
    del heap_outs, out, got
    tilefuse.clear_workspaces()
    return True


def test_output_pointers_change_between_calls(pools):
    assert all(pools.run(2, job_out_pointers, timeout=600))


def job_auto_resolves_once(ctx, op, variant):
    """auto, its bucket decided as ``variant``: after the first call of a signature, a call neither
    resolves nor decides again (one lookup), and stays correct."""
    from ophelpers import assert_matches

    from tilefuse.ops import dispatch, registry
    from tilefuse.tuning import tables

    dispatch.clear()
    tilefuse.clear_workspaces()
    a, b = _operands(ctx, op, 24, 40, 32, seed=300)
    bkey = dispatch._call_facts(op, a, b, None)[-1]
    dispatch._BUCKETS[bkey] = tables.Choice(variant, None, "set by the test")
    public, ref = getattr(tilefuse, op), registry.get(op, "reference")
    real = dispatch.resolve
    resolved = [0]

    def counting(*args, **kwargs):
        resolved[0] += 1
        return real(*args, **kwargs)

    dispatch.resolve = counting
    try:
        for i in range(4):
            a, b = _operands(ctx, op, 24, 40, 32, seed=300 + i)
            assert_matches(public(a, b), ref(a, b), torch.float32, 32, ctx.on_gpu, f"auto {op} call {i}",
                           scale=ctx.world)
    finally:
        dispatch.resolve = real
        dispatch.clear()
    return resolved[0]


@pytest.mark.parametrize("op, variant", [("gemm_all_reduce", "wg_specialized"), ("all_gather_gemm", "plain")])
def test_auto_resolves_a_signature_once(pools, op, variant):
    for resolved in pools.run(2, job_auto_resolves_once, op, variant, timeout=600):
        assert resolved == 1, resolved


def job_strided_operands(ctx, op, variant):
    """Operands that change layout and alignment from call to call: a column-major ``b`` and an
    ``a`` that is a column slice of a wider matrix starting at element 0 or 1 (another 16-byte
    alignment); every result (and all_gather_gemm's gathered A) is correct."""
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


def test_environment_switches_read_as_strings(monkeypatch):
    """Per-call switches read the environment's raw mapping (bytes on POSIX): they must still
    compare as os.environ's strings, so that ``=0`` turns a switch off."""
    from tilefuse.runtime import _env

    read = _env.env_reader("TILEFUSE_TEST_SWITCH", "TILEFUSE_TEST_UNSET")
    monkeypatch.delenv("TILEFUSE_TEST_UNSET", raising=False)
    monkeypatch.delenv("TILEFUSE_TEST_SWITCH", raising=False)
    assert read() == (None, None)
    for value in ("0", "1", ""):
        monkeypatch.setenv("TILEFUSE_TEST_SWITCH", value)
        assert read() == (value, None)


def test_tuple_arguments_specialise_as_their_elements():
    """A ``call`` tuple's pointers keep their alignment in the binary's key, and its integers whether
    they are 1 or multiples of 16, even where the parameter is not specialised (Triton 3.6 builds a
    1 in): a new workspace generation 2 after 1 must not reuse the binary made for 1."""
    from tilefuse.runtime.launcher import _spec

    t = torch.zeros(8)
    call = (t, t[1:], 3, 2**40, 1)
    assert _spec(call, False) == _spec((t, t[1:], 5, 2**41, 1), False)
    assert _spec(call, False) != _spec((t[1:], t[1:], 3, 2**40, 1), False), "alignment of a pointer"
    assert _spec(call, False) != _spec((t, t[1:], 3, 2**40, 2), False), "an integer 1 in the tuple"
    assert _spec(call, False) != _spec((t, t[1:], 3, 2**40, 16), False), "divisibility by 16 in the tuple"


def test_written_out_keys_tell_apart_what_triton_specialises_on():
    """The launcher's per-kernel key function (written out for the first launch's kinds of arguments)
    gives one key for calls of the same values but other tensors of the same dtype and alignment,
    and for unspecialised integers of one width; another where a pointer's alignment, an int's
    width or divisibility (a specialised int: its value), a constexpr or a tuple's length differs,
    or a bool stands where an int was; an argument of another kind makes it raise, and the launch
    takes the generic key instead."""
    from tilefuse.runtime.launcher import _key_function

    t = torch.zeros(64)
    first = [t, 48, (t, 3, 7), 128, None, 5]
    key = _key_function(first, [False, False, False, True, False, False], dns={5})
    assert key(first) == key([t[4:], 48, (t[8:], 3, 7), 128, None, 2**20 + 1])
    for other in ([t[1:], 48, (t, 3, 7), 128, None, 5], [t, 47, (t, 3, 7), 128, None, 5],
                  [t, 32, (t, 3, 7), 128, None, 5], [t, 2**40, (t, 3, 7), 128, None, 5],
                  [t, 48, (t, 3, 7), 64, None, 5], [t, 48, (t[1:], 3, 7), 128, None, 5],
                  [t, 48, (t, 3, 7, 1), 128, None, 5], [t, 48, (t, 1, 7), 128, None, 5],
                  [t, 48, (t, 3, 32), 128, None, 5], [t, 48, (t, True, 7), 128, None, 5],
                  [t, 48, (t, 3, 7), 128, None, 2**40]):
        assert key(other) != key(first), other
    with pytest.raises((AttributeError, TypeError, IndexError)):
        key([None, 48, (t, 3, 7), 128, None, 5])
    empty = _key_function([(), t], [False, False], dns=set())  # a tuple with nothing in it keys by its length
    assert empty([(), t]) == empty([(), t[4:]]) and empty([(), t]) != empty([(1,), t])


def test_a_call_that_does_not_bind_goes_through_triton(monkeypatch):
    """The launcher's written-out binder refuses a call with an argument missing or given twice, and
    the call goes through Triton's own path (which raises, naming it)."""
    log = []
    k = FastKernel(_jit_stand_in(_kernel, log))
    k._fast = True
    from tilefuse.runtime import launcher

    monkeypatch.setattr(launcher, "_current_stream", lambda: 7)
    x = torch.zeros(64)
    k[(1,)](x, 32, BLOCK=16)  # seq missing
    k[(1,)](x, 32, 5, BLOCK=16, n=3)  # n twice
    assert [entry[0] for entry in log] == ["triton", "triton"], log
    assert k._bind((x, 32, 5), {"BLOCK": 16, "num_warps": 4})[0] == [x, 32, 5, 16, 3]
