"""Device loops shared by the gemm_all_reduce variants: push partial tiles to every rank, sum them.

Tiles ``t`` of ``c [M, N]`` are numbered alike on every rank (grouped swizzle). ``stage [W, M, N]``
(input dtype) on every heap: push layout (fused variants), slot s of every rank holds source s's
partial, rounded once; pull layout (bulk_sync), rank s's partial stays in slot s of its own heap.
``flags [W, num_tiles]`` int64: ``(s, t)`` is set to the call's sequence number once source s's
partial of tile t is in this rank's slot s. Every rank sums tile t's W partials in fp32 in the
order 0, 1, ..., W-1 (the same bits on every rank), then adds the bias; ``NORM``: the residual add
and the RMSNorm too (``norm.py``). Strides travel as tuples: ``stride_a = (am, ak)``, ``stride_b =
(bk, bn)``, ``stride_s = (slot, m, n)``, ``stride_c = (m, n)``.
"""

import triton
import triton.language as tl

from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.flags import tile_acquire
from ..common.reduce import block_offsets, push_partial, slot_ptr
from ..common.split_k import hand_in_slice, slice_sum, split_k_work
from ..common.tiles import gemm_operands, gemm_tile_range, tile_coords, tile_offsets
from .norm import OWN_TAIL, store_sum, tile_done


@triton.jit
def produce_tiles(
    a_ptr, b_ptr, scales, M, N, K, stride_a, stride_b,
    # stage [W, M, N] (input dtype; fp32 for float8) and flags [W, num_tiles] int64 (symmetric addresses)
    stage_ptr, flags_ptr, stride_s,
    call, epoch, pid,  # the call, its sequence number; this program among NUM_PROGRAMS
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, RELEASE: tl.constexpr,
    GATE: tl.constexpr = False,
    # with SUM_HERE: (output c [M, N], bias [N], stride_c, norm), all local (norm: norm.py, with NORM)
    sum_out=None, HAS_BIAS: tl.constexpr = False, SUM_HERE: tl.constexpr = False, NORM: tl.constexpr = 0,
    # with SPLIT: (K slices per tile, split-K scratch slots, counts) (ops.common.split_k.SPLIT_K_SCRATCH)
    split=None, SPLIT: tl.constexpr = False, ALIGN: tl.constexpr = 1,
):
    """This rank's partial of tiles pid, pid + NUM_PROGRAMS, ..., rounded once, into slot ``rank`` of ranks
    rank + 1, ..., itself last; ``RELEASE``: then each destination's flag (rank, t) = ``epoch``. ``GATE``
    (``P.enter_aside``): the stores wait for the begin (``P.ready``). Returns whether the call runs.
    ``SUM_HERE`` (one work item a program): each tile summed right after its push (:func:`sum_tile_with_own`;
    ``NORM``: then ``norm.tile_done``). ``SPLIT``: the work items are K slices, handed in whether or not the
    call runs (the counts are zero after every launch); a tile's last slice sums the slices and goes on."""
    rank, world = P.rank(call), P.world(call)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    my_slot = slot_ptr(stage_ptr, rank, stride_s[0])
    a_op, b_op = gemm_operands(a_ptr, b_ptr, M, N, K, stride_a[0], stride_a[1], stride_b[0], stride_b[1],
                               BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR)
    pushes = world - 1 if SUM_HERE else world  # SUM_HERE: the own partial stays in registers
    split_k = split[0] if SPLIT else 1
    num_work = num_tiles * split_k
    live = P.gate_start(epoch, GATE)
    for w in range(pid, num_work, NUM_PROGRAMS):
        t, s, k_lo, k_hi = split_k_work(w, K, split_k, BLOCK_K, SPLIT)
        pid_m, pid_n = tile_coords(t, num_pid_m, num_pid_n, GROUP_M)
        acc = gemm_tile_range(a_op, b_op, scales, pid_m, pid_n, M, N, K, k_lo, k_hi, stride_a[0], stride_a[1],
                              stride_b[0], stride_b[1], BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR,
                              ALIGN)  # [BM, BN] fp32
        finish = True
        if SPLIT:
            slots, finish = hand_in_slice(acc, t, s, split_k, split_k, split[1], split[2], BLOCK_M, BLOCK_N)
            if finish:
                acc = slice_sum(slots, split_k, t, split[2], BLOCK_M, BLOCK_N)
        if finish:
            part = acc.to(stage_ptr.dtype.element_ty)  # [BM, BN], rounded once
            offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N)
            live = P.gate(live, P.ctl(call), P.bases(call), rank, world, epoch, GATE)
            if live:
                for i in range(0, pushes):
                    dst = (rank + 1 + i) % world
                    # Release (RELEASE): pairs with the acquire in reduce_tiles (WAIT) or sum_tile_with_own on `dst`.
                    push_partial(my_slot, part, offs_m, offs_n, M, N, stride_s[1], stride_s[2],
                                 flags_ptr + rank * num_tiles + t, epoch, rank, dst, P.bases(call), RELEASE)
                if SUM_HERE:
                    c_ptr, bias_ptr, stride_c, norm = sum_out
                    s_tile = sum_tile_with_own(part, stage_ptr, flags_ptr, stride_s, c_ptr, bias_ptr, stride_c,
                                               M, N, num_tiles, t, offs_m, offs_n, call, epoch, HAS_BIAS,
                                               pid_n, num_pid_n, norm, NORM)
                    if NORM > 0:  # one tile a program: the split tail where programs may wait (a GPU)
                        tile_done(s_tile, offs_m, offs_n, c_ptr, stride_c, pid_m, num_pid_n, M, N, norm, call,
                                  BLOCK_M, SPLIT_TAIL=OWN_TAIL)
    return live


