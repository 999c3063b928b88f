"""The synchronization protocol under faults: every call ends correct or raising on every rank.

One-sided argument errors, calls that differ between ranks after their workspaces are warm, a peer
slower than the wait bound (poison, then reset), a device that does not finish (GPU), sequence numbers
at the int64 wrap point, and two threads making calls on one rank. W = 2 and 3, CPU ranks (errors
raise at the failing call there) and the GPU.
"""

import threading
import time

import pytest
import torch
import triton
import triton.language as tl
from ophelpers import assert_matches, randn

import tilefuse
from tilefuse.ops import registry
from tilefuse.runtime import control_block, primitives, world
from tilefuse.runtime.protocol import now_ns

OPS = ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter")
VARIANTS = ("bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized")


def _operands(ctx, op, rows, n, k, seed):
    M = rows * ctx.world if op == "gemm_reduce_scatter" else rows
    a = randn((M, k), torch.float32, ctx.device, seed=seed * 10 + (0 if op == "gemm_all_scatter" else ctx.rank))
    b = randn((k, n), torch.float32, ctx.device, seed=seed * 10 + 5 + ctx.rank)
    return a, b


def _check(ctx, op, variant, rows, n, k, seed, **kwargs):
    a, b = _operands(ctx, op, rows, n, k, seed)
    ref = registry.get(op, "reference")(a, b)
    got = registry.get(op, variant)(a, b, **kwargs)
    assert_matches(got, ref, torch.float32, k, ctx.on_gpu, f"{op}/{variant}", scale=ctx.world)


def sync_errors(job):
    """Run ``job`` with errors raised at the failing call itself (the CPU backend's behaviour; on a
    GPU it costs a device sync per call)."""
    import functools

    @functools.wraps(job)
    def run(ctx, *args):
        old = world.set_sync_errors(True)
        try:
            return job(ctx, *args)
        finally:
            world.set_sync_errors(old)

    return run


@sync_errors
def job_one_sided_error(ctx, op, variant):
    """Rank 0's call fails its checks; every rank raises for that call; the next calls are correct."""
    _check(ctx, op, variant, 24, 40, 32, seed=1)
    a, b = _operands(ctx, op, 24, 40, 32, seed=2)
    if ctx.rank == 0:
        a = a.to(torch.int32)  # a bad dtype on one rank only
    with pytest.raises((TypeError, tilefuse.PeerCallError)) as info:
        registry.get(op, variant)(a, b)
    kind = type(info.value).__name__
    if ctx.rank != 0:
        assert "failed on rank 0" in str(info.value), str(info.value)
    for seed in (3, 4):
        _check(ctx, op, variant, 24, 40, 32, seed=seed)
    tilefuse.barrier()
    return kind


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("op", OPS)
def test_one_sided_argument_error(pools, world, op):
    variant = VARIANTS[(OPS.index(op) + world) % len(VARIANTS)]
    kinds = pools.run(world, job_one_sided_error, op, variant)
    assert kinds[0] == "TypeError" and set(kinds[1:]) == {"PeerCallError"}, kinds


@sync_errors
def job_mismatch_after_warmup(ctx, op, what):
    """Both shapes (or variants) are warm on every rank; then the ranks disagree: every rank raises
    CallMismatchError naming both calls, and the following calls are correct."""
    shapes = [(16, 40, 32), (24, 24, 16)]
    variants = ["fused_sequential", "wg_specialized"]
    for shape in shapes:
        for variant in variants:
            _check(ctx, op, variant, *shape, seed=5)
    shape = shapes[ctx.rank % 2] if what == "shape" else shapes[0]
    variant = variants[ctx.rank % 2] if what == "variant" else variants[0]
    a, b = _operands(ctx, op, *shape, seed=6)
    with pytest.raises(tilefuse.CallMismatchError) as info:
        registry.get(op, variant)(a, b)
    msg = str(info.value)
    assert "differs between ranks" in msg and op in msg, msg
    _check(ctx, op, variants[1], *shapes[1], seed=7)
    _check(ctx, op, variants[0], *shapes[0], seed=8)
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("what", ["shape", "variant"])
def test_mismatch_after_warmup(pools, world, what):
    assert all(pools.run(world, job_mismatch_after_warmup, "gemm_all_scatter", what))


