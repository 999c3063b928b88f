"""Host-side plumbing shared by every variant: the checked GEMM call and its config (:func:`prepare_gemm`),
and per call the output, the call's begin and its protocol argument (:func:`begin_call`, :func:`call_arg`)."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch

from ...runtime import _env, control_block, get_heap, hw, is_initialized
from ...runtime import call as _call
from ...runtime import world as _world
from ...runtime.call import CollectiveCall
from ...runtime.primitives import phase_barrier_kernel
from . import gemm
from .checks import check_kernel_dtype, check_operands
from .config import Config, check_config_fits, default_config, launch_shape
from .gemm import UNALIGNED_PAD_MIN_M, ensure_triton_allocator, gemm_layout, tma_operands


def collective(op: str):
    """Decorator of a variant's entry point: one :class:`CollectiveCall` on its ``group``'s state."""

    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            with CollectiveCall(op, _call.call_state(kwargs.get("group"), op)):  # inside another: part of it
                return fn(*args, **kwargs)

        return run

    return wrap


def begin(key: tuple, *outputs) -> None:
    """Launch the current call's begin kernel (pairing, signature check, barrier) after the checks;
    ``outputs`` are filled with NaN if the call aborts."""
    _call.current_call().begin(key, outputs)


def begin_call(key: tuple, *outputs, kernel_begins: bool = False) -> tuple | None:
    """Begin the current call (:func:`begin`), or with ``kernel_begins`` return the begin arguments of
    its first kernel, which begins it itself (``P.enter``; then :func:`launched`)."""
    if kernel_begins:
        return _call.current_call().enter_args(key, outputs)
    begin(key, *outputs)
    return None


def call_arg(heap, entry: tuple | None) -> tuple:
    """The ``call`` tuple of a kernel in the call protocol (``P.enter``/``P.exit``), with never-read
    stand-ins when a begin kernel began the call (``entry`` None: ``ENTER=False``)."""
    g = _call.active()  # the call's group (its control block)
    if entry is None:
        entry = (0, 0, g.dummy, 0, g.dummy, 0, g.dummy)  # never read
    return (heap.heap_bases, g.ctl, heap.rank, heap.world_size, *entry)


def launched(entry: tuple | None, ends: bool = True) -> None:
    """After launching the kernel given ``entry``: it began the call and, with ``ends``, ended it."""
    if entry is not None:
        _call.current_call().entered(ends)


def gemm_call_args(heap, entry: tuple | None) -> tuple | None:
    """``gemm.matmul``'s ``call``: :func:`call_arg`, or None when a begin kernel began the call."""
    return None if entry is None else call_arg(heap, entry)


def op_heap(op: str, group):
    """The heap of ``group`` (None: the call's group inside a collective call, else the default group)."""
    if group is None:
        if not is_initialized():
            raise RuntimeError(f"{op}: tilefuse is not initialised on this rank: call tilefuse.init() first")
        return _call.active().heap  # the current call's group, else the default
    heap = _world.state_for(group, op).heap
    if _call.in_call() and heap is not get_heap():
        raise RuntimeError(f"{op}: called with group {_world._describe_group(group)} inside a collective call "
                           f"on another group ({_world._describe_group(get_heap().group)})")
    return heap


@functools.lru_cache(maxsize=4096)
def _default_config(M: int, N: int, K: int, dtype, sms: int, interpreter: bool, comm: bool) -> Config:
    config = default_config(M, N, K, dtype, num_sms=sms, interpreter=interpreter, comm=comm)
    check_config_fits(config, sms)
    return config


