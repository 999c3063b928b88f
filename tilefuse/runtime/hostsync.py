"""Bounded host collectives for tilefuse's own host steps (heap rendezvous, shape checks, workspaces).

Unlike ``torch.distributed``'s object collectives (30 minutes with gloo, naming nobody), these use the
group's store and give up after ``timeout`` seconds (default ``TILEFUSE_HOST_TIMEOUT``) with a
:class:`HostTimeoutError` naming the missing ranks and the step. Every rank makes the same calls in order:

======================  ==================================================================
step                    keys (``P`` = ``tilefuse/hostsync/<group>/<generation>/<sequence>``)
======================  ==================================================================
publish                 each rank ``r`` sets ``P/r`` to its pickled ``(what, obj)``
gather                  each rank waits (bounded) for ``P/0`` .. ``P/W-1`` and reads them
release                 each rank adds 1 to ``P/done``; the rank that brings it to ``W``
                        deletes every key of the call (nobody reads them after their add)
======================  ==================================================================

A rank that runs out of time sets ``P/gave_up`` naming the missing ranks (its peers stop at once)
and marks the group out of step until :func:`reset`. Ranks that pass different ``what`` raise
:class:`CallMismatchError`; a peer process that exits ends every wait (:func:`watch`).

:func:`reset` is a bounded, re-entrant rendezvous of its own, whatever the ranks did before (a reset
one rank made alone, or one that timed out, leaves nothing behind). Keys ``R = tilefuse/reset/<group>``:

======================  ==================================================================
step                    keys
======================  ==================================================================
present                 each rank sets ``R/in/r`` to a token new for each attempt (emptied
                        when it leaves)
agree                   a rank that sees every rank's token acks the round those tokens name,
                        ``R/ack/<round>/r``; a token that goes away withdraws the ack
commit                  once every rank acked the round, each returns: ``<round>`` is the new
                        key namespace of the group's host steps; the last to leave deletes
======================  ==================================================================

A rank withdraws its ack only when a token changed and not every ack is there (a peer empties its
token after seeing every ack; acks stay until every rank has left). A rank that acked gets a grace
period past its deadline: its peers, all present, ack within a poll.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import pickle
import time
import uuid
from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from . import _env
from .errors import CallMismatchError, PeerExitedError

_PREFIX = "tilefuse/hostsync"
_STORE_DIED = "the rank hosting the store (usually rank 0) may have died"
_HINT = "A rank that died, hangs, or skipped this step; raise TILEFUSE_HOST_TIMEOUT if a rank is only slow."


class HostTimeoutError(RuntimeError):
    """A bounded host step ran out of time: some rank of the group did not arrive."""


@dataclass
class _GroupState:
    name: str
    store: object
    generation: str = "0"  # the key namespace: the last reset's round
    sequence: int = 0
    broken: str | None = None  # why the ranks are out of step, once a call failed


_GROUPS: dict[str, _GroupState] = {}
_WATCHERS: dict = {}  # group name -> check(what, calls): raises once a peer cannot come (exited, in a call)


def watch(group, check) -> None:
    """Call ``check(what, calls)`` while waiting for ``group``'s peers (None: stop)."""
    name = _group_name(_resolve(group))
    if check is None:
        _WATCHERS.pop(name, None)
    else:
        _WATCHERS[name] = check


