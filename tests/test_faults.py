"""Faults between ranks: every disagreement ends in the same error on every rank, within seconds."""

import time

import pytest
import torch
from ophelpers import assert_matches, environment, tolerance

import tilefuse
from tilefuse.ops import registry


def job_first_call_mismatch(ctx, op, what):
    """Each rank's first call of a new shape, the ranks disagreeing on M or on the variant: every
    rank raises CallMismatchError (not a plain ValueError); a call they agree on then works. (Each
    case has a K of its own: a first call on some ranks against a warm call on others is another
    case.)"""
    gen = torch.Generator().manual_seed(7 + ctx.rank)
    k = {"shape": 24, "variant": 40}[what]
    m = 8 + (ctx.rank if what == "shape" else 0)
    variant = ("bulk_sync", "fused_sequential")[ctx.rank % 2] if what == "variant" else "fused_sequential"
    a = torch.randn(m, k, generator=gen).to(ctx.device)
    b = torch.randn(k, 16, generator=gen).to(ctx.device)
    with pytest.raises(tilefuse.CallMismatchError):
        registry.get(op, variant)(a, b)
        tilefuse.synchronize()
    a = torch.randn(8, k, generator=gen).to(ctx.device)
    got = registry.get(op, "fused_sequential")(a, b)
    tilefuse.synchronize()
    return got.shape[0] == 8 * ctx.world


@pytest.mark.parametrize("what", ["shape", "variant"])
def test_first_call_mismatch_is_call_mismatch_error(pools, what):
    assert all(pools.run(2, job_first_call_mismatch, "all_gather_gemm", what))


def job_requires_grad_on_one_rank(ctx, op):
    """``requires_grad`` on one rank only is the same call: autograd's view of a call is local."""
    gen = torch.Generator().manual_seed(11 + ctx.rank)
    a = torch.randn(8, 32, generator=gen).to(ctx.device).requires_grad_(ctx.rank == 0)
    b = torch.randn(32, 16, generator=gen).to(ctx.device)
    out = getattr(tilefuse, op)(a, b, variant="fused_sequential")
    tilefuse.synchronize()
    return tuple(out.shape)


def test_requires_grad_on_one_rank_is_the_same_call(pools):
    assert len(set(pools.run(2, job_requires_grad_on_one_rank, "all_gather_gemm"))) == 1


def job_first_call_against_a_warm_call(ctx, host_s):
    """Rank 1 calls a shape for the first time (its workspace's host step) while rank 0 makes a warm
    call: rank 1 sees rank 0's call begin and raises CallMismatchError at once, not after the host
    bound; rank 0's call raises PeerCallError (rank 1's call counts as failed); reset() recovers."""
    gen = torch.Generator().manual_seed(21 + ctx.rank)
    b = torch.randn(48, 16, generator=gen).to(ctx.device)
    call = registry.get("all_gather_gemm", "fused_sequential")
    call(torch.randn(8, 48, generator=gen).to(ctx.device), b)
    tilefuse.synchronize()
    t0 = time.monotonic()
    with environment(TILEFUSE_HOST_TIMEOUT=host_s):
        try:
            call(torch.randn(8 + 4 * ctx.rank, 48, generator=gen).to(ctx.device), b)
            tilefuse.synchronize()
            raised = "nothing"
        except (tilefuse.CallMismatchError, tilefuse.PeerCallError) as err:
            raised = type(err).__name__
    took = time.monotonic() - t0
    tilefuse.reset()
    a = torch.randn(8, 48, generator=gen).to(ctx.device)
    assert_matches(call(a, b), registry.get("all_gather_gemm", "reference")(a, b), torch.float32, 48, ctx.on_gpu,
                   "the call after reset", scale=ctx.world)
    tilefuse.barrier()
    return raised, took


def test_a_first_call_against_a_warm_call_is_a_call_mismatch_within_seconds(pools):
    host_s = 60.0
    res = pools.run(2, job_first_call_against_a_warm_call, host_s)
    assert [r[0] for r in res] == ["PeerCallError", "CallMismatchError"], res
    assert max(r[1] for r in res) < 5.0, res


