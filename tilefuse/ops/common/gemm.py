"""Shared GEMM building blocks: tile swizzle, operand setup, K loop, tile load/store, a plain GEMM.

Every op variant computes its tiles with these helpers, so a variant differs from its siblings only
in schedule and communication. A kernel that computes ``C = A @ B`` tile by tile reads::

    a_op, b_op = gemm_operands(a_ptr, b_ptr, M, N, K, ...)        # once, at kernel start
    for tile_id in range(pid, num_tiles, NUM_PROGRAMS):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        acc = gemm_tile(a_op, b_op, pid_m, pid_n, M, N, K, ...)   # [BM, BN] fp32
        offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N)
        store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn)

Split-K, for shapes with too few tiles to occupy the multiprocessors (small M, large K): a work item
is one of ``split_k`` K slices of a tile. :func:`split_k_work` maps it to ``(tile, slice, k_lo,
k_hi)``, :func:`gemm_tile_range` computes the slice's fp32 partial, :func:`hand_in_slice` stores it
and tells the one program whose slice completes the tile to finish it, and :func:`store_slice_sum`
sums the partials (in slice order: deterministic) into the tile of C; the other slices' programs
move on. The
partials and per-tile counts live in a per-stream scratch (:class:`SplitKScratch`).

Operand layouts (decided on the host by :func:`gemm_layout`):

- ``USE_TMA=False``: raw pointers, masked loads at any strides (the portable path).
- ``USE_TMA=True``: device-side tensor descriptors (TMA on Hopper). A is row-major ``[M, K]``;
  B is row-major ``[K, N]``, or, with ``B_KMAJOR=True``, column-major ``[K, N]`` (a row-major
  ``[N, K]`` buffer, e.g. ``w.t()`` of a torch ``Linear`` weight), whose ``[BN, BK]`` tiles are
  transposed in registers before ``tl.dot``. Out-of-bounds elements read as zero, so ragged M, N
  and K need no masks, and nothing outside the ``[M, K]``/``[K, N]`` window is ever read.

Precision: accumulation is fp32. Inputs may be fp16, bf16 or fp32; fp32 inputs use ``tl.dot``'s
default input precision, which is tf32 on NVIDIA GPUs (about 1e-3 relative error) and exact fp32 in
the interpreter.
"""

from __future__ import annotations

import contextvars
import functools
import os

import torch
import triton
import triton.language as tl

from ...runtime import primitives as P
from ...runtime.world import on_reset
from .config import launch_shape, pointer_tiles, stream_k_slots, stream_k_whole_tiles

# ---------------------------------------------------------------------------------------------
# Device-side helpers
# ---------------------------------------------------------------------------------------------


@triton.jit
def tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Grouped swizzle: linear tile_id -> (pid_m, pid_n) tile coordinates of a [num_pid_m, num_pid_n] grid."""
    # Consecutive tile ids walk down a band of GROUP_M row blocks before moving one column block
    # right, so programs running at the same time share A rows and B columns in L2.
    tiles_per_band = GROUP_M * num_pid_n
    band = tile_id // tiles_per_band
    first_pid_m = band * GROUP_M
    band_rows = tl.minimum(num_pid_m - first_pid_m, GROUP_M)  # the last band may be shorter
    index_in_band = tile_id % tiles_per_band
    pid_m = first_pid_m + index_in_band % band_rows
    pid_n = index_in_band // band_rows
    return pid_m, pid_n


@triton.jit
def gemm_operands(
    a_ptr, b_ptr,
    M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr,
):
    """Operands for gemm_tile: TMA descriptors of A [M, K] and B [K, N] if USE_TMA, else the raw pointers."""
    # The pointers may point anywhere in global memory, including a peer's heap (translated
    # pointer). With USE_TMA the unit strides (stride_ak, and stride_bn or stride_bk) are 1 by
    # construction (checked on the host), so only the leading strides enter the descriptors.
    a_op = a_ptr
    b_op = b_ptr
    if USE_TMA:
        a_op = tl.make_tensor_descriptor(
            a_ptr, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K]
        )
        if B_KMAJOR:
            # Column-major B [K, N] is a row-major [N, K] buffer: tiles come out as [BN, BK].
            b_op = tl.make_tensor_descriptor(
                b_ptr, shape=[N, K], strides=[stride_bn, 1], block_shape=[BLOCK_N, BLOCK_K]
            )
        else:
            b_op = tl.make_tensor_descriptor(
                b_ptr, shape=[K, N], strides=[stride_bk, 1], block_shape=[BLOCK_K, BLOCK_N]
            )
    return a_op, b_op


@triton.jit
def gemm_tile(
    a_op, b_op,
    pid_m, pid_n,
    M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, ALIGN: tl.constexpr = 1,
):
    """K loop of output tile (pid_m, pid_n): the fp32 accumulator [BM, BN] of A[rows, :] @ B[:, cols]."""
    return gemm_tile_range(
        a_op, b_op, pid_m, pid_n, M, N, K, 0, tl.cdiv(K, BLOCK_K), stride_am, stride_ak, stride_bk, stride_bn,
        BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR, ALIGN,
    )


@triton.jit
def gemm_tile_range(
    a_op, b_op,
    pid_m, pid_n,
    M, N, K,
    k_lo, k_hi,
    stride_am, stride_ak, stride_bk, stride_bn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, ALIGN: tl.constexpr = 1,
):
    """K steps [k_lo, k_hi) (in units of BLOCK_K) of tile (pid_m, pid_n): the fp32 partial [BM, BN]
    of A[rows, k_lo*BK : k_hi*BK] @ B[k_lo*BK : k_hi*BK, cols] (zeros for an empty range).

    ``ALIGN`` (pointer path; :func:`pointer_align`): A is row-major, B column-major (a Linear
    weight's ``w.t()``), and ``K``, ``stride_am`` and ``stride_bn`` are multiples of ``ALIGN``.
    Saying so lets the compiler load ``ALIGN`` contiguous elements at once where it would otherwise
    load one (rows of K = 3500 bf16 values are 8-byte, not 16-byte, aligned)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # [BM, BN]
    if USE_TMA:
        # Descriptor coordinates are element indices (int32); out-of-bounds reads return zeros.
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        for k in range(k_lo, k_hi):
            off_k = k * BLOCK_K
            a = a_op.load([off_m, off_k])  # [BM, BK]
            if B_KMAJOR:
                b = tl.trans(b_op.load([off_n, off_k]))  # [BN, BK] -> [BK, BN]
            else:
                b = b_op.load([off_k, off_n])  # [BK, BN]
            acc = tl.dot(a, b, acc)
    else:
        # Masked loads: rows past M, columns past N and the K tail read as zero.
        offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
        offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
        offs_k = tl.arange(0, BLOCK_K)  # [BK]
        first_k = (k_lo * BLOCK_K + offs_k).to(tl.int64)  # [BK], columns of A / rows of B of step k_lo
        if ALIGN > 1:
            # The same values, written so that the compiler sees them as multiples of ALIGN.
            stride_am = stride_am // ALIGN * ALIGN
            stride_bn = stride_bn // ALIGN * ALIGN
            K = K // ALIGN * ALIGN  # the K tail's mask is then constant over ALIGN elements
        mask_m = offs_m < M  # [BM]
        mask_n = offs_n < N  # [BN]
        a_ptrs = a_op + offs_m[:, None] * stride_am + first_k[None, :] * stride_ak  # [BM, BK]
        b_ptrs = b_op + first_k[:, None] * stride_bk + offs_n[None, :] * stride_bn  # [BK, BN]
        for k in range(k_lo, k_hi):
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < k_left), other=0.0)  # [BM, BK]
            b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & mask_n[None, :], other=0.0)  # [BK, BN]
            acc = tl.dot(a, b, acc)
            # Advancing the pointers (64-bit) avoids k * BLOCK_K * stride overflowing int32.
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def split_k_work(work_id, K, split_k, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr):
    """Work item ``work_id`` of a split-K schedule -> ``(tile_id, slice, k_lo, k_hi)``.

    ``SPLIT`` (constexpr) is ``split_k > 1``; without it a work item is a whole tile. Work items are
    numbered tile by tile (``work_id = tile_id * split_k + slice``), so programs that run at the same
    time take the slices of the same tiles and finish them together. Slice s gets the K steps
    ``[s * steps // split_k, (s + 1) * steps // split_k)`` of the ``steps = cdiv(K, BLOCK_K)``
    (sizes differ by at most one step; a slice may be empty when steps < split_k).
    """
    if SPLIT:
        tile_id = work_id // split_k
        s = work_id % split_k
        steps = tl.cdiv(K, BLOCK_K)
        return tile_id, s, s * steps // split_k, (s + 1) * steps // split_k
    else:
        return work_id, 0, 0, tl.cdiv(K, BLOCK_K)