def test_mismatch_after_warmup_other_ops(pools):
    assert all(pools.run(2, job_mismatch_after_warmup, "all_gather_gemm", "shape"))
    assert all(pools.run(2, job_mismatch_after_warmup, "gemm_reduce_scatter", "variant"))


def job_slow_peer(ctx, bound_s, delay_s):
    """The last rank arrives later than the others' wait bound: the call raises on every rank, every op
    raises until reset(), and after reset() calls are correct."""
    op, variant = "gemm_reduce_scatter", "wg_specialized"
    _check(ctx, op, variant, 16, 24, 16, seed=9)
    tilefuse.barrier()
    old = tilefuse.set_wait_timeout(bound_s)
    a, b = _operands(ctx, op, 16, 24, 16, seed=10)
    seq = int(control_block()[int(primitives.CTL_SEQ)].item()) + 1  # this call's sequence number
    t0 = time.monotonic()
    try:
        if ctx.rank == ctx.world - 1:
            time.sleep(delay_s)
        with pytest.raises((tilefuse.WaitTimeoutError, tilefuse.PoisonedError)) as info:
            registry.get(op, variant)(a, b)
            tilefuse.synchronize()  # on a GPU the error is reported here (no sync per call by default)
        first = type(info.value).__name__
        if first == "WaitTimeoutError":  # it names the call (a one-kernel call: ctl[SEQ] lags by one)
            assert f"call #{seq} " in str(info.value), (seq, str(info.value))
        with pytest.raises(tilefuse.PoisonedError, match="reset"):
            registry.get(op, variant)(a, b)
        with pytest.raises(tilefuse.PoisonedError):
            tilefuse.gemm_all_scatter(a[:4], b, variant="bulk_sync")
    finally:
        tilefuse.set_wait_timeout(old)
    elapsed = time.monotonic() - t0
    tilefuse.reset()
    for seed in (11, 12):
        _check(ctx, op, variant, 16, 24, 16, seed=seed)
    _check(ctx, "all_gather_gemm", "producer_consumer", 16, 24, 16, seed=13)
    tilefuse.barrier()
    return first, elapsed


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_slow_peer_poisons_then_reset(pools, world):
    out = pools.run(world, job_slow_peer, 0.5, 2.0)
    kinds = [k for k, _ in out]
    assert "WaitTimeoutError" in kinds, kinds
    assert max(t for _, t in out) < 30.0, out


@triton.jit
def _spin(flag_ptr, limit_ns):
    """Spins until the flag is set or ``limit_ns`` passed: a kernel tilefuse's poison does not end."""
    start = now_ns()
    elapsed = start - start
    seen = tl.load(flag_ptr, volatile=True)
    while (seen == 0) & (elapsed < limit_ns):
        seen = tl.load(flag_ptr, volatile=True)
        elapsed = now_ns() - start


def job_stuck_device(ctx, host_s):
    """Rank 0's device runs a kernel that tilefuse's poison does not end, with its poison word set:
    tilefuse.synchronize() raises HostTimeoutError after TILEFUSE_HOST_TIMEOUT (not a hang), later
    calls raise it, and once the kernel has ended reset() recovers on every rank."""
    from tilefuse.runtime import _env

    _check(ctx, "gemm_all_scatter", "fused_sequential", 16, 24, 16, seed=60)
    tilefuse.barrier()
    waited = 0.0
    if ctx.rank == 0:
        flag, side = torch.zeros(1, dtype=torch.int64, device=ctx.device), torch.cuda.Stream(ctx.device)
        _spin[(1,)](flag, int(30e9))
        with torch.cuda.stream(side):  # beside the stuck stream
            control_block()[int(primitives.CTL_POISON)].fill_(1)
        side.synchronize()
        saved = _env.host_timeout
        _env.host_timeout = lambda: host_s
        t0 = time.monotonic()
        try:
            # The message says what the control block shows: here no tilefuse kernel is running.
            with pytest.raises(tilefuse.HostTimeoutError, match=r"rank 0's device work has not finished.*control "
                               r"block: call #\d+ \(live\), begun through #\d+, the running kernel's programs 0 "
                               r"entered and 0 finished, calls begun by rank \[\d+, \d+\]"):
                tilefuse.synchronize()
            waited = time.monotonic() - t0
            with pytest.raises(tilefuse.HostTimeoutError, match="stuck"):
                tilefuse.gemm_all_scatter(*_operands(ctx, "gemm_all_scatter", 16, 24, 16, seed=61), variant="bulk_sync")
        finally:
            _env.host_timeout = saved
            with torch.cuda.stream(side):
                flag.fill_(1)
            torch.cuda.synchronize()
    tilefuse.reset()
    _check(ctx, "gemm_all_scatter", "fused_sequential", 16, 24, 16, seed=62)
    tilefuse.barrier()
    return waited


