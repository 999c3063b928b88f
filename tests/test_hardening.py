"""Runtime hardening: heap lifetime, private heap files, bounded host steps, a flat heap.

Each test names what would go wrong without the protection it checks: a crash or an alias after
``shutdown()``, heap files other users can map or that outlive a failed ``init``, a host step that
waits for a dead peer as long as the process group's timeout, a heap that leaks blocks.
Tests that need a rank to die run their own small process group (``harness.run_group``), never the
shared pools.
"""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import time
import types
import warnings
from pathlib import Path

import pytest
import torch
from harness import TEST_DEVICE, run_group

REPO = Path(__file__).resolve().parents[1]
cpu_only = pytest.mark.skipif(TEST_DEVICE != "cpu", reason="the /dev/shm heap is the cpu backend's")


# ----------------------------------------------------------------------------- heap lifetime
def group_tensor_after_shutdown(rank, world):
    import torch.distributed as dist

    import tilefuse
    from tilefuse.runtime.heap import LiveHeapTensorsWarning

    heap = tilefuse.init(heap_size=2 << 20)
    t = tilefuse.full((4096,), 7.0)
    addr = t.data_ptr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tilefuse.shutdown()
    messages = [str(w.message) for w in caught if issubclass(w.category, LiveHeapTensorsWarning)]
    del heap
    gc.collect()
    t.add_(1.0)  # the old heap's memory is still this tensor's
    heap2 = tilefuse.init(heap_size=2 << 20)
    u = tilefuse.full((4096,), 3.0)
    overlap = heap2.base <= addr < heap2.base + heap2.size
    seen = (t.min().item(), t.max().item(), u.min().item(), u.max().item())
    del u
    tilefuse.shutdown()
    try:
        heap2.empty(4)
        closed = "allocated"
    except RuntimeError as err:
        closed = str(err)
    dist.destroy_process_group()
    del t
    gc.collect()
    return {"warnings": messages, "values": seen, "overlap": overlap, "closed": closed}


def test_heap_tensor_stays_valid_after_shutdown_and_nothing_aliases_it(capfd):
    """Before: SIGSEGV on the CPU when the tensor is touched, and on a GPU the next heap's
    allocation took the same memory (a tensor filled with 7.0 read 3.0)."""
    res = run_group(group_tensor_after_shutdown, 2, timeout=180)
    err = capfd.readouterr().err
    for r in range(2):
        status, value = res[r]
        assert status == "ok", f"rank {r}: {status} {value}"
        assert value["values"] == (8.0, 8.0, 3.0, 3.0)
        assert not value["overlap"]
        assert "closed" in value["closed"] and "tilefuse.init()" in value["closed"], value["closed"]
        assert value["warnings"], "shutdown() with a live heap tensor must warn"
        assert "still referenced" in value["warnings"][0] and "bytes" in value["warnings"][0]
    # Clean exit: no "Exception ignored in Block.__del__" or AttributeError at interpreter shutdown.
    assert "Exception ignored" not in err and "AttributeError" not in err, err[-3000:]
    # GPU: every rank dropped its peers' mappings before the closing barrier, so no producer exits
    # while a consumer still holds its memory.
    assert "Producer process has been terminated" not in err, err[-3000:]


def job_closed_heap_warns_and_keeps_memory(ctx):
    from tilefuse.runtime.heap import LiveHeapTensorsWarning, SymmetricHeap

    heap = SymmetricHeap(1 << 20, ctx.heap.group, ctx.heap.backend, ctx.device)
    keep = heap.full((1000,), float(ctx.rank + 1))
    internal = heap.zeros(10)
    marked = heap.zeros(100)
    heap.mark_internal(marked[10:])  # a view marks its whole block
    reused = heap.zeros(100)
    heap.mark_internal(reused)
    del reused  # its block goes back to the pool, unmarked
    user = heap.zeros(50)  # takes the freed block: a user tensor again
    gone = heap.zeros(10)
    del gone
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        heap.close(internal=(internal,))
    msgs = [str(w.message) for w in caught if issubclass(w.category, LiveHeapTensorsWarning)]
    del heap, internal, marked, user
    gc.collect()
    keep.mul_(2)
    with warnings.catch_warnings(record=True) as quiet:
        warnings.simplefilter("always")
        clean = SymmetricHeap(1 << 20, ctx.heap.group, ctx.heap.backend, ctx.device)
        x = clean.zeros(3)
        del x
        clean.close()
    return msgs, keep.sum().item(), [str(w.message) for w in quiet]


