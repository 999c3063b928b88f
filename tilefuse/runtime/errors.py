"""The runtime's exceptions, and the device's error records turned into them (:func:`error_from`)."""

from __future__ import annotations

import torch.distributed as dist

from . import primitives as P


class WaitTimeoutError(RuntimeError):
    """A device-side wait ran out of its bound: a peer never released the flag it waited for."""


class PoisonedError(RuntimeError):
    """A wait timed out on some rank: every op raises until the collective :func:`tilefuse.reset`."""


class PeerExitedError(PoisonedError):
    """A peer process of the group has exited: this call and every later one raise (before launching)."""


class CallMismatchError(ValueError):
    """Ranks made different collective calls (op, variant, shapes, dtype or config differ)."""


class PeerCallError(RuntimeError):
    """A peer's copy of this collective call failed (its argument checks raised)."""


class StaleCallError(RuntimeError):
    """A call (typically a CUDA graph replay) used workspaces that were released since."""


def describe_group(group) -> str:
    """``'name' (ranks [...])`` for error messages (whatever the group is)."""
    if isinstance(group, str):
        return repr(group)
    try:
        name = getattr(group, "group_name", None) or dist.distributed_c10d._world.pg_names.get(group) or "?"
    except Exception:
        name = "?"
    try:
        return f"{name!r} (ranks {dist.get_process_group_ranks(group)})"
    except Exception:
        return repr(name)


def describe_sig(st, value: int) -> str:
    """What call the signature hash ``value`` stands for (``st``: the group that made it)."""
    if value == int(P.SIG_FAILED):
        return "a call that failed its argument checks"
    text = st.describe(value)
    return f"({text})" if text else f"a call with signature {value:#x} (not made on this rank)"


def take_record(st) -> dict | None:
    """The error record, error count and poison word of ``st``'s control block (one device read), None when
    neither is set; then the count and record are zeroed (and the host's copy of the count), not the poison."""
    names = ("kind", "seq", "rank", "peer", "addr", "target", "seen", "ns")
    lo, first = int(P.CTL_POISON), int(P.CTL_REC_KIND)
    words = st.ctl[lo:first + len(names)].tolist()
    rec = dict(zip(names, words[first - lo:])) | {"errors": int(words[int(P.CTL_ERRORS) - lo]), "poison": int(words[0])}
    if rec["errors"] == 0 and rec["poison"] == 0:
        return None
    st.ctl[int(P.CTL_ERRORS)] = 0
    st.ctl[int(P.CTL_REC_KIND):int(P.CTL_REC_NS) + 1] = 0
    if st.status_host is not None:
        st.status_host[1] = 0
    return rec


def error_from(st, rec: dict) -> Exception:
    """The exception for the record ``rec`` of group ``st``, naming the ranks, call and flag."""
    heap = st.heap
    kind, seq = rec["kind"], rec["seq"]
    if kind == int(P.ERR_TIMEOUT):
        offset = rec["addr"] - heap.base
        where = f"heap offset {offset}" if 0 <= offset < heap.size else f"address {rec['addr']:#x}"
        src = f"rank {rec['peer']}" if rec["peer"] >= 0 else "a peer"
        return WaitTimeoutError(f"rank {rec['rank']} gave up after {rec['ns'] / 1e9:.1f} s in call #{seq} waiting "
                                f"for the flag at {where} to reach {rec['target']} (written by {src}); it still "
                                f"read {rec['seen']}. The writer never released it: a rank that did not make the "
                                "same call, crashed, or is slower than TILEFUSE_WAIT_TIMEOUT. The runtime is now "
                                "poisoned on every rank: call tilefuse.reset() on every rank to go on.")
    if kind == int(P.ERR_MISMATCH):
        return CallMismatchError(f"collective call #{seq} differs between ranks: rank {rec['rank']} made "
                                 f"{describe_sig(st, rec['target'])} but rank {rec['peer']} made "
                                 f"{describe_sig(st, rec['seen'])}. No data moved; every rank raises for this call. "
                                 "Every rank must make the same calls in the same order with the same shapes, "
                                 "dtype, variant and config.")
    if kind == int(P.ERR_PEER_FAILED):
        return PeerCallError(f"collective call #{seq} ({describe_sig(st, rec['target'])}) failed on rank "
                             f"{rec['peer']}: its argument checks raised there (see that rank's error). No data "
                             "moved; the call raises on every rank, and the next calls pair as usual.")
    if kind == int(P.ERR_STALE):
        return StaleCallError(f"call #{seq} was launched for workspace generation {rec['target']}, but the "
                              f"workspaces were released since (now generation {rec['seen']}): a CUDA graph captured "
                              "before tilefuse.clear_workspaces()/reset() was replayed. It did nothing; capture "
                              "the graph again.")
    return RuntimeError(f"tilefuse: unknown device error record {rec}")


def poison_message(rec: dict | None) -> str:
    """What a poisoned group raises: poison word ``r + 1``: rank r's wait timed out; ``-(r + 1)``: it reset."""
    word = (rec or {}).get("poison", 0)
    if word < 0:
        what = f"rank {-word - 1} entered tilefuse.reset()"
    else:
        what = f"a device wait timed out on {f'rank {word - 1}' if word > 0 else 'a rank'}"
    return (f"tilefuse is poisoned: {what}, so every op raises on every rank until tilefuse.reset() is "
            "called on every rank")