def test_a_stuck_device_raises_instead_of_hanging(pools, on_gpu):
    if not on_gpu:
        pytest.skip("the CPU backend's kernels run synchronously: nothing is left queued to wait for")
    waited = pools.run(2, job_stuck_device, 1.0)
    assert 1.0 <= waited[0] < 10.0, waited


def job_async_report(ctx, op, variant, next_call):
    """Without a sync per call (the GPU default) a peer's failed checks abort the call on every rank:
    its output is NaN, never another call's data, and the error is raised at synchronize() or
    (``next_call``) by this rank's next call, found through the status words alone after a device
    sync that reads no record (the copy queued after a begun call, or the words a one-kernel call
    writes to the host itself); the calls after it are correct."""
    world.set_sync_errors(False)
    _check(ctx, op, variant, 24, 40, 32, seed=50)
    a, b = _operands(ctx, op, 24, 40, 32, seed=51)
    call = registry.get(op, variant)
    if ctx.rank == 0:
        with pytest.raises(TypeError):
            call(a.to(torch.int32), b)
        torch.cuda.synchronize()
        if next_call:
            call(a, b)  # its own failure is not recorded here: this call returns
        tilefuse.synchronize()
    else:
        out = call(a, b)
        torch.cuda.synchronize()
        with pytest.raises(tilefuse.PeerCallError, match="failed on rank 0"):
            call(a, b) if next_call else tilefuse.synchronize()  # the next call alone must raise it
        assert torch.isnan(out).all(), "an aborted call's output must be NaN"
    torch.cuda.synchronize()
    _check(ctx, op, variant, 24, 40, 32, seed=52)
    world.set_sync_errors(True)
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("op, variant, next_call", [("all_gather_gemm", "wg_specialized", False),
                                                    ("gemm_all_reduce", "bulk_sync", True),
                                                    ("gemm_all_reduce", "wg_specialized", True)])
def test_async_error_report(pools, on_gpu, op, variant, next_call):
    if not on_gpu:
        pytest.skip("the CPU backend raises at the failing call itself (kernels run synchronously)")
    assert all(pools.run(2, job_async_report, op, variant, next_call))


def job_wrap(ctx, start):
    """Sequence numbers just below the int64 wrap: calls across it stay paired and correct."""
    tilefuse.barrier()
    ctl = control_block()
    W = ctx.world
    ctl[int(primitives.CTL_SEQ)] = start
    fixed = int(primitives.CTL_FIXED)
    ctl[fixed:fixed + W] = start  # ARRIVE
    tilefuse.barrier()
    for i in range(6):
        for op in OPS:
            _check(ctx, op, VARIANTS[i % 4], 16, 24, 16, seed=20 + i)
    seq = int(ctl[int(primitives.CTL_SEQ)].item())
    tilefuse.barrier()
    return seq


def test_sequence_wraps(pools):
    start = 2**63 - 7
    seqs = pools.run(2, job_wrap, start)
    assert len(set(seqs)) == 1 and seqs[0] < 0, seqs  # wrapped past 2**63 - 1, the same on every rank


@sync_errors
def job_two_threads(ctx, calls):
    """Two threads per rank call ops at once: every call is correct or raises (the ranks may pair the
    threads' calls in different orders), nothing hangs, and later single-thread calls are correct."""
    op = "gemm_all_scatter"
    outcomes = []
    for shape in ((16, 24, 16), (24, 16, 32)):  # workspaces are created collectively: warm them first
        _check(ctx, op, "fused_sequential", *shape, seed=29)

    def worker(t):
        if ctx.on_gpu:
            torch.cuda.set_device(ctx.device)  # a new thread starts on GPU 0
        for i in range(calls):
            shape = (16, 24, 16) if t == 0 else (24, 16, 32)
            a, b = _operands(ctx, op, *shape, seed=30 + i)
            try:
                got = registry.get(op, "fused_sequential")(a, b)
            except (tilefuse.CallMismatchError, tilefuse.PeerCallError) as err:
                outcomes.append(type(err).__name__)
                continue
            # The reference is a host collective: compare on this rank only, after the threads.
            outcomes.append((a, b, got))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads), "a thread hung"
    ok = 0
    for item in outcomes:
        if isinstance(item, str):
            continue
        a, b, got = item
        # A call that returned paired with the peers' call of the same signature: its own block is a @ b.
        r, n = ctx.rank, b.shape[1]
        assert_matches(got[:, r * n:(r + 1) * n], a @ b, torch.float32, a.shape[1], ctx.on_gpu, "thread call")
        assert not torch.isnan(got).any()
        ok += 1
    _check(ctx, op, "wg_specialized", 16, 24, 16, seed=40)
    tilefuse.barrier()
    return ok, len(outcomes)


