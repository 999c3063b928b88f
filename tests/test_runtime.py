"""Runtime tests: heap, device primitives, atomics, flags, bounded waits (W = 1..4 rank processes)."""

import os
import time

import pytest
import torch
import triton
import triton.language as tl

import tilefuse
from tilefuse.runtime import primitives as P
from tilefuse.runtime.heap import ALIGNMENT, Allocator, HeapFullError

WORLDS = [2, 3, pytest.param(4, marks=pytest.mark.slow)]  # W = 4: GPU runs and `make test-all`


# ----------------------------------------------------------------------------- kernels
@triton.jit
def _p2p_kernel(src_ptr, inbox_store_ptr, inbox_put_ptr, got_load_ptr, got_get_ptr, copy_dst_ptr,
                heap_bases, cur_rank, world, n, L: tl.constexpr, MASKED: tl.constexpr):
    peer = tl.program_id(0)
    offs = tl.arange(0, L)
    mask = offs < n if MASKED else None
    row = cur_rank * L + offs
    vals = tl.load(src_ptr + offs, mask=mask)
    # store: my src values into row `cur_rank` of peer's inbox_store
    P.store(inbox_store_ptr + row, vals, cur_rank, peer, heap_bases, mask=mask)
    # put: the same through put (reads local src itself)
    P.put(inbox_put_ptr + row, src_ptr + offs, cur_rank, peer, heap_bases, mask=mask)
    # load: peer's src into my got_load[peer] (an ordinary local tensor)
    v = P.load(src_ptr + offs, cur_rank, peer, heap_bases, mask=mask)
    tl.store(got_load_ptr + peer * L + offs, v, mask=mask)
    # get: peer's src into my got_get[peer] (on the heap)
    P.get(got_get_ptr + peer * L + offs, src_ptr + offs, cur_rank, peer, heap_bases, mask=mask)
    # copy: peer's src into row `cur_rank` of the next rank's copy_dst (a third-party copy)
    P.copy(copy_dst_ptr + row, src_ptr + offs, cur_rank, peer, (peer + 1) % world, heap_bases, mask=mask)


@triton.jit
def _atomic_kernel(buf_ptr, heap_bases, cur_rank, world, SEM: tl.constexpr, SCOPE: tl.constexpr):
    """buf (int32/int64/fp32 [4]) on every peer: [0] += 1, [1] -= 1, [2] = max, [3] = min."""
    peer = tl.program_id(0)
    one = tl.load(buf_ptr + 4)  # a 1 of the buffer's dtype, stored by the host
    P.atomic_add(buf_ptr + 0, one, cur_rank, peer, heap_bases, SEM=SEM, SCOPE=SCOPE)
    P.atomic_sub(buf_ptr + 1, one, cur_rank, peer, heap_bases, SEM=SEM, SCOPE=SCOPE)
    rank_val = one * (cur_rank + 10)
    P.atomic_max(buf_ptr + 2, rank_val, cur_rank, peer, heap_bases, SEM=SEM, SCOPE=SCOPE)
    P.atomic_min(buf_ptr + 3, rank_val, cur_rank, peer, heap_bases, SEM=SEM, SCOPE=SCOPE)


@triton.jit
def _bitwise_kernel(words_ptr, won_ptr, heap_bases, cur_rank, world, SEM: tl.constexpr,
                    SCOPE: tl.constexpr):
    """int32 words on every peer: [0] |= bit, [1] &= ~bit, [2] ^= bit, [3+r] xchg, [3+W] cas race."""
    peer = tl.program_id(0)
    bit = 1 << cur_rank
    P.atomic_or(words_ptr + 0, bit, cur_rank, peer, heap_bases, SEM=SEM, SCOPE=SCOPE)
    P.atomic_and(words_ptr + 1, ~bit, cur_rank, peer, heap_bases, SEM=SEM, SCOPE=SCOPE)
    P.atomic_xor(words_ptr + 2, bit, cur_rank, peer, heap_bases, SEM=SEM, SCOPE=SCOPE)
    P.atomic_xchg(words_ptr + 3 + cur_rank, cur_rank + 100, cur_rank, peer, heap_bases, SEM=SEM,
                  SCOPE=SCOPE)
    zero = tl.zeros([], dtype=tl.int32)
    old = P.atomic_cas(words_ptr + 3 + world, zero, zero + cur_rank + 1, cur_rank, peer, heap_bases,
                       SEM=SEM, SCOPE=SCOPE)
    tl.store(won_ptr + peer, (old == 0).to(tl.int32))


