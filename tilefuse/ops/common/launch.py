"""Host-side plumbing shared by every variant: the call's begin and its protocol argument, heap
lookup, config, streams.

A variant's entry point is decorated with :func:`collective` (its host part runs inside a
:class:`tilefuse.runtime.world.CollectiveCall` on the call's ``group``) and has two phases:

- prepare, once per call signature (:func:`tilefuse.ops.common.arena.prepared`): checks, config
  (:func:`resolve_config`), heap workspaces (:func:`tilefuse.ops.common.arena.workspace`), grids;
- launch, every call: the output, :func:`begin_call` (the call's pairing and signature check, by a
  begin kernel or by the call's own first kernel), :func:`call_arg` (the kernels' ``call`` tuple),
  the launches and stream fork/join (:class:`ForkedStreams`).

Kernels read the call's sequence number from the control block: nothing on the host counts epochs.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch

from ...runtime import _env, control_block, get_heap, hw, is_initialized
from ...runtime import world as _world
from ...runtime.world import CollectiveCall
from .config import Config, check_config_fits, default_config, launch_shape


def collective(op: str):
    """Decorator of a variant's entry point: its host part runs as one collective call on the state
    of the call's ``group`` keyword (calls paired across ranks, one at a time per process, errors
    reported: :class:`CollectiveCall`). A call made inside another (a variant handing a degenerate
    call to another) is part of that call."""

    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            if _world.in_call():
                return fn(*args, **kwargs)
            with CollectiveCall(op, _world.call_state(kwargs.get("group"), op)):
                return fn(*args, **kwargs)

        return run

    return wrap


def begin(key: tuple, *outputs) -> None:
    """Launch the current call's begin kernel (pairing, signature check, barrier); ``outputs`` are
    filled with NaN if the call aborts. Call it after the checks and allocations, before any launch."""
    _world.current_call().begin(key, outputs)


def begin_call(key: tuple, *outputs, kernel_begins: bool = False) -> tuple | None:
    """Begin the current call (:func:`begin`), or, with ``kernel_begins`` (the call's first kernel
    begins it itself: ``primitives.enter`` with ``ENTER``, one launch less), return that
    kernel's begin arguments (pass :func:`enter_args` of the result to it and to the call's last
    kernel, which ends the call, ``primitives.exit``; call :func:`launched` after the launches)."""
    if kernel_begins:
        return _world.current_call().enter_args(key, outputs)
    begin(key, *outputs)
    return None


def enter_args(entry: tuple | None) -> tuple:
    """``sig, gen, out0, n_out0, out1, n_out1, status`` for a kernel taking ``primitives.enter``'s
    arguments: :func:`begin_call`'s, or never-read stand-ins when a begin kernel began the call
    (``entry`` None: launch with ``ENTER=False``)."""
    if entry is not None:
        return entry
    dummy = _world.stand_in()
    return (0, 0, dummy, 0, dummy, 0, dummy)


def call_arg(heap, entry: tuple | None) -> tuple:
    """The ``call`` argument of a kernel that takes part in the call protocol
    (``primitives.enter``/``exit``): ``(heap_bases, ctl, rank, world, sig, gen, out0, n_out0, out1,
    n_out1, status)``, with :func:`begin_call`'s ``entry`` (stand-ins when a begin kernel began the
    call: launch with ``ENTER=False``)."""
    return (heap.heap_bases, control_block(), heap.rank, heap.world_size, *enter_args(entry))


def launched(entry: tuple | None, ends: bool = True) -> None:
    """After launching the kernel given :func:`begin_call`'s ``entry``: that kernel began the call;
    ``ends``: it (or, for a call of several kernels, the last one, also given ``entry``) ends the
    call and writes its status words. A call of several kernels calls this after its first kernel
    with ``ends=False`` and again after its last."""
    if entry is not None:
        _world.current_call().entered(ends)


def gemm_call_args(heap, entry: tuple | None) -> tuple | None:
    """The ``call`` argument of ``gemm.matmul`` in a call whose kernels begin it (``entry``:
    :func:`begin_call`'s result): :func:`call_arg`; None when a begin kernel began the call."""
    return None if entry is None else call_arg(heap, entry)


class Entered:
    """Mixin of an op's call record whose ``enter`` attribute holds :func:`begin_call`'s result."""

    enter: tuple | None

    @property
    def begins(self) -> bool:
        """Whether the call's kernel begins the call itself (its ``ENTER`` constexpr)."""
        return self.enter is not None

    @property
    def enter_args(self) -> tuple:
        """The begin arguments of the call's kernel (:func:`enter_args`)."""
        return enter_args(self.enter)

    def call_arg(self, heap) -> tuple:
        """The ``call`` argument of the call's kernels (:func:`call_arg`)."""
        return call_arg(heap, self.enter)

    def gemm_call_args(self, heap) -> tuple | None:
        """The ``call`` argument of ``gemm.matmul`` (:func:`gemm_call_args`)."""
        return gemm_call_args(heap, self.enter)

    @property
    def status(self):
        """Where the kernel that ends the call writes the status words (``primitives.exit``; a never-read
        stand-in when a begin kernel began the call)."""
        return self.enter_args[-1]

    def entered(self, ends: bool = True) -> None:
        """After launching the kernel given :attr:`enter_args` (:func:`launched`)."""
        launched(self.enter, ends)


def op_heap(op: str, group):
    """The heap for ``group``: the heap of a group passed to ``tilefuse.init`` (None: the call's
    group inside a collective call, else the default group). A group never initialised on this rank
    raises, naming the remedy. (The call's ``CollectiveCall`` checked that the heap's GPU is current.)"""
    if group is None:
        if not is_initialized():
            raise RuntimeError(f"{op}: tilefuse is not initialised on this rank: call tilefuse.init() first")
        heap = get_heap()
    else:
        heap = _world.state_for(group, op).heap
        if _world.in_call() and heap is not get_heap():
            raise RuntimeError(f"{op}: called with group {_world._describe_group(group)} inside a collective call "
                               f"on another group ({_world._describe_group(get_heap().group)})")
    return heap


def check_on_device(op: str, heap, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.device != heap.device:
            raise ValueError(f"{op}: {name} is on {t.device}, but this rank's heap is on {heap.device}")


def resolve_config(op: str, config: Config | None, M: int, N: int, K: int, dtype: torch.dtype, heap,
                   *, comm: bool) -> Config:
    """The caller's config (checked to fit the device) or the heuristic default."""
    sms = hw.num_sms(heap.device)
    if config is None:
        return _default_config(M, N, K, dtype, sms, hw.interpreting(), comm)  # checked when made
    if not isinstance(config, Config):
        raise TypeError(f"{op}: config must be a tilefuse Config, got {type(config).__name__}")
    if comm and config.COMM_SMS < 1:
        raise ValueError(f"{op}: this variant needs COMM_SMS >= 1 communication programs, "
                         f"got {config.COMM_SMS}")
    check_config_fits(config, sms)
    return config


@functools.lru_cache(maxsize=4096)
def _default_config(M: int, N: int, K: int, dtype, sms: int, interpreter: bool, comm: bool) -> Config:
    config = default_config(M, N, K, dtype, num_sms=sms, interpreter=interpreter, comm=comm)
    check_config_fits(config, sms)
    return config


def debug_poison() -> bool:
    """Whether new workspaces and outputs start as NaN, so that a tile a variant forgets to write
    shows (``tilefuse.runtime.set_debug_poison``: the test harness turns it on)."""
    return _env.debug_poison()


def new_output(shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A fresh ordinary output tensor (NaN under :func:`debug_poison`)."""
    if debug_poison():
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def ctl(heap) -> torch.Tensor:
    return control_block()


def mid_barrier(heap, phase: int) -> None:
    """A barrier inside the current call (``phase`` 0 or 1: a call's barriers use distinct phases)."""
    from ...runtime.primitives import phase_barrier_kernel

    if heap.world_size > 1:
        phase_barrier_kernel[(1,)](control_block(), heap.heap_bases, heap.rank, heap.world_size, PHASE=phase,
                                   num_warps=1)


_SIDE_STREAMS: dict = {}
_EVENTS: dict = {}  # device -> (fork, join) events, reused: a wait uses the record made just before it


def _side_stream(device: torch.device):
    stream = _SIDE_STREAMS.get(device)
    if stream is None:
        stream = _SIDE_STREAMS[device] = torch.cuda.Stream(device)
        _EVENTS[device] = (torch.cuda.Event(), torch.cuda.Event())
    return stream


class ForkedStreams:
    """A second stream that starts after everything queued so far on the current one.

    Producer-consumer launchers fork *before* launching the producer, launch the consumer inside
    ``with streams.side():`` and then ``join()`` (on the stream they forked from), so that the two
    kernels run at the same time. On the CPU every launch is synchronous, and all of this is a no-op
    (launch the producer first). Fork and join each record one of two events kept per device and make
    the other stream wait on it (no new event or stream object per call). Streams are named
    explicitly (the current one looked up once by device index, switched with ``set_stream``): torch's
    stream context and events without a stream look the device up again through its availability
    checks, several microseconds each.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.stream = _side_stream(device)
            self.main = torch.cuda.current_stream(_device_index(device))
            fork, _ = _EVENTS[device]
            fork.record(self.main)  # everything queued so far
            self.stream.wait_event(fork)

    def side(self):
        if not self.cuda:
            return contextlib.nullcontext()
        return _OnStream(self.stream, self.main)

    def join(self) -> None:
        if self.cuda:
            _, joined = _EVENTS[self.device]
            joined.record(self.stream)
            self.main.wait_event(joined)  # the stream forked from


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


class _OnStream:
    """``with``: ``stream`` is the current stream, then ``back`` again (both of the current device)."""

    __slots__ = ("stream", "back")

    def __init__(self, stream, back):
        self.stream, self.back = stream, back

    def __enter__(self):
        torch.cuda.set_stream(self.stream)
        return self

    def __exit__(self, *exc):
        torch.cuda.set_stream(self.back)
        return False


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
        """Pointers, sizes and strides of A and B in the order the kernels take them."""
        a, b = self.a, self.b
        return (a, b, self.M, self.N, self.K, a.stride(0), a.stride(1), b.stride(0), b.stride(1))

    @property
    def warp_spec(self) -> bool:
        """Whether the GEMM's tile loop runs warp-specialized (:func:`gemm.warp_specialized`)."""
        if not (self.specialize and self.config.WARP_SPEC):
            return False
        from .gemm import warp_specialized

        return warp_specialized(self.config, self.use_tma, self.a.device)

    @property
    def kernel_may_begin(self) -> bool:
        """Whether the call's kernels may begin and end it themselves (``primitives.enter``,
        ``primitives.exit``): not where the tile loop is to run warp-specialized (``Config.WARP_SPEC`` on a
        launcher that takes it). Triton's Hopper warp specialization (3.6 and 3.7) gives up, without
        a word, on a kernel holding any ``if`` with an ``else`` branch, and the begin's ticket, its
        bounded waits and the closing barrier have them: the kernel would run its specialized launch
        shape (4 warps for a 128x256 tile) unspecialized. Such a call is begun by the begin kernel and
        its barriers are kernels of their own (checked for sm_90 in tests/test_warp_spec_compile.py).
        Decided on the config, not the device, so CPU ranks take the same path as the GPU."""
        return not (self.specialize and self.config.WARP_SPEC)

    @property
    def gemm_meta(self) -> dict:
        """Constexprs and launch options of the GEMM part, for a kernel that takes no ``WARP_SPEC``
        (a warp-specialized config then runs unspecialized: :func:`config.launch_shape`)."""
        c = self.config
        warps, stages = launch_shape(c, self.warp_spec)
        return dict(BLOCK_M=c.BLOCK_M, BLOCK_N=c.BLOCK_N, BLOCK_K=c.BLOCK_K, GROUP_M=c.GROUP_M,
                    USE_TMA=self.use_tma, B_KMAJOR=self.b_kmajor, num_warps=warps, num_stages=stages)

    @property
    def gemm_meta_ws(self) -> dict:
        """:attr:`gemm_meta` and ``WARP_SPEC``, for the kernels that take it."""
        return dict(self.gemm_meta, WARP_SPEC=self.warp_spec)

    def key(self, variant: str, *extra) -> tuple:
        """The call's signature: what every rank must agree on (checked by the begin kernel)."""
        return (self.op, variant, tuple(self.a.shape), tuple(self.b.shape), self.a.dtype, self.config) + extra

    @property
    def num_tiles(self) -> int:
        c = self.config
        return -(-self.M // c.BLOCK_M) * -(-self.N // c.BLOCK_N)


def prepare_gemm(op: str, a, b, group, config, *, comm: bool, tile_m: int | None = None,
                 tile_n: int | None = None, pad: bool = True, specialize: bool = False) -> GemmCall:
    """Check ``a [M, K]`` and ``b [K, N]`` for ``op`` and resolve the config and GEMM layout.

    ``tile_m``/``tile_n`` override the M and N the config heuristic sees (e.g. per-shard sizes).
    With ``pad``, operands whose strides keep them off the tensor-descriptor path are copied onto it
    (``GemmCall.a``/``b`` are then the copies; launchers must pass those, not their arguments).
    """
    from .checks import check_dtypes, check_inner_dim, check_kernel_dtype, check_matrix, check_same_device
    from .gemm import UNALIGNED_PAD_MIN_M, ensure_triton_allocator, gemm_layout, tma_operands

    heap = op_heap(op, group)
    check_matrix(op, "a", a)
    check_matrix(op, "b", b)
    check_same_device(op, a=a, b=b)
    check_on_device(op, heap, a=a)
    check_dtypes(op, a=a, b=b)
    check_kernel_dtype(op, a.dtype)
    check_inner_dim(op, a, b)
    M, K = a.shape
    N = b.shape[1]
    cfg = resolve_config(op, config, tile_m or M, tile_n or N, K, a.dtype, heap, comm=comm)
    if pad:
        a, b, use_tma, b_kmajor = tma_operands(a, b, UNALIGNED_PAD_MIN_M)
    else:
        use_tma, b_kmajor = gemm_layout(a, b)
    if use_tma:
        ensure_triton_allocator()
    return GemmCall(op, heap, a, b, M, N, K, cfg, use_tma, b_kmajor, specialize)