def test_close_counts_only_the_blocks_users_still_hold(pools):
    """The warning names the live blocks and bytes; tilefuse's own (``internal=``, ``mark_internal``)
    and freed blocks are not counted, and a heap closed with nothing alive says nothing."""
    for r, (msgs, total, quiet) in enumerate(pools.run(2, job_closed_heap_warns_and_keeps_memory)):
        assert len(msgs) == 1 and "2 heap tensor block(s) (4352 bytes)" in msgs[0], msgs
        assert total == 1000 * (r + 1) * 2
        assert quiet == []


# ----------------------------------------------------------------------------- heap files
def watch_heap_files(hook):
    """Call ``hook(stage, paths)`` in this rank's heap file rendezvous: "created" once its file exists,
    "mapped" once every rank has mapped every file (before the unlinks). Returns the undo."""
    from tilefuse.runtime import backends, hostsync

    real, paths = hostsync.all_gather_object, []

    def gather(obj, group=None, *, what, **kwargs):
        if what == "tilefuse.init: creating the heap files":
            hook("created", paths)
        out = real(obj, group, what=what, **kwargs)
        if what == "tilefuse.init: heap file names":
            paths[:] = [os.path.join(backends.SHM_DIR, f"tilefuse-{out[0]}-r{r}") for r in range(len(out))]
        elif what == "tilefuse.init: mapping the heap files":
            hook("mapped", paths)
        return out

    hostsync.all_gather_object = gather
    return lambda: setattr(hostsync, "all_gather_object", real)


def job_heap_files(ctx):
    from tilefuse.runtime import heap as heapmod
    from tilefuse.runtime import hostsync

    seen = {}

    def mode(path):
        try:  # a peer past the last exchange may unlink its file at any moment
            return os.stat(path, follow_symlinks=False).st_mode & 0o777
        except FileNotFoundError:
            return None

    def hook(stage, paths):
        seen[stage] = {p: mode(p) for p in paths}

    undo = watch_heap_files(hook)
    try:
        heap = heapmod.SymmetricHeap(1 << 20, ctx.heap.group, "cpu", ctx.device)
    finally:
        undo()
    hostsync.barrier(ctx.heap.group, what="test: every rank's init returned")
    left = [p for p in seen["mapped"] if os.path.lexists(p)]
    heap.close()
    return seen, left


@cpu_only
def test_heap_files_are_private_and_gone_after_init(pools):
    """Before: created 0644 (any local user could map another job's heap between creation and
    unlink and keep the mapping)."""
    for rank, (seen, left) in enumerate(pools.run(2, job_heap_files)):
        own = sorted(seen["created"])[rank]
        assert seen["created"][own] == 0o600 and seen["mapped"][own] == 0o600, seen
        # A peer that got past the last exchange may have unlinked its file already.
        assert all(m in (0o600, None) for m in list(seen["created"].values()) + list(seen["mapped"].values())), seen
        assert left == [], f"heap files still in /dev/shm after init: {left}"


@cpu_only
def test_a_heap_file_readable_by_others_or_a_link_is_refused(tmp_path):
    """A peer's heap file is checked on its open descriptor: a link is not followed, and a file
    that others may read or write (not made by this user's rendezvous) is not mapped."""
    from tilefuse.runtime.backends import _map_file

    public, link, private = tmp_path / "public", tmp_path / "link", tmp_path / "private"
    for path, mode in ((public, 0o644), (private, 0o600)):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        os.ftruncate(fd, 4096)
        os.fchmod(fd, mode)
        os.close(fd)
    os.symlink(private, link)
    with pytest.raises(PermissionError, match="not a private regular file"):
        _map_file(str(public), 4096)
    with pytest.raises(OSError):
        _map_file(str(link), 4096)
    with pytest.raises(OSError, match="holds 4096 bytes, expected 8192"):
        _map_file(str(private), 8192)
    t = _map_file(str(private), 4096)
    t.fill_(5)
    assert private.read_bytes() == bytes([5]) * 4096