def _resolve(group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("tilefuse host collectives need an initialised torch.distributed process group")
    return c10d._get_default_group() if group is None or group is dist.group.WORLD else group


def _group_name(pg) -> str:
    name = getattr(pg, "group_name", None) or c10d._world.pg_names.get(pg)
    if not name:
        raise RuntimeError("tilefuse host collectives: the process group has no name (is this rank a member?)")
    return str(name)


def _state(pg) -> _GroupState:
    name = _group_name(pg)
    st = _GROUPS.get(name)
    store = c10d._get_process_group_store(pg)
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


RESET_GRACE_S = 5.0


def reset(group=None, *, what: str = "tilefuse.reset", late=None) -> None:
    """Rendezvous of ``group``'s ranks, then a fresh key namespace; :class:`HostTimeoutError` after
    ``TILEFUSE_HOST_TIMEOUT``. ``late = (seconds, fn)``: ``fn()`` once a rank is missing after ``seconds``."""
    pg = _resolve(group)
    rank, world = dist.get_rank(pg), dist.get_world_size(pg)
    st = _state(pg)
    bound = _env.host_timeout()
    if world == 1:
        st.generation, st.sequence, st.broken = uuid.uuid4().hex, 0, None
        return
    store, base = st.store, f"tilefuse/reset/{st.name}"
    mine = f"{base}/in/{rank}"
    token_keys = [f"{base}/in/{r}" for r in range(world)]
    t0 = time.monotonic()
    deadline = t0 + bound
    acked = None  # the round this rank acked
    check = _WATCHERS.get(st.name)
    pause = 1e-4
    try:
        store.set(mine, uuid.uuid4().hex)
        while True:
            if acked is not None and _all_acked(store, base, acked, world):
                break
            # A token key, once set, is never deleted (emptied instead): get() never blocks on it.
            tokens = [store.get(k) if store.check([k]) else b"" for k in token_keys]
            present = [r for r, t in enumerate(tokens) if t]
            round_id = hashlib.blake2b(b"|".join(tokens), digest_size=12).hexdigest() if len(present) == world else None
            if acked is not None and round_id != acked:
                # A token changed: a peer gave up, or it left after seeing every ack (then so do we).
                if _all_acked(store, base, acked, world):
                    break
                store.delete_key(f"{base}/ack/{acked}/{rank}")
                acked = None
            if round_id is not None and acked is None:
                store.set(f"{base}/ack/{round_id}/{rank}", b"1")
                acked = round_id
                continue
            if check is not None:
                check(what, False)  # (peers stuck in a call are expected here: reset poisoned them)
            now = time.monotonic()
            if late is not None and round_id is None and now - t0 >= late[0]:
                late, fire = None, late[1]
                fire()
            if now >= deadline and not (acked is not None and now < deadline + RESET_GRACE_S):
                if acked is not None and _all_acked(store, base, acked, world):
                    break
                missing = [r for r in range(world) if r not in present]
                if late is not None:  # (a bound shorter than ``late``'s wait: it runs before giving up)
                    late[1]()
                raise HostTimeoutError(f"{what}: rank(s) {_names(pg, missing) or '?'} of {world} did not come "
                                       f"within {bound:g} s (seen from rank {_global(pg, rank)}); every rank "
                                       "must call it. Calling it again starts over.")
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
    except BaseException:
        with contextlib.suppress(Exception):
            if acked is not None:
                store.delete_key(f"{base}/ack/{acked}/{rank}")
            store.set(mine, b"")
        raise
    with contextlib.suppress(Exception):  # cleanup only
        store.set(mine, b"")
        if store.add(f"{base}/done/{acked}", 1) == world:  # every rank has seen every ack
            for r in range(world):
                store.delete_key(f"{base}/ack/{acked}/{r}")
            store.delete_key(f"{base}/done/{acked}")
    st.generation, st.sequence, st.broken = acked, 0, None


def _all_acked(store, base: str, round_id: str, world: int) -> bool:
    return store.check([f"{base}/ack/{round_id}/{r}" for r in range(world)])


LAST_STEP_WAIT_S = 10.0
_CAP_S: list = [None]  # an upper bound on every step's timeout (set at interpreter exit)


def cap_timeouts(seconds: float | None) -> None:
    """Bound every host step by ``seconds`` from now on (None: their own bounds again)."""
    _CAP_S[0] = seconds


def all_gather_object(obj, group=None, *, what: str, timeout: float | None = None, last: bool = False) -> list:
    """Every rank's ``obj`` (picklable, small), in group-rank order; collective over ``group`` (default: the
    world), bounded by ``timeout`` seconds; ``what`` names the step. ``last`` (the group's last step before
    its ranks may exit): wait (at most ``LAST_STEP_WAIT_S``) until every rank has read the keys. Raises
    :class:`HostTimeoutError` (a rank did not arrive, the store is lost, an earlier step failed) or
    :class:`CallMismatchError` (the ranks' ``what`` differ)."""
    pg = _resolve(group)
    rank, world = dist.get_rank(pg), dist.get_world_size(pg)
    if rank < 0:
        raise ValueError(f"{what}: this process is not a member of the group")
    bound = _env.host_timeout() if timeout is None else float(timeout)
    if not (bound > 0 and math.isfinite(bound)):
        raise ValueError(f"host collective timeout must be a positive number of seconds, got {timeout!r}")
    if _CAP_S[0] is not None:
        bound = min(bound, _CAP_S[0])
    if world == 1:
        return [obj]
    st = _state(pg)
    if st.broken is not None:
        raise HostTimeoutError(f"{what}: an earlier host step on process group {st.name!r} failed ({st.broken}), so "
                               "the ranks are out of step; call tilefuse.reset() on every rank (or re-create it)")
    base = f"{_PREFIX}/{st.name}/{st.generation}/{st.sequence}"
    st.sequence += 1
    keys = [f"{base}/{r}" for r in range(world)]
    store = st.store
    deadline = time.monotonic() + bound
    try:
        store.set(keys[rank], pickle.dumps((what, obj), protocol=pickle.HIGHEST_PROTOCOL))
    except Exception as err:
        st.broken = f"{what}: the store was unreachable"
        raise HostTimeoutError(f"{what}: rank {_global(pg, rank)} could not publish to the process group's store "
                               f"({type(err).__name__}: {err}); {_STORE_DIED}") from err
    gave_up = f"{base}/gave_up"
    try:
        status, detail = _wait(store, keys, gave_up, deadline, _WATCHERS.get(st.name), what)
    except BaseException as err:  # a peer process exited, or began a call instead of this step
        st.broken = f"{what}: {type(err).__name__}"
        raise
    if status != "ok":
        st.broken = f"{what}: {status}"
        if status == "lost":
            raise HostTimeoutError(f"{what}: rank {_global(pg, rank)} lost the process group's store while "
                                   f"waiting for its peers (bound {bound:g} s); {_STORE_DIED}")
        if status == "aborted":
            who, their_missing = detail
            raise HostTimeoutError(f"{what}: rank {_global(pg, who)} gave up waiting for rank(s) "
                                   f"{_names(pg, their_missing)}; this rank ({_global(pg, rank)}) stops too. {_HINT}")
        with contextlib.suppress(Exception):  # peers that arrive later stop at once, naming the missing
            store.set(gave_up, pickle.dumps((rank, detail)))
        raise HostTimeoutError(f"{what}: rank(s) {_names(pg, detail)} of {world} did not arrive within {bound:g} s "
                               f"(seen from rank {_global(pg, rank)}). {_HINT}")
    try:
        entries = [pickle.loads(store.get(k)) for k in keys]
    except Exception as err:
        st.broken = f"{what}: reading the store failed"
        raise HostTimeoutError(f"{what}: reading the peers' objects from the store failed: {err}") from err
    done_key = f"{base}/done"
    with contextlib.suppress(Exception):  # cleanup only: the values are read
        done = store.add(done_key, 1)
        if done == world:  # every rank has read: the keys can go (the count stays for a last step)
            for k in keys if last else keys + [done_key]:
                store.delete_key(k)
        end, pause = min(time.monotonic() + LAST_STEP_WAIT_S, deadline), 1e-4
        while last and done < world and time.monotonic() < end:  # until every rank has read the keys
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
            done = store.add(done_key, 0)
    steps = [e[0] for e in entries]
    if any(s != what for s in steps):
        st.broken = f"{what}: ranks at different steps"
        others = "; ".join(f"rank {_global(pg, r)} at {s!r}" for r, s in enumerate(steps) if s != what)
        raise CallMismatchError(f"{what}: the ranks are at different host steps: rank {_global(pg, rank)} at "
                                f"{what!r}; {others}. Every rank must make the same tilefuse calls in the same "
                                "order; call tilefuse.reset() on every rank to go on.")
    return [e[1] for e in entries]


def barrier(group=None, *, what: str, timeout: float | None = None, last: bool = False) -> None:
    """Return once every rank of ``group`` got here; bounded like :func:`all_gather_object`."""
    all_gather_object(None, group, what=what, timeout=timeout, last=last)


def _wait(store, keys: list, gave_up: str, deadline: float, check=None, what: str = "") -> tuple:
    """Poll (ending at the deadline, logging nothing) until every key is set, a peer gave up, or the deadline:
    ``("ok", None)``, ``("aborted", (rank, missing))``, ``("missing", ranks)`` or ``("lost", None)``."""
    pause = 1e-4
    try:
        while True:
            ready = store.check(keys)
            if store.check([gave_up]):  # checked when every key is set too: a peer may give up meanwhile
                try:
                    return "aborted", pickle.loads(store.get(gave_up))
                except Exception:
                    return "aborted", (-1, [])
            if ready:
                return "ok", None
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [r for r, k in enumerate(keys) if not store.check([k])]
                return ("missing", missing) if missing else ("ok", None)
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.02)
            if check is not None and pause >= 0.02:
                err = check(what, True)
                # A peer begins a call after this step only once every key is set: keys still missing
                # after its begin was seen mean it is not at this step.
                if err is not None and not store.check(keys):
                    raise err
    except (PeerExitedError, CallMismatchError):
        raise
    except Exception:
        return "lost", None
