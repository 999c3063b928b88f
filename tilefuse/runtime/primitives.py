"""The device API in one namespace, as kernels use it (``from tilefuse.runtime import primitives as P``):
memory on any rank's copy of a symmetric address (:mod:`.memory`: ``load``, ``put``, ``atomic_*``,
``signal``, ...), the call protocol (:mod:`.protocol`: the ``call`` tuple's accessors, ``enter``,
``enter_aside``, ``ready``, ``gate``, ``exit``, ``wait``, ``CTL_*``, ``ERR_*``, the begin and barrier
kernels) and ``kernel`` (``triton.jit`` for kernels tilefuse launches: :mod:`.launcher`).
"""

from .launcher import kernel  # noqa: F401
from .memory import *  # noqa: F403
from .protocol import *  # noqa: F403
