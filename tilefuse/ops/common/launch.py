"""Host-side plumbing shared by every variant launcher: heap lookup, config, workspaces, streams.

A launcher is decorated with :func:`collective` (the host part of the call runs inside a
:class:`tilefuse.runtime.world.CollectiveCall`, on the state of the call's ``group``: its heap,
control block and epochs; ``group=None`` is the default group's) and does, on every call:
``heap = op_heap(op, group)`` -> checks -> ``cfg = resolve_config(...)`` (cached per shape) ->
``ws = workspace(...)`` (heap buffers allocated once per shape, collectively, and reused) ->
``begin(signature, outputs)`` -> launches. Kernels read the call's sequence number from the control
block (``ctl(heap)``): nothing on the host counts epochs.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections import OrderedDict
from dataclasses import dataclass

import torch

from ...runtime import _env, control_block, get_heap, hostsync, hw, is_initialized
from ...runtime import world as _world
from ...runtime.world import CollectiveCall, check_current_device, on_reset, on_shutdown
from .checks import check_out_tensor
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
    begins it itself: ``primitives.call_enter`` with ``ENTER``, one launch less), return that
    kernel's begin arguments (pass :func:`enter_args` of the result to it and to the call's last
    kernel, which ends the call, ``call_exit``; call :func:`launched` after the launches)."""
    if kernel_begins:
        return _world.current_call().enter_args(key, outputs)
    begin(key, *outputs)
    return None


def enter_args(entry: tuple | None) -> tuple:
    """``sig, gen, out0, n_out0, out1, n_out1, status`` for a kernel taking ``call_enter``'s
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
        """Where the kernel that ends the call writes the status words (``call_exit``; a never-read
        stand-in when a begin kernel began the call)."""
        return self.enter_args[-1]

    def entered(self, ends: bool = True) -> None:
        """After launching the kernel given :attr:`enter_args` (:func:`launched`)."""
        launched(self.enter, ends)

    def first_gemm(self, heap, a: torch.Tensor, b: torch.Tensor, dst: torch.Tensor, config: Config, *,
                   barrier: bool, ends: bool = False) -> None:
        """``dst = a @ b`` on the GEMM core as the call's first kernel (a ``bulk_sync``'s GEMM): its
        first program begins the call where the call's kernels begin it; with ``barrier`` every rank's
        GEMM is complete and visible after it (its last program passes the barrier, or a barrier
        kernel follows where a begin kernel began the call); ``ends``: no kernel follows it."""
        from .gemm import matmul

        matmul(a, b, dst, config, ctl(heap), call=self.gemm_call_args(heap), enter=True, barrier=barrier)
        self.entered(ends=ends)
        if barrier and not self.begins:
            mid_barrier(heap, 0)


def op_heap(op: str, group):
    """The heap for ``group``: the heap of a group passed to ``tilefuse.init`` (None: the call's
    group inside a collective call, else the default group). A group never initialised on this rank
    raises, naming the remedy."""
    if group is None:
        if not is_initialized():
            raise RuntimeError(f"{op}: tilefuse is not initialised on this rank: call tilefuse.init() first")
        heap = get_heap()
    else:
        heap = _world.state_for(group, op).heap
        if _world.in_call() and heap is not get_heap():
            raise RuntimeError(f"{op}: called with group {_world._describe_group(group)} inside a collective call "
                               f"on another group ({_world._describe_group(get_heap().group)})")
    check_current_device(op, heap.device)  # kernels launch on the current device
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


class Workspace:
    """Heap buffers of one (op, variant, shape) key."""

    def __init__(self, buffers: dict):
        self.buffers = buffers
        self.nbytes = sum(b.numel() * b.element_size() for b in buffers.values())
        self.captured = False  # used inside a CUDA graph capture: kept until shutdown

    def __getattr__(self, name):
        try:
            return self.__dict__["buffers"][name]
        except KeyError:
            raise AttributeError(name) from None


_WORKSPACES: OrderedDict = OrderedDict()  # least recently used first
_KEPT_FOR_GRAPHS: list = []  # (heap uid, workspace) of captured graphs, dropped from the cache


# The fraction of a heap that cached workspaces may hold; the rest stays free for the caller's own
# heap tensors (``out=`` buffers). Set it alike on every rank.
WORKSPACE_FRACTION = 0.75


def workspace_budget(heap) -> int:
    """Bytes of ``heap`` the cached workspaces on it may hold (:data:`WORKSPACE_FRACTION` of it);
    beyond it the least recently used workspaces are released (on every rank alike)."""
    return int(heap.size * WORKSPACE_FRACTION)


def workspace_bytes(heap=None) -> int:
    """Heap bytes held by cached workspaces (this process; ``heap``: on that heap only)."""
    if heap is None:
        return sum(ws.nbytes for ws in _WORKSPACES.values())
    return sum(ws.nbytes for key, ws in _WORKSPACES.items() if key[0] == heap.uid)


def workspace_keys() -> list:
    """The keys of the cached workspaces, least recently used first (for tests and tools)."""
    return [key[1:] for key in _WORKSPACES]


def workspaces(heap=None) -> list:
    """The cached :class:`Workspace` objects (``heap``: on that heap only), least recently used first
    (for tests and tools)."""
    if heap is None:
        return list(_WORKSPACES.values())
    return [ws for key, ws in _WORKSPACES.items() if key[0] == heap.uid]


def debug_poison() -> bool:
    """Whether new workspaces and outputs start as NaN, so that a tile a variant forgets to write
    shows (``tilefuse.runtime.set_debug_poison``: the test harness turns it on)."""
    return _env.debug_poison()


def new_output(shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A fresh ordinary output tensor (NaN under :func:`debug_poison`)."""
    if debug_poison():
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def _capturing(heap) -> bool:
    return heap.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def workspace(heap, key: tuple, make, nbytes: int | None = None) -> Workspace:
    """The cached workspace for ``key``; ``make(heap) -> dict`` allocates it on first use.

    Collective on first use: every rank must reach it with the same key (checked: a rank passing
    other shapes raises ValueError on every rank), and the buffers' heap offsets are checked to
    agree across ranks; where they do not (a block held by a reference cycle on some rank), every
    rank runs ``gc.collect()`` and allocates once more (no collection otherwise). Before new buffers
    are touched, one device barrier makes sure no peer still uses the memory they reuse. Least
    recently used workspaces beyond :func:`workspace_budget` are released first (every rank makes the
    same calls, so every rank releases the same ones). Under :func:`debug_poison` new floating-point
    buffers start as NaN. Inside a CUDA graph capture
    a missing workspace is an error (make one eager call of the shape first); one that is used there
    is kept until shutdown.
    """
    full_key = (heap.uid,) + key  # not id(heap): a later heap may reuse the address of a closed one
    ws = _WORKSPACES.get(full_key)
    if ws is not None:
        _WORKSPACES.move_to_end(full_key)
        if not ws.captured and _capturing(heap):
            ws.captured = True
        return ws
    if _capturing(heap):
        raise RuntimeError(
            f"{key[0]}: a CUDA graph capture needs this call's heap workspace {key[1:]}, which does not exist "
            "yet (heap buffers are created collectively, outside capture): make one eager call with the same "
            "shapes, dtype, variant and config before capturing"
        )
    if nbytes is not None:
        _evict(heap, nbytes)
    buffers = _allocate(heap, key, make)
    failure = _check_offsets(heap, key, buffers)
    if failure is not None and failure[0] is RuntimeError and _DIVERGED in failure[1]:
        # Blocks held only by reference cycles are freed by the cyclic collector at different moments
        # on different ranks, so the ranks' allocators drifted apart. Every rank compared the same
        # gathered offsets and got this error: they all collect now and allocate once more, in step.
        buffers.clear()
        gc.collect()
        buffers = _allocate(heap, key, make)
        failure = _check_offsets(heap, key, buffers)
    if failure is not None:
        buffers.clear()  # the blocks return now, on every rank alike
        gc.collect()
        raise failure[0](failure[1])
    _world.device_barrier()  # no peer still reads or writes the memory these buffers reuse
    for name, buf in buffers.items():
        if name.startswith("flags"):
            buf.zero_()
    if debug_poison():  # a tile that a variant forgets to write shows as NaN, not as zero
        for buf in buffers.values():
            if buf.dtype.is_floating_point:
                buf.fill_(float("nan"))
    ws = Workspace(buffers)
    _WORKSPACES[full_key] = ws
    return ws


