"""Multi-rank test harness: a pool of rank processes per world size, started once per session.

A job is a module-level function ``fn(ctx, *args)`` run on every rank; ``ctx`` is a
:class:`RankContext`. ``RankPool.run`` returns the per-rank return values, or raises
:class:`RankFailure` with every failing rank's traceback. A job that does not finish within its
timeout kills the pool (it is restarted on the next job) and raises ``TimeoutError`` naming the
ranks that did not answer; shortly before that, every rank still in the job writes the Python stack
of each of its threads to stderr (``faulthandler``), so a hang shows where each rank waits. Once a
rank has failed, the others get ``ERROR_GRACE`` seconds; the error then raised carries the stacks of
those still in the job, which each writes when asked (``SIGUSR1``) just before the pool is killed.

Processes: on the cpu device, rank processes (pools and :func:`run_group`) are forked from a
forkserver that has imported torch, triton and numpy once (about 3 s of CPU each time otherwise);
a child takes the test process's environment as it is when the child starts, as a spawned one
would, and imports tilefuse itself. On GPUs they are spawned (nothing CUDA-related is inherited).
Each rank freezes the objects it imported (``gc.freeze``), so the ``gc.collect`` between jobs and
in tilefuse's workspace code only walks what jobs created.

Device: ``TILEFUSE_TEST_DEVICE=cuda`` runs the ranks on GPUs (rank r on GPU r % n, so ranks share
GPU 0 when there is one), bootstrapped with gloo (NCCL refuses two ranks on one GPU; with a GPU per
rank ``TILEFUSE_TEST_PG=nccl`` selects NCCL); the default ``cpu`` runs them in Triton's interpreter
on a shared-memory heap.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import gc
import multiprocessing.forkserver
import os
import pickle
import queue
import signal
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler

import torch.multiprocessing as mp

TEST_DEVICE = os.environ.get("TILEFUSE_TEST_DEVICE", "cpu").strip().lower()
HEAP_BYTES = int(os.environ.get("TILEFUSE_TEST_HEAP", str(64 << 20)))
# gloo by default (NCCL refuses two ranks on one GPU); TILEFUSE_TEST_PG=nccl with a GPU per rank
# runs the plain paths' collectives and tilefuse's host exchanges over NCCL, as users run them.
PG_BACKEND = os.environ.get("TILEFUSE_TEST_PG", "gloo").strip().lower()
DEFAULT_TIMEOUT = float(os.environ.get("TILEFUSE_TEST_TIMEOUT", "240"))
ERROR_GRACE = 40.0
VERBOSE = os.environ.get("TILEFUSE_TEST_VERBOSE", "0") not in ("", "0")  # each rank names each job it starts
POLL_PAUSE_S = 3e-4  # the interpreter's pause before each volatile load (see speed_up_interpreter)
STACKS_BEFORE_TIMEOUT = 8.0  # a rank still busy this long before its job's timeout prints its stacks


# Imported once by the forkserver; none of them reads tilefuse's or Triton's settings at import.
PRELOAD = ["numpy", "torch", "torch._dynamo", "torch.distributed", "triton", "triton.language", "pytest"]


def process_context():
    """The multiprocessing context rank processes start from (see the module docstring)."""
    if TEST_DEVICE != "cpu":
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def start_forkserver() -> None:
    """Start the forkserver now (it imports in the background) so the first pool need not wait."""
    if TEST_DEVICE == "cpu":
        process_context()
        multiprocessing.forkserver.ensure_running()


def speed_up_interpreter() -> bool:
    """Make Triton's interpreter cheaper for the suite, leaving every result unchanged.

    Skip re-patching ``triton.language`` while its patch is in place (below); look numpy dtypes up
    in a memo; pause briefly before each volatile load (a poll); drop integer overflow checks
    whose assert is off.

    Triton 3.7's interpreter swaps every builtin of ``triton.language`` (``inspect.getmembers`` over
    five namespaces) for an interpreted one at each launch, and again at each call of one
    ``@triton.jit`` function from another, although the launch's swap is still in place: at test
    sizes that is about half of all interpreter time. With this, a patch request for a function
    whose language modules are all patched already returns a scope that restores nothing (the
    swap in place is the one it would make); any other request, a launch's first, runs Triton's
    own code. ``TILEFUSE_TEST_FAST_INTERPRETER=0`` turns it off. Returns whether it is installed
    (not when the interpreter lacks the names it relies on, as other Triton versions may).
    """
    if os.environ.get("TILEFUSE_TEST_FAST_INTERPRETER", "1") in ("", "0"):
        return False
    try:
        from triton.runtime import interpreter as interp
    except ImportError:
        return False
    real = getattr(interp, "_patch_lang", None)
    tl = getattr(interp, "tl", None)
    if real is None or tl is None:
        return False
    if getattr(real, "_skips_live_patch", False):  # installed already
        return True
    is_builtin = tl.core.is_builtin

    def one_builtin(pkg):
        return next((n for n in sorted(vars(pkg)) if is_builtin(getattr(pkg, n))), None)

    # For each language module a kernel may see, the namespaces its patch swaps and one builtin of each.
    watched = {}
    for lang in (tl, tl.core):
        pkgs = [lang, lang.tensor] + ([lang.math] if lang is tl else []) + [tl.core.tensor_descriptor_base]
        watched[lang] = [(pkg, one_builtin(pkg)) for pkg in pkgs]
    if any(name is None for pairs in watched.values() for _, name in pairs):
        return False
    langs_of: dict = {}

    class _NothingToRestore:
        def restore(self) -> None:
            pass

    nothing = _NothingToRestore()

    def patch_lang(fn):
        langs = langs_of.get(fn)
        if langs is None:
            langs = langs_of[fn] = tuple(v for v in fn.__globals__.values() if v is tl or v is tl.core)
        if langs and all(not is_builtin(getattr(pkg, name)) for lang in langs for pkg, name in watched[lang]):
            return nothing
        return real(fn)

    patch_lang._skips_live_patch = True
    interp._patch_lang = patch_lang

    # The numpy dtype of a Triton type: Triton builds a 17-entry dict for every lookup.
    real_np_dtype = getattr(interp, "_get_np_dtype", None)
    if real_np_dtype is not None:
        np_dtypes: dict = {}

        def np_dtype(tt_dtype):
            scalar = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
            try:
                return np_dtypes[scalar]
            except KeyError:
                np_dtypes[scalar] = found = real_np_dtype(scalar)
                return found
            except TypeError:  # pointer types do not hash
                return real_np_dtype(tt_dtype)

        interp._get_np_dtype = np_dtype

    # A volatile load is a poll of memory another process writes (a flag). The interpreter would
    # poll at full speed on a core the writer may need (three ranks share two cores in CI): a short
    # sleep before each poll gives the core back. It changes timing only, never what is read.
    builder = getattr(interp, "interpreter_builder", None)
    real_masked_load = getattr(builder, "create_masked_load", None)
    if real_masked_load is not None:

        def masked_load(*args, **kwargs):  # (ptrs, mask, other, cache_modifier, eviction_policy, is_volatile)
            if kwargs.get("is_volatile", args[5] if len(args) > 5 else False):
                time.sleep(POLL_PAUSE_S)
            return real_masked_load(*args, **kwargs)

        builder.create_masked_load = masked_load

    # Integer overflow checks end in a device assert, which does nothing unless Triton's debug
    # option is on: without it the interpreter computes each check and throws it away.
    options = getattr(builder, "options", None)
    if dataclasses.is_dataclass(options) and not getattr(options, "debug", True) \
            and getattr(options, "sanitize_overflow", False):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True


def install_fixed_order_dot() -> bool:
    """Make the interpreter's ``tl.dot`` add over K in one fixed order, so its bits never depend on
    the CPU's BLAS.

    Triton's interpreter computes ``tl.dot`` as ``np.matmul``, and OpenBLAS picks its kernels by the
    CPU it finds: on some of them (its Haswell sgemm, for one) an element's bits depend on the row it
    sits in within the block. Variants that tile the same rows differently then give different bits,
    and the suite's bit-identity verdicts would depend on the machine. Here every element is
    ``(a[i, 0] * b[0, j] + a[i, 1] * b[1, j] + ...) + acc``, each product and each partial sum rounded
    to the accumulator's float type in that order, whatever the element's position: the same bits on any
    x86-64 CPU. Integer dots stay ``np.matmul`` (exact). Returns whether it is installed (not when
    the interpreter lacks ``create_dot``, as other Triton versions may).
    """
    try:
        from triton.runtime import interpreter as interp
    except ImportError:
        return False
    builder = getattr(interp, "interpreter_builder", None)
    real_dot = getattr(builder, "create_dot", None)
    if real_dot is None:
        return False
    if getattr(real_dot, "_fixed_order", False):
        return True
    import numpy as np

    def fixed_order_dot(a, b, d, input_precision, max_num_imprecise_acc):
        acc = d.data
        if not np.issubdtype(acc.dtype, np.floating):
            return real_dot(a, b, d, input_precision, max_num_imprecise_acc)
        a_data, b_data = a.data, b.data
        if (a.dtype.primitive_bitwidth == 8 and a.dtype.is_floating()) or \
                (b.dtype.primitive_bitwidth == 8 and b.dtype.is_floating()):  # float8: as Triton does
            a_data = interp._convert_float(a_data, a.dtype, interp.tl.float16, None).view(np.float16)
            b_data = interp._convert_float(b_data, b.dtype, interp.tl.float16, None).view(np.float16)
        work = np.float64 if acc.dtype == np.float64 else np.float32
        # [K, M, N] products, then a sum over the leading axis: numpy adds whole [M, N] slices one
        # after another (k = 0, 1, ...), the same order for every element.
        a_k = np.moveaxis(a_data.astype(work, copy=False), -1, 0)[..., None]  # [K, (B,) M, 1]
        b_k = np.moveaxis(b_data.astype(work, copy=False), -2, 0)[..., None, :]  # [K, (B,) 1, N]
        products = np.multiply(a_k, b_k)
        total = np.add.reduce(products, axis=0) if products.shape[0] else np.zeros(acc.shape, work)
        return interp.TensorHandle((total + acc.astype(work, copy=False)).astype(acc.dtype, copy=False), d.dtype.scalar)

    fixed_order_dot._fixed_order = True
    builder.create_dot = fixed_order_dot
    return True


def _adopt_environment(env: dict) -> None:
    """Make this process's environment ``env`` (the test process's, taken when it started us)."""
    os.environ.clear()
    os.environ.update(env)


class RankFailure(AssertionError):
    """One or more ranks raised; the message holds each failing rank's traceback."""