@triton.jit
def sum_tile_with_own(
    part,  # this rank's partial of tile t [BM, BN] (the stage's dtype), at rows offs_m, columns offs_n
    # stage [W, M, N] (input dtype), flags [W, num_tiles] (push layout), output c [M, N], bias [N]
    stage_ptr, flags_ptr, stride_s, c_ptr, bias_ptr, stride_c,
    M, N, num_tiles, t, offs_m, offs_n,
    call, epoch,
    HAS_BIAS: tl.constexpr,
    # with NORM: tile t's column block, the column blocks, and norm.py's tuple
    pid_n=0, num_pid_n=1, norm=None, NORM: tl.constexpr = 0,
):
    """:func:`reduce_tiles` of tile t, this rank's partial ``part`` from registers (rounded as a staged one):
    the other sources' flags, then the sum into c (``norm.store_sum``). Returns the tile stored, in fp32."""
    rank, world = P.rank(call), P.world(call)
    for i in range(1, world):
        src = (rank + i) % world
        # Acquire: pairs with the release in produce_tiles (SUM_HERE) on rank `src`.
        tile_acquire(flags_ptr + src * num_tiles + t, epoch, rank, src, P.ctl(call), P.bases(call), world)
    offs = offs_m[:, None] * stride_s[1] + offs_n[None, :] * stride_s[2]  # [BM, BN] int32
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)  # [BM, BN]
    own = part.to(tl.float32)
    # Start from s_0 itself (0.0 + -0.0 would be +0.0).
    total = tl.where(rank == 0, own, load_partial(stage_ptr, 0, offs, mask & (rank != 0), call, stride_s[0], False))
    for src in range(1, world):
        total += tl.where(src == rank, own,
                          load_partial(stage_ptr, src, offs, mask & (src != rank), call, stride_s[0], False))
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)  # [BN]
        total += bias[None, :]
    return store_sum(total, c_ptr, stride_c, offs_m, offs_n, M, N, pid_n, num_pid_n, norm, NORM)


