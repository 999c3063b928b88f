"""The test harness's shortcuts for the CPU suite: the interpreter's and the rank processes'.

The interpreter shortcuts (``harness.speed_up_interpreter``) must leave results unchanged and must
stay installed: a Triton upgrade that drops the names they rely on makes the suite twice as slow,
so it fails here instead of passing slowly.
"""

import os

import harness
import pytest
import torch
import triton
import triton.language as tl
from harness import TEST_DEVICE, RankFailure, RankPool, install_fixed_order_dot, run_group, speed_up_interpreter
from triton.language import core as tl_core

pytestmark = pytest.mark.skipif(TEST_DEVICE != "cpu", reason="the shortcuts are for Triton's interpreter")


@triton.jit
def _wrap_add(x, y):
    return x + y  # int32: wraps around


@triton.jit
def _twice(x):
    return _wrap_add(x, x)


@triton.jit
def _core_only(x):
    return tl_core.full([], 3, tl_core.int32) * x


@triton.jit
def _nested_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0, volatile=True)  # a poll: paused first
    for _ in range(3):  # helpers called again while the launch's patch is in place
        x = _twice(x)
    tl.store(out_ptr + offs, _core_only(x), mask=offs < n)


def test_interpreter_shortcuts_are_installed_and_change_no_result():
    if os.environ.get("TILEFUSE_TEST_FAST_INTERPRETER", "1") in ("", "0"):
        pytest.skip("TILEFUSE_TEST_FAST_INTERPRETER=0")
    assert speed_up_interpreter(), "the interpreter shortcuts no longer fit this Triton: see harness.py"
    x = torch.tensor([1, -7, 2**27 + 5, 2**31 - 1, 0], dtype=torch.int32)
    out = torch.full((8,), -1, dtype=torch.int32)
    _nested_kernel[(1,)](x, out, x.numel(), BLOCK=8)
    want = (x.to(torch.int64) * 8 * 3 + 2**31) % 2**32 - 2**31  # int32 wrap-around, as on a GPU
    assert torch.equal(out[:5].to(torch.int64), want), out
    assert torch.equal(out[5:], torch.full((3,), -1, dtype=torch.int32)), "a masked lane was written"
    # The launch put triton.language back as it found it.
    assert tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.tensor.__add__)


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a = tl.load(a_ptr + rm[:, None] * BK + rk[None, :])  # [BM, BK]
    b = tl.load(b_ptr + rk[:, None] * BN + rn[None, :])  # [BK, BN]
    acc = tl.dot(a, b, tl.full((BM, BN), 0.5, tl.float32))  # [BM, BN]
    tl.store(c_ptr + rm[:, None] * BN + rn[None, :], acc)


@pytest.mark.bits
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_interpreter_dot_bits_do_not_depend_on_position_or_blas(dtype):
    """An element's bits are ``(a[i, 0] * b[0, j] + a[i, 1] * b[1, j] + ...) + 0.5``, rounded step by
    step in fp32, wherever its row sits in the block: the same on every CPU (see install_fixed_order_dot).
    np.matmul (OpenBLAS) fails this on CPUs whose sgemm kernels add in a row-dependent order."""
    assert install_fixed_order_dot(), "the fixed-order dot no longer fits this Triton: see harness.py"
    gen = torch.Generator().manual_seed(5)
    BM, BN, BK = 32, 16, 64
    a = torch.randn(BM, BK, generator=gen).to(dtype)
    b = torch.randn(BK, BN, generator=gen).to(dtype)
    want = torch.zeros(BM, BN)
    for k in range(BK):
        want = want + a[:, k, None].float() * b[None, k, :].float()
    want = want + 0.5
    for rows in (torch.arange(BM), torch.randperm(BM, generator=gen)):
        c = torch.empty(BM, BN)
        _dot_kernel[(1,)](a[rows].contiguous(), b, c, BM=BM, BN=BN, BK=BK)
        assert torch.equal(c, want[rows]), (c - want[rows]).abs().max()


def _report_process(rank, world):
    import gc

    import triton.runtime.interpreter as interp

    return {"frozen": gc.get_freeze_count(), "patched": getattr(interp._patch_lang, "_skips_live_patch", False),
            "env": os.environ.get("TILEFUSE_TEST_PROBE")}


def _stuck_in_a_sleep(rank, world):
    import time

    time.sleep(60)


@pytest.mark.slow  # it waits out a 10 s deadline: the harness's own check, kept out of `make test`'s budget
def test_a_group_rank_past_its_deadline_reports_where_it_was_stuck():
    """A test that times out says where: the rank's stacks, dumped a few seconds before the deadline."""
    res = run_group(_stuck_in_a_sleep, 1, timeout=10)
    status, stacks = res[0]
    assert status == "timeout", res
    assert stacks is not None and "_stuck_in_a_sleep" in stacks, stacks


def _rank1_fails_rank0_waits(ctx):
    if ctx.rank == 1:
        raise RuntimeError("rank 1 gives up")
    import time

    time.sleep(60)


def test_a_rank_stuck_after_a_peers_error_shows_where(monkeypatch):
    """A pool whose rank fails while another stays stuck reports both: the error, and the stuck rank's
    stacks, asked of it before the pool is killed (its own dump before the job's timeout never comes)."""
    monkeypatch.setattr(harness, "ERROR_GRACE", 2.0)
    pool = RankPool(2)
    try:
        with pytest.raises(RankFailure) as info:
            pool.run(_rank1_fails_rank0_waits, timeout=120)
    finally:
        pool.close()
    text = str(info.value)
    assert "rank 1 gives up" in text and "--- rank 0, where it was stuck ---" in text, text
    assert "_rank1_fails_rank0_waits" in text.split("where it was stuck")[1], text


def test_group_processes_take_the_callers_environment_and_the_shortcuts(monkeypatch):
    # The forkserver started before this variable existed: a child sees it only if it is handed over.
    monkeypatch.setenv("TILEFUSE_TEST_PROBE", "late")
    res = run_group(_report_process, 2, timeout=120)
    for rank in range(2):
        status, value = res[rank]
        assert status == "ok", value
        assert value["env"] == "late", value
        assert value["patched"] is True, value
        assert value["frozen"] > 1000, value  # the imported modules are out of the collector's way