_PREPARED: dict = {}  # (heap uid, key) -> what a variant prepared for that call signature
_MAX_PREPARED = 4096


def prepared(heap, key: tuple, make):
    """``make()`` the first time ``key`` is seen on ``heap``'s group, the same object afterwards: what
    a variant prepares once per call signature (checks, config, workspaces, grids). The cache is
    dropped with the workspaces (cleared, evicted, reset, shut down), so what ``make`` returns may
    hold workspace buffers; ``key`` must hold everything it depends on."""
    full = (heap.uid, key)
    got = _PREPARED.get(full)
    if got is None:
        got = make()
        if len(_PREPARED) >= _MAX_PREPARED:  # ever-new signatures (changing token counts): stay bounded
            _PREPARED.clear()
        _PREPARED[full] = got
    return got


def _drop_prepared(uid: int) -> None:
    for full in [k for k in _PREPARED if k[0] == uid]:
        del _PREPARED[full]


def _allocate(heap, key: tuple, make) -> dict:
    """``make(heap)``; when the heap is full, once more after a cyclic collection on this rank (blocks
    held only by reference cycles come back; the offsets check that follows is collective)."""
    try:
        return make(heap)
    except MemoryError:
        pass  # the exception (and the frames keeping a partial allocation) goes before collecting
    gc.collect()
    try:
        return make(heap)
    except MemoryError as err:
        raise type(err)(f"{err}\n(tilefuse keeps one workspace per call shape: tilefuse.clear_workspaces() "
                        "releases them all, and at most WORKSPACE_FRACTION of the heap is kept)") from err


_DIVERGED = "heap allocations diverged"  # SymmetricHeap.check_symmetric's error for offsets that differ