def group_die_during_init(rank, world, dying):
    import tilefuse

    paths: list = []

    def hook(stage, names):
        if stage == "created":
            paths.extend(names)
            if rank == dying:
                time.sleep(2.0)  # the survivor has the file names by now (it needs them to clean up)
                os.kill(os.getpid(), signal.SIGKILL)

    watch_heap_files(hook)
    t0 = time.monotonic()
    try:
        tilefuse.init(heap_size=1 << 20)
    except Exception as err:  # noqa: BLE001 - the message is the result
        return {"error": f"{type(err).__name__}: {err}", "s": time.monotonic() - t0, "paths": paths}
    return {"error": None, "s": time.monotonic() - t0, "paths": paths}


@cpu_only
@pytest.mark.slow
@pytest.mark.parametrize("dying", [1, 0], ids=["peer-dies", "store-host-dies"])
def test_a_rank_dying_during_init_leaves_nothing_in_dev_shm(dying):
    """Before: the heap files of a failed init stayed in /dev/shm (the survivor waited on
    ``all_gather_object`` for the process group's timeout, and nobody unlinked the dead rank's
    file). Now the survivor raises within TILEFUSE_HOST_TIMEOUT and unlinks every file of the
    rendezvous, the dead rank's included. Rank 0 also hosts the store: its death ends the wait at once.
    (A rank killed before the names reach its peers leaves its own file: nobody else can name it.)"""
    bound = 4.0
    res = run_group(group_die_during_init, 2, dying, timeout=90, env={"TILEFUSE_HOST_TIMEOUT": str(bound)})
    assert res[dying] == ("died", -signal.SIGKILL), res
    survivor = 1 - dying
    status, value = res[survivor]
    assert status == "ok", value
    assert value["error"] is not None and "HostTimeoutError" in value["error"], value
    if dying == 1:
        assert "rank(s) 1 of 2 did not arrive" in value["error"], value["error"]
    assert value["s"] < bound + 5, value
    assert len(value["paths"]) == 2
    left = [p for p in value["paths"] if os.path.lexists(p)]
    assert left == [], f"left in /dev/shm: {left}"


def group_die_before_watching_peers(rank, world):
    import tilefuse
    from tilefuse.runtime import group as tf_group
    from tilefuse.runtime import heap as heapmod
    from tilefuse.runtime import world as tf_world

    closed = []
    real_close = heapmod.SymmetricHeap.close

    def close(self, **kwargs):
        closed.append(self.rank)
        return real_close(self, **kwargs)

    heapmod.SymmetricHeap.close = close
    if rank == 1:  # mapped, then gone before the step that exchanges the process ids
        tf_group.watch_peers = lambda group, r: os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        tilefuse.init(heap_size=1 << 20)
    except Exception as err:  # noqa: BLE001 - the message is the result
        return {"error": f"{type(err).__name__}: {err}", "s": time.monotonic() - t0, "closed": closed,
                "states": len(tf_world.groups())}
    return {"error": None, "s": time.monotonic() - t0, "closed": closed, "states": len(tf_world.groups())}


@cpu_only
@pytest.mark.slow
def test_a_rank_dying_at_init_s_last_host_steps_leaves_the_heap_closed():
    """A peer gone after the heaps are mapped, before init's last host steps (the control block's
    symmetry, the exchange of process ids): the survivor raises within the host bound and closes its
    heap (peer mappings dropped, no state registered), where it used to leave it open."""
    bound = 2.0
    res = run_group(group_die_before_watching_peers, 2, timeout=60, env={"TILEFUSE_HOST_TIMEOUT": str(bound)})
    assert res[1] == ("died", -signal.SIGKILL), res
    status, value = res[0]
    assert status == "ok", value
    assert value["error"] is not None and "HostTimeoutError" in value["error"], value
    assert value["closed"] == [0] and value["states"] == 0, value
    assert value["s"] < 2 * bound + 5, value


