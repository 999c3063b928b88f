"""gemm_all_reduce, fused sequential: each partial tile goes from registers into every rank's slot,
and the program that made it then sums the W partials of that tile.

    program p:  | tile t: K loop | store to slot r of ranks r+1, ..., r, release flag (r, t) there | tile t + P ... |
                | tile t: acquire flags (0, t) ... (W-1, t), sum slots 0 .. W-1 (+ bias) -> c | tile t + P ... |
    rank r:     | fused kernel: program 0 begins the call while the others run their first K loop |

Every program sums the tiles it computed (the same ids on every rank: it waits only on other ranks'
programs). One kernel, no barrier; where every program has at most one tile, the sum follows each
push with this rank's own partial from registers.
"""

from __future__ import annotations

import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.config import sum_rows
from ..common.launch import call_arg, collective, launched
from ..common.split_k import SPLIT_K_SCRATCH
from ._prepare import OP, prepare
from ._tiles import produce_tiles, reduce_tiles
from .norm import NORM_SCRATCH


@kernel
def _fused_kernel(
    a_ptr, b_ptr, scales, M, N, K, stride_a, stride_b,  # scales: common.scaled
    # stage [W, M, N], flags [W, num_tiles] int64 (symmetric); out: (c [M, N], bias [N], stride_c, norm.py's)
    stage_ptr, flags_ptr, stride_s, out,
    call, split,  # the call (begun here with ENTER); with SPLIT: (K slices a tile, split-K scratch, counts)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, SUB_M: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr,
    HAS_BIAS: tl.constexpr, ENTER: tl.constexpr = False,
    OWN_SUM: tl.constexpr = False, SPLIT: tl.constexpr = False, ALIGN: tl.constexpr = 1, NORM: tl.constexpr = 0,
):
    """``ENTER``: program 0 begins the call while the others run their first K loop (``P.enter_aside``).
    ``OWN_SUM``: ``produce_tiles``' ``SUM_HERE``. ``NORM``: c is ``new_residual``, normed into ``y`` (norm.py)."""
    pid = tl.program_id(0)
    c_ptr, bias_ptr, stride_c, norm = out
    if ENTER:
        epoch = P.enter_aside(call)
        first = (pid + NUM_PROGRAMS - 1) % NUM_PROGRAMS  # the same on every rank: the sum's waits pair up
        live = produce_tiles(a_ptr, b_ptr, scales, M, N, K, stride_a, stride_b, stage_ptr, flags_ptr, stride_s, call,
                             epoch, first, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, USE_TMA, B_KMAJOR,
                             RELEASE=True, GATE=True, sum_out=out, HAS_BIAS=HAS_BIAS, SUM_HERE=OWN_SUM, NORM=NORM,
                             split=split, SPLIT=SPLIT, ALIGN=ALIGN)
    else:  # the begin kernel began the call
        epoch, live = P.enter(call, False)
        first = pid
        if live:
            produce_tiles(a_ptr, b_ptr, scales, M, N, K, stride_a, stride_b, stage_ptr, flags_ptr, stride_s, call,
                          epoch, first, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, USE_TMA, B_KMAJOR,
                          RELEASE=True, sum_out=out, HAS_BIAS=HAS_BIAS, SUM_HERE=OWN_SUM, NORM=NORM, split=split,
                          SPLIT=SPLIT, ALIGN=ALIGN)
    if not OWN_SUM:
        if live:  # the tiles this program produced (the same ids on every rank)
            reduce_tiles(stage_ptr, flags_ptr, stride_s, c_ptr, bias_ptr, stride_c, M, N, call, epoch, first,
                         BLOCK_M, BLOCK_N, SUB_M, GROUP_M, NUM_PROGRAMS, PULL=False, WAIT=True,
                         HAS_BIAS=HAS_BIAS, norm=norm, NORM=NORM)
    P.exit(call, epoch, live, NUM_PROGRAMS, ENTER)


def _launch(p) -> dict:
    """The kernel's constexprs: GEMM_SMS + COMM_SMS programs (one kernel per config); ``OWN_SUM`` where every
    program has at most one work item and the reduction's blocks are whole tiles (no more registers)."""
    cfg = p.config
    programs = cfg.GEMM_SMS + cfg.COMM_SMS
    own_sum = p.num_tiles * cfg.SPLIT_K <= programs and sum_rows(cfg) == cfg.BLOCK_M
    return dict(NUM_PROGRAMS=programs, SUB_M=sum_rows(cfg), HAS_BIAS=p.has_bias, ENTER=p.begins,
                OWN_SUM=own_sum, SPLIT=cfg.SPLIT_K > 1, ALIGN=p.align, NORM=p.norm, **p.gemm_meta)


def split_arg(p, c):
    """``split`` of :func:`_fused_kernel`: ``(SPLIT_K, slots, counts)`` of this stream's ``SPLIT_K_SCRATCH``."""
    cfg = p.config
    if cfg.SPLIT_K == 1:
        return (1, p.stage, p.stage)
    parts, counts = SPLIT_K_SCRATCH.get(c.device, p.num_tiles * cfg.SPLIT_K * cfg.BLOCK_M * cfg.BLOCK_N, p.num_tiles)
    return (cfg.SPLIT_K, parts, counts)


def norm_arg(p, c, y, norm) -> tuple:
    """``norm`` of :func:`_fused_kernel` (``norm.py``'s tuple, this stream's ``NORM_SCRATCH``) for ``norm``."""
    if norm is None:
        return (p.stage, p.stage, p.stage, p.stage, p.stage, 0.0, 0, 0)
    residual, weight, eps = norm
    parts, counts = NORM_SCRATCH.get(c.device, p.M * (-(-p.N // p.config.BLOCK_N) + 1), -(-p.M // p.config.BLOCK_M))
    res = c if residual is None else residual
    return (y, res, weight, counts, parts, eps, res.stride(0), y.stride(0))


@collective(OP)
def fused_sequential(a, b, *, config=None, group=None, bias=None, scale_a=None, scale_b=None, out_dtype=None,
                     norm=None):
    """gemm_all_reduce as one fused persistent kernel; same contract as :func:`tilefuse.gemm_all_reduce`.
    ``norm``: ``(residual or None, norm_weight, eps)`` (checked): the call returns ``(y, new_residual)``."""
    p = prepare("fused_sequential", a, b, config, group, bias, (scale_a, scale_b, out_dtype), comm=False, flags=True,
                launch=_launch, norm=norm)
    if norm is None:
        a, b, c, entry = p.start(a, b)
        y = None
    else:
        a, b, c, y, entry = p.start_norm(a, b)
    if p.empty:
        return c if norm is None else (y, c)
    _fused_kernel[(p.launch["NUM_PROGRAMS"],)](
        a, b, p.scales(scale_a, scale_b), p.M, p.N, p.K, p.stride_a, p.stride_b, p.stage, p.flags,
        p.stride_s, (c, c if bias is None else bias.contiguous(), c.stride(), norm_arg(p, c, y, norm)),
        call_arg(p.heap, entry), split_arg(p, c), **p.launch)
    launched(entry)
    return c if norm is None else (y, c)
