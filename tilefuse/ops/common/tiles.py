"""Shared tile code every variant computes its tiles with: tile swizzle (:func:`tile_coords`), operands
(:func:`gemm_operands`: masked pointer loads at any strides, or tensor descriptors with A row-major and
B row- or, with ``B_KMAJOR``, column-major), the K loop (:func:`gemm_tile`: fp32 accumulation, zeros
out of bounds, a float8 call's scales applied at its end), tile load/store and persistent tile loops.
"""

from __future__ import annotations

import triton
import triton.language as tl


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
    """Operands for gemm_tile: descriptors of A [M, K] and B [K, N] if USE_TMA, else the pointers."""
    a_op = a_ptr
    b_op = b_ptr
    if USE_TMA:
        a_op = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
        if B_KMAJOR:
            # Column-major B [K, N] is a row-major [N, K] buffer: tiles come out as [BN, BK].
            b_op = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_bn, 1],
                                             block_shape=[BLOCK_N, BLOCK_K])
        else:
            b_op = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, 1],
                                             block_shape=[BLOCK_K, BLOCK_N])
    return a_op, b_op


@triton.jit
def gemm_tile(
    a_op, b_op, scales,
    pid_m, pid_n,
    M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, ALIGN: tl.constexpr = 1,
):
    """:func:`gemm_tile_range` over all of K."""
    return gemm_tile_range(a_op, b_op, scales, pid_m, pid_n, M, N, K, 0, tl.cdiv(K, BLOCK_K), stride_am, stride_ak,
                           stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR, ALIGN)


@triton.jit
def gemm_tile_range(
    a_op, b_op, scales,
    pid_m, pid_n,
    M, N, K,
    k_lo, k_hi,
    stride_am, stride_ak, stride_bk, stride_bn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, ALIGN: tl.constexpr = 1,
):
    """K steps [k_lo, k_hi) of tile (pid_m, pid_n): the fp32 partial [BM, BN], scaled. ``ALIGN``
    (pointer path): ``K``, ``stride_am``, ``stride_bn`` are multiples of it."""
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
    return scale_tile(acc, scales, pid_m, pid_n, M, N, BLOCK_M, BLOCK_N)


@triton.jit
def scale_tile(acc, scales, pid_m, pid_n, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``acc * scale_a[rows, None] * scale_b[None, cols]`` for float32 ``scales``; ``acc`` unscaled."""
    if is_scaled(scales):
        offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N)
        scale_a = tl.load(scales[0] + offs_m * scales[1], mask=offs_m < M, other=0.0)  # [BM]
        scale_b = tl.load(scales[2] + offs_n * scales[3], mask=offs_n < N, other=0.0)  # [BN]
        acc = acc * scale_a[:, None] * scale_b[None, :]
    return acc


@triton.jit
def is_scaled(scales):
    """Whether ``scales`` are a float8 call's (float32), not an unscaled call's stand-ins: a constexpr."""
    return scales[0].dtype.element_ty == tl.float32


@triton.jit
def scales_from_row(scales, row):
    """``scales`` of the rows of A from ``row`` on (A's row block, read as a matrix of its own)."""
    return scales[0] + row * scales[1], scales[1], scales[2], scales[3]


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
    a_op, b_op, scales, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    pid, num_work, num_programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, ALIGN: tl.constexpr,
    FLATTEN: tl.constexpr, TMA_STORE: tl.constexpr, WARP_SPEC: tl.constexpr = False,
):
    """Tiles pid, pid + num_programs, ... of C over all of K; ``FLATTEN``: one pipelined loop,
    ``TMA_STORE``: stores through a descriptor (2: in two column halves). The store's tile has its own
    counter so that, flattened, the next tile's loads do not wait on this store."""
    if TMA_STORE:
        c_op = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1],
                                         block_shape=[BLOCK_M, BLOCK_N // TMA_STORE])
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    work_c = pid - num_programs
    for work_id in tl.range(pid, num_work, num_programs, flatten=FLATTEN, warp_specialize=WARP_SPEC):
        pid_m, pid_n = tile_coords(work_id, num_pid_m, num_pid_n, GROUP_M)
        acc = gemm_tile(a_op, b_op, scales, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                        BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR, ALIGN)  # [BM, BN] fp32
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
    a_op, b_op, scales, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    # int32 [1]: tiles taken so far in this launch (0 before it, and left at 0 after it)
    claims_ptr, num_claimers,
    # this program among the dealt_programs that start at once (< 0: a program that joins late)
    dealt_pid, dealt_programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr, FLATTEN: tl.constexpr,
):
    """Tiles of C over all of K shared by ``num_claimers`` programs, some starting late: an even share
    dealt to the ``dealt_programs`` that start at once, the rest claimed from a counter; the launch's
    last claim (``total - dealt + num_claimers``) resets it."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    total = num_pid_m * num_pid_n
    dealt = (total // num_claimers) * dealt_programs
    # A late program's range is empty.
    whole_tiles(a_op, b_op, scales, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                tl.where(dealt_pid >= 0, dealt_pid, dealt), dealt, dealt_programs, BLOCK_M, BLOCK_N, BLOCK_K,
                GROUP_M, USE_TMA, B_KMAJOR, 1, FLATTEN, False)
    # Relaxed: the counter only hands out tile numbers; no data is published through it.
    t = dealt + tl.atomic_add(claims_ptr, 1, sem="relaxed", scope="gpu")
    while t < total:
        pid_m, pid_n = tile_coords(t, num_pid_m, num_pid_n, GROUP_M)
        acc = gemm_tile(a_op, b_op, scales, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                        BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR)  # [BM, BN] fp32
        offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N)
        store_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn)
        t = dealt + tl.atomic_add(claims_ptr, 1, sem="relaxed", scope="gpu")
    if t == total + num_claimers - 1:  # the launch's last claim
        tl.atomic_xchg(claims_ptr, 0, sem="relaxed", scope="gpu")