def group_rank_dies_mid_call(rank, world, variant, after_exit):
    import select

    import tilefuse
    from tilefuse.runtime import world as tf_world

    heap = tilefuse.init(heap_size=8 << 20)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(64, 32, generator=gen).half().to(heap.device)  # the heap's device: cpu, or a GPU
    b = torch.randn(32, 16, generator=gen).half().to(heap.device)
    tilefuse.gemm_all_scatter(a, b, variant=variant)  # warm: the workspace exists, no host step is left
    tilefuse.synchronize()
    if rank == world - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    if after_exit:  # the peer has exited before this rank's call (its pidfd reads ready)
        fds = [fd for _, _, fd in tf_world.state_for(None).peers if fd >= 0]
        assert fds and select.select(fds, [], [], 30)[0], "the peer did not exit"
    t0 = time.monotonic()
    errors = []
    for _ in range(2):  # the call after the peer's exit, and the one after that
        try:
            tilefuse.gemm_all_scatter(a, b, variant=variant)
            tilefuse.synchronize()
            errors.append(None)
        except Exception as err:  # noqa: BLE001 - the message is the result
            errors.append(f"{type(err).__name__}: {err}")
    return {"error": errors[0], "second": errors[1], "s": time.monotonic() - t0}


@pytest.mark.parametrize("variant", ["bulk_sync", pytest.param("fused_sequential", marks=pytest.mark.slow)])
@pytest.mark.parametrize("after_exit", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_a_rank_dying_mid_call_makes_the_survivor_raise_within_the_bound(variant, after_exit):
    """Checked through the public API: a peer killed between two calls of a warm shape. Once its
    process has exited (``after_exit``), the survivor's next call raises PeerExitedError naming it
    before launching anything (on a GPU a kernel that stores into the memory of an exited process
    never finishes, so the device waits' bound cannot end it), and so does the call after. Killed as
    the survivor's call starts (a race: the call may launch while the peer still runs), the call
    must end in an error within TILEFUSE_WAIT_TIMEOUT, never hang or return a result: on a GPU, where
    its kernels may stall storing into the exited peer, ``tilefuse.synchronize`` gives up with
    PeerExitedError once the bound has passed after the exit."""
    bound = 5.0
    res = run_group(group_rank_dies_mid_call, 2, variant, after_exit, timeout=120,
                    env={"TILEFUSE_WAIT_TIMEOUT": str(bound), "TILEFUSE_HOST_TIMEOUT": str(bound)})
    assert res[1] == ("died", -signal.SIGKILL), res
    status, value = res[0]
    assert status == "ok", value
    assert value["error"] is not None, f"the call returned without its peer: {value}"
    assert value["second"] is not None, f"the second call returned without its peer: {value}"
    if after_exit:
        for err in (value["error"], value["second"]):
            assert err.startswith("PeerExitedError") and "rank 1 (pid" in err and "has exited" in err, value
        assert value["s"] < 2.0, value  # nothing waited
    else:
        assert value["s"] < 2 * bound + 15, value


class _Work:
    """Stands in for a group's ``done_event`` (a torch.cuda.Event): work behind the recorded event finishes
    after ``polls`` queries (never: None)."""

    def __init__(self, polls):
        self.polls, self.queries, self.recorded = polls, 0, []

    def record(self, stream):
        self.recorded.append(stream)

    def query(self):
        self.queries += 1
        return self.polls is not None and self.queries > self.polls


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs os.pidfd_open (Linux 5.3+, Python 3.9+)")
@pytest.mark.parametrize("finishes", [True, False])
@pytest.mark.timeout(60)
def test_host_wait_for_the_device_gives_up_once_a_peer_has_exited(monkeypatch, finishes):
    """The host's wait for the device (synchronize, reset, shutdown) polls an event behind the last
    call's stream. Work that finishes ends the wait; work that never does (on a GPU, a kernel storing
    into an exited peer's memory) raises PeerExitedError naming the peer once the wait bound has passed
    after the peer's exit, and poisons the rank's state. (On the CPU backend kernels are synchronous:
    this checks the wait itself, with stand-ins for the event and the device sync.)"""
    import tilefuse
    from tilefuse.runtime import world as tf_world

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    fd = os.pidfd_open(child.pid)
    work = _Work(polls=5 if finishes else None)
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    # With no eager call since a capture (a replayed graph's work): behind the current stream.
    last = types.SimpleNamespace(device="cuda:0")  # the last call's stream, on the heap's device
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "current stream")
    st = tf_world.Group(heap=type("Heap", (), {"device": "cuda:0"})(), ctl=None, dummy=None, status_host=None,
                        sync_errors=False, peers=((1, child.pid, fd),), wait_bound_s=0.3, group="tp", done_event=work)
    st.order.stream = None if finishes else last
    try:
        if finishes:
            st.wait_device("waiting for this rank's device")  # the peer still runs
            assert work.queries == 6 and synced == ["cuda:0"] and st.poisoned is None
            assert work.recorded == ["current stream"]
            return
        child.kill()
        child.wait()
        t0 = time.monotonic()
        with pytest.raises(tilefuse.PeerExitedError, match=rf"rank 1 \(pid {child.pid}\) of group 'tp' has exited; "
                                                           r"waiting for this rank's device gave up"):
            st.wait_device("waiting for this rank's device")
        assert 0.3 <= time.monotonic() - t0 < 3.0, "gave up before the bound, or long after it"
        assert work.recorded == [last] and not synced
        assert st.poison_error is tilefuse.PeerExitedError and "has exited" in st.poisoned
    finally:
        child.kill()
        child.wait()
        os.close(fd)


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs os.pidfd_open (Linux 5.3+, Python 3.9+)")
def test_check_peers_before_work_that_is_not_a_call(monkeypatch):
    """``tilefuse.check_peers()`` (to run before a CUDA graph replay, which no call check sees): nothing
    while the peers run; PeerExitedError naming the peer once one has exited, and again after (poisoned)."""
    import tilefuse
    from tilefuse.runtime import world as tf_world

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    fd = os.pidfd_open(child.pid)
    st = tf_world.Group(heap=None, ctl=None, dummy=None, status_host=None, sync_errors=False,
                        peers=((1, child.pid, fd),), group="tp")
    monkeypatch.setattr(tf_world, "group_of", lambda group=None: st)
    try:
        tilefuse.check_peers()
        assert st.poisoned is None
        child.kill()
        child.wait()
        for _ in range(2):
            with pytest.raises(tilefuse.PeerExitedError,
                               match=rf"rank 1 \(pid {child.pid}\) of group 'tp' has exited; tilefuse.check_peers"):
                tilefuse.check_peers()
    finally:
        child.kill()
        child.wait()
        os.close(fd)