def test_two_threads(pools):
    out = pools.run(2, job_two_threads, 3)
    assert all(n == 6 for _, n in out), out


ONE_KERNEL = [("gemm_all_scatter", "wg_specialized"), ("all_gather_gemm", "wg_specialized"),
              ("gemm_reduce_scatter", "wg_specialized"), ("gemm_all_reduce", "wg_specialized"),
              ("gemm_all_reduce", "fused_sequential"), ("gemm_all_scatter", "fused_sequential")]
# Calls of several kernels that begin and end them: the first and the last one, or (producer_consumer)
# two kernels on two streams together.
KERNEL_BEGUN = [("gemm_all_scatter", "bulk_sync"), ("all_gather_gemm", "bulk_sync"),
                ("gemm_reduce_scatter", "bulk_sync"), ("gemm_all_reduce", "bulk_sync"),
                ("gemm_reduce_scatter", "fused_sequential"), ("all_gather_gemm", "fused_sequential"),
                *((op, "producer_consumer") for op in ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter",
                                                       "gemm_all_reduce"))]
# Calls that still launch the begin kernel first: all_gather_gemm's copy_engine form.
BEGIN_KERNEL = [("all_gather_gemm", "copy_engine", {})]


def _entry_words(ctl) -> tuple:
    return tuple(int(ctl[int(w)].item()) for w in (primitives.CTL_SEQ, primitives.CTL_GO, primitives.CTL_ENTER,
                                                   primitives.CTL_EXIT, primitives.CTL_STATE))


@sync_errors
def job_one_kernel_calls(ctx):
    """Calls whose one kernel begins them, and calls of several kernels whose first kernel begins
    them, between calls that launch the begin kernel: each call moves the sequence number by one, a
    call that began itself leaves ``GO`` at its number and its entry counters at zero, every result
    is correct; then a mismatch between a one-kernel call and a begun one, one between two calls of
    several kernels, and one between a call begun by two kernels on two streams and one begun by
    its GEMM raises on every rank, and the calls after it are correct."""
    ctl = control_block()
    words = []
    for i in range(3):  # the first call of a shape creates its workspaces (device barriers)
        for op, variant, *kwargs in ONE_KERNEL + KERNEL_BEGUN + BEGIN_KERNEL:
            before = _entry_words(ctl)[0]
            _check(ctx, op, variant, 16, 24, 16, seed=60 + i, **(kwargs[0] if kwargs else {}))
            seq, go, enter, exit_, state = _entry_words(ctl)
            if i == 0:
                continue
            assert seq == before + 1, (op, variant, before, seq)
            assert (enter, exit_, state) == (0, 0, 0), (op, variant, enter, exit_, state)
            if not kwargs:  # begun by its own kernels: GO holds the call's number
                assert go == seq, (op, variant, go, seq)
            words.append(seq)
    op = "all_gather_gemm"
    a, b = _operands(ctx, op, 16, 24, 16, seed=70)
    with pytest.raises(tilefuse.CallMismatchError):  # begun by its kernels against begun by the begin kernel
        registry.get(op, "producer_consumer" if ctx.rank % 2 else "copy_engine")(a, b)
    for variant in ("fused_sequential", "bulk_sync", "wg_specialized"):
        _check(ctx, op, variant, 16, 24, 16, seed=71)
    op = "gemm_reduce_scatter"
    a, b = _operands(ctx, op, 16, 24, 16, seed=72)
    with pytest.raises(tilefuse.CallMismatchError):  # two calls of several kernels, each begun by its GEMM
        registry.get(op, "bulk_sync" if ctx.rank % 2 else "fused_sequential")(a, b)
    op = "gemm_all_scatter"
    a, b = _operands(ctx, op, 16, 24, 16, seed=74)
    with pytest.raises(tilefuse.CallMismatchError):  # a call begun by two kernels on two streams, one by its GEMM
        registry.get(op, "bulk_sync" if ctx.rank % 2 else "producer_consumer")(a, b)
    for op, variant in KERNEL_BEGUN:
        _check(ctx, op, variant, 16, 24, 16, seed=73)
    assert _entry_words(ctl)[2:] == (0, 0, 0)
    tilefuse.barrier()
    return words


