"""Host-side plumbing shared by every variant launcher: heap lookup, config, workspaces, streams.

A launcher does: ``heap = op_heap(op, group)`` -> checks -> ``cfg = resolve_config(...)`` ->
``ws = workspace(...)`` (heap buffers allocated once per shape, collectively, and reused) ->
``epoch = ws.next_epoch()`` -> launch -> ``after_launch(heap)``.
"""

from __future__ import annotations

import contextlib
import gc
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ...runtime import control_block, get_heap, hw, is_initialized
from ...runtime.world import check_current_device, check_not_capturing, note_launch, on_shutdown, poll_waits
from .checks import check_out_tensor
from .config import Config, check_config_fits, default_config


def op_heap(op: str, group):
    """The heap for ``group`` (only the group tilefuse was initialised with is supported)."""
    if not is_initialized():
        raise RuntimeError(f"{op}: tilefuse is not initialised on this rank: call tilefuse.init() first")
    heap = get_heap()
    check_current_device(op, heap.device)  # kernels launch on the current device
    poll_waits()  # an earlier call's wait that gave up is reported here, before more work is queued
    check_not_capturing(op)
    if group is not None and group is not heap.group and group is not dist.group.WORLD:
        raise ValueError(f"{op}: group must be the process group passed to tilefuse.init (or None)")
    if group is dist.group.WORLD and heap.group is not dist.group.WORLD:
        raise ValueError(f"{op}: tilefuse was initialised on a subgroup; pass that group (or None)")
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
        config = default_config(M, N, K, dtype, num_sms=sms, interpreter=hw.interpreting(), comm=comm)
    elif not isinstance(config, Config):
        raise TypeError(f"{op}: config must be a tilefuse Config, got {type(config).__name__}")
    if comm and config.COMM_SMS < 1:
        raise ValueError(f"{op}: this variant needs COMM_SMS >= 1 communication programs, "
                         f"got {config.COMM_SMS}")
    check_config_fits(config, sms)
    return config


@dataclass
class Workspace:
    """Heap buffers of one (op, variant, shape) and the epoch counter of its flags."""

    buffers: dict
    epoch: int = 0
    extra: dict = field(default_factory=dict)

    def next_epoch(self) -> int:
        self.epoch += 1
        return self.epoch

    def __getattr__(self, name):
        try:
            return self.__dict__["buffers"][name]
        except KeyError:
            raise AttributeError(name) from None


_WORKSPACES: dict = {}


def workspace(heap, key: tuple, make) -> Workspace:
    """The cached workspace for ``key``; ``make(heap) -> dict`` allocates it on first use.

    Collective on first use: every rank must reach it with the same key (checked: a rank passing
    other shapes raises ValueError on every rank), and the buffers' heap offsets are checked to
    agree across ranks. Flags start at zero; epochs start at 1. With
    ``TILEFUSE_DEBUG_POISON=1`` new floating-point buffers start as NaN.
    """
    full_key = (heap.uid,) + key  # not id(heap): a later heap may reuse the address of a closed one
    ws = _WORKSPACES.get(full_key)
    if ws is None:
        # Blocks held only by reference cycles come back now, on every rank alike, so that the
        # ranks' allocators stay in step (frees left to the cyclic collector happen at
        # different moments on different ranks).
        gc.collect()
        buffers = make(heap)
        if os.environ.get("TILEFUSE_DEBUG_POISON", "0") not in ("", "0"):
            # Debug aid: a tile that a variant forgets to write shows as NaN, not as zero.
            for buf in buffers.values():
                if buf.dtype.is_floating_point:
                    buf.fill_(float("nan"))
        heap.check_symmetric(f"workspace {key[0]}", *buffers.values(), signature=key)
        ws = Workspace(buffers)
        _WORKSPACES[full_key] = ws
    return ws


def clear_workspaces() -> None:
    """Drop every cached workspace, giving their heap blocks back (collective: all ranks call it
    together, after a barrier, once no queued kernel still uses them). Workspaces are kept per shape
    and never evicted otherwise: a workload with many distinct shapes should call this now and then."""
    _WORKSPACES.clear()