@triton.jit
def _producer_kernel(data_ptr, flag_ptr, heap_bases, cur_rank, world, epoch, L: tl.constexpr):
    """Write epoch-stamped data to every peer, then release its flag."""
    peer = tl.program_id(0)
    offs = tl.arange(0, L)
    vals = (offs + epoch * 1000).to(tl.float32)
    P.store(data_ptr + offs, vals, cur_rank, peer, heap_bases)
    # Release: pairs with the wait in _consumer_kernel on rank `peer`.
    P.signal(flag_ptr, epoch, cur_rank, peer, heap_bases)


@triton.jit
def _consumer_kernel(data_ptr, flag_ptr, out_ptr, ctl_ptr, heap_bases, cur_rank, world, src, epoch,
                     L: tl.constexpr):
    offs = tl.arange(0, L)
    # Acquire: pairs with the signal in _producer_kernel on rank `src`.
    ok = P.wait(flag_ptr, epoch, cur_rank, src, ctl_ptr, heap_bases, world)
    if ok:
        tl.store(out_ptr + offs, tl.load(data_ptr + offs))


@triton.jit
def _lonely_wait_kernel(flag_ptr, ctl_ptr, heap_bases, cur_rank, world, target, NWAITS: tl.constexpr):
    for i in tl.static_range(NWAITS):
        P.wait(flag_ptr + i, target, cur_rank, 1 - cur_rank, ctl_ptr, heap_bases, world)


# ----------------------------------------------------------------------------- jobs
def job_p2p(ctx, L, n, masked):
    heap, r, W = ctx.heap, ctx.rank, ctx.world
    src = heap.empty(L)
    src.copy_(torch.arange(L, dtype=torch.float32, device=ctx.device) + 1000 * r)
    inbox_store = heap.full((W, L), -1.0)
    inbox_put = heap.full((W, L), -1.0)
    got_get = heap.full((W, L), -1.0)
    copy_dst = heap.full((W, L), -1.0)
    got_load = torch.full((W, L), -1.0, device=ctx.device)
    heap.check_symmetric("p2p", src, inbox_store, inbox_put, got_get, copy_dst)
    tilefuse.barrier()
    _p2p_kernel[(W,)](src, inbox_store, inbox_put, got_load, got_get, copy_dst, heap.heap_bases, r, W, n,
                      L=L, MASKED=masked)
    tilefuse.barrier()
    # Host-side view of the next rank's copy agrees with what that rank wrote.
    nxt = (r + 1) % W
    expect_src = torch.arange(L, dtype=torch.float32, device=ctx.device) + 1000 * nxt
    assert torch.equal(heap.peer_view(src, nxt), expect_src)
    assert torch.equal(heap.peer_view(inbox_store, nxt)[r, :n], src[:n])
    k = n if masked else L
    idx = torch.arange(L, dtype=torch.float32, device=ctx.device)

    def expect(row_rank):
        e = torch.full((L,), -1.0, device=ctx.device)
        e[:k] = idx[:k] + 1000 * row_rank
        return e

    for q in range(W):
        assert torch.equal(inbox_store[q], expect(q)), f"store from rank {q}: {inbox_store[q]}"
        assert torch.equal(inbox_put[q], expect(q)), f"put from rank {q}"
        assert torch.equal(got_load[q], expect(q)), f"load from rank {q}"
        assert torch.equal(got_get[q], expect(q)), f"get from rank {q}"
        # Row q on rank r was written by rank q copying from rank (r - 1) % W.
        assert torch.equal(copy_dst[q], expect((r - 1) % W)), f"copy row {q}"
    tilefuse.barrier()
    return True