# Small tiles (32 x 64: 4 tiles of a 37 x 72 output) on 6 programs, then on 2. Two warps: the reduction's
# blocks are whole tiles, so that gemm_all_reduce's fused_sequential sums each tile in its epilogue
# where it has one tile a program (the first config).
ASIDE_CONFIGS = [dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=16, GROUP_M=2, num_warps=2, num_stages=1, GEMM_SMS=s, COMM_SMS=s)
                 for s in (3, 1)]
ASIDE_CALLS = [("gemm_all_reduce", "fused_sequential"), ("gemm_all_reduce", "wg_specialized"),
               ("gemm_all_scatter", "fused_sequential")]


@sync_errors
def job_begin_aside(ctx):
    """The one-kernel calls that begin beside their K loops (program 0 begins the call, the other GEMM
    programs wait for it only before their first store, a reducer before its first flag),
    with fewer tiles than programs (program 0 has none; gemm_all_reduce's fused_sequential sums each
    tile in its epilogue, its own partial from registers) and more, a different rank late each call:
    the reference's result; then the calls after a mismatch of the aside form are correct."""
    for op, variant in ASIDE_CALLS:
        for i, config in enumerate(ASIDE_CONFIGS):
            cfg = tilefuse.Config(**config)
            for call in range(2):
                a, b = _operands(ctx, op, 37, 72, 24, seed=80 + 2 * i + call)
                if ctx.rank == (call + i) % ctx.world:
                    time.sleep(0.2)  # the others' begins wait for this rank
                got = registry.get(op, variant)(a, b, config=cfg)
                tilefuse.synchronize()
                assert_matches(got, registry.get(op, "reference")(a, b), torch.float32, 24, ctx.on_gpu,
                               f"{op}/{variant} {config} call {call}", scale=ctx.world)
    for op, variant in ASIDE_CALLS:  # the aside form against a call of two kernels: aborted on every rank
        a, b = _operands(ctx, op, 37, 72, 24, seed=90)
        with pytest.raises(tilefuse.CallMismatchError):
            registry.get(op, "bulk_sync" if ctx.rank % 2 else variant)(a, b, config=tilefuse.Config(**ASIDE_CONFIGS[0]))
        _check(ctx, op, variant, 37, 72, 24, seed=91)
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("world", [pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)])
def test_begin_aside_of_the_k_loops(pools, world):
    assert all(pools.run(world, job_begin_aside))


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)])
def test_one_kernel_calls_keep_the_sequence(pools, world):
    words = pools.run(world, job_one_kernel_calls)
    assert all(w == words[0] for w in words), words  # the same sequence numbers on every rank


def job_bf16_on_the_interpreter(ctx):
    """On the CPU backend the fused variants refuse bfloat16 (Triton's interpreter computes it wrong)
    instead of returning garbage, and the refused call counts on every rank; auto and plain take it."""
    out = {}
    for op in OPS + ("gemm_all_reduce",):
        a, b = _operands(ctx, op, 16, 24, 16, seed=1)
        a, b = a.bfloat16(), b.bfloat16()
        for variant in VARIANTS:
            with pytest.raises((TypeError, tilefuse.PeerCallError), match="bfloat16 on the CPU backend|failed on"):
                registry.get(op, variant)(a, b)
        ref = registry.get(op, "reference")(a, b)
        for variant in ("auto", "plain"):
            got = getattr(tilefuse, op)(a, b, variant=variant)
            out[(op, variant)] = float((got.float() - ref.float()).abs().max() / ref.float().abs().max())
    _check(ctx, "gemm_all_scatter", "fused_sequential", 16, 24, 16, seed=2)  # the next calls pair as usual
    return out


def test_bf16_refused_by_the_interpreters_kernels(pools, on_gpu):
    if on_gpu:
        pytest.skip("bfloat16 is computed right on GPUs")
    for out in pools.run(2, job_bf16_on_the_interpreter):
        assert all(err < 2e-2 for err in out.values()), out