def new_output(shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A fresh output tensor (NaN under ``set_debug_poison``, so that a tile nobody writes shows)."""
    if _env.debug_poison():
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(size=shape, dtype=dtype, device=device)  # (size= parses faster than a positional shape)


def ctl(heap) -> torch.Tensor:
    """The control block of ``heap``'s group (the current call's)."""
    return _call.active().ctl


def mid_barrier(heap, phase: int) -> None:
    """A barrier inside the current call (``phase`` 0 or 1: a call's barriers use distinct phases)."""
    if heap.world_size > 1:
        phase_barrier_kernel[(1,)](control_block(), heap.heap_bases, heap.rank, heap.world_size, PHASE=phase,
                                   num_warps=1)


_SIDE_STREAMS: dict = {}
_EVENTS: dict = {}  # device -> (fork, join) events, reused: a wait uses the record made just before it


class ForkedStreams:
    """A second stream that starts after everything queued so far on the current one: launch the
    consumer inside ``with streams.side():``, then ``join()`` (a no-op on the CPU). Streams are named
    explicitly (``set_stream``): torch's stream context looks the device up, microseconds each."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            if device not in _SIDE_STREAMS:
                _SIDE_STREAMS[device] = torch.cuda.Stream(device)
                _EVENTS[device] = (torch.cuda.Event(), torch.cuda.Event())
            self.stream = _SIDE_STREAMS[device]
            self.main = _call.current_stream(device.index if device.index is not None else torch.cuda.current_device())
            fork, _ = _EVENTS[device]
            fork.record(self.main)  # everything queued so far
            self.stream.wait_event(fork)

    def side(self):
        """``with``: the side stream is the current stream, then the forked-from one again."""
        return self if self.cuda else contextlib.nullcontext()

    def __enter__(self):
        torch.cuda.set_stream(self.stream)
        return self

    def __exit__(self, *exc):
        torch.cuda.set_stream(self.main)
        return False

    def join(self) -> None:
        if self.cuda:
            _, joined = _EVENTS[self.device]
            joined.record(self.stream)
            self.main.wait_event(joined)  # the stream forked from


@dataclass
class GemmCall:
    """Checked operands of one GEMM-based op call and the pieces every launcher needs."""

    op: str
    heap: object
    a: torch.Tensor
    b: torch.Tensor
    M: int
    N: int
    K: int
    config: Config
    use_tma: bool
    b_kmajor: bool
    # The launcher's kernel takes WARP_SPEC and its tile loop sets no flags (Config.WARP_SPEC).
    specialize: bool = False

    @property
    def gemm_args(self) -> tuple:
        """Pointers, sizes and strides of A and B, in the kernels' order."""
        a, b = self.a, self.b
        return (a, b, self.M, self.N, self.K, a.stride(0), a.stride(1), b.stride(0), b.stride(1))

    @property
    def warp_spec(self) -> bool:
        """Whether the GEMM's tile loop runs warp-specialized (:func:`gemm.warp_specialized`, looked up on
        the module at each call, so that tests can stand in for the device)."""
        return bool(self.specialize and self.config.WARP_SPEC) and gemm.warp_specialized(self.config, self.use_tma,
                                                                                          self.a.device)

    @property
    def kernel_may_begin(self) -> bool:
        """Whether the call's kernels may begin and end it themselves: not for a warp-specialized tile
        loop (Triton 3.6/3.7 silently declines to specialize a kernel with ``if``/``else``, as the begin's
        waits have; tests/test_warp_spec_compile.py). Decided on the config, so CPU ranks take the GPU's path."""
        return not (self.specialize and self.config.WARP_SPEC)

    @property
    def gemm_meta(self) -> dict:
        """Constexprs and launch options of the GEMM part, for a kernel that takes no ``WARP_SPEC``."""
        c = self.config
        warps, stages = launch_shape(c, self.warp_spec)
        return dict(BLOCK_M=c.BLOCK_M, BLOCK_N=c.BLOCK_N, BLOCK_K=c.BLOCK_K, GROUP_M=c.GROUP_M,
                    USE_TMA=self.use_tma, B_KMAJOR=self.b_kmajor, num_warps=warps, num_stages=stages)

    @property
    def gemm_meta_ws(self) -> dict:
        return dict(self.gemm_meta, WARP_SPEC=self.warp_spec)

    def key(self, variant: str, *extra) -> tuple:
        """The call's signature: what every rank must agree on (checked by the begin)."""
        return (self.op, variant, tuple(self.a.shape), tuple(self.b.shape), self.a.dtype, self.config) + extra

    @property
    def num_tiles(self) -> int:
        c = self.config
        return -(-self.M // c.BLOCK_M) * -(-self.N // c.BLOCK_N)


def prepare_gemm(op: str, a, b, group, config, *, comm: bool, tile_m: int | None = None,
                 tile_n: int | None = None, pad: bool = True, specialize: bool = False) -> GemmCall:
    """Check ``a [M, K]`` and ``b [K, N]`` for ``op``; resolve the config (the caller's, checked, or the
    default for ``tile_m``/``tile_n``) and the layout, with ``pad`` copying operands onto descriptors."""
    heap = op_heap(op, group)
    check_operands(op, a, b)
    if a.device != heap.device:
        raise ValueError(f"{op}: a is on {a.device}, but this rank's heap is on {heap.device}")
    check_kernel_dtype(op, a.dtype)
    M, K = a.shape
    N = b.shape[1]
    sms = hw.num_sms(heap.device)
    if config is None:  # the heuristic default (checked when made)
        config = _default_config(tile_m or M, tile_n or N, K, a.dtype, sms, hw.interpreting(), comm)
    elif not isinstance(config, Config):
        raise TypeError(f"{op}: config must be a tilefuse Config, got {type(config).__name__}")
    elif comm and config.COMM_SMS < 1:
        raise ValueError(f"{op}: this variant needs COMM_SMS >= 1 communication programs, got {config.COMM_SMS}")
    else:
        check_config_fits(config, sms)
    if pad:
        a, b, use_tma, b_kmajor = tma_operands(a, b, UNALIGNED_PAD_MIN_M)
    else:
        use_tma, b_kmajor = gemm_layout(a, b)
    if use_tma:
        ensure_triton_allocator()
    return GemmCall(op, heap, a, b, M, N, K, config, use_tma, b_kmajor, specialize)
