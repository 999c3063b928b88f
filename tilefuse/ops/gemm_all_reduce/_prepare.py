"""What a gemm_all_reduce variant prepares once per call signature: checks, config, heap buffers.
A variant's host function then does, on every call: ``p.start(a, b)`` (operands, output, begin), the
call tuple and the launches."""

from __future__ import annotations

import dataclasses
import functools

import torch

from ...runtime import hw
from ..common.checks import FLOAT8_DTYPES
from ..common.config import (
    WARP_SPEC_VARIANTS,
    Config,
    check_variant_config,
    decode_split_config,
    narrow_decode,
    side_warps,
    sum_rows,
)
from ..common.gemm import UNALIGNED_PAD_MIN_M, operand_path
from ..common.launch import new_output, op_heap, prepare_gemm
from ..common.prepare import PreparedCall, once
from ..common.scaled import OUT_DTYPES, UNSCALED, prepare_scaling

OP = "gemm_all_reduce"


def check_bias(op: str, bias, a: torch.Tensor, b: torch.Tensor) -> None:
    """``bias`` is a 1-D tensor of ``N = b.shape[1]`` elements with a's dtype (float8 operands: any
    result dtype, it is added in fp32), on a's device."""
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"{op}: bias must be a torch.Tensor or None, got {type(bias).__name__}")
    if bias.dim() != 1 or bias.shape[0] != b.shape[1]:
        raise ValueError(f"{op}: bias must have shape ({b.shape[1]},) (N, the columns of b), got {tuple(bias.shape)}")
    if a.dtype in FLOAT8_DTYPES:
        if bias.dtype not in OUT_DTYPES:
            raise TypeError(f"{op}: bias of float8 operands must be bfloat16, float16 or float32, got {bias.dtype}")
    elif bias.dtype != a.dtype:
        raise TypeError(f"{op}: bias has dtype {bias.dtype} but a has dtype {a.dtype}")
    if bias.device != a.device:
        raise ValueError(f"{op}: bias is on {bias.device} but a is on {a.device}")


MIN_DEFAULT_BLOCK_N = 32