def _check_offsets(heap, key: tuple, buffers: dict) -> tuple | None:
    """Collective: check that every rank made the same call and that the new ``buffers`` sit at the
    same heap offsets on every rank; the error as (type, message), or None. Not the exception: its
    frames would keep the buffers alive (a caller's ``pytest.raises``, a log record), on the ranks
    that raised only."""
    try:
        heap.check_symmetric(f"workspace {key[0]}", *buffers.values(), signature=key)
    except (ValueError, RuntimeError) as err:
        return type(err), str(err)
    return None


def _evict(heap, nbytes: int) -> None:
    budget = workspace_budget(heap)
    for full_key in _heap_keys(heap.uid):
        if workspace_bytes(heap) + nbytes <= budget:
            return
        ws = _WORKSPACES.pop(full_key)
        _drop_prepared(heap.uid)
        if ws.captured:
            _KEPT_FOR_GRAPHS.append((heap.uid, ws))


def clear_workspaces(group=None) -> None:
    """Release every cached workspace of ``group``'s heap (default: the default group's; collective:
    call it on every rank of the group). Waits for this rank's device work
    and for every rank of the group, so no queued kernel still uses them. CUDA graphs captured before
    abort when replayed (their error is reported at the next call); their buffers stay allocated
    until shutdown. Other groups' workspaces stay."""
    if group is None and not is_initialized():
        _WORKSPACES.clear()
        _PREPARED.clear()
        return
    with _world.using(_world.state_for(group, "tilefuse.clear_workspaces")) as st:
        _world.synchronize(st.group)
        hostsync.barrier(st.heap.group, what="tilefuse.clear_workspaces")
        _drop_workspaces()


def _heap_keys(uid: int) -> list:
    """The cached workspaces' keys on the heap ``uid``, least recently used first."""
    return [key for key in _WORKSPACES if key[0] == uid]


def _drop_verified(uid: int) -> None:
    for key in [k for k in _VERIFIED_OUT if k[0] == uid]:
        _VERIFIED_OUT.discard(key)


def _drop_workspaces() -> None:
    """Drop the workspaces of the active group's heap (:func:`tilefuse.runtime.world.using`)."""
    if not is_initialized():
        _WORKSPACES.clear()
        _VERIFIED_OUT.clear()
        _PREPARED.clear()
        return
    uid = get_heap().uid
    _drop_prepared(uid)
    keys = _heap_keys(uid)
    if any(_WORKSPACES[k].captured for k in keys):
        _world.bump_generation()
    for key in keys:
        ws = _WORKSPACES.pop(key)
        if ws.captured:
            _KEPT_FOR_GRAPHS.append((uid, ws))
    _drop_verified(uid)
    keys = ws = None
    gc.collect()  # blocks held by reference cycles come back now, on every rank alike


_RETIRED: list = []  # (control block, workspaces) of closed heaps that captured CUDA graphs still name


def _drop_all() -> None:
    """At shutdown, for the active group's heap (the one that closes): drop its workspaces."""
    if not is_initialized():
        return
    heap = get_heap()
    keys = _heap_keys(heap.uid)
    captured = [_WORKSPACES[k] for k in keys if _WORKSPACES[k].captured]
    captured += [ws for uid, ws in _KEPT_FOR_GRAPHS if uid == heap.uid]
    if captured:
        # A graph replayed after shutdown reads the control block (its generation is now invalid, so
        # the call aborts before touching anything else): keep that memory until the process ends.
        heap.mark_internal(*(b for ws in captured for b in ws.buffers.values()))
        _RETIRED.append((control_block(), captured))
    for key in keys:
        del _WORKSPACES[key]
    _drop_prepared(heap.uid)
    _KEPT_FOR_GRAPHS[:] = [(uid, ws) for uid, ws in _KEPT_FOR_GRAPHS if uid != heap.uid]
    _drop_verified(heap.uid)


on_shutdown(_drop_all)  # tilefuse.shutdown() gives every workspace back with the heap
on_reset(_drop_workspaces)


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
        """Whether the call's kernels may begin and end it themselves (``primitives.call_enter``,
        ``call_exit``): not where the tile loop is to run warp-specialized (``Config.WARP_SPEC`` on a
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


_VERIFIED_OUT: set = set()


def check_out(op: str, heap, out, shape: tuple, dtype, **inputs) -> bool:
    """Check ``out`` (shape, dtype, device: no silent cast or broadcast; no overlap with ``inputs``);
    True when the kernels can write it in place: a contiguous heap tensor at the same offset on every
    rank. Any other tensor receives a copy of the result. The offset check is collective and runs
    once per (offset, shape); later calls are free. (Every rank must pass the same kind of ``out``.)"""
    check_out_tensor(op, out, shape, dtype, heap.device, **inputs)
    if not (heap.is_on_heap(out) and out.is_contiguous()):
        return False
    key = (heap.uid, heap.offset_of(out), tuple(out.shape), tuple(out.stride()))
    if key not in _VERIFIED_OUT:
        heap.check_symmetric(f"{op}: out", out)
        if len(_VERIFIED_OUT) > 4096:
            _VERIFIED_OUT.clear()
        _VERIFIED_OUT.add(key)
    return True
