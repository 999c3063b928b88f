"""The device API in one namespace, as kernels use it (``from tilefuse.runtime import primitives as P``).

- Memory on any rank's copy of a symmetric address (:mod:`.memory`): ``translate``, ``load``,
  ``store``, ``get``, ``put``, ``copy``, ``atomic_*``, and ``signal`` (the release of a flag).
- The call protocol (:mod:`.protocol`, whose docstring describes it): the ``call`` tuple's accessors
  ``bases``, ``ctl``, ``rank``, ``world``; ``enter``, ``enter_aside``, ``ready``, ``gate`` and
  ``exit`` around a call's kernels; ``wait`` (the bounded acquire of a flag); the control block's
  layout (``CTL_*``), error kinds (``ERR_*``) and the kernels the host launches for a call's begin
  and its inner barriers.
- ``kernel``: ``triton.jit`` for kernels tilefuse launches (:mod:`.launcher`).
"""

from .launcher import kernel
from .memory import (
    atomic_add,
    atomic_and,
    atomic_cas,
    atomic_max,
    atomic_min,
    atomic_or,
    atomic_sub,
    atomic_xchg,
    atomic_xor,
    copy,
    get,
    load,
    put,
    signal,
    store,
    translate,
)
from .protocol import (
    CTL_BOUND_NS,
    CTL_ENTER,
    CTL_ERRORS,
    CTL_EXIT,
    CTL_FIXED,
    CTL_GEN,
    CTL_GO,
    CTL_PHASES,
    CTL_POISON,
    CTL_REC_ADDR,
    CTL_REC_KIND,
    CTL_REC_NS,
    CTL_REC_PEER,
    CTL_REC_RANK,
    CTL_REC_SEEN,
    CTL_REC_SEQ,
    CTL_REC_TARGET,
    CTL_SEQ,
    CTL_STATE,
    ERR_MISMATCH,
    ERR_PEER_FAILED,
    ERR_STALE,
    ERR_TIMEOUT,
    SIG_FAILED,
    bases,
    call_begin_kernel,
    call_epoch,
    ctl,
    ctl_words,
    enter,
    enter_aside,
    exit,
    gate,
    gate_start,
    now_ns,
    phase_barrier_kernel,
    rank,
    ready,
    wait,
    world,
)

__all__ = [
    "CTL_BOUND_NS", "CTL_ENTER", "CTL_ERRORS", "CTL_EXIT", "CTL_FIXED", "CTL_GEN", "CTL_GO", "CTL_PHASES",
    "CTL_POISON", "CTL_REC_ADDR", "CTL_REC_KIND", "CTL_REC_NS", "CTL_REC_PEER", "CTL_REC_RANK", "CTL_REC_SEEN",
    "CTL_REC_SEQ", "CTL_REC_TARGET", "CTL_SEQ", "CTL_STATE", "ERR_MISMATCH", "ERR_PEER_FAILED", "ERR_STALE",
    "ERR_TIMEOUT", "SIG_FAILED", "atomic_add", "atomic_and", "atomic_cas", "atomic_max", "atomic_min", "atomic_or",
    "atomic_sub", "atomic_xchg", "atomic_xor", "bases", "call_begin_kernel", "call_epoch", "copy", "ctl",
    "ctl_words", "enter", "enter_aside", "exit", "gate", "gate_start", "get", "kernel", "load", "now_ns",
    "phase_barrier_kernel", "put", "rank", "ready", "signal", "store", "translate", "wait", "world",
]
