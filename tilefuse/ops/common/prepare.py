"""What every op's ``_prepare`` shares: a variant's set-up made once per call signature (:func:`once`)
and the base of what it makes (:class:`PreparedCall`)."""

from __future__ import annotations

import torch

from ...runtime import call as _call
from .arena import Workspace, prepared, workspace
from .config import Config
from .gemm import UNALIGNED_PAD_MIN_M, GemmLaunch, ensure_triton_allocator, tma_operands
from .launch import new_output
from .scaled import kernel_scales


def once(heap, key: tuple, make, config, *tensors):
    """``make()`` the first time ``key``, ``config`` and the layouts of ``tensors`` (shape, strides, dtype,
    device, 16-byte alignment; None for an absent one) are seen on ``heap``'s group, the same
    :class:`PreparedCall` afterwards; arguments that form no key go to ``make``'s checks."""
    if not (config is None or isinstance(config, Config)):
        return make()
    parts = [*key, config]
    for t in tensors:
        if t is None:
            parts.append(None)  # never a layout's first entry (a torch.Size): the key reads one way only
        elif isinstance(t, torch.Tensor):
            parts += (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15)
        else:
            return make()
    return prepared(heap, tuple(parts), make)


class PreparedCall:
    """One call signature of a variant, set up once (:func:`once`): sizes, ``config``, signature ``sig``,
    workspaces and per-call steps; each op's ``Prepared`` adds its buffers and launch options."""

    def __init__(self, g, a: torch.Tensor, b: torch.Tensor, sig: tuple, *, empty: bool, pad: bool = True,
                 out_dtype: torch.dtype | None = None):
        self.heap, self.config, self.sig = g.heap, g.config, sig
        self.out_dtype = a.dtype if out_dtype is None else out_dtype  # the result's (a float8 call's out_dtype)
        self.M, self.N, self.K = g.M, g.N, g.K
        self.empty = empty  # nothing to compute or move (the same on every rank)
        self.begins = g.kernel_may_begin  # the call's first kernel may begin it (P.enter with ENTER)
        self.pad = pad and (g.a is not a or g.b is not b)  # operands copied onto the descriptor path every call
        self.use_tma = g.use_tma
        self.unscaled = kernel_scales(None, None, g.heap.device)  # the kernels' stand-ins for absent scales
        self.core = None  # the GEMM core's launch (bulk_sync: :meth:`gemm`)

    def hold(self, key: tuple, make, nbytes: int) -> Workspace:
        """A workspace this call signature holds (``arena.workspace``)."""
        return workspace(self.heap, key, make, nbytes)

    def scales(self, scale_a: torch.Tensor | None, scale_b: torch.Tensor | None) -> tuple:
        """The kernels' ``scales`` (``scaled.kernel_scales``)."""
        return self.unscaled if scale_a is None else kernel_scales(scale_a, scale_b, self.heap.device)

    def gemm(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, **flags) -> GemmLaunch:
        """The GEMM core's launch of this call signature (``gemm.matmul`` with ``flags``), made from the tensors
        of its first call: every later call's have the same layouts."""
        if self.core is None:
            self.core = GemmLaunch(a, b, c, self.config, in_call=True, **flags)
        return self.core

    def operands(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``a`` and ``b`` as the variant's kernels read them (copies where ``pad``)."""
        if self.pad:
            a, b = tma_operands(a, b, UNALIGNED_PAD_MIN_M)[:2]
        if self.use_tma:
            ensure_triton_allocator()  # per thread: the descriptors' scratch (autograd's backward has its own)
        return a, b

    def start(self, a: torch.Tensor, b: torch.Tensor) -> tuple:
        """Per call: ``(a, b, c, entry)``: the operands, a fresh output ``c`` and :meth:`begin`'s result."""
        c = new_output(self.out_shape, self.out_dtype, a.device)
        entry = self.begin(c)
        return (*self.operands(a, b), c, entry)

    def begin(self, *outputs: torch.Tensor | None) -> tuple | None:
        """Begin the call as ``launch.begin_call``: the begin kernel now (None), or the begin arguments of the
        call's first kernel, which begins it itself (``outputs`` are filled with NaN if the call aborts)."""
        call = _call.current_call()
        if self.begins and not self.empty:
            return call.enter_args(self.sig, outputs)
        call.begin(self.sig, outputs)
        return None