# ----------------------------------------------------------------------------- bounded host steps
def job_missing_peer(ctx, bound):
    import torch.distributed as dist

    from tilefuse.runtime import hostsync

    sub = dist.new_group(backend="gloo")  # its own sequence of host steps: the pools' is untouched
    present = dist.new_group(ranks=list(range(ctx.world - 1)), backend="gloo")
    out = {}
    try:
        if ctx.rank != ctx.world - 1:
            hostsync.barrier(present, what="test: the present ranks start together")
            t0 = time.monotonic()
            try:
                hostsync.all_gather_object(ctx.rank, sub, what="test: shape exchange", timeout=bound)
                out["first"] = "returned"
            except hostsync.HostTimeoutError as err:
                out["first"] = str(err)
            out["s"] = time.monotonic() - t0
            t0 = time.monotonic()
            try:
                hostsync.barrier(sub, what="test: next step", timeout=bound)
                out["second"] = "returned"
            except hostsync.HostTimeoutError as err:
                out["second"] = str(err)
            out["second_s"] = time.monotonic() - t0
        hostsync.barrier(what="test: everyone done")  # on the world group: all ranks take part
        hostsync.reset(sub)
        out["after_reset"] = hostsync.all_gather_object(ctx.rank * 10, sub, what="test: after reset", timeout=bound)
    finally:
        dist.destroy_process_group(sub)
        if ctx.rank != ctx.world - 1:
            dist.destroy_process_group(present)
    return out