def job_atomics(ctx, dtype):
    heap, r, W = ctx.heap, ctx.rank, ctx.world
    buf = heap.zeros(5, dtype=dtype)
    words = heap.zeros(4 + W, dtype=torch.int32)
    won = torch.zeros(W, dtype=torch.int32, device=ctx.device)
    combos = [(sem, scope) for sem in ("relaxed", "acquire", "release", "acq_rel")
              for scope in ("gpu", "sys", "cta")]
    for sem, scope in combos:
        buf.copy_(torch.tensor([0, 0, -(10**6), 10**6, 1], dtype=dtype))
        words.zero_()
        words[1] = -1
        tilefuse.barrier()
        _atomic_kernel[(W,)](buf, heap.heap_bases, r, W, SEM=sem, SCOPE=scope)
        if dtype == torch.int32:
            _bitwise_kernel[(W,)](words, won, heap.heap_bases, r, W, SEM=sem, SCOPE=scope)
        tilefuse.barrier()
        got = buf[:4].tolist()
        assert got == [W, -W, W - 1 + 10, 10], f"{dtype} sem={sem} scope={scope}: {got}"
        if dtype == torch.int32:
            allbits = (1 << W) - 1
            w = words.tolist()
            assert w[0] == allbits, f"or: {w[0]}"
            assert w[1] == ~allbits, f"and: {w[1]}"
            assert w[2] == allbits, f"xor: {w[2]}"
            assert w[3:3 + W] == [q + 100 for q in range(W)], f"xchg: {w[3:3 + W]}"
            assert 1 <= w[3 + W] <= W, f"cas: {w[3 + W]}"
            won_here = [0] * W
            # Exactly one rank wins the cas race on each rank's word: gather the wins per target rank.
            import torch.distributed as dist

            all_won = [None] * W
            dist.all_gather_object(all_won, won.tolist())
            for target in range(W):
                won_here[target] = sum(all_won[src][target] for src in range(W))
            assert won_here == [1] * W, f"cas winners per rank: {won_here}"
        tilefuse.barrier()
    return True


def job_message_passing(ctx, epochs, delay_s):
    heap, r, W = ctx.heap, ctx.rank, ctx.world
    L = 64
    data = heap.full((L,), float("nan"))
    flag = heap.zeros(1, dtype=torch.int64)
    heap.check_symmetric("mp", data, flag)
    tilefuse.barrier()
    producer = 0
    for epoch in range(1, epochs + 1):
        if r == producer:
            time.sleep(delay_s)  # consumers must really wait
            _producer_kernel[(W,)](data, flag, heap.heap_bases, r, W, epoch, L=L)
            tilefuse.synchronize()
        else:
            out = torch.full((L,), float("nan"), device=ctx.device)
            t0 = time.monotonic()
            _consumer_kernel[(1,)](data, flag, out, tilefuse.runtime.control_block(), heap.heap_bases, r, W,
                                   producer, epoch, L=L)
            tilefuse.synchronize()
            waited = time.monotonic() - t0
            expect = torch.arange(L, dtype=torch.float32, device=ctx.device) + epoch * 1000
            assert torch.equal(out, expect), f"epoch {epoch}: consumer read {out[:4]}"
            if epoch == 1 and delay_s > 0 and not ctx.on_gpu:
                assert waited > 0.5 * delay_s, f"consumer returned after {waited:.2f}s: did it wait?"
        tilefuse.barrier()
    return True


def job_lonely_wait(ctx, seconds, nwaits):
    heap, r = ctx.heap, ctx.rank
    flags = heap.zeros(nwaits, dtype=torch.int64)
    old = tilefuse.set_wait_timeout(seconds)
    try:
        t0 = time.monotonic()
        _lonely_wait_kernel[(1,)](flags, tilefuse.runtime.control_block(), heap.heap_bases, r, ctx.world, 7,
                                  NWAITS=nwaits)
        with pytest.raises((tilefuse.WaitTimeoutError, tilefuse.PoisonedError)) as info:
            tilefuse.synchronize()
        elapsed = time.monotonic() - t0
        msg = str(info.value)
        if isinstance(info.value, tilefuse.WaitTimeoutError):  # this rank's own wait gave up first
            assert f"rank {r} gave up after" in msg, msg
            assert "to reach 7" in msg and f"offset {heap.offset_of(flags)}" in msg, msg
            assert f"written by rank {1 - r}" in msg, msg
        # The runtime is poisoned on every rank: every op raises until reset().
        a = torch.randn(20, 16).to(torch.float16).to(ctx.device)
        b = torch.randn(16, 8).to(torch.float16).to(ctx.device) * (r + 1)
        with pytest.raises(tilefuse.PoisonedError, match="reset"):
            tilefuse.gemm_all_scatter(a, b, variant="wg_specialized")
    finally:
        tilefuse.set_wait_timeout(old)
    tilefuse.reset()
    got = tilefuse.gemm_all_scatter(a, b, variant="wg_specialized")
    ref = tilefuse.gemm_all_scatter(a, b, variant="reference")
    torch.testing.assert_close(got.float(), ref.float(), rtol=1e-2, atol=1e-2)
    return elapsed


