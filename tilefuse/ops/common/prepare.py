"""What every op's ``_prepare`` shares: a variant's set-up made once per call signature (:func:`once`),
the heap workspaces it holds (:func:`hold`), and the per-call steps of :class:`CallSteps`."""

from __future__ import annotations

import torch

from .config import Config
from .gemm import UNALIGNED_PAD_MIN_M, ensure_triton_allocator, tma_operands
from .launch import Workspace, begin_call, prepared, workspace


def layout(t: torch.Tensor | None) -> tuple | None:
    """What a call signature holds of a tensor argument: shape, strides, dtype, device, alignment."""
    if t is None:
        return None
    return tuple(t.shape), t.stride(), t.dtype, t.device, t.data_ptr() % 16


def once(heap, key: tuple, make, config, *tensors):
    """``make()`` the first time ``key``, ``config`` and the layouts of ``tensors`` are seen on
    ``heap``'s group (``launch.prepared``), the same object afterwards, whose ``workspaces``
    (:func:`hold`'s entries) are looked up again on every call: the same least-recently-used order on
    every rank, and kept until shutdown once a CUDA graph captures a call. Arguments that form no key
    (a tensor argument that is not one, a config that is no :class:`Config`) go to ``make``, whose
    checks raise, naming the argument."""
    if not (all(t is None or isinstance(t, torch.Tensor) for t in tensors)
            and (config is None or isinstance(config, Config))):
        return make()
    p = prepared(heap, (*key, config, *map(layout, tensors)), make)
    for entry in p.workspaces:
        workspace(heap, *entry)
    return p


def hold(heap, held: list, key: tuple, make, nbytes: int) -> Workspace:
    """``launch.workspace(heap, key, make, nbytes)``, its arguments appended to ``held`` (the
    ``workspaces`` that :func:`once` looks up on every call)."""
    held.append((key, make, nbytes))
    return workspace(heap, key, make, nbytes)


class CallSteps:
    """The per-call steps of a prepared call signature. The class that takes it has ``heap``, ``sig``
    (the call's signature, checked against the peers' by the begin), ``begins`` (the call's first
    kernel may begin it: ``GemmCall.kernel_may_begin``), ``empty`` (nothing to compute or move),
    ``pad`` (the operands are copied onto the tensor-descriptor path every call) and ``use_tma``."""

    def operands(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``a`` and ``b`` as the variant's own kernels read them (copies where ``pad``)."""
        if self.pad:
            a, b = tma_operands(a, b, UNALIGNED_PAD_MIN_M)[:2]
        if self.use_tma:
            ensure_triton_allocator()  # per thread: the descriptors' scratch (autograd's backward has its own)
        return a, b

    def begin(self, *outputs: torch.Tensor | None) -> tuple | None:
        """Pair the call with the peers' and check its signature: by the begin kernel now (returns
        None; always for an empty call), or by the call's first kernel given the result (``P.enter``
        with ``ENTER``; ``launch.begin_call``). ``outputs`` are filled with NaN if the call aborts."""
        return begin_call(self.sig, *outputs, kernel_begins=self.begins and not self.empty)