@dataclass
class RankContext:
    rank: int
    world: int
    device: object  # torch.device
    heap: object  # tilefuse SymmetricHeap

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _on_host(value):
    """``value`` with every CUDA tensor in it (nested in lists, tuples, dicts) copied to the host.

    A CUDA tensor sent to the test process would travel as a CUDA IPC handle of this rank's memory,
    which the test process would then hold past the rank's exit; results are compared on the host.
    """
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu() if value.is_cuda else value
    if isinstance(value, (list, tuple)):
        items = [_on_host(v) for v in value]
        return type(value)(items) if type(value) in (list, tuple) else value
    if isinstance(value, dict):
        return {k: _on_host(v) for k, v in value.items()}
    return value


def _worker(rank: int, world: int, port: int, device_kind: str, env: dict, jobs, results, stack_path: str) -> None:
    # SIGUSR1 prints every thread's stacks into stack_path (the pool asks for them before it kills a stuck rank).
    stack_file = open(stack_path, "w")  # noqa: SIM115 (open as long as the process runs)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    _adopt_environment(env)
    if device_kind == "cpu":
        os.environ["TILEFUSE_BACKEND"] = "cpu"
        os.environ["TRITON_INTERPRET"] = "1"
        speed_up_interpreter()
        install_fixed_order_dot()
    else:
        os.environ["TILEFUSE_BACKEND"] = "cuda"
    # Errors recorded on the device raise at the failing call (a sync per call on GPUs; tests of the
    # asynchronous report turn it off), and no test tunes shapes or writes the user's cache.
    os.environ.setdefault("TILEFUSE_SYNC_ERRORS", "1")
    os.environ.setdefault("TILEFUSE_AUTOTUNE", "0")
    import tempfile

    os.environ.setdefault("TILEFUSE_CACHE_DIR", tempfile.mkdtemp(prefix="tilefuse-test-cache-"))
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if device_kind == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    import tilefuse

    tilefuse.runtime.set_debug_poison(True)  # new workspaces and outputs start as NaN

    gc.freeze()  # modules stay; the collections below only walk what jobs and the heap create
    try:
        dist.init_process_group(
            PG_BACKEND, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
            timeout=datetime.timedelta(seconds=120),
        )
        heap = tilefuse.init(heap_size=HEAP_BYTES)
        device = heap.device
        results.put((rank, "ready", None))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
        return
    ctx = RankContext(rank=rank, world=world, device=device, heap=heap)
    while True:
        job = jobs.get()
        if job is None:
            break
        job_id, fn, args, kwargs, timeout = job
        if VERBOSE:
            print(f"[rank {rank}/{world}] job {fn.__name__} starts", file=sys.stderr, flush=True)
        faulthandler.dump_traceback_later(max(1.0, timeout - STACKS_BEFORE_TIMEOUT), file=sys.stderr)
        try:
            value = fn(ctx, *args, **kwargs)
            try:
                # Serialised here, not in the queue's feeder thread, where a failure is only printed
                # and the test process would wait for a result that never comes.
                payload = bytes(ForkingPickler.dumps(_on_host(value)))
            except Exception as err:
                raise RuntimeError(f"job {fn.__name__} returned a value that cannot be sent to the test "
                                   f"process ({type(value).__name__}): {err}") from err
            results.put((rank, "ok", (job_id, payload)))
        except BaseException:
            results.put((rank, "error", (job_id, traceback.format_exc())))
        finally:
            faulthandler.cancel_dump_traceback_later()
        # Heap blocks held by reference cycles (a traceback, say) must come back on every rank
        # before the next job, or the ranks' allocations diverge.
        value = None
        gc.collect()
    tilefuse.shutdown()
    # Rank 0 hosts the store that shutdown's last host step reads: it must not exit before every
    # rank has read it (bounded: close() kills the ranks still here after 5 s).
    dist.barrier()
    dist.destroy_process_group()