def job_device_barrier(ctx, rounds):
    heap, r, W = ctx.heap, ctx.rank, ctx.world
    slot = heap.zeros(W, dtype=torch.int32)
    heap.check_symmetric("barrier", slot)
    for i in range(1, rounds + 1):
        if r == W - 1:
            time.sleep(0.2)
        slot[r] = i
        tilefuse.device_barrier()
        # After the barrier every rank's slot[r] holds i: read them through a remote load kernel.
        seen = torch.zeros(W, dtype=torch.int32, device=ctx.device)
        _gather_slot_kernel[(W,)](slot, seen, heap.heap_bases, r)
        tilefuse.synchronize()
        assert seen.tolist() == [i] * W, f"round {i}: {seen.tolist()}"
        tilefuse.device_barrier()
    tilefuse.barrier()
    return True


@triton.jit
def _gather_slot_kernel(slot_ptr, out_ptr, heap_bases, cur_rank):
    peer = tl.program_id(0)
    tl.store(out_ptr + peer, P.load(slot_ptr + peer, cur_rank, peer, heap_bases))


def job_heap_alloc(ctx):
    heap = ctx.heap
    free0 = heap.bytes_free
    a = heap.empty(1000, dtype=torch.float16)
    off_a = heap.offset_of(a)
    assert off_a % ALIGNMENT == 0
    assert heap.is_on_heap(a) and heap.is_on_heap(a[3:7])
    del a
    b = heap.empty(1000, dtype=torch.float16)
    assert heap.offset_of(b) == off_a, "a freed block is reused"
    view = b[10:20]
    del b
    c = heap.empty(1000, dtype=torch.float16)
    assert heap.offset_of(c) != off_a, "a live view keeps its block"
    del view, c
    assert heap.bytes_free == free0, "every block came back"
    with pytest.raises(HeapFullError, match=r"requested \d+ bytes .* \d+ bytes free"):
        heap.empty(heap.size + 1, dtype=torch.uint8)
    big = heap.empty(heap.bytes_free // 2, dtype=torch.uint8)
    del big
    z = heap.zeros(3, 5, dtype=torch.int64)
    assert z.shape == (3, 5) and int(z.abs().sum()) == 0
    f = heap.full((4,), 2.5)
    assert f.tolist() == [2.5] * 4
    ar = heap.arange(6)
    assert ar.tolist() == list(range(6))
    rn = heap.randn(64, 64)
    assert 0.5 < float(rn.std()) < 1.5
    with pytest.raises(ValueError, match="symmetric heap"):
        heap.check_on_heap("x", torch.zeros(4, device=ctx.device))
    assert not heap.is_on_heap(torch.zeros(4, device=ctx.device))
    assert tilefuse.init() is heap, "init is idempotent"
    return True


# ----------------------------------------------------------------------------- tests
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("L,n,masked", [(64, 64, False), (64, 37, True)])
def test_point_to_point(pools, world, L, n, masked):
    assert all(pools.run(world, job_p2p, L, n, masked))


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32])
def test_atomics_exact_across_ranks(pools, world, dtype):
    assert all(pools.run(world, job_atomics, dtype))


@pytest.mark.parametrize("world", WORLDS)
def test_message_passing_with_delayed_producer(pools, world):
    assert all(pools.run(world, job_message_passing, 3, 0.4))


def test_bounded_wait_raises(pools):
    """A wait nobody releases gives up after its bound in seconds, poisons every rank, and reset() recovers."""
    elapsed = pools.run(2, job_lonely_wait, 1.0, 4)
    # Four waits, but once the first gives up the rest give up at once: about one bound in all.
    assert max(elapsed) < 20.0


@pytest.mark.parametrize("world", WORLDS)
def test_device_barrier(pools, world):
    assert all(pools.run(world, job_device_barrier, 3))


def test_heap_alloc_free_reuse(pools):
    assert all(pools.run(1, job_heap_alloc))


