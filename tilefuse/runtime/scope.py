"""Scopes of collective calls: the step and role a call belongs to, XORed into its signature (per
thread), so two ranks making the same op at different points of their programs (one skipped a
backward: its next forward meets the peer's backward) raise ``CallMismatchError`` instead of pairing.
"""

from __future__ import annotations

import hashlib
import threading

import torch

_MAX_SCOPES = 4096


def hash62(text: str) -> int:
    """A 62-bit hash of ``text``, the same in every process (not Python's salted ``hash``)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 2


class _ScopeState(threading.local):
    def __init__(self):  # per thread, on its first use (instance attributes: the fastest reads)
        self.steps: tuple = ()  # the steps of the enclosing step blocks, outermost first
        self.role: str | None = None  # "forward", "backward", or None (a call made outside any role)
        self.mix: int = 0  # hash of (steps, role), XORed into every call's signature hash; 0: no scope


STATE = _ScopeState()
_MIXES: dict = {}  # (steps, role) -> mix
SCOPE_TEXTS: dict = {}  # mix -> the scope in words, for error messages


def _mix_of(steps: tuple, role: str | None) -> int:
    if not steps and role is None:
        return 0
    hit = _MIXES.get((steps, role))
    if hit is None:
        if len(_MIXES) >= _MAX_SCOPES:
            _MIXES.clear()
            SCOPE_TEXTS.clear()
        words = [f"step {'.'.join(map(repr, steps))}"] if steps else []
        words += [f"role {role}"] if role is not None else []
        text = ", ".join(words)
        hit = _MIXES[(steps, role)] = hash62("scope: " + text)
        SCOPE_TEXTS[hit] = text
    return hit


for _role in ("forward", "backward"):  # known to every process: a peer's call in one is described
    _mix_of((), _role)


class Scope:
    """This thread's calls inside carry a step (appended) or ``steps`` (replacing) and a role in their signature."""

    __slots__ = ("step", "steps", "role", "saved")

    def __init__(self, *, step=None, steps: tuple | None = None, role: str | None = None):
        self.step, self.steps, self.role = step, steps, role

    def __enter__(self):
        st = STATE
        self.saved = (st.steps, st.role, st.mix)
        if self.steps is not None:
            st.steps, st.role = self.steps, self.role
        else:
            if self.step is not None:
                st.steps = st.steps + (self.step,)
            if self.role is not None:
                st.role = self.role
        st.mix = _mix_of(st.steps, st.role)
        return self

    def __exit__(self, *exc):
        STATE.steps, STATE.role, STATE.mix = self.saved
        return False


def step(i: int | str) -> Scope:
    """``with tilefuse.step(i):`` the calls made inside (in this thread, and their backward) belong to step
    ``i`` (an int or a str, the same on every rank; nestable): a rank that skipped calls of a step gets
    :class:`CallMismatchError` on every rank, not another's data (then :func:`tilefuse.reset` on every rank)."""
    if isinstance(i, bool) or not isinstance(i, (int, str)):
        raise TypeError(f"tilefuse.step: the step must be an int or a str, got {type(i).__name__}")
    return Scope(step=i)


def current_scope() -> tuple:
    """``(steps, role)`` of this thread's scope."""
    return STATE.steps, STATE.role


def saved_scope() -> tuple | None:
    """What an autograd forward keeps for its backward: :func:`current_scope` (None while compiling)."""
    return None if torch.compiler.is_compiling() else current_scope()


def in_backward(saved: tuple | None, fn, *args):
    """``fn(*args)`` in the role ``"backward"`` under the steps a forward kept (:func:`saved_scope`)."""
    if saved is None:
        return fn(*args)
    with Scope(steps=saved[0], role="backward"):
        return fn(*args)


_FORWARD_MIX = _mix_of((), "forward")


def in_forward(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in the role ``"forward"`` (no Scope object: the decode path)."""
    if torch.compiler.is_compiling():
        return fn(*args, **kwargs)
    st = STATE
    steps, role, mix = st.steps, st.role, st.mix
    st.role, st.mix = "forward", _mix_of(steps, "forward") if steps else _FORWARD_MIX
    try:
        return fn(*args, **kwargs)
    finally:
        st.role, st.mix = role, mix
