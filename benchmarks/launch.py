"""The benchmarks' rank launcher: run ``fn(ctx, *args)`` on every rank.

    from benchmarks.launch import launch
    results = launch(fn, world, *args, heap_size=256 << 20)   # one result per rank, in rank order

``fn`` must be a module-level function (ranks are spawned processes); it gets a :class:`RankCtx`:
the rank, the world size, the device, the symmetric heap, the process-group backend and a gloo
group for host barriers and cross-rank reductions. Each rank's setup: GPU ``rank % device_count``
(ranks share GPU 0 on a one-GPU machine), the NCCL process group when every rank has a GPU of its
own and gloo otherwise (NCCL refuses two ranks on one GPU; ``BENCH_PG_BACKEND`` forces one), then
``tilefuse.init(heap_size)``; with no usable GPU the ranks run on the CPU in Triton's interpreter.

Under ``torchrun`` (``RANK``/``WORLD_SIZE`` set) ``launch`` runs this process's rank only and
returns its result alone; otherwise world 1 runs in this process and more ranks are spawned. Every
wait is bounded: a rank that raises is reported with its traceback (:class:`LaunchError`), the
others get 30 s to finish, and ranks still running at ``timeout`` are killed.
"""

from __future__ import annotations

import datetime
import math
import os
import pickle
import queue
import socket
import time
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

ERROR_GRACE_S = 30.0  # after one rank fails, how long the others get before they are killed