on_shutdown(clear_workspaces)  # tilefuse.shutdown() gives every workspace back with the heap


def ctl(heap) -> torch.Tensor:
    return control_block()


def after_launch(heap) -> None:
    """Report a wait that gave up: at once on the CPU, at the next call on a GPU (no sync)."""
    note_launch()


_SIDE_STREAMS: dict = {}


class ForkedStreams:
    """A second stream that starts after everything queued so far on the current one.

    Producer-consumer launchers fork *before* launching the producer, launch the consumer inside
    ``with streams.side():`` and then ``join()``, so that the two kernels run at the same time.
    On the CPU every launch is synchronous, and all of this is a no-op (launch the producer first).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.main = torch.cuda.current_stream(device)
            stream = _SIDE_STREAMS.get(device)
            if stream is None:
                stream = _SIDE_STREAMS[device] = torch.cuda.Stream(device)
            stream.wait_stream(self.main)
            self.stream = stream

    def side(self):
        return torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext()

    def join(self) -> None:
        if self.cuda:
            self.main.wait_stream(self.stream)


@dataclass
class GemmCall:
    """Checked operands of one GEMM-based op call and the pieces every launcher needs."""

    heap: object
    a: torch.Tensor
    b: torch.Tensor
    M: int
    N: int
    K: int
    config: Config
    use_tma: bool
    b_kmajor: bool

    @property
    def gemm_args(self) -> tuple:
        """Pointers, sizes and strides of A and B in the order the kernels take them."""
        a, b = self.a, self.b
        return (a, b, self.M, self.N, self.K, a.stride(0), a.stride(1), b.stride(0), b.stride(1))

    @property
    def gemm_meta(self) -> dict:
        """Constexprs and launch options of the GEMM part."""
        c = self.config
        return dict(BLOCK_M=c.BLOCK_M, BLOCK_N=c.BLOCK_N, BLOCK_K=c.BLOCK_K, GROUP_M=c.GROUP_M,
                    USE_TMA=self.use_tma, B_KMAJOR=self.b_kmajor, num_warps=c.num_warps,
                    num_stages=c.num_stages)

    @property
    def num_tiles(self) -> int:
        c = self.config
        return -(-self.M // c.BLOCK_M) * -(-self.N // c.BLOCK_N)


def prepare_gemm(op: str, a, b, group, config, *, comm: bool, tile_m: int | None = None,
                 tile_n: int | None = None) -> GemmCall:
    """Check ``a [M, K]`` and ``b [K, N]`` for ``op`` and resolve the config and GEMM layout.

    ``tile_m``/``tile_n`` override the M and N the config heuristic sees (e.g. per-shard sizes).
    """
    from .checks import check_dtypes, check_inner_dim, check_matrix, check_same_device
    from .gemm import ensure_triton_allocator, gemm_layout

    heap = op_heap(op, group)
    check_matrix(op, "a", a)
    check_matrix(op, "b", b)
    check_same_device(op, a=a, b=b)
    check_on_device(op, heap, a=a)
    check_dtypes(op, a=a, b=b)
    check_inner_dim(op, a, b)
    M, K = a.shape
    N = b.shape[1]
    cfg = resolve_config(op, config, tile_m or M, tile_n or N, K, a.dtype, heap, comm=comm)
    use_tma, b_kmajor = gemm_layout(a, b)
    if use_tma:
        ensure_triton_allocator()
    return GemmCall(heap, a, b, M, N, K, cfg, use_tma, b_kmajor)


_VERIFIED_OUT: set = set()


def check_out(op: str, heap, out, shape: tuple, dtype) -> None:
    """``out`` must be a heap tensor of ``shape``/``dtype`` at the same offset on every rank.

    The offset check is collective and runs once per (offset, shape); later calls are free.
    """
    check_out_tensor(op, out, shape, dtype, getattr(out, "device", None))  # the heap check covers the device
    heap.check_on_heap(f"{op}: out", out)
    key = (heap.uid, heap.offset_of(out), tuple(out.shape), tuple(out.stride()))
    if key not in _VERIFIED_OUT:
        heap.check_symmetric(f"{op}: out", out)
        _VERIFIED_OUT.add(key)