@triton.jit
def load_partial(stage_ptr, src, offs, mask, call, stride_slot, PULL: tl.constexpr):
    """Source ``src``'s partial of a block in fp32 (0 outside ``mask``), from slot src of rank src (PULL) or here."""
    if PULL:
        part = P.load(slot_ptr(stage_ptr, src, stride_slot) + offs, P.rank(call), src, P.bases(call), mask=mask,
                      other=0.0)
    else:
        part = tl.load(slot_ptr(stage_ptr, src, stride_slot) + offs, mask=mask, other=0.0)
    return part.to(tl.float32)


@triton.jit
def reduce_tiles(
    # stage [W, M, N] (input dtype), flags [W, num_tiles] (push layout), output c [M, N], bias [N]
    stage_ptr, flags_ptr, stride_s, c_ptr, bias_ptr, stride_c,
    M, N, call, epoch, cid,  # cid: this program among NUM_PROGRAMS
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUB_M: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, PULL: tl.constexpr, WAIT: tl.constexpr, HAS_BIAS: tl.constexpr,
    norm=None, NORM: tl.constexpr = 0,
):
    """Sum the W partials of tiles cid, cid + NUM_PROGRAMS, ... into c: ``((s_0 + s_1) + ...) + bias`` in
    fp32, in [SUB_M, BN] blocks (``load_partial``'s ``PULL``); ``WAIT``: first acquire the tile's W flags;
    ``NORM``: ``norm.store_sum``, then the tile's ticket (``norm.tile_done``)."""
    world = P.world(call)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    for t in range(cid, num_tiles, NUM_PROGRAMS):
        if WAIT:
            for src in range(0, world):
                # Acquire: pairs with the release in produce_tiles on rank `src`.
                tile_acquire(flags_ptr + src * num_tiles + t, epoch, P.rank(call), src, P.ctl(call), P.bases(call),
                             world)
        pid_m, pid_n = tile_coords(t, num_pid_m, num_pid_n, GROUP_M)
        for sub in range(0, tl.cdiv(tl.minimum(BLOCK_M, M - pid_m * BLOCK_M), SUB_M)):
            offs_m, offs_n = block_offsets(pid_m, pid_n, sub, BLOCK_M, BLOCK_N, SUB_M)  # [SUB_M], [BN]
            offs = offs_m[:, None] * stride_s[1] + offs_n[None, :] * stride_s[2]  # [SUB_M, BN] int32
            mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)  # [SUB_M, BN]
            # Start from s_0 itself (0.0 + -0.0 would be +0.0).
            acc = load_partial(stage_ptr, 0, offs, mask, call, stride_s[0], PULL)  # [SUB_M, BN]
            for src in range(1, world):
                acc += load_partial(stage_ptr, src, offs, mask, call, stride_s[0], PULL)
            if HAS_BIAS:
                bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)  # [BN]
                acc += bias[None, :]
            store_sum(acc, c_ptr, stride_c, offs_m, offs_n, M, N, pid_n, num_pid_n, norm, NORM)
        if NORM > 0:  # several tiles a program may have: the tail that waits on nobody
            tile_done(0.0, 0, 0, c_ptr, stride_c, pid_m, num_pid_n, M, N, norm, call, BLOCK_M)


@kernel
def reduce_kernel(
    stage_ptr, flags_ptr, stride_s, c_ptr, bias_ptr, stride_c, M, N,
    call, exit_programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUB_M: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, PULL: tl.constexpr, WAIT: tl.constexpr, HAS_BIAS: tl.constexpr,
    END: tl.constexpr = False, ENTER: tl.constexpr = False,
):
    """One persistent launch of :func:`reduce_tiles`; ``END``: the call's last kernel (``P.exit`` over
    ``exit_programs``), ``ENTER``: also one that begins it (beside a GEMM kernel that does too)."""
    epoch, live = P.enter(call, ENTER)
    if live:
        reduce_tiles(stage_ptr, flags_ptr, stride_s, c_ptr, bias_ptr, stride_c, M, N, call, epoch,
                     tl.program_id(0), BLOCK_M, BLOCK_N, SUB_M, GROUP_M, NUM_PROGRAMS, PULL, WAIT, HAS_BIAS)
    P.exit(call, epoch, live, exit_programs, END)
