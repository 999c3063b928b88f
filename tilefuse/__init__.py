"""tilefuse: fused GEMM + multi-GPU communication operators in Python and Triton.

The ops, ``init``/``reset`` and the heap helpers take ``group=`` (default: the first group
initialised). Importing tilefuse turns on Triton's interpreter when no GPU is usable.

Calls pair across ranks by sequence and signature; ``with tilefuse.step(i):`` adds the step to the
signature and backward formulas run in the role ``backward`` (:mod:`tilefuse.runtime.scope`), so
calls from different points of a program raise ``CallMismatchError`` instead of pairing. Unchecked:
the plain path's torch collectives, the role and step of calls in a compiled backward or a CUDA graph
(which replays its capture's step), and calls inside one step and role (paired by order).
"""

from ._version import __version__
from .runtime import _env

_env.configure()

from .ops import plain as _plain  # noqa: E402,F401  (registers the plain path)
from .ops.all_gather_gemm import all_gather_gemm  # noqa: E402
from .ops.common.arena import clear_workspaces  # noqa: E402
from .ops.common.config import Config  # noqa: E402
from .ops.dispatch import choose as _choose  # noqa: E402
from .ops.gemm_all_reduce import gemm_all_reduce  # noqa: E402
from .ops.gemm_all_scatter import gemm_all_scatter  # noqa: E402
from .ops.gemm_reduce_scatter import gemm_reduce_scatter  # noqa: E402
from .ops.registry import VARIANTS  # noqa: E402
from .runtime import (  # noqa: E402
    CallMismatchError,
    HeapFullError,
    HostTimeoutError,
    PeerCallError,
    PeerExitedError,
    PoisonedError,
    StaleCallError,
    WaitTimeoutError,
    barrier,
    check_peers,
    device_barrier,
    get_heap,
    init,
    is_initialized,
    reset,
    set_wait_timeout,
    shutdown,
    step,
    synchronize,
)


def empty(*shape, dtype=None, group=None):
    """Uninitialised tensor on this rank's symmetric heap of ``group`` (collective by convention)."""
    return get_heap(group).empty(*shape, **({} if dtype is None else {"dtype": dtype}))


def zeros(*shape, dtype=None, group=None):
    return get_heap(group).zeros(*shape, **({} if dtype is None else {"dtype": dtype}))


def full(shape, fill_value, dtype=None, group=None):
    return get_heap(group).full(shape, fill_value, **({} if dtype is None else {"dtype": dtype}))


def arange(n, dtype=None, group=None):
    return get_heap(group).arange(n, **({} if dtype is None else {"dtype": dtype}))


def randn(*shape, dtype=None, generator=None, group=None):
    return get_heap(group).randn(*shape, generator=generator, **({} if dtype is None else {"dtype": dtype}))


def is_on_heap(t, group=None):
    return get_heap(group).is_on_heap(t)


def matmul(a, b, *, config=None, out=None, scale_a=None, scale_b=None, out_dtype=None):
    """tilefuse's GEMM core alone (every variant's K loop), to compare with ``torch.matmul``: ``a [M, K] @
    b [K, N]`` -> ``[M, N]`` in the inputs' dtype (``out``: a tensor to write), fp32 accumulation.
    ``config``: default ``Config.for_shape(M, N, K, a.dtype, comm=False, core=True)``. Float8 ``a`` and ``b`` take
    ``scale_a`` and ``scale_b`` as ``torch._scaled_mm``; ``out_dtype`` default: ``out``'s, else bfloat16."""
    from .ops.common.checks import check_same_device
    from .ops.common.gemm import matmul as _core
    from .ops.common.scaled import is_float8, kernel_scales, prepare_scaling

    check_same_device("matmul", a=a, b=b, **({} if out is None else {"out": out}))
    if out is not None and out_dtype is None and is_float8(a):
        out_dtype = out.dtype
    dtype, kind = prepare_scaling("matmul", a, b, scale_a, scale_b, out_dtype)
    M, N = a.shape[0], b.shape[1]
    if config is None:
        config = Config.for_shape(M, N, a.shape[1], a.dtype, device=a.device, comm=False, core=True)
    if out is None:
        out = a.new_empty(M, N, dtype=dtype)
    scales = None if kind is None else kernel_scales(scale_a, scale_b, a.device)
    return _core(a, b, out, config, scales=scales)


def auto_choice(op: str, a, b, group=None) -> tuple:
    """``(variant, source)``: what ``variant="auto"`` runs for ``op(a, b)`` on this rank and where that
    came from (the bucket's decision, else this rank's tables and cache). Communicates nothing."""
    choice = _choose(op, a, b, group)
    return choice.variant, choice.source


from . import nn  # noqa: E402  (tensor-parallel layers on the ops; ops never import nn)

__all__ = [
    "CallMismatchError", "Config", "HeapFullError", "HostTimeoutError", "PeerCallError", "PeerExitedError",
    "PoisonedError", "StaleCallError", "VARIANTS", "WaitTimeoutError", "__version__", "all_gather_gemm", "arange",
    "auto_choice", "barrier", "check_peers", "clear_workspaces", "device_barrier", "empty", "full", "gemm_all_reduce",
    "gemm_all_scatter", "gemm_reduce_scatter", "get_heap", "init", "is_initialized", "is_on_heap", "matmul", "nn",
    "randn", "reset", "set_wait_timeout", "shutdown", "step", "synchronize", "zeros",
]