# ---------------------------------------------------------------------------------------------
# Calls from different points of a program never pair (steps and roles)
# ---------------------------------------------------------------------------------------------


class _UserLoss(torch.autograd.Function):
    """A user's Function on the MLP's output whose backward raises where ``fail``."""

    @staticmethod
    def forward(ctx, y, fail):
        ctx.fail = fail
        return y.clone()

    @staticmethod
    def backward(ctx, g):
        if ctx.fail:
            raise RuntimeError("the user's backward failed")
        return g, None


def _mlp_data(ctx, it, H, F):
    """Iteration ``it``'s tokens of this rank ``[8, H]``, and the weights ``w1``, ``w2`` ``[H, F/W]``."""
    gen = torch.Generator().manual_seed(1000 * it + ctx.rank)
    x = torch.randn(8, H, generator=gen).to(ctx.device)
    wgen = torch.Generator().manual_seed(77 + ctx.rank)
    w1 = torch.randn(H, F // ctx.world, generator=wgen).to(ctx.device).requires_grad_()
    w2 = torch.randn(H, F // ctx.world, generator=wgen).to(ctx.device).requires_grad_()
    return x, w1, w2


def _four_ops_right(ctx, seed):
    """Every op gives the reference's answer (the calls after a reset)."""
    for i, op in enumerate(("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce")):
        rows = 8 * ctx.world if op == "gemm_reduce_scatter" else 8
        gen = torch.Generator().manual_seed(seed + 10 * i + (0 if op == "gemm_all_scatter" else ctx.rank))
        a = torch.randn(rows, 16, generator=gen).to(ctx.device)
        b = torch.randn(16, 16, generator=torch.Generator().manual_seed(seed + 10 * i + 5 + ctx.rank)).to(ctx.device)
        got = registry.get(op, "fused_sequential")(a, b)
        tilefuse.synchronize()
        assert_matches(got, registry.get(op, "reference")(a, b), torch.float32, 16, ctx.on_gpu, f"{op} after reset",
                       scale=ctx.world)
    return True


def job_backward_fault_in_steps(ctx, iterations, fail_at):
    """The probe's scenario: a sequence-parallel MLP (all_gather_gemm -> gemm_reduce_scatter,
    fused_sequential, new tokens every iteration), a user's Function whose backward raises on rank 1
    in iteration ``fail_at``, a training loop that catches and goes on, each iteration in
    ``tilefuse.step(it)``. Rank 1 skips its backward calls; without the steps and roles rank 0's
    backward calls would pair with rank 1's next forward calls (same ops, same shapes) and the
    iterations after would return wrong results on both ranks. Now every call after the fault raises
    on every rank, no forward result is wrong, and reset() brings right answers back."""
    H, F = 16, 16 * ctx.world
    variant = "fused_sequential"
    outcomes, outputs = [], {}
    t0 = time.monotonic()
    for it in range(iterations):
        x, w1, w2 = _mlp_data(ctx, it, H, F)
        try:
            with tilefuse.step(it):
                h = tilefuse.all_gather_gemm(x, w1, variant=variant)  # [8W, F/W]
                y = tilefuse.gemm_reduce_scatter(h, w2.t(), variant=variant)  # [8, H]
                outputs[it] = y.detach().clone()
                _UserLoss.apply(y, ctx.rank == 1 and it == fail_at).sum().backward()
            outcomes.append("ok")
        except Exception as err:  # noqa: BLE001 - what each iteration ends in is the result
            outcomes.append(type(err).__name__)
    took = time.monotonic() - t0
    tilefuse.reset()
    # The forward results the loop returned, against the reference (collective: computed after reset).
    wrong = []
    for it in range(iterations):
        x, w1, w2 = _mlp_data(ctx, it, H, F)
        ref = registry.get("gemm_reduce_scatter", "reference")(
            registry.get("all_gather_gemm", "reference")(x, w1.detach()), w2.detach().t())
        got = outputs.get(it)
        rtol, atol = tolerance(torch.float32, F, ctx.on_gpu)  # tf32 on a GPU; a mispaired call is far off
        if got is not None and not torch.allclose(got, ref, rtol=rtol, atol=atol * float(ref.abs().max())):
            wrong.append(it)
    right = _four_ops_right(ctx, seed=300)
    tilefuse.barrier()
    return outcomes, wrong, took, right


def test_a_backward_that_raises_on_one_rank_ends_in_errors_not_wrong_results(pools):
    res = pools.run(2, job_backward_fault_in_steps, 4, 1)
    for rank, (outcomes, wrong, took, right) in enumerate(res):
        assert wrong == [], f"rank {rank} returned wrong forward results in iterations {wrong}: {outcomes}"
        assert outcomes[0] == "ok", outcomes
        after = outcomes[1:] if rank == 0 else outcomes[2:]
        assert "ok" not in after, f"rank {rank}: a call after the fault paired: {outcomes}"
        assert "CallMismatchError" in after, outcomes
        assert took < 30.0 and right, (took, outcomes)
    assert res[1][0][1] == "RuntimeError", res[1][0]  # the user's own error


def job_roles_and_steps_never_pair(ctx):
    """The same op and shapes in a forward on one rank and a backward on the other (or in two
    different steps) raise CallMismatchError on every rank, naming the scopes; nested steps and the
    same step on every rank pair as usual."""
    from tilefuse.runtime.scope import Scope

    gen = torch.Generator().manual_seed(5 + ctx.rank)
    a = torch.randn(8, 16, generator=gen).to(ctx.device)
    b = torch.randn(16, 16, generator=gen).to(ctx.device)
    call = registry.get("all_gather_gemm", "fused_sequential")
    ref = registry.get("all_gather_gemm", "reference")(a, b)
    messages = []
    for scope in (Scope(role="backward" if ctx.rank else "forward"), tilefuse.step(ctx.rank)):
        with pytest.raises(tilefuse.CallMismatchError) as info, scope:
            call(a, b)
            tilefuse.synchronize()
        messages.append(str(info.value))
    with tilefuse.step(3), tilefuse.step("batch"), Scope(role="forward"):
        got = call(a, b)
        tilefuse.synchronize()
    assert_matches(got, ref, torch.float32, 16, ctx.on_gpu, "a call in the same scope on every rank")
    tilefuse.barrier()
    return messages


def test_a_forward_never_pairs_with_a_backward_or_another_step(pools):
    res = pools.run(2, job_roles_and_steps_never_pair)
    for rank, messages in enumerate(res):
        assert "in role forward" in messages[0] and "in role backward" in messages[0], messages[0]
        assert f"in step {rank})" in messages[1], messages[1]


# ---------------------------------------------------------------------------------------------
# reset() recovers whatever happened before
# ---------------------------------------------------------------------------------------------


def job_lone_reset_then_collective_reset(ctx, host_s):
    """Rank 1 calls reset() alone while rank 0 makes a call: rank 0's call raises at once (the reset
    poisons every rank), rank 1's reset times out after the host bound naming rank 0; then a reset
    on every rank recovers, and all four ops give right answers."""
    import torch.distributed as dist

    _four_ops_right(ctx, seed=400)
    tilefuse.barrier()
    a = torch.randn(8, 16).to(ctx.device)
    b = torch.randn(16, 16).to(ctx.device)
    t0 = time.monotonic()
    with environment(TILEFUSE_HOST_TIMEOUT=host_s):
        if ctx.rank == 1:
            with pytest.raises(tilefuse.HostTimeoutError, match=r"rank\(s\) 0 .*did not come") as info:
                tilefuse.reset()
        else:
            with pytest.raises(tilefuse.PoisonedError, match="rank 1 entered tilefuse.reset") as info:
                registry.get("all_gather_gemm", "fused_sequential")(a, b)
                tilefuse.synchronize()
    took = time.monotonic() - t0
    first = type(info.value).__name__
    dist.barrier()  # (torch's: tilefuse's host steps are what is being reset)
    with pytest.raises(tilefuse.PoisonedError):  # every op raises until the collective reset
        tilefuse.gemm_all_reduce(a, b, variant="bulk_sync")
    tilefuse.reset()
    tilefuse.reset()  # twice in a row is fine too
    right = _four_ops_right(ctx, seed=500)
    tilefuse.barrier()
    return first, took, right


def test_a_lone_reset_then_a_collective_reset_recovers(pools):
    host_s = 1.0
    res = pools.run(2, job_lone_reset_then_collective_reset, host_s)
    (first0, took0, right0), (first1, took1, right1) = res
    assert (first0, first1) == ("PoisonedError", "HostTimeoutError")
    assert took0 < 5.0 and host_s - 0.1 <= took1 < host_s + 5.0, res
    assert right0 and right1


# ---------------------------------------------------------------------------------------------
# A peer process that exits
# ---------------------------------------------------------------------------------------------


def group_peer_dies_in_a_host_step(rank, world):
    """Rank 1 is killed while rank 0 waits for it in a new shape's first call (a host step): rank 0
    raises PeerExitedError naming rank 1 at once, not after the host bound; reset() and every later
    call then raise it at once too, saying that the group must be re-created."""
    import os
    import signal

    import tilefuse

    heap = tilefuse.init(heap_size=16 << 20)
    a = torch.randn(8, 16, device=heap.device)
    b = torch.randn(16, 16, device=heap.device)
    tilefuse.all_gather_gemm(a, b, variant="fused_sequential")
    tilefuse.synchronize()
    if rank == 1:
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    out = {}
    for what, fn in (("first call", lambda: tilefuse.all_gather_gemm(a[:4], b, variant="fused_sequential")),
                     ("reset", tilefuse.reset),
                     ("call", lambda: tilefuse.all_gather_gemm(a, b, variant="fused_sequential"))):
        t0 = time.monotonic()
        try:
            fn()
            tilefuse.synchronize()
            out[what] = ("returned", time.monotonic() - t0)
        except Exception as err:  # noqa: BLE001 - the error is the result
            out[what] = (f"{type(err).__name__}: {err}", time.monotonic() - t0)
    return out


@pytest.mark.slow
def test_a_dead_peer_is_named_at_once_and_reset_says_to_re_create_the_group():
    from harness import run_group

    bound = 20.0
    res = run_group(group_peer_dies_in_a_host_step, 2, timeout=120,
                    env={"TILEFUSE_WAIT_TIMEOUT": str(bound), "TILEFUSE_HOST_TIMEOUT": str(bound)})
    assert res[1][0] == "died", res
    status, out = res[0]
    assert status == "ok", out
    for what, (err, took) in out.items():
        assert err.startswith("PeerExitedError") and "rank 1 (pid" in err, (what, err)
        assert "must be re-created" in err, (what, err)
        assert took < (3.0 if what == "first call" else 0.5), (what, took)


def test_steps_nest_per_thread_and_backward_keeps_the_forward_steps():
    import threading

    from tilefuse.runtime import scope

    assert scope.current_scope() == ((), None) and scope.STATE.mix == 0
    seen = {}
    with tilefuse.step(1), tilefuse.step("b"):
        assert scope.current_scope() == ((1, "b"), None)
        saved, mix = scope.saved_scope(), scope.STATE.mix
        thread = threading.Thread(target=lambda: seen.update(other=scope.current_scope()))
        thread.start()
        thread.join()
        with scope.Scope(role="forward"):
            assert scope.current_scope() == ((1, "b"), "forward") and scope.STATE.mix not in (0, mix)
        assert scope.STATE.mix == mix
    assert seen["other"] == ((), None)  # another thread (autograd's, say) starts outside any scope
    assert scope.current_scope() == ((), None) and scope.STATE.mix == 0
    assert scope.in_backward(saved, scope.current_scope) == ((1, "b"), "backward")
    assert scope.in_backward(None, scope.current_scope) == ((), None)
    assert scope.in_forward(scope.current_scope) == ((), "forward")
    with tilefuse.step(1):
        assert scope.STATE.mix != mix  # step 1 alone is another scope than step 1, step "b"
    for bad in (True, 1.5, None):
        with pytest.raises(TypeError, match="tilefuse.step"):
            tilefuse.step(bad)