class RankPool:
    """``world`` rank processes sharing a symmetric heap, reused across jobs."""

    def __init__(self, world: int, device_kind: str = TEST_DEVICE):
        self.world = world
        self.device_kind = device_kind
        self._procs: list = []
        self._job_id = 0

    def _start(self) -> None:
        ctx = process_context()
        port = _free_port()
        env = dict(os.environ)
        self._jobs = [ctx.Queue() for _ in range(self.world)]
        self._results = ctx.Queue()
        stacks = tempfile.mkdtemp(prefix="tilefuse-test-stacks-")
        self._stack_paths = [os.path.join(stacks, f"rank{r}.txt") for r in range(self.world)]
        self._procs = [
            ctx.Process(target=_worker, args=(r, self.world, port, self.device_kind, env,
                                               self._jobs[r], self._results, self._stack_paths[r]), daemon=True)
            for r in range(self.world)
        ]
        for p in self._procs:
            p.start()
        ready = self._collect(lambda msg: msg[1] in ("ready", "error"), timeout=180, what="start-up")
        errors = {r: m[2] for r, m in ready.items() if m[1] == "error"}
        if errors:
            self.close()
            raise RankFailure(self._format("pool start-up failed", errors))

    def _collect(self, accept, timeout: float, what: str) -> dict:
        got: dict = {}
        deadline = time.monotonic() + timeout
        while len(got) < self.world:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(self.world)) - set(got))
                stacks = self._stacks(missing)
                self.close()
                errors = {r: m[2][1] if isinstance(m[2], tuple) else m[2]
                          for r, m in got.items() if m[1] == "error"}
                if errors:
                    raise RankFailure(self._format(
                        f"{what} failed on world={self.world} (ranks {missing} then stuck; pool killed)",
                        errors) + stacks)
                raise TimeoutError(
                    f"world={self.world}: ranks {missing} did not finish {what} within {timeout:.0f} s "
                    "(pool killed; it restarts on the next job)" + stacks
                )
            try:
                msg = self._results.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(self._procs) if not p.is_alive() and r not in got]
                if dead:
                    codes = {r: self._procs[r].exitcode for r in dead}
                    self.close()
                    raise RankFailure(
                        f"world={self.world}: rank process(es) died during {what}: {codes}") from None
                continue
            if accept(msg):
                got[msg[0]] = msg
                if msg[1] == "error":
                    # The others may be stuck waiting for the failed rank: give them a grace period.
                    deadline = min(deadline, time.monotonic() + ERROR_GRACE)
        return got

    def _stacks(self, ranks: list) -> str:
        """The Python stacks of the stuck ``ranks``, each rank asked for them (SIGUSR1) before it is killed."""
        asked = [r for r in ranks if self._procs[r].is_alive()]
        for r in asked:
            try:
                os.kill(self._procs[r].pid, signal.SIGUSR1)
            except OSError:
                pass
        time.sleep(1.0 if asked else 0.0)  # faulthandler writes from its signal handler, at once
        parts = []
        for r in ranks:
            try:
                with open(self._stack_paths[r]) as f:
                    text = f.read().strip()
            except OSError:
                text = ""
            parts.append(f"\n--- rank {r}, where it was stuck ---\n{text or '(no stacks: the process had exited)'}")
        return "".join(parts)

    @staticmethod
    def _format(title: str, errors: dict) -> str:
        parts = [title]
        for r in sorted(errors):
            parts.append(f"--- rank {r} ---\n{errors[r]}")
        return "\n".join(parts)

    def run(self, fn, *args, timeout: float = DEFAULT_TIMEOUT, **kwargs) -> list:
        """Run ``fn(ctx, *args, **kwargs)`` on every rank; return the per-rank results."""
        if not self._procs or any(not p.is_alive() for p in self._procs):
            self.close()
            self._start()
        self._job_id += 1
        job_id = self._job_id
        for q in self._jobs:
            q.put((job_id, fn, args, kwargs, timeout))
        got = self._collect(lambda msg: msg[1] in ("ok", "error") and msg[2][0] == job_id, timeout,
                            f"{fn.__name__}")
        errors = {r: m[2][1] for r, m in got.items() if m[1] == "error"}
        if errors:
            raise RankFailure(self._format(f"{fn.__name__} failed on world={self.world}", errors))
        return [pickle.loads(got[r][2][1]) for r in range(self.world)]

    def close(self) -> None:
        for q in getattr(self, "_jobs", []):
            try:
                q.put(None)
            except Exception:
                pass
        deadline = time.monotonic() + 5
        for p in self._procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self._procs = []