def test_a_missing_peer_at_a_host_step_raises_within_the_bound_naming_it(pools):
    """Before: the first call of a new shape exchanged shapes with ``all_gather_object``, bounded
    only by the process group's timeout (30 minutes with gloo)."""
    bound = 2.0
    res = pools.run(3, job_missing_peer, bound)
    for r in (0, 1):
        out = res[r]
        # The first rank to run out of time names rank 2; a peer still waiting stops with the same name.
        assert "test: shape exchange" in out["first"] and re.search(r"rank\(s\) 2\b", out["first"]), out
        assert out["s"] < bound + 2.0, out
        # The ranks are out of step now: the next step says so at once instead of pairing wrongly.
        assert "out of step" in out["second"] and out["second_s"] < 0.5, out
    assert max(res[0]["s"], res[1]["s"]) >= bound - 0.1
    assert any("did not arrive within" in res[r]["first"] for r in (0, 1))
    assert all(out["after_reset"] == [0, 10, 20] for out in res)


def job_first_call_shape_mismatch(ctx, bound):
    """Ranks disagree on M where one rank calls its shape for the first time: that rank's workspace
    host step ends (CallMismatchError once it sees the peer's call begin, else HostTimeoutError
    within the bound), the peer's call raises PeerCallError, and tilefuse.reset() on every rank
    brings the calls back."""
    import os

    import tilefuse
    from tilefuse.ops import registry

    fn, ref = registry.get("gemm_all_reduce", "fused_sequential"), registry.get("gemm_all_reduce", "reference")
    g = torch.Generator().manual_seed(3 + ctx.rank)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(ctx.device)

    fn(randn(4, 8), randn(8, 8))
    tilefuse.synchronize()
    os.environ["TILEFUSE_HOST_TIMEOUT"] = str(bound)
    t0 = time.monotonic()
    try:
        fn(randn(4 + ctx.rank, 8), randn(8, 8))  # rank 1: a new shape
        tilefuse.synchronize()
        raised = "nothing"
    except (tilefuse.HostTimeoutError, tilefuse.PeerCallError, tilefuse.CallMismatchError) as err:
        raised = type(err).__name__
    finally:
        del os.environ["TILEFUSE_HOST_TIMEOUT"]
    took = time.monotonic() - t0
    tilefuse.reset()
    from ophelpers import assert_matches

    a, b = randn(6, 8), randn(8, 8)
    assert_matches(fn(a, b), ref(a, b), torch.float32, 8, ctx.on_gpu, "the call after reset", scale=ctx.world)
    ok = True
    tilefuse.barrier()
    return raised, took, ok


def test_a_shape_mismatch_on_a_first_call_ends_within_the_host_bound(pools):
    """The case the README names under "Different calls on different ranks": a shape one rank has
    not called before makes it create a workspace, a host step its peer does not join."""
    bound = 1.0
    res = pools.run(2, job_first_call_shape_mismatch, bound)
    # The rank at the host step sees its peer's call begin: CallMismatchError before the bound.
    assert [r[0] for r in res] == ["PeerCallError", "CallMismatchError"], res
    assert all(r[1] < bound + 5.0 for r in res) and all(r[2] for r in res), res


def job_last_step_waits_for_every_read(ctx, delay):
    """Rank W-1 reads the step's keys ``delay`` s late; rank 0 (the store's host) times the step."""
    import pickle

    import torch.distributed as dist

    from tilefuse.runtime import hostsync

    class SlowReads:  # hostsync's pickle on the slow rank: loads after a pause
        dumps = staticmethod(pickle.dumps)
        HIGHEST_PROTOCOL = pickle.HIGHEST_PROTOCOL

        @staticmethod
        def loads(data):
            time.sleep(delay)
            return pickle.loads(data)

    sub = dist.new_group(backend="gloo")
    times = {}
    try:
        for last in (False, True):
            dist.barrier(sub)
            if ctx.rank == ctx.world - 1:
                hostsync.pickle = SlowReads
            t0 = time.monotonic()
            try:
                hostsync.barrier(sub, what=f"test: last={last}", last=last)
            finally:
                hostsync.pickle = pickle
            times[last] = time.monotonic() - t0
            dist.barrier(sub)
    finally:
        dist.destroy_process_group(sub)
    return times