def test_peer_ipc_handles_open_on_this_ranks_device():
    """torch's CUDA IPC rebuild opens a peer's memory on the owner's device index; the heap changes
    that argument to its own device, or a kernel on this GPU faults on a peer on another GPU."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    from tilefuse.runtime.backends import _open_on_device

    names = list(__import__("inspect").signature(rebuild_cuda_tensor).parameters)
    args = tuple(f"arg{i}" for i in range(len(names)))
    got = _open_on_device(rebuild_cuda_tensor, args, torch.device("cuda", 3))
    k = names.index("storage_device")
    assert got[k] == 3 and got[:k] + got[k + 1:] == args[:k] + args[k + 1:]


def test_allocator_coalesces():
    alloc = Allocator(4096)
    offs = [alloc.alloc(1000) for _ in range(4)]
    assert offs == [0, 1024, 2048, 3072]
    with pytest.raises(HeapFullError, match="requested 10 bytes"):
        alloc.alloc(10)
    for o in (offs[1], offs[3], offs[2]):
        alloc.free(o)
    assert alloc.alloc(3000) == 1024, "three freed neighbours merge into one block"
    alloc.free(offs[0])
    alloc.free(1024)
    assert alloc.bytes_used == 0 and alloc._free == [(0, 4096)], "every block came back, merged"


def test_init_without_process_group():
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group exists in the test process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        tilefuse.init()


def test_heap_size_env(monkeypatch):
    from tilefuse.runtime.heap import resolve_heap_size

    monkeypatch.setenv("TILEFUSE_HEAP_SIZE", "3M")
    assert resolve_heap_size(None, "cpu") == 3 << 20
    assert resolve_heap_size(4096, "cpu") == 4096
    monkeypatch.setenv("TILEFUSE_HEAP_SIZE", "lots")
    with pytest.raises(ValueError, match="not a size"):
        resolve_heap_size(None, "cpu")
    monkeypatch.delenv("TILEFUSE_HEAP_SIZE")
    assert resolve_heap_size(None, "cpu") == 256 << 20
    assert os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()


def test_shutdown_gives_workspaces_back_and_a_new_heap_starts_clean():
    """In-process world 1: an op's workspaces belong to the heap they were made on. shutdown() drops
    them, and a heap made later never gets one of the old heap's (caches key on heap.uid, not id())."""
    import socket

    import torch.distributed as dist

    from tilefuse.ops.common import arena

    if dist.is_initialized():
        pytest.skip("a process group exists in the test process")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    uids = []
    try:
        for _ in range(2):
            heap = tilefuse.init(heap_size=16 << 20)
            a = torch.randn(40, 24).to(torch.float16).to(heap.device)
            b = torch.randn(24, 16).to(torch.float16).to(heap.device)
            got = tilefuse.gemm_all_scatter(a, b, variant="wg_specialized")
            torch.testing.assert_close(got.float(), a.float() @ b.float(), rtol=1e-2, atol=1e-2)
            assert arena.workspaces(), "the op made a workspace"
            uids.append(heap.uid)
            tilefuse.shutdown()
            assert not arena.workspaces(), "shutdown() kept workspaces of a closed heap"
        assert uids[0] != uids[1]
    finally:
        tilefuse.shutdown()
        dist.destroy_process_group()


def test_ops_refuse_to_launch_on_another_current_device(monkeypatch):
    """Triton launches on the current CUDA device: a thread whose current device is not the heap's
    would run the op's kernels on the wrong GPU. The check names both devices and the fix."""
    from tilefuse.runtime.group import check_current_device

    check_current_device("op", torch.device("cpu"))  # nothing to check on the CPU backend
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    check_current_device("op", torch.device("cuda", 1))
    with pytest.raises(RuntimeError, match=r"heap is on cuda:0 but the current CUDA device is cuda:1.*set_device\(0\)"):
        check_current_device("gemm_all_scatter", torch.device("cuda", 0))


def job_returns_a_tensor_that_needs_grad(ctx):
    x = torch.ones(2, requires_grad=True)  # a host tensor: the harness detaches device results as it copies them
    return x * 2  # a non-leaf tensor that requires grad cannot cross process boundaries


def test_harness_fails_fast_on_a_result_it_cannot_send(pools):
    """Such a result used to hang the test until its timeout (the queue's feeder thread only printed)."""
    from harness import RankFailure

    start = time.monotonic()
    with pytest.raises(RankFailure, match="cannot be sent to the test process"):
        pools.run(2, job_returns_a_tensor_that_needs_grad, timeout=120)
    assert time.monotonic() - start < 60
    assert pools.run(2, job_device_is_usable) == [True, True], "the pool must stay usable"


def job_device_is_usable(ctx):
    return bool(torch.ones(1, device=ctx.device).sum().item() == 1)