class Pools:
    """Session-wide pools, one per world size, started on first use."""

    def __init__(self, device_kind: str = TEST_DEVICE):
        self.device_kind = device_kind
        self._pools: dict[int, RankPool] = {}

    def __call__(self, world: int) -> RankPool:
        if world not in self._pools:
            self._pools[world] = RankPool(world, self.device_kind)
        return self._pools[world]

    def run(self, world: int, fn, *args, **kwargs) -> list:
        return self(world).run(fn, *args, **kwargs)

    def close(self) -> None:
        # One pool after another: ranks shutting down on a crowded CPU make tilefuse's last host
        # step (the heap close) more likely to outlast the store host's exit, which the rank warns of.
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()


# ---------------------------------------------------------------------------------------------
# Fresh process groups, for tests where ranks die or must not share the pools' state
# ---------------------------------------------------------------------------------------------


def _group_worker(rank: int, world: int, port: int, env: dict, fn, args, results, stacks: tuple | None = None) -> None:
    _adopt_environment(env)
    if stacks is not None:  # (path, seconds): every thread's stack into the file if still running then
        faulthandler.dump_traceback_later(stacks[1], exit=False, file=open(stacks[0], "w"))  # noqa: SIM115
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        speed_up_interpreter()
        install_fixed_order_dot()
    gc.freeze()
    try:
        import datetime

        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
        value = fn(rank, world, *args)
        results.put((rank, "ok", bytes(ForkingPickler.dumps(_on_host(value)))))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))


