"""What a gemm_all_reduce variant prepares once per call signature (:func:`prepare`): checks, config,
heap buffers and the variant's launch options."""

from __future__ import annotations

import dataclasses
import functools

import torch

from ...runtime import hw
from ..common.checks import FLOAT8_DTYPES
from ..common.config import (
    WARP_SPEC_VARIANTS,
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
    """``bias`` is an ``[N]`` tensor of a's dtype (float8 operands: any result dtype) on a's device."""
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


@functools.lru_cache(maxsize=4096)
def fill_device(cfg, M: int, N: int, *, comm: bool):
    """The default config, with BLOCK_N halved (down to 32) while the tiles would leave GEMM programs
    idle: where the GEMM is bound by reading B, an idle program is bandwidth unused."""
    programs = cfg.GEMM_SMS if comm else cfg.GEMM_SMS + cfg.COMM_SMS
    block_n = cfg.BLOCK_N
    while block_n > 32 and -(-M // cfg.BLOCK_M) * -(-N // block_n) < programs:
        block_n //= 2
    return cfg if block_n == cfg.BLOCK_N else dataclasses.replace(cfg, BLOCK_N=block_n)


def default_tiles(cfg, M: int, N: int, dtype: torch.dtype, *, comm: bool, interpreter: bool):
    """The tiles of a call without a caller's config: the narrow decode tiles as they are, else :func:`fill_device`."""
    return cfg if narrow_decode(M, dtype, interpreter) else fill_device(cfg, M, N, comm=comm)


class Prepared(PreparedCall):
    """One call signature of one variant: the checked operands, the config and operand path, the heap
    buffers (the stage shared by the variants, each call's begin being a barrier) and ``launch(p)``."""

    def __init__(self, variant: str, a, b, config, group, bias, scaling: tuple, comm: bool, flags: bool, norm: int,
                 launch):
        call = prepare_gemm(OP, a, b, group, config, comm=comm, specialize=variant in WARP_SPEC_VARIANTS[OP])
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
        self.align = 1  # gemm_tile_range's ALIGN
        if cfg.SPLIT_K > 1 and variant == "fused_sequential":
            programs = cfg.GEMM_SMS + cfg.COMM_SMS
            if call.num_tiles * cfg.SPLIT_K > programs:
                raise ValueError(f"{OP}: fused_sequential with SPLIT_K={cfg.SPLIT_K} needs a K slice a program: "
                                 f"{call.num_tiles} tiles x {cfg.SPLIT_K} slices exceed GEMM_SMS + COMM_SMS = "
                                 f"{programs}; use fewer slices or larger tiles")
            if sum_rows(cfg) < cfg.BLOCK_M:
                raise ValueError(f"{OP}: fused_sequential with SPLIT_K={cfg.SPLIT_K} sums a whole tile in registers: "
                                 f"BLOCK_M x BLOCK_N = {cfg.BLOCK_M * cfg.BLOCK_N} must be at most 1024 x num_warps = "
                                 f"{1024 * side_warps(cfg)}")
            # The GEMM core's operand path for the config (its split decode tiles load through pointers).
            a_op, b_op, use_tma, b_kmajor, self.align = operand_path(call.a, call.b, cfg, min_m=UNALIGNED_PAD_MIN_M)
            call = dataclasses.replace(call, a=a_op, b=b_op, use_tma=use_tma, b_kmajor=b_kmajor)
        if bias is not None:
            check_bias(OP, bias, a, b)
        if call.K == 0 and call.use_tma:
            # A descriptor of an empty K extent is not valid on every device; the pointer path loops 0 times.
            call = dataclasses.replace(call, use_tma=False, b_kmajor=False)
        M, N, W = call.M, call.N, call.heap.world_size
        # K_loc may differ between ranks: the signature holds the tile grid the flags (and the in-kernel
        # norm's sums, norm.pair_sum) follow, not BLOCK_K.
        sig = (OP, variant, M, N, str(a.dtype), kind, (cfg.BLOCK_M, cfg.BLOCK_N, cfg.GROUP_M), bias is not None)
        super().__init__(call, a, b, sig + ((("norm", norm),) if norm else ()), empty=M == 0 or N == 0,
                         pad=variant != "bulk_sync", out_dtype=out_dtype)  # the GEMM core pads itself
        self.out_shape = (M, N)
        self.stride_a = (call.a.stride(0), call.a.stride(1))  # (am, ak) of the operands the kernels read
        self.stride_b = (call.b.stride(0), call.b.stride(1))  # (bk, bn)
        self.gemm_meta = call.gemm_meta  # the GEMM part's constexprs and launch options
        self.has_bias = bias is not None
        self.norm = norm  # the epilogue in the kernel: 0 none, 1 RMSNorm, 2 residual add + RMSNorm
        # stage [W, M, N] (input dtype; float8: fp32) and its (slot, m, n) strides; flags [W, num_tiles] int64
        # (not bulk_sync), both on the heap; the variant's launch options. Empty calls have none.
        self.stage, self.stride_s, self.flags, self.launch = None, (), None, {}
        if self.empty:
            return
        if M * N >= 2**31:
            raise ValueError(f"{OP}: M x N = {M} x {N} elements must stay below 2**31 (the reduction indexes a "
                             "slot with 32-bit offsets); split the call")
        stage = a.dtype if kind is None else torch.float32  # float8 partials travel in fp32: one rounding
        self.stage = self.hold((OP, "stage", stage, W, M, N), lambda h: {"stage": h.empty((W, M, N), dtype=stage)},
                               W * M * N * stage.itemsize).stage
        self.stride_s = self.stage.stride()
        if flags:
            tiles = self.num_tiles
            self.flags = self.hold((OP, variant, W, M, N, cfg.BLOCK_M, cfg.BLOCK_N),
                                   lambda h: {"flags": h.zeros((W, tiles), dtype=torch.int64)}, 8 * W * tiles).flags
        self.launch = launch(self)

    @property
    def num_tiles(self) -> int:
        return -(-self.M // self.config.BLOCK_M) * -(-self.N // self.config.BLOCK_N)

    def start_norm(self, a: torch.Tensor, b: torch.Tensor) -> tuple:
        """:meth:`start` of a call whose kernel also norms: ``(a, b, c, y, entry)``, both outputs
        filled with NaN if the call aborts (c is ``new_residual``)."""
        c = new_output(self.out_shape, self.out_dtype, a.device)
        y = new_output(self.out_shape, self.out_dtype, a.device)
        entry = self.begin(c, y)
        return (*self.operands(a, b), c, y, entry)

    def reduce_meta(self, programs: int, *, pull: bool, wait: bool, end: bool = False, enter: bool = False) -> dict:
        """Constexprs and launch options of ``_tiles.reduce_kernel`` on ``programs`` programs."""
        cfg = self.config
        return dict(BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, SUB_M=sum_rows(cfg), GROUP_M=cfg.GROUP_M,
                    NUM_PROGRAMS=programs, PULL=pull, WAIT=wait, HAS_BIAS=self.has_bias, END=end, ENTER=enter,
                    num_warps=side_warps(cfg))


def prepare(variant: str, a, b, config, group, bias, scaling: tuple = UNSCALED, *, comm: bool, flags: bool,
            launch, norm=None) -> Prepared:
    """The :class:`Prepared` of this call's signature, made on its first call; ``scaling``: ``(scale_a,
    scale_b, out_dtype)``; ``launch(p)``: the variant's launch options; ``norm``: ``(residual or None,
    norm_weight, eps)`` of an epilogue the kernel runs (checked by ``norm.run_with_norm``)."""
    mode = 0 if norm is None else 1 if norm[0] is None else 2
    make = lambda: Prepared(variant, a, b, config, group, bias, scaling, comm, flags, mode, launch)
    return once(op_heap(OP, group), (OP, variant, comm, flags, scaling[2], mode), make, config, a, b, bias,
                *scaling[:2], *(norm or ())[:2])
