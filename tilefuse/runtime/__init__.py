"""tilefuse's runtime (it never imports ``ops``), bottom up: ``backends``, ``heap``, ``hostsync``, ``errors``,
``group``, ``call``, ``world`` (the public functions); the device API is :mod:`.primitives`.
"""

from . import _env
from ._env import set_debug_poison

_env.configure()  # TRITON_INTERPRET must be set before the first @triton.jit module is imported

from . import hw, primitives  # noqa: E402
from .call import device_barrier, synchronize  # noqa: E402
from .errors import (  # noqa: E402
    CallMismatchError,
    PeerCallError,
    PeerExitedError,
    PoisonedError,
    StaleCallError,
    WaitTimeoutError,
)
from .heap import HeapFullError, SymmetricHeap  # noqa: E402
from .hostsync import HostTimeoutError  # noqa: E402
from .scope import step  # noqa: E402
from .world import (  # noqa: E402
    barrier,
    check_peers,
    control_block,
    get_heap,
    groups,
    init,
    is_initialized,
    reset,
    set_wait_timeout,
    shutdown,
)

__all__ = [
    "CallMismatchError", "HeapFullError", "HostTimeoutError", "PeerCallError", "PeerExitedError", "PoisonedError",
    "StaleCallError", "SymmetricHeap", "WaitTimeoutError", "barrier", "check_peers", "control_block",
    "device_barrier", "get_heap", "groups", "hw", "init", "is_initialized", "primitives", "reset",
    "set_debug_poison", "set_wait_timeout", "shutdown", "step", "synchronize",
]