@functools.lru_cache(maxsize=4096)
def fill_device(cfg, M: int, N: int, *, comm: bool):
    """The default config, with BLOCK_N halved (down to 32) while the tiles would leave GEMM programs
    idle: where the GEMM is bound by reading B, an idle program is bandwidth unused."""
    programs = cfg.GEMM_SMS if comm else cfg.GEMM_SMS + cfg.COMM_SMS
    block_n = cfg.BLOCK_N
    while block_n > MIN_DEFAULT_BLOCK_N and -(-M // cfg.BLOCK_M) * -(-N // block_n) < programs:
        block_n //= 2
    return cfg if block_n == cfg.BLOCK_N else dataclasses.replace(cfg, BLOCK_N=block_n)


def default_tiles(cfg, M: int, N: int, dtype: torch.dtype, *, comm: bool, interpreter: bool):
    """The tiles of a call without a caller's config: the narrow decode tiles as they are (their
    BLOCK_N already fills the device; narrower tiles read B less efficiently), else
    :func:`fill_device`."""
    if narrow_decode(M, dtype, interpreter):
        return cfg
    return fill_device(cfg, M, N, comm=comm)


class Prepared(PreparedCall):
    """One call signature of one variant, checked and set up."""

    def __init__(self, variant: str, call, a, b, sig: tuple, align: int, has_bias: bool, out_dtype):
        super().__init__(call, a, b, sig, empty=call.M == 0 or call.N == 0,
                         pad=variant != "bulk_sync", out_dtype=out_dtype)  # the GEMM core pads itself
        self.out_shape = (call.M, call.N)
        self.align = align  # gemm_tile_range's ALIGN
        self.stride_a = (call.a.stride(0), call.a.stride(1))  # (am, ak) of the operands the kernels read
        self.stride_b = (call.b.stride(0), call.b.stride(1))  # (bk, bn)
        self.gemm_meta = call.gemm_meta  # the GEMM part's constexprs and launch options
        self.has_bias = has_bias
        self.stage = None  # [W, M, N] in the input dtype (float8: fp32), on the heap (None: an empty call)
        self.stride_s = ()  # the stage's (slot, m, n)
        self.flags = None  # [W, num_tiles] int64 on the heap (every variant but bulk_sync)
        self.launch = {}  # the variant's constexprs and launch options
        self.norm = 0  # the epilogue in the kernel (norm_mode): 0 none, 1 RMSNorm, 2 residual add + RMSNorm

    @property
    def kernel_begins(self) -> bool:
        """The call's first kernel begins it (ENTER); else the begin kernel does."""
        return self.begins and not self.empty

    @property
    def num_tiles(self) -> int:
        cfg = self.config
        return -(-self.M // cfg.BLOCK_M) * -(-self.N // cfg.BLOCK_N)

    @property
    def row_blocks(self) -> int:
        return -(-self.M // self.config.BLOCK_M)

    def start_norm(self, a: torch.Tensor, b: torch.Tensor) -> tuple:
        """:meth:`start` of a call whose kernel also norms: ``(a, b, c, y, entry)``, both outputs
        filled with NaN if the call aborts (c is ``new_residual``)."""
        c = new_output(self.out_shape, self.out_dtype, a.device)
        y = new_output(self.out_shape, self.out_dtype, a.device)
        entry = self.begin(c, y)
        return (*self.operands(a, b), c, y, entry)

    @property
    def stride_c(self) -> tuple:
        return (self.N, 1)  # c is a fresh contiguous [M, N]

    def reduce_meta(self, programs: int, *, pull: bool, wait: bool, end: bool = False, enter: bool = False) -> dict:
        """Constexprs and launch options of ``_tiles.reduce_kernel`` on ``programs`` programs."""
        cfg = self.config
        return dict(BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, SUB_M=sum_rows(cfg), GROUP_M=cfg.GROUP_M,
                    NUM_PROGRAMS=programs, PULL=pull, WAIT=wait, HAS_BIAS=self.has_bias, END=end, ENTER=enter,
                    num_warps=side_warps(cfg))


def norm_mode(norm) -> int:
    """:attr:`Prepared.norm` of a call's ``norm = (residual or None, norm_weight, eps)`` (or None)."""
    return 0 if norm is None else 1 if norm[0] is None else 2


def prepare(variant: str, a, b, config, group, bias, scaling: tuple = UNSCALED, *, comm: bool, flags: bool,
            launch=None, norm=None) -> Prepared:
    """The :class:`Prepared` of this call's signature (made by :func:`_make` on first sight,
    ``common.prepare.once``); ``scaling``: the call's ``(scale_a, scale_b, out_dtype)``
    (:mod:`..common.scaled`); ``launch(p)`` returns the variant's :attr:`Prepared.launch`; ``norm``:
    ``(residual, norm_weight, eps)`` of an epilogue the kernel runs (checked by ``norm.run_with_norm``).
    Raises on bad arguments, every time."""
    mode = norm_mode(norm)

    def make():
        p = _make(variant, a, b, config, group, bias, scaling, comm=comm, flags=flags, norm=mode)
        if launch is not None and p.stage is not None:
            p.launch = launch(p)
        return p

    if not mode:
        return once(op_heap(OP, group), (OP, variant, comm, flags, scaling[2]), make, config, a, b, bias,
                    *scaling[:2])
    return once(op_heap(OP, group), (OP, variant, comm, flags, scaling[2], mode), make, config, a, b, bias,
                *scaling[:2], norm[0], norm[1])


def _make(variant: str, a, b, config, group, bias, scaling: tuple, *, comm: bool, flags: bool,
          norm: int = 0) -> Prepared:
    """Check ``a [M, K_loc]``, ``b [K_loc, N]`` and ``bias [N]``; resolve the config and the
    operands' path; get the heap buffers: the stage (a's dtype) is shared by every variant of one
    (dtype, M, N) (each call's begin is a barrier), the flags belong to one variant and tile shape."""
    call = prepare_gemm(OP, a, b, group, config, comm=comm, specialize=variant in WARP_SPEC_VARIANTS[OP])
    heap = call.heap
    out_dtype, kind = prepare_scaling(OP, a, b, *scaling)
    check_variant_config(OP, variant, call.config)  # split K: bulk_sync, and fused_sequential within one wave
    interp = hw.interpreting()
    if config is None:
        split = None
        if variant == "fused_sequential":  # the GEMM core's split decode tiles, if any
            cfg = call.config
            split = decode_split_config(call.M, call.N, call.K, a.dtype, num_sms=cfg.GEMM_SMS + cfg.COMM_SMS,
                                        interpreter=interp)
        call = dataclasses.replace(call, config=split or default_tiles(call.config, call.M, call.N, a.dtype,
                                                                       comm=comm, interpreter=interp))
    cfg = call.config
    align = 1
    if cfg.SPLIT_K > 1 and variant == "fused_sequential":
        _check_one_wave_split(cfg, call.num_tiles)
        # The GEMM core's operand path for the config (its split decode tiles load through pointers).
        a_op, b_op, use_tma, b_kmajor, align = operand_path(call.a, call.b, cfg, min_m=UNALIGNED_PAD_MIN_M)
        call = dataclasses.replace(call, a=a_op, b=b_op, use_tma=use_tma, b_kmajor=b_kmajor)
    if bias is not None:
        check_bias(OP, bias, a, b)
    if call.K == 0 and call.use_tma:
        # A descriptor of an empty K extent is not valid on every device; the pointer path loops 0 times.
        call = dataclasses.replace(call, use_tma=False, b_kmajor=False)
    M, N, W = call.M, call.N, heap.world_size
    # K_loc may differ between ranks, and with it the default config's BLOCK_K: the signature holds
    # the tile grid, on which the ranks' tile numbering (and so the flags) depends, and everything else.
    # The in-kernel norm's sums are fixed by BLOCK_M and BLOCK_N alone (norm.pair_sum): the same bits
    # whatever num_warps a rank's config has.
    sig = (OP, variant, M, N, str(a.dtype), kind, (cfg.BLOCK_M, cfg.BLOCK_N, cfg.GROUP_M), bias is not None)
    if norm:
        sig += (("norm", norm),)
    p = Prepared(variant, call, a, b, sig, align, bias is not None, out_dtype)
    p.norm = norm
    if p.empty:
        return p
    if M * N >= 2**31:
        raise ValueError(f"{OP}: M x N = {M} x {N} elements must stay below 2**31 (the reduction indexes a "
                         "slot with 32-bit offsets); split the call")
    stage = a.dtype if kind is None else torch.float32  # float8 partials travel in fp32: one rounding
    p.stage = p.hold((OP, "stage", stage, W, M, N), lambda h: {"stage": h.empty((W, M, N), dtype=stage)},
                     W * M * N * stage.itemsize).stage
    p.stride_s = p.stage.stride()
    if flags:
        tiles = p.num_tiles
        p.flags = p.hold((OP, variant, W, M, N, cfg.BLOCK_M, cfg.BLOCK_N),
                         lambda h: {"flags": h.zeros((W, tiles), dtype=torch.int64)}, 8 * W * tiles).flags
    return p


def _check_one_wave_split(cfg: Config, num_tiles: int) -> None:
    """Raise ValueError unless fused_sequential can split K: at most one K slice a program, and tiles
    whose fp32 sum fits in a program's registers (:func:`~..common.config.sum_rows`)."""
    programs = cfg.GEMM_SMS + cfg.COMM_SMS
    if num_tiles * cfg.SPLIT_K > programs:
        raise ValueError(f"{OP}: fused_sequential with SPLIT_K={cfg.SPLIT_K} needs a K slice a program: "
                         f"{num_tiles} tiles x {cfg.SPLIT_K} slices exceed GEMM_SMS + COMM_SMS = {programs}; "
                         "use fewer slices or larger tiles")
    if sum_rows(cfg) < cfg.BLOCK_M:
        raise ValueError(f"{OP}: fused_sequential with SPLIT_K={cfg.SPLIT_K} sums a whole tile in registers: "
                         f"BLOCK_M x BLOCK_N = {cfg.BLOCK_M * cfg.BLOCK_N} must be at most 1024 x num_warps = "
                         f"{1024 * side_warps(cfg)}")
