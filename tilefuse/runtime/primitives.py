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

from .launcher import kernel  # noqa: F401
from .memory import *  # noqa: F403
from .protocol import *  # noqa: F403