@dataclass
class RankCtx:
    """What a launched function gets on each rank."""

    rank: int
    world: int
    device: torch.device
    heap: object  # tilefuse SymmetricHeap
    pg_backend: str  # "nccl" or "gloo": the process group tilefuse was initialised with
    host_group: object  # gloo group for host barriers and reductions

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def sync(self) -> None:
        if self.on_gpu:
            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        """This rank's device work is done and every rank got here."""
        self.sync()
        if self.world > 1:
            dist.barrier(group=self.host_group)

    def max(self, value: float) -> float:
        """Maximum of ``value`` over ranks (NaN if any rank has NaN)."""
        if self.world == 1:
            return float(value)
        nan = math.isnan(value)
        t = torch.tensor([0.0 if nan else float(value), 1.0 if nan else 0.0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.host_group)
        return float("nan") if t[1] > 0 else float(t[0])

    def all_true(self, flag: bool) -> bool:
        if self.world == 1:
            return bool(flag)
        t = torch.tensor([0 if flag else 1], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.host_group)
        return int(t[0]) == 0

    def all_gather_object(self, obj) -> list:
        """Every rank's ``obj`` (picklable), in rank order (a host round trip on the gloo group)."""
        if self.world == 1:
            return [obj]
        out: list = [None] * self.world
        dist.all_gather_object(out, obj, group=self.host_group)
        return out


class LaunchError(RuntimeError):
    """One or more ranks raised or died; the message holds their tracebacks."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def is_main_process() -> bool:
    """The process that prints and writes files: the launcher, or rank 0 under torchrun."""
    return not under_torchrun() or int(os.environ["RANK"]) == 0


def use_interpreter_without_gpu() -> bool:
    """Switch Triton's interpreter on when there is no usable GPU (or ``TILEFUSE_BACKEND=cpu``);
    call it before any Triton kernel module is imported. Returns True when it did."""
    if torch.cuda.is_available() and os.environ.get("TILEFUSE_BACKEND", "").strip().lower() != "cpu":
        return False
    os.environ["TILEFUSE_BACKEND"] = "cpu"
    os.environ["TRITON_INTERPRET"] = "1"
    return True


def gpu_count() -> int:
    """GPUs the ranks may use (0 under ``TILEFUSE_BACKEND=cpu``)."""
    if os.environ.get("TILEFUSE_BACKEND", "").strip().lower() == "cpu":
        return 0
    return torch.cuda.device_count()


def on_cuda() -> bool:
    """Whether tilefuse runs on CUDA here: ``TILEFUSE_BACKEND``, else whether torch sees a GPU."""
    forced = os.environ.get("TILEFUSE_BACKEND", "").strip().lower()
    return forced == "cuda" or (forced != "cpu" and torch.cuda.is_available())


def pg_backend(world: int) -> str:
    """NCCL when every rank has a GPU of its own, else gloo (``BENCH_PG_BACKEND`` overrides)."""
    forced = os.environ.get("BENCH_PG_BACKEND", "").strip().lower()
    if forced:
        return forced
    if on_cuda() and torch.cuda.device_count() >= world:
        return "nccl"
    return "gloo"


def init_rank(rank: int, world: int, init_method: str, *, local_rank: int | None = None,
              heap_size: int | None = None, pg: str | None = None, pg_timeout_s: float = 300.0) -> RankCtx:
    """Set this process up as rank ``rank`` of ``world``: its GPU (``local_rank % device_count`` when
    tilefuse runs on CUDA), the process group (``pg``, default :func:`pg_backend`), a gloo group for
    host work, and the symmetric heap. Undo with :func:`close_rank`."""
    import tilefuse

    if on_cuda():
        torch.cuda.set_device((rank if local_rank is None else local_rank) % torch.cuda.device_count())
    pg = pg or pg_backend(world)
    dist.init_process_group(pg, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=pg_timeout_s))
    try:
        host_group = dist.new_group(backend="gloo") if pg != "gloo" else dist.group.WORLD
        heap = tilefuse.init(heap_size=heap_size)
    except BaseException:
        dist.destroy_process_group()
        raise
    return RankCtx(rank=rank, world=world, device=heap.device, heap=heap, pg_backend=pg, host_group=host_group)


def close_rank() -> None:
    """The heap and the process group of :func:`init_rank` go."""
    import tilefuse

    try:
        tilefuse.shutdown()
    finally:
        dist.destroy_process_group()


def _run_rank(rank: int, world: int, init_method: str, local_rank: int, fn, args, kwargs, heap_size):
    ctx = init_rank(rank, world, init_method, local_rank=local_rank, heap_size=heap_size)
    try:
        return fn(ctx, *args, **kwargs)
    finally:
        close_rank()


def _worker(rank, world, port, fn, args, kwargs, heap_size, results) -> None:
    """A spawned rank: its result or its traceback goes to the launcher before the rank's heap and
    process group are closed (closing waits for the peers, which a failed run may never send)."""
    ctx = None
    try:
        ctx = init_rank(rank, world, f"tcp://127.0.0.1:{port}", local_rank=rank, heap_size=heap_size)
        value = fn(ctx, *args, **kwargs)
        try:  # pickled here: a value that cannot be sent fails this rank now, not the queue's thread later
            payload = pickle.dumps(value)
        except Exception as err:
            raise RuntimeError(f"{getattr(fn, '__name__', fn)} returned a value that cannot be sent to the "
                               f"launcher ({type(value).__name__}): {err}") from err
        results.put((rank, "ok", payload))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if ctx is not None:
            close_rank()


def _any_error(got: dict) -> bool:
    return any(status == "error" for status, _ in got.values())


def launch(fn, world: int, *args, heap_size: int | None = None, timeout: float = 1800.0,
           error_grace_s: float = ERROR_GRACE_S, **kwargs) -> list:
    """Run ``fn(ctx, *args, **kwargs)`` on ``world`` ranks; return the list of per-rank results.

    Under torchrun ``world`` is ignored (``WORLD_SIZE`` rules) and the list holds only this rank's
    result. Raises :class:`LaunchError` with every failing rank's traceback, or naming the ranks
    that did not finish within ``timeout`` seconds, or within ``error_grace_s`` after a rank failed
    (they are killed).
    """
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    if under_torchrun():
        env_world = int(os.environ["WORLD_SIZE"])
        rank = int(os.environ["RANK"])
        local = int(os.environ.get("LOCAL_RANK", rank))
        return [_run_rank(rank, env_world, "env://", local, fn, args, kwargs, heap_size)]
    use_interpreter_without_gpu()  # spawned ranks inherit the environment
    if world == 1:
        return [_run_rank(0, 1, f"tcp://127.0.0.1:{free_port()}", 0, fn, args, kwargs, heap_size)]
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, fn, args, kwargs, heap_size, results),
                         daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    got: dict = {}
    deadline = time.monotonic() + timeout
    try:
        while len(got) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                rank, status, value = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                if any(not p.is_alive() and r not in got for r, p in enumerate(procs)):
                    time.sleep(1.0)  # a rank may have died right after putting its result
                    while not results.empty():
                        rank, status, value = results.get()
                        got[rank] = (status, value)
                    dead = {r: p.exitcode for r, p in enumerate(procs) if not p.is_alive() and r not in got}
                    if dead:
                        got.update({r: ("error", f"process died, exit code {c}") for r, c in dead.items()})
                        break
                continue
            got[rank] = (status, value)
            if status == "error":
                deadline = min(deadline, time.monotonic() + error_grace_s)  # the others may be stuck on it
    finally:
        for p in procs:
            p.join(timeout=30.0 if len(got) == world and not _any_error(got) else 1.0)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    errors = {r: v for r, (s, v) in got.items() if s == "error"}
    missing = sorted(set(range(world)) - set(got))
    if errors or missing:
        parts = [f"{len(errors)} rank(s) failed" + (f"; ranks {missing} did not finish within {timeout:.0f} s"
                                                    if missing else "")]
        parts += [f"--- rank {r} ---\n{errors[r]}" for r in sorted(errors)]
        raise LaunchError("\n".join(parts))
    return [pickle.loads(got[r][1]) for r in range(world)]
