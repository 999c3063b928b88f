"""Bounded host collectives for tilefuse's own host steps (heap rendezvous, shape checks, workspaces).

``torch.distributed``'s object collectives wait as long as the process group's timeout (30 minutes
with gloo) and do not say who is missing. These go through the group's key-value store instead and
give up after ``timeout`` seconds (default ``TILEFUSE_HOST_TIMEOUT``, 60) with a
:class:`HostTimeoutError` naming the ranks that did not arrive and the step.

One call on a group (every rank makes the same calls on it in the same order):

======================  ==================================================================
step                    keys (``P`` = ``tilefuse/hostsync/<group>/<generation>/<sequence>``)
======================  ==================================================================
publish                 each rank ``r`` sets ``P/r`` to its pickled ``(what, obj)``
gather                  each rank waits (bounded) for ``P/0`` .. ``P/W-1`` and reads them
release                 each rank adds 1 to ``P/done``; the rank that brings it to ``W``
                        deletes every key of the call (nobody reads them after their add)
======================  ==================================================================

A rank that runs out of time sets ``P/gave_up`` naming the missing ranks (a peer still waiting, or
arriving later, stops at once with the same names) and marks the group out of step: every later
call on it raises at once until :func:`reset` on every rank. Ranks that pass different ``what`` are
at different steps: that raises too, naming both.
"""

from __future__ import annotations

import math
import pickle
import time
from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from . import _env

_PREFIX = "tilefuse/hostsync"
_HINT = "A rank that died, hangs, or skipped this step; raise TILEFUSE_HOST_TIMEOUT if a rank is only slow."


class HostTimeoutError(RuntimeError):
    """A bounded host step ran out of time: some rank of the group did not arrive."""


@dataclass
class _GroupState:
    name: str
    store: object
    generation: int = 0
    sequence: int = 0
    broken: str | None = None  # why the ranks are out of step, once a call failed


_GROUPS: dict[str, _GroupState] = {}