def test_the_last_host_step_returns_only_after_every_rank_read_it(pools):
    """shutdown's last step: the rank hosting the store must not return (and exit) while a peer still
    reads the step's keys from it; an ordinary step returns as soon as this rank has read."""
    delay = 0.15
    res = pools.run(2, job_last_step_waits_for_every_read, delay)
    slow_read = 2 * delay  # the slow rank reads both ranks' keys
    assert res[0][False] < slow_read * 0.8, res  # an ordinary step does not wait for the peer's read
    assert res[0][True] >= slow_read * 0.9, res  # the last step does
    assert res[1][True] >= slow_read * 0.9, res


def job_host_steps(ctx, n):
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    import tilefuse
    from tilefuse.runtime import hostsync

    results = []
    for i in range(n):
        obj = {"rank": ctx.rank, "i": i, "shape": (i, ctx.rank)}
        results.append(hostsync.all_gather_object(obj, what=f"test: step {i % 3}"))
    st = hostsync._state(c10d._get_default_group())
    last = f"{hostsync._PREFIX}/{st.name}/{st.generation}/{st.sequence - 1}"
    hostsync.barrier(what="test: keys deleted")
    leftover = [k for k in [f"{last}/{r}" for r in range(ctx.world)] + [f"{last}/done"] if st.store.check([k])]
    sub = dist.new_group(backend="gloo")
    try:
        hostsync.all_gather_object(None, sub, what=f"test: rank {ctx.rank}'s own step", timeout=5)
        mismatch = "returned"
    except tilefuse.CallMismatchError as err:
        mismatch = str(err)
    finally:
        dist.destroy_process_group(sub)
    return results, leftover, mismatch


def test_host_steps_gather_in_rank_order_clean_up_and_catch_ranks_at_different_steps(pools):
    n = 40
    res = pools.run(2, job_host_steps, n)
    for results, leftover, mismatch in res:
        assert results == [[{"rank": r, "i": i, "shape": (i, r)} for r in range(2)] for i in range(n)]
        assert leftover == [], leftover
        assert "different host steps" in mismatch and "rank 1's own step" in mismatch, mismatch


def test_host_timeout_comes_from_the_environment(monkeypatch):
    from tilefuse.runtime import _env

    monkeypatch.delenv("TILEFUSE_HOST_TIMEOUT", raising=False)
    assert _env.host_timeout() == 60.0
    monkeypatch.setenv("TILEFUSE_HOST_TIMEOUT", "2.5")
    assert _env.host_timeout() == 2.5
    for bad in ("soon", "0", "-1", "nan", "inf"):
        monkeypatch.setenv("TILEFUSE_HOST_TIMEOUT", bad)
        with pytest.raises(ValueError, match="TILEFUSE_HOST_TIMEOUT"):
            _env.host_timeout()


# ----------------------------------------------------------------------------- a flat heap
def job_alloc_cycles(ctx, cycles, heap_bytes):
    import random

    from tilefuse.runtime.heap import SymmetricHeap

    heap = SymmetricHeap(heap_bytes, ctx.heap.group, ctx.heap.backend, ctx.device)
    rng = random.Random(1234)  # the same sequence on every rank: allocations stay symmetric
    base = heap.bytes_used
    shapes = set()
    used_after = []
    try:
        for cycle in range(cycles):
            live = []
            for _ in range(rng.randint(1, 6)):
                shape = (rng.randint(1, 300), rng.randint(1, 300))
                dtype = rng.choice([torch.float16, torch.float32, torch.int32])
                shapes.add((shape, dtype))
                live.append(heap.empty(*shape, dtype=dtype).fill_(cycle % 7))
            if cycle % 50 == 0:
                heap.check_symmetric("test: cycle", *live, signature=cycle)
            rng.shuffle(live)
            while live:
                live.pop()
            used_after.append(heap.bytes_used - base)
        whole = heap.empty(heap.size - base, dtype=torch.uint8)  # no fragment was left behind
        del whole
        return len(shapes), max(used_after), heap.bytes_used - base
    finally:
        heap.close()


def test_hundreds_of_distinct_allocations_leave_a_small_heap_flat(pools):
    heap_bytes = 4 << 20
    for distinct, worst, end in pools.run(2, job_alloc_cycles, 400, heap_bytes):
        assert distinct > 300
        assert worst == 0 and end == 0