@triton.jit
def hand_in_slice(
    acc, tile_id, s, n, slots_per_tile,
    partial_ptr, count_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Hand in slice ``s`` (of the tile's ``n`` K slices, in K order) as the fp32 partial ``acc``
    [BM, BN] of tile ``tile_id``; returns ``(slots, done)``.

    The slice's partial goes to its own slot of the tile (``partial_ptr``: fp32, ``slots_per_tile
    >= n`` slots of ``BM * BN`` per tile; ``slots`` is the tile's first), then it counts itself in
    (``count_ptr[tile_id]``, int32). ``done`` is True for the program whose slice is counted last:
    it finishes the tile (:func:`store_slice_sum`); the others move on. Nobody waits.
    """
    slots = partial_ptr + tile_id.to(tl.int64) * slots_per_tile * (BLOCK_M * BLOCK_N)
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # [BM, BN]
    tl.store(slots + s * (BLOCK_M * BLOCK_N) + offs, acc)
    # Every thread's part of the slot is stored before the one thread's count below.
    tl.debug_barrier()
    # Release (this slot) and acquire (the other slots): pairs with the same atomic of the tile's
    # other slices, in this launch and on this device only (local memory, gpu scope).
    arrived = tl.atomic_add(count_ptr + tile_id, 1, sem="acq_rel", scope="gpu")
    return slots, arrived == n - 1


@triton.jit
def store_slice_sum(
    slots, n, tile_id, count_ptr,
    c_ptr, pid_m, pid_n, M, N, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUB_M: tl.constexpr,
):
    """Store tile (pid_m, pid_n) of C as ``slot 0 + slot 1 + ... + slot n-1`` (fp32, in that order
    whichever slice came last: deterministic), ``SUB_M`` rows at a time, then set the tile's count
    back to 0 for the next launch on the stream.

    Row blocks keep one [SUB_M, BN] sum and one loaded block in registers, not whole [BM, BN]
    tiles: a 128x256 fp32 sum next to a loaded partial would spill. Row blocks wholly below M are
    skipped. The loads bypass L1 (.cg): other multiprocessors wrote the slots.
    """
    sub = tl.arange(0, SUB_M)  # [SUB_M]
    cols = tl.arange(0, BLOCK_N)  # [BN]
    offs_n = pid_n.to(tl.int64) * BLOCK_N + cols  # [BN]
    for r in range(0, tl.cdiv(tl.minimum(BLOCK_M, M - pid_m * BLOCK_M), SUB_M)):
        offs = (r * SUB_M + sub)[:, None] * BLOCK_N + cols[None, :]  # [SUB_M, BN] within a slot
        total = tl.load(slots + offs, cache_modifier=".cg")  # [SUB_M, BN]
        for j in range(1, n):
            total += tl.load(slots + j * (BLOCK_M * BLOCK_N) + offs, cache_modifier=".cg")
        offs_m = pid_m.to(tl.int64) * BLOCK_M + r * SUB_M + sub  # [SUB_M]
        store_tile(c_ptr, total, offs_m, offs_n, M, N, stride_cm, stride_cn)
    tl.store(count_ptr + tile_id, 0)


@triton.jit
def slice_sum(
    slots, n, tile_id, count_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """The fp32 sum ``slot 0 + slot 1 + ... + slot n-1`` [BM, BN] of a tile whose last slice this
    program handed in (:func:`hand_in_slice`), the same values :func:`store_slice_sum` stores, for
    a kernel that does more with the tile than store it (small tiles: the sum and a loaded slot fit
    in registers); sets the tile's count back to 0 for the next launch on the stream."""
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # [BM, BN]
    total = tl.load(slots + offs, cache_modifier=".cg")  # [BM, BN]
    for j in range(1, n):
        total += tl.load(slots + j * (BLOCK_M * BLOCK_N) + offs, cache_modifier=".cg")
    tl.store(count_ptr + tile_id, 0)
    return total


@triton.jit
def stream_k_owner(g, total, units):
    """The stream-K work unit whose range holds global K step ``g`` (int64) of ``total``: unit u has
    the steps ``[u * total // units, (u + 1) * total // units)``."""
    return (((g + 1) * units - 1) // total).to(tl.int32)


@triton.jit
def tile_offsets(pid_m, pid_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Row indices [BM] and column indices [BN] (int64) of output tile (pid_m, pid_n)."""
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    return offs_m, offs_n


@triton.jit
def store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn):
    """Masked store of acc [BM, BN] at rows offs_m [BM] / cols offs_n [BN] of C [M, N], cast to C's dtype."""
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn  # [BM, BN]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)  # [BM, BN]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def load_tile(ptr, offs_m, offs_n, M, N, stride_m, stride_n):
    """Load the [BM, BN] tile at rows offs_m [BM] / cols offs_n [BN] of an [M, N] matrix; zeros outside."""
    ptrs = ptr + offs_m[:, None] * stride_m + offs_n[None, :] * stride_n  # [BM, BN]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)  # [BM, BN]
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def whole_tiles(
    a_op, b_op, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    pid, num_work, num_programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, ALIGN: tl.constexpr,
    FLATTEN: tl.constexpr, TMA_STORE: tl.constexpr, WARP_SPEC: tl.constexpr = False,
):
    """Tiles pid, pid + num_programs, ... of C, each over all of K (matmul_kernel's ``FLATTEN``,
    ``TMA_STORE`` and warp-specialized forms of its tiles schedule). The epilogue's tile comes from a
    counter of its own, one step behind the loads' (the same values): with the loops flattened, the
    next tile's loads then do not wait on this tile's store. ``TMA_STORE`` 2 stores a tile through
    the descriptor in two halves of ``BLOCK_N // 2`` columns (half the shared memory for the store)."""
    if TMA_STORE:
        c_op = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1],
                                         block_shape=[BLOCK_M, BLOCK_N // TMA_STORE])
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    work_c = pid - num_programs
    for work_id in tl.range(pid, num_work, num_programs, flatten=FLATTEN, warp_specialize=WARP_SPEC):
        pid_m, pid_n = tile_coords(work_id, num_pid_m, num_pid_n, GROUP_M)
        acc = gemm_tile(
            a_op, b_op, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
            BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR, ALIGN,
        )  # [BM, BN] fp32
        work_c += num_programs
        pid_m_c, pid_n_c = tile_coords(work_c, num_pid_m, num_pid_n, GROUP_M)
        if TMA_STORE == 2:
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))  # [BM, BN/2, 2]
            left, right = tl.split(halves)  # [BM, BN/2] each
            c_op.store([pid_m_c * BLOCK_M, pid_n_c * BLOCK_N], left.to(c_ptr.dtype.element_ty))
            c_op.store([pid_m_c * BLOCK_M, pid_n_c * BLOCK_N + BLOCK_N // 2], right.to(c_ptr.dtype.element_ty))
        elif TMA_STORE:
            c_op.store([pid_m_c * BLOCK_M, pid_n_c * BLOCK_N], acc.to(c_ptr.dtype.element_ty))
        else:
            offs_m, offs_n = tile_offsets(pid_m_c, pid_n_c, BLOCK_M, BLOCK_N)
            store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn)


@triton.jit
def claimed_tiles(
    a_op, b_op, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    # int32 [1]: tiles taken so far in this launch (0 before it, and left at 0 after it)
    claims_ptr, num_claimers,
    # this program among the dealt_programs that start at once (< 0: a program that joins late)
    dealt_pid, dealt_programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, FLATTEN: tl.constexpr,
):
    """Tiles of C, each over all of K, shared by ``num_claimers`` programs of the launch, some of
    which may start late.

    Each claimer's even share, ``total // num_claimers`` tiles, is dealt out beforehand to each of
    the ``dealt_programs`` programs that start at once (program ``dealt_pid`` takes tiles dealt_pid,
    dealt_pid + dealt_programs, ...: :func:`whole_tiles`, flattened with ``FLATTEN``). The rest are
    taken one at a time from a counter: whoever is free takes the next tile (in :func:`tile_coords`
    order), so programs that join late take only what nobody has started, and none has more than
    its share while another idles. Every claimer claims until it gets none, so a launch makes
    exactly ``total - dealt + num_claimers`` claims, and the one that makes the last sets the counter
    back to zero for the next launch (every other claim came before it). The claimed loop is a while
    loop: not flattened."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    total = num_pid_m * num_pid_n
    dealt = (total // num_claimers) * dealt_programs
    # A late program's range is empty.
    whole_tiles(a_op, b_op, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                tl.where(dealt_pid >= 0, dealt_pid, dealt), dealt, dealt_programs, BLOCK_M, BLOCK_N, BLOCK_K,
                GROUP_M, USE_TMA, B_KMAJOR, 1, FLATTEN, False)
    # Relaxed: the counter only hands out tile numbers; no data is published through it.
    t = dealt + tl.atomic_add(claims_ptr, 1, sem="relaxed", scope="gpu")
    while t < total:
        pid_m, pid_n = tile_coords(t, num_pid_m, num_pid_n, GROUP_M)
        acc = gemm_tile(a_op, b_op, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                        BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR)  # [BM, BN] fp32
        offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N)
        store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn)
        t = dealt + tl.atomic_add(claims_ptr, 1, sem="relaxed", scope="gpu")
    if t == total + num_claimers - 1:  # the launch's last claim
        tl.atomic_xchg(claims_ptr, 0, sem="relaxed", scope="gpu")


# ---------------------------------------------------------------------------------------------
# Plain persistent GEMM
# ---------------------------------------------------------------------------------------------


@P.kernel
def matmul_kernel(
    # pointers
    a_ptr, b_ptr, c_ptr,
    # sizes
    M, N, K,
    # strides
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    # with IN_CALL: the control block of the collective call this GEMM belongs to; with ENTER or END
    # the call's begin and end arguments (primitives.call_enter, call_exit), else never read
    ctl_ptr, heap_bases, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1, status_ptr,
    # with SPLIT or STREAM: fp32 partial slots [tiles split or dealt out, slots_per_tile, BM * BN],
    # int32 count per such tile (zeros)
    partial_ptr, count_ptr,
    # schedule: K slices per tile (SPLIT), partial slots per tile, programs of the launch, tiles
    # computed whole before stream-K deals out the K steps of the others (STREAM)
    split_k, slots_per_tile, num_programs, dp_tiles,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT: tl.constexpr, STREAM: tl.constexpr, SUB_M: tl.constexpr, USE_TMA: tl.constexpr,
    B_KMAJOR: tl.constexpr, IN_CALL: tl.constexpr, ALIGN: tl.constexpr = 1, WARP_SPEC: tl.constexpr = False,
    ENTER: tl.constexpr = False, END: tl.constexpr = False, BARRIER: tl.constexpr = False,
    FLATTEN: tl.constexpr = False, TMA_STORE: tl.constexpr = False,
):
    """Persistent C [M, N] = A [M, K] @ B [K, N] in one of three schedules.

    Tiles (neither flag): program pid computes tiles pid, pid + num_programs, ... . ``SPLIT``
    (``split_k > 1``): the work items are the tiles' ``split_k`` K slices, taken the same way.
    ``STREAM`` (stream-K): the first ``dp_tiles`` tiles as in the tiles schedule (whole waves of
    them), then the K steps of the other tiles, tile after tile, are dealt out in ``num_programs``
    contiguous ranges of (nearly) equal length, one per program; a tile that a range covers whole is
    stored directly, a tile shared by several ranges is finished by the last of them
    (:func:`hand_in_slice`, :func:`store_slice_sum`: slices summed in K order, ``SUB_M`` rows at a
    time). ``split_k``, ``slots_per_tile``, ``num_programs`` and ``dp_tiles`` are runtime values, so
    shapes and splits share one compiled kernel per tile config. With ``IN_CALL`` it does nothing
    when its collective call was aborted (runtime.primitives); with ``ENTER`` it begins the call
    itself (the call's first kernel: ``call_enter``), with ``END`` it ends it (its last:
    ``call_exit``; a kernel that begins a call also ends with it), with ``BARRIER`` too its last
    program passes a barrier with the other ranks (``call_exit``), in place of a barrier kernel
    after it. ``ALIGN``: see :func:`gemm_tile_range`. ``WARP_SPEC`` (tiles schedule on the
    descriptor path only): the tile loop is warp-specialized (on Hopper, a producer warp group
    issues the loads and two consumer warp groups each multiply half of the tile's rows; the sums
    are those of the loop without it, bit for bit). Tiles schedule without split (``FLATTEN``
    also without specialization):
    ``FLATTEN`` asks Triton to flatten the tile and K loops into one pipelined loop (the next tile's
    first loads are issued before this tile's epilogue; the epilogue's coordinates come from a
    counter of their own so that they do not wait on the next tile's; with ``STREAM``, the loop of
    its whole tiles), ``TMA_STORE`` stores each tile through a tensor descriptor of C (row-major C,
    16-byte aligned rows; 2: in two halves of its columns, not under ``WARP_SPEC``); ``TMA_STORE``
    with ``WARP_SPEC``: the loop of :func:`whole_tiles` is the one specialized."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_work = num_pid_m * num_pid_n
    if SPLIT:
        num_work *= split_k
    if IN_CALL:
        seq, live = P.call_enter(ctl_ptr, heap_bases, cur_rank, world, sig, gen, out0_ptr, n_out0, out1_ptr, n_out1,
                                 ENTER)
        num_work = tl.where(live, num_work, 0)
    a_op, b_op = gemm_operands(
        a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
        BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR,
    )
    if STREAM:
        # The waves of tiles that fill every program go first, whole (dp_tiles of them); then the
        # K steps of the tiles left are dealt out.
        dp = tl.minimum(dp_tiles, num_work)
        whole_tiles(a_op, b_op, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                     pid, dp, num_programs, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA, B_KMAJOR, ALIGN,
                     FLATTEN, False)
        steps = tl.cdiv(K, BLOCK_K)
        total = (num_work - dp).to(tl.int64) * steps  # K steps of the tiles left (0 if the call was aborted)
        lo = pid * total // num_programs  # this program's K steps: [lo, hi) of the tiles left
        hi = (pid + 1) * total // num_programs
        t_first = (lo // steps).to(tl.int32)
        # The tiles the range touches, one segment each.
        segments = tl.where(hi > lo, ((hi - 1) // steps).to(tl.int32) - t_first + 1, 0)
        for i in range(0, segments):
            t = t_first + i  # the t-th tile left: its partial slots and count are the t-th
            start = t.to(tl.int64) * steps
            k_lo = (tl.maximum(lo, start) - start).to(tl.int32)
            k_hi = (tl.minimum(hi, start + steps) - start).to(tl.int32)
            pid_m, pid_n = tile_coords(dp + t, num_pid_m, num_pid_n, GROUP_M)
            acc = gemm_tile_range(
                a_op, b_op, pid_m, pid_n, M, N, K, k_lo, k_hi, stride_am, stride_ak, stride_bk, stride_bn,
                BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR, ALIGN,
            )  # [BM, BN] fp32
            if (k_lo == 0) & (k_hi == steps):  # a tile this range covers whole
                offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N)
                store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn)
            else:  # shared with the neighbouring ranges: the last of them to finish stores it
                first = stream_k_owner(start, total, num_programs)
                last = stream_k_owner(start + steps - 1, total, num_programs)
                n = last - first + 1
                slots, done = hand_in_slice(acc, t, pid - first, n, slots_per_tile,
                                            partial_ptr, count_ptr, BLOCK_M, BLOCK_N)
                if done:
                    store_slice_sum(slots, n, t, count_ptr, c_ptr, pid_m, pid_n, M, N,
                                    stride_cm, stride_cn, BLOCK_M, BLOCK_N, SUB_M)
    elif FLATTEN:  # (each condition one constexpr: Triton drops the branches not taken)
        whole_tiles(a_op, b_op, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                     pid, num_work, num_programs, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA, B_KMAJOR, ALIGN,
                     True, TMA_STORE, WARP_SPEC)
    elif TMA_STORE:
        whole_tiles(a_op, b_op, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                     pid, num_work, num_programs, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA, B_KMAJOR, ALIGN,
                     False, TMA_STORE, WARP_SPEC)
    else:
        for work_id in tl.range(pid, num_work, num_programs, warp_specialize=WARP_SPEC):
            tile_id, s, k_lo, k_hi = split_k_work(work_id, K, split_k, BLOCK_K, SPLIT)
            pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
            acc = gemm_tile_range(
                a_op, b_op, pid_m, pid_n, M, N, K, k_lo, k_hi, stride_am, stride_ak, stride_bk, stride_bn,
                BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR, ALIGN,
            )  # [BM, BN] fp32
            if SPLIT:
                slots, done = hand_in_slice(acc, tile_id, s, split_k, split_k, partial_ptr, count_ptr,
                                            BLOCK_M, BLOCK_N)
                if done:
                    store_slice_sum(slots, split_k, tile_id, count_ptr, c_ptr, pid_m, pid_n, M, N,
                                    stride_cm, stride_cn, BLOCK_M, BLOCK_N, SUB_M)
            else:
                offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N)
                store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn)
    if IN_CALL:
        P.call_exit(ctl_ptr, heap_bases, cur_rank, world, seq, live, status_ptr, num_programs, END, BARRIER=BARRIER)


# ---------------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------------


def _interpreting() -> bool:
    """True when this module's kernels run in Triton's interpreter (decided when it was imported)."""
    return type(matmul_kernel.jit_fn).__name__ == "InterpretedFunction"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _tma_device(device: torch.device) -> bool:
    """Whether kernels on `device` can use tensor descriptors: the interpreter, or NVIDIA sm_90+."""
    if _interpreting():
        return True
    if device.type != "cuda" or torch.version.hip is not None:
        # ROCm reports MI300 as capability 9.4; descriptors there are not the fast path we tuned.
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_major(index) >= 9


@functools.cache
def _cuda_major(index: int) -> int:
    # Cached: get_device_capability costs microseconds, and gemm_layout runs on every call.
    return torch.cuda.get_device_capability(index)[0]


def _tma_compatible(t: torch.Tensor, unit_dim: int) -> bool:
    """`t` has stride 1 along `unit_dim`, a 16-byte aligned base and a leading stride of 16-byte multiples."""
    lead = t.stride(1 - unit_dim)
    return (
        t.stride(unit_dim) == 1
        and lead > 0
        and (lead * t.element_size()) % 16 == 0
        and t.data_ptr() % 16 == 0
    )


def gemm_layout(a: torch.Tensor, b: torch.Tensor) -> tuple[bool, bool]:
    """Return ``(use_tma, b_kmajor)`` for ``a [M, K] @ b [K, N]``.

    Tensor descriptors are used when the device supports them (NVIDIA compute capability >= 9, or
    the interpreter), ``TILEFUSE_NO_TMA`` is not set, A is row-major and B is row-major
    (``b_kmajor=False``) or column-major (``b_kmajor=True``), both base pointers are 16-byte
    aligned and both leading strides are positive multiples of 16 bytes. Otherwise the pointer
    path (``(False, False)``) runs, which accepts any strides.
    """
    if _env_flag("TILEFUSE_NO_TMA") or not _tma_device(a.device):
        return False, False
    if not _tma_compatible(a, unit_dim=1):
        return False, False
    if _tma_compatible(b, unit_dim=1):
        return True, False
    if _tma_compatible(b, unit_dim=0):
        return True, True
    return False, False


def _padded(t: torch.Tensor, unit_dim: int) -> torch.Tensor:
    """A copy of the 2-D ``t`` with stride 1 along ``unit_dim`` and a leading stride rounded up to 16
    bytes, as a view of ``t``'s shape (the padding is never read)."""
    rows, cols = (t.shape[0], t.shape[1]) if unit_dim == 1 else (t.shape[1], t.shape[0])
    per16 = max(1, 16 // t.element_size())
    lead = -(-max(cols, 1) // per16) * per16
    buf = torch.empty((rows, lead), dtype=t.dtype, device=t.device)
    view = buf[:, :cols]
    view.copy_(t if unit_dim == 1 else t.t())
    return view if unit_dim == 1 else view.t()


# Below this many rows of A, operands off the tensor-descriptor path stay where they are (pointer
# path): the GEMM reads B about once, and a padded copy triples B's traffic. For the GEMM core,
# whose pointer path loads aligned vectors (ALIGN), measured on an H200 with K = 3500 (rows of 7000
# bytes), bf16, against torch.matmul: unpadded 0.71x / 0.62x / 1.10x at M = 64 / 128 / 333, padded
# 0.46x / 0.52x / 0.96x; at M = 512 padded 1.01x (1.14x warp-specialized), unpadded 0.78x
# (docs/perf/2026-12-01_h200_ws1_gemm_parity_warp_spec_bf16.csv; between 333 and 512 not measured).
PAD_MIN_M = 384
# The same for the op variants' own kernels, whose pointer path loads one element at a time:
# unpadded 0.57x at M = 16 (padded 0.46x), but 0.36x at M = 64 and 0.08x at M = 128, where the
# padded copy gives about 0.46x (docs/perf/2026-11-30_h200_ws1_gemm_parity_default*.csv).
UNALIGNED_PAD_MIN_M = 64


def pointer_align(a: torch.Tensor, b: torch.Tensor) -> int:
    """``ALIGN`` of :func:`gemm_tile_range` for operands on the pointer path: the largest of 8, 4, 2
    elements that divide K and the leading strides (A row-major, B column-major, 16-byte aligned
    bases); 1 for any other layout."""
    if a.stride(1) != 1 or b.stride(0) != 1 or a.data_ptr() % 16 or b.data_ptr() % 16:
        return 1
    for align in (8, 4, 2):
        if a.shape[1] % align == 0 and a.stride(0) % align == 0 and b.stride(1) % align == 0:
            return align
    return 1


def operand_path(a: torch.Tensor, b: torch.Tensor, config, *, min_m: int):
    """``(a, b, use_tma, b_kmajor, align)``: how the GEMM core with ``config``'s tiles reads ``a @ b``.

    The 16-row decode tiles of :func:`~.config.pointer_tiles` on a Linear weight (column-major B,
    rows of A and B 16-byte aligned: :func:`pointer_align` 8) load through pointers, where they
    measured 3-10 % faster than through descriptors (docs/PERF.md, "GEMM core"; in the op variants'
    own tile loops the two paths measured alike, so those keep the descriptors). Every other config
    takes the descriptor path where the operands fit it, copying an operand that does not fit when A
    has at least ``min_m`` rows (:func:`tma_operands`). ``align``: ``ALIGN`` of
    :func:`gemm_tile_range` for the pointer path (1 on descriptors)."""
    if pointer_tiles(config, a.dtype) and pointer_align(a, b) == 8:
        return a, b, False, False, 8
    a, b, use_tma, b_kmajor = tma_operands(a, b, min_m)
    return a, b, use_tma, b_kmajor, 1 if use_tma else pointer_align(a, b)


def warp_specialized(config, use_tma: bool, device: torch.device) -> bool:
    """Whether a tile loop runs ``config`` warp-specialized: ``Config.WARP_SPEC`` asks for it, the
    operands are on the descriptor path, no K is split, the device is an NVIDIA GPU (the
    interpreter has no warps) and ``TILEFUSE_NO_WARP_SPEC`` is not set (then every kernel runs the
    config unspecialized: :func:`config.launch_shape`)."""
    return (bool(config.WARP_SPEC) and use_tma and config.SPLIT_K == 1 and not config.STREAM_K
            and device.type == "cuda" and not _interpreting() and not _env_flag("TILEFUSE_NO_WARP_SPEC"))


def flattened_loop(config, use_tma: bool) -> bool:
    """Whether a loop of whole tiles (no split K, no warp specialization, no flag in its body) is
    flattened (:func:`whole_tiles`' ``FLATTEN``): 128-row tiles on the descriptor path. A rule of the
    config and the operands' path, never the shape, so new shapes of a config launch the kernel
    already compiled (measured for the GEMM core in docs/PERF.md, "GEMM core"). ``TILEFUSE_NO_FLATTEN``
    set: no loop is flattened (the switch of an A/B measurement)."""
    return bool(use_tma) and config.BLOCK_M >= 128 and not _env_flag("TILEFUSE_NO_FLATTEN")


def tma_operands(a: torch.Tensor, b: torch.Tensor, min_m: int) -> tuple[torch.Tensor, torch.Tensor, bool, bool]:
    """``(a, b, use_tma, b_kmajor)``: the operands on the tensor-descriptor path where the device has
    it, copying an operand whose strides or alignment do not fit (a leading dimension that is not a
    multiple of 16 bytes, say) into a padded buffer when A has at least ``min_m`` rows (``PAD_MIN_M``
    for the GEMM core, ``UNALIGNED_PAD_MIN_M`` for the variants' own kernels). One extra
    read and write of that operand buys the fast path; the pointer path measured under half of
    torch.matmul's speed on such shapes at M = 4100."""
    use_tma, b_kmajor = gemm_layout(a, b)
    if use_tma or _env_flag("TILEFUSE_NO_TMA") or not _tma_device(a.device) or _interpreting():
        return a, b, use_tma, b_kmajor
    if a.shape[0] < min_m:
        return a, b, use_tma, b_kmajor
    if a.numel() == 0 or b.numel() == 0:
        return a, b, use_tma, b_kmajor
    if not _tma_compatible(a, unit_dim=1):
        a = _padded(a, unit_dim=1)
    if not (_tma_compatible(b, unit_dim=1) or _tma_compatible(b, unit_dim=0)):
        b = _padded(b, unit_dim=0 if b.stride(0) == 1 else 1)
    use_tma, b_kmajor = gemm_layout(a, b)
    return a, b, use_tma, b_kmajor


_SCRATCH: dict = {}  # (device index, raw stream) -> int8 scratch reused by that stream's launches
_SCRATCH_MIN = 1 << 16
_SCRATCH_STREAMS = 64  # streams remembered at most (the cache is dropped beyond)


def _cuda_scratch(size: int, alignment: int, stream):
    """Global scratch that device-side tensor descriptors are written into (128 bytes each per program).

    One buffer per (device, stream), reused by every launch on that stream: a kernel writes its
    descriptors at its start and launches on one stream never overlap, so the next launch may
    overwrite them (allocating a fresh tensor per launch cost a few microseconds of host time). A
    CUDA graph capture gets a fresh tensor from the graph's pool instead: replays of two graphs may
    run at the same time."""
    if torch.cuda.is_current_stream_capturing():
        return torch.empty(size, dtype=torch.int8, device="cuda")
    key = (torch.cuda.current_device(), stream)
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < size:
        if buf is None and len(_SCRATCH) >= _SCRATCH_STREAMS:
            _SCRATCH.clear()
        buf = _SCRATCH[key] = torch.empty(max(size, _SCRATCH_MIN), dtype=torch.int8, device="cuda")
    return buf


# triton.set_allocator stores the allocator in a ContextVar, so it is per thread/context: track
# "installed" the same way, so that a launch from a fresh thread installs it again.
_allocator_installed: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "tilefuse_allocator_installed", default=False
)


def ensure_triton_allocator() -> None:
    """Install the scratch allocator that kernels creating tensor descriptors need on a GPU.

    Call before launching a kernel with ``USE_TMA=True``. The interpreter needs none (measured
    with triton 3.7.1), so this is a no-op there. The scratch is allocated on the current CUDA
    device and stream, i.e. where Triton launches the kernel.
    """
    if _interpreting() or _allocator_installed.get():
        return
    triton.set_allocator(_cuda_scratch)
    _allocator_installed.set(True)


class SplitKScratch:
    """Partial slots and per-tile counts of split-K launches, one set per (device, stream).

    The counts start at zero and every launch leaves them at zero (the last slice of a tile resets
    its count), so a stream's launches, which run one after another, share one set without a memset
    per call; launches on different streams get different sets. A call inside a CUDA graph capture
    gets a fresh zeroed set instead (the memset is part of the graph), never a cached one: a graph
    may be replayed on any stream. :func:`tilefuse.reset` drops the cache (a launch of an aborted
    call may stop between a tile's slices and leave a count behind). A launch plan keeps the set it
    was recorded with (:meth:`owns`), whatever stream replays it: an op's calls on one group do not
    run at the same time on two streams (they share the group's heap workspaces and side stream).
    """

    def __init__(self):
        self._sets: dict = {}

    def get(self, device: torch.device, num_tiles: int, slot_elems: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(partials, counts)``: fp32 ``[num_tiles * slot_elems]`` and int32 ``[num_tiles]`` zeros."""
        n_part = num_tiles * slot_elems
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return (torch.empty(n_part, dtype=torch.float32, device=device),
                    torch.zeros(num_tiles, dtype=torch.int32, device=device))
        key = (device, torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0)
        parts, counts = self._sets.get(key, (None, None))
        if parts is None or parts.numel() < n_part:
            parts = torch.empty(triton.next_power_of_2(n_part), dtype=torch.float32, device=device)
        if counts is None or counts.numel() < num_tiles:
            counts = torch.zeros(triton.next_power_of_2(num_tiles), dtype=torch.int32, device=device)
        self._sets[key] = (parts, counts)
        return parts, counts

    def owns(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is one of the cached sets' tensors (a launch plan may keep it)."""
        return any(t is x for pair in self._sets.values() for x in pair)

    def clear(self) -> None:
        self._sets.clear()


SPLIT_K_SCRATCH = SplitKScratch()
on_reset(SPLIT_K_SCRATCH.clear)


def matmul(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config, ctl: torch.Tensor | None = None, *,
           call: tuple | None = None, enter: bool = False, barrier: bool = False,
           flatten: bool | None = None, tma_store: int = 0, stream_whole: bool = True) -> torch.Tensor:
    """``c[:] = a @ b`` with the persistent Triton GEMM; returns ``c``. With ``ctl`` (the control
    block) the GEMM is part of a collective call and does nothing if the call was aborted. With
    ``call`` (``heap_bases, rank, world`` and the call's begin arguments, ``launch.enter_args`` of a
    call whose kernels begin it) the GEMM begins the call (``enter``: it is the call's first kernel)
    or ends it (it is the last); ``barrier``: its last program then also passes a barrier with the
    other ranks (what it stored into the heap is complete and visible on every rank after it).

    ``a [M, K]``, ``b [K, N]`` and ``c [M, N]`` on one device, at any strides (``c`` may be a
    column block of a wider matrix). fp32 accumulation, output cast to ``c.dtype``. Uses
    ``config``'s ``BLOCK_*``, ``GROUP_M``, ``num_warps``, ``num_stages``, ``SPLIT_K`` and ``GEMM_SMS``
    programs (fewer when there are fewer work items). With ``SPLIT_K > 1`` each tile's K steps are
    split into ``SPLIT_K`` slices computed by different programs; the last slice of a tile to finish
    sums the fp32 partials in slice order (deterministic: the same bits on every run, though not
    those of ``SPLIT_K = 1``) and stores the tile, using the stream's :class:`SplitKScratch`. With
    ``STREAM_K = 1`` the whole waves of tiles of the ``GEMM_SMS`` programs but the last
    (:func:`~.config.stream_k_whole_tiles`; none with ``stream_whole=False``) are computed whole,
    then the K steps of the others are dealt out evenly over the programs (stream-K), and tiles
    shared by several programs are finished the same way. ``flatten`` applies to whole tiles
    without split-K or warp specialization (with stream-K, to its whole tiles), ``tma_store`` (0, 1,
    or 2: in two halves of a tile's columns, whole tiles in a warp-specialized loop) to whole tiles
    without split-K or stream-K:
    matmul_kernel's ``FLATTEN`` and ``TMA_STORE`` (the latter where ``c`` is row-major with 16-byte
    aligned rows and the operands are on the descriptor path). Neither changes the sums. ``flatten``
    None (the default): flattened for 128-row tiles on the descriptor path (measured in
    docs/PERF.md, "GEMM core": 2-5 % faster where programs have several tiles, M = 333-1024 with N =
    6144 or 14336; with one tile a program within the noise there, and a third slower on the pointer
    path). The choice follows the config and the operands' path only, never the shape: new shapes of
    a config launch the kernel already compiled. ``tma_store`` is off by default: it measured no
    faster on the unspecialized loops (whole or in halves), slower on 64x64 tiles, and 0.5-2 % slower
    on the warp-specialized 128x256 loop, where it takes a stage's shared memory (docs/PERF.md,
    "GEMM core"). The operands' path: :func:`operand_path` (descriptors where
    they fit, but the 16-row decode tiles on a Linear weight load through pointers). The op variants' own
    tile loops are not flattened: with a loop over destination ranks in the tile loop
    (gemm_all_reduce's push of its partials) the flattened form measured 0.27x plain where the loop as
    it is measures 0.81-0.94x.
    """
    M, K = a.shape
    N = b.shape[1]
    if tma_store not in (0, 1, 2):
        raise ValueError(f"matmul: tma_store is 0, 1 or 2, got {tma_store!r}")
    if b.shape[0] != K or tuple(c.shape) != (M, N):
        raise ValueError(
            f"matmul: shapes do not chain: a {tuple(a.shape)} @ b {tuple(b.shape)} -> c {tuple(c.shape)}"
        )
    ends = call is not None and ctl is not None
    if not ends:  # nothing to launch (a kernel that begins or ends a call runs, with no tiles or K steps)
        if M == 0 or N == 0:
            return c
        if K == 0:
            return c.zero_()
    a, b, use_tma, b_kmajor, align = operand_path(a, b, config, min_m=PAD_MIN_M)
    if min(M, N, K) == 0:
        use_tma = b_kmajor = False  # a descriptor of an empty extent is not valid on every device
        if K == 0:
            c.zero_()  # an empty sum (stream-K would store no tile)
    if use_tma:
        ensure_triton_allocator()
    split, stream = config.SPLIT_K, bool(config.STREAM_K)
    # A GEMM that begins its call or passes the closing barrier cannot be specialized (Triton declines
    # a kernel with else branches: launch.GemmCall.kernel_may_begin); it then runs with the
    # unspecialized launch shape, not the specialized one's 4 warps.
    warp_spec = warp_specialized(config, use_tma, a.device) and not (ends and (enter or barrier))
    warps, stages = launch_shape(config, warp_spec)
    num_tiles = triton.cdiv(M, config.BLOCK_M) * triton.cdiv(N, config.BLOCK_N)
    slots, dp_tiles, scratch_tiles = split, 0, num_tiles
    if stream:
        steps = triton.cdiv(K, config.BLOCK_K)
        # Every range holds a K step or more; one program where there is none (K = 0, or no tiles: a
        # kernel that begins or ends a collective call still runs).
        num_programs = max(1, min(config.GEMM_SMS, num_tiles * steps))
        dp_tiles = stream_k_whole_tiles(num_tiles, num_programs) if stream_whole else 0
        scratch_tiles = num_tiles - dp_tiles
        slots = stream_k_slots(steps, scratch_tiles * steps, num_programs) if scratch_tiles else 1
    else:
        num_programs = max(1, min(config.GEMM_SMS, num_tiles * split))
    # Rows of a tile summed at a time when slices are combined: about 32 fp32 values per thread.
    sub_m = min(config.BLOCK_M, max(1, 1024 * config.num_warps // config.BLOCK_N))
    if slots > 1:
        partials, counts = SPLIT_K_SCRATCH.get(c.device, scratch_tiles, slots * config.BLOCK_M * config.BLOCK_N)
    else:
        partials, counts = c, c  # never read
    tiles_only = not (split > 1 or stream or warp_spec)
    # Never a warp-specialized loop: Triton (3.6, 3.7) compiles a flattened one unspecialized for sm_90.
    flatten = (tiles_only or stream) and (flattened_loop(config, use_tma) if flatten is None else flatten)
    if warp_spec and tma_store == 2:
        # Triton 3.6's Hopper warp specialization fails on the split of a tile into halves (its data
        # partition has no rule for tt.split): the specialized loop stores whole tiles.
        tma_store = 1
    tma_store = int(tma_store) if (tiles_only or warp_spec) and use_tma and c.stride(1) == 1 and \
        (c.stride(0) * c.element_size()) % 16 == 0 and c.data_ptr() % 16 == 0 else 0
    if call is None:
        call = (c, 0, 1, 0, 0, c, 0, c, 0, c)  # never read
    matmul_kernel[(num_programs,)](
        a, b, c,
        M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        ctl if ctl is not None else c, *call,
        partials, counts,
        split, slots, num_programs, dp_tiles,
        BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N, BLOCK_K=config.BLOCK_K, GROUP_M=config.GROUP_M,
        SPLIT=split > 1, STREAM=stream, SUB_M=sub_m, USE_TMA=use_tma, B_KMAJOR=b_kmajor, IN_CALL=ctl is not None,
        ALIGN=1 if use_tma else align, WARP_SPEC=warp_spec,
        ENTER=ends and enter, END=ends, BARRIER=ends and barrier, FLATTEN=flatten, TMA_STORE=tma_store,
        num_warps=warps, num_stages=stages,
    )
    return c