def _resolve(group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("tilefuse host collectives need an initialised torch.distributed process group")
    return c10d._get_default_group() if group is None or group is dist.group.WORLD else group


def _group_name(pg) -> str:
    name = getattr(pg, "group_name", None) or c10d._world.pg_names.get(pg)
    if not name:
        raise RuntimeError("tilefuse host collectives: the process group has no name (is this rank a member?)")
    return str(name)


def _group_store(pg):
    getter = getattr(c10d, "_get_process_group_store", None)
    if getter is not None:
        return getter(pg)
    return c10d._world.pg_map[pg][1]


def _state(pg) -> _GroupState:
    name = _group_name(pg)
    st = _GROUPS.get(name)
    store = _group_store(pg)
    if st is None or st.store is not store:
        # A group of this name made anew (after destroy_process_group) starts a fresh sequence.
        st = _GROUPS[name] = _GroupState(name, store)
    return st


def _global(pg, rank: int) -> str:
    try:
        g = dist.get_global_rank(pg, rank)
    except Exception:  # pragma: no cover - torch without the mapping for this group
        return str(rank)
    return str(rank) if g == rank else f"{rank} (global rank {g})"


def _names(pg, ranks) -> str:
    return ", ".join(_global(pg, r) for r in ranks)


def reset(group=None) -> None:
    """Forget an earlier failed call on ``group``: later calls use a fresh key namespace. Every rank
    of the group calls it at the same point of its host steps (a collective reset)."""
    st = _state(_resolve(group))
    st.generation += 1
    st.sequence = 0
    st.broken = None


def all_gather_object(obj, group=None, *, what: str, timeout: float | None = None, last: bool = False) -> list:
    """Every rank's ``obj`` (picklable, small: it travels through the store), in group-rank order;
    collective over ``group`` (default: the world), bounded by ``timeout`` seconds (default
    ``TILEFUSE_HOST_TIMEOUT``). ``what`` names the step (the same on every rank) in errors.
    ``last``: the group's last step before its ranks may exit: return only once every rank has read
    the step's keys (for at most ``LAST_STEP_WAIT_S``), so the store's host does not exit under a reader.

    Raises :class:`HostTimeoutError` when some rank did not arrive (named), the store cannot be
    reached, or an earlier call on this group failed; ``RuntimeError`` when the ranks' ``what`` differ.
    """
    pg = _resolve(group)
    rank, world = dist.get_rank(pg), dist.get_world_size(pg)
    if rank < 0:
        raise ValueError(f"{what}: this process is not a member of the group")
    bound = _env.host_timeout() if timeout is None else float(timeout)
    if not (bound > 0 and math.isfinite(bound)):
        raise ValueError(f"host collective timeout must be a positive number of seconds, got {timeout!r}")
    if world == 1:
        return [obj]
    st = _state(pg)
    if st.broken is not None:
        raise HostTimeoutError(
            f"{what}: an earlier host step on process group {st.name!r} failed ({st.broken}), so the ranks "
            "are out of step; re-create the process group, or call tilefuse.runtime.hostsync.reset on "
            "every rank"
        )
    base = f"{_PREFIX}/{st.name}/{st.generation}/{st.sequence}"
    st.sequence += 1
    keys = [f"{base}/{r}" for r in range(world)]
    store = st.store
    deadline = time.monotonic() + bound
    try:
        store.set(keys[rank], pickle.dumps((what, obj), protocol=pickle.HIGHEST_PROTOCOL))
    except Exception as err:
        st.broken = f"{what}: the store was unreachable"
        raise HostTimeoutError(
            f"{what}: rank {_global(pg, rank)} could not publish to the process group's store "
            f"({type(err).__name__}: {err}); the rank hosting the store (usually rank 0) may have died"
        ) from err
    gave_up = f"{base}/gave_up"
    status, detail = _wait(store, keys, gave_up, deadline)
    if status != "ok":
        st.broken = f"{what}: {status}"
        if status == "lost":
            raise HostTimeoutError(
                f"{what}: rank {_global(pg, rank)} lost the process group's store while waiting "
                f"for its peers (bound {bound:g} s); the rank hosting the store (usually rank 0) may have died"
            )
        if status == "aborted":
            who, their_missing = detail
            raise HostTimeoutError(
                f"{what}: rank {_global(pg, who)} gave up waiting for rank(s) {_names(pg, their_missing)}; "
                f"this rank ({_global(pg, rank)}) stops too. {_HINT}"
            )
        try:
            # Peers that arrive later stop at once, naming the missing ranks.
            store.set(gave_up, pickle.dumps((rank, detail)))
        except Exception:
            pass
        raise HostTimeoutError(
            f"{what}: rank(s) {_names(pg, detail)} of {world} did not arrive within {bound:g} s "
            f"(seen from rank {_global(pg, rank)}). {_HINT}"
        )
    try:
        entries = [pickle.loads(store.get(k)) for k in keys]
    except Exception as err:
        st.broken = f"{what}: reading the store failed"
        raise HostTimeoutError(f"{what}: reading the peers' objects from the store failed: {err}") from err
    done_key = f"{base}/done"
    try:
        done = store.add(done_key, 1)
        if done == world:  # every rank has read: the keys can go (the count stays for a last step)
            for k in keys if last else keys + [done_key]:
                store.delete_key(k)
        if last:
            _wait_all_read(store, done_key, done, world, min(LAST_STEP_WAIT_S, deadline - time.monotonic()))
    except Exception:
        pass  # cleanup only: the values are read
    steps = [e[0] for e in entries]
    if any(s != what for s in steps):
        st.broken = f"{what}: ranks at different steps"
        others = "; ".join(f"rank {_global(pg, r)} at {s!r}" for r, s in enumerate(steps) if s != what)
        raise RuntimeError(
            f"{what}: the ranks are at different host steps: rank {_global(pg, rank)} at {what!r}; {others}. "
            "Every rank must make the same tilefuse calls in the same order."
        )
    return [e[1] for e in entries]


def barrier(group=None, *, what: str, timeout: float | None = None, last: bool = False) -> None:
    """Return once every rank of ``group`` got here; bounded like :func:`all_gather_object` (``last``:
    see there)."""
    all_gather_object(None, group, what=what, timeout=timeout, last=last)


LAST_STEP_WAIT_S = 10.0


def _wait_all_read(store, key: str, done: int, world: int, seconds: float) -> None:
    """Poll the step's read count until every rank has added to it, for at most ``seconds``."""
    end = time.monotonic() + max(0.0, seconds)
    pause = 1e-4
    while done < world and time.monotonic() < end:
        time.sleep(pause)
        pause = min(pause * 2, 0.01)
        done = store.add(key, 0)


def _read_gave_up(store, key: str) -> tuple:
    try:
        return pickle.loads(store.get(key))
    except Exception:
        return (-1, [])


def _wait(store, keys: list, gave_up: str, deadline: float) -> tuple:
    """Poll until every key is set, a peer gave up, or the deadline passes: ``("ok", None)``,
    ``("aborted", (rank, missing))``, ``("missing", ranks)`` or ``("lost", None)`` (the store
    failed). A poll, not the store's ``wait``: it ends at the deadline and logs no socket warnings."""
    pause = 1e-4
    try:
        while True:
            ready = store.check(keys)
            if store.check([gave_up]):  # checked when every key is set too: a peer may give up meanwhile
                return "aborted", _read_gave_up(store, gave_up)
            if ready:
                return "ok", None
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [r for r, k in enumerate(keys) if not store.check([k])]
                return ("missing", missing) if missing else ("ok", None)
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.02)
    except Exception:
        return "lost", None