def run_group(fn, world: int, *args, timeout: float = 120.0, env: dict | None = None) -> dict:
    """Run ``fn(rank, world, *args)`` in ``world`` new processes joined by a new gloo process group.

    Unlike :class:`RankPool`, nothing is initialised but the process group (``fn`` calls
    ``tilefuse.init`` itself, or not), the processes end after ``fn``, and a rank may die: the
    result maps every rank to ``("ok", value)``, ``("error", traceback)``, ``("died", exitcode)``
    or ``("timeout", stacks)`` (the rank's Python stacks a few seconds before the deadline, where it
    was stuck; None if it had not got that far). ``env`` is added to each rank's environment before it
    imports tilefuse (the cpu backend by default).
    """
    import tempfile

    stack_dir = tempfile.mkdtemp(prefix="tilefuse-stacks-")
    stack_after = max(1.0, timeout - 5.0)
    base = {"TILEFUSE_BACKEND": "cpu", "TRITON_INTERPRET": "1"} if TEST_DEVICE == "cpu" else {}
    ctx = process_context()
    results = ctx.Queue()
    port = _free_port()
    full_env = {**os.environ, **base, **(env or {})}
    procs = [ctx.Process(target=_group_worker, daemon=True,
                         args=(r, world, port, full_env, fn, args, results, (f"{stack_dir}/{r}.txt", stack_after)))
             for r in range(world)]
    for p in procs:
        p.start()
    got: dict = {}
    deadline = time.monotonic() + timeout
    try:
        while len(got) < world and time.monotonic() < deadline:
            try:
                rank, status, value = results.get(timeout=0.5)
                got[rank] = (status, pickle.loads(value) if status == "ok" else value)
            except queue.Empty:
                for r, p in enumerate(procs):
                    if r not in got and not p.is_alive():
                        time.sleep(0.5)  # its result may still be in the queue's pipe
                        while True:
                            try:
                                rank, status, value = results.get(timeout=0.1)
                            except queue.Empty:
                                break
                            got[rank] = (status, pickle.loads(value) if status == "ok" else value)
                        if r not in got:
                            got[r] = ("died", p.exitcode)
    finally:
        for p in procs:
            p.join(timeout=max(0.1, min(10.0, deadline - time.monotonic())))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    for r in range(world):
        if r not in got:
            try:
                with open(f"{stack_dir}/{r}.txt") as f:
                    got[r] = ("timeout", f.read() or None)
            except OSError:
                got[r] = ("timeout", None)
    import shutil

    shutil.rmtree(stack_dir, ignore_errors=True)
    return got
