"""Device code shared by the gemm_all_scatter variants: the GEMM side (``compute_tiles``) and the
communication side (``push_ready_tiles``), both in the GEMM core's grouped tile order, and the copy
of the peers' blocks out of c (``copy_peer_blocks``). The result and c are [M, W*N_loc], strided alike."""

import triton
import triton.language as tl

from ...runtime import hw
from ...runtime import primitives as P
from ...runtime.primitives import kernel
from ..common.flags import tile_acquire, tile_release
from ..common.gather import copy_pieces
from ..common.tiles import gemm_operands, gemm_tile, load_tile, store_tile, tile_coords, tile_offsets


@triton.jit
def push_tile(c_ptr, tile, offs_m, offs_n, M, N, stride_cm, stride_cn, cur_rank, world, heap_bases,
              FIRST: tl.constexpr):
    """Store ``tile`` [BM, BN] at (offs_m, offs_n) of C on ranks cur_rank + FIRST, ... in ring order."""
    ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn  # [BM, BN]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)  # [BM, BN]
    value = tile.to(c_ptr.dtype.element_ty)
    for i in range(FIRST, world):
        P.store(ptrs, value, cur_rank, (cur_rank + i) % world, heap_bases, mask=mask)


@triton.jit
def compute_tiles(
    a_ptr, b_ptr, scales, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    # the result, c (a symmetric address), both [M, W*N] strided alike; int64 flag per tile
    o_ptr, c_ptr, stride_cm, stride_cn, flags_ptr,
    call, seq, pid,  # the call and its sequence number; this program among NUM_PROGRAMS
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr, B_KMAJOR: tl.constexpr,
    PUSH: tl.constexpr, RELEASE: tl.constexpr, WARP_SPEC: tl.constexpr = False, GATE: tl.constexpr = False,
):
    """Tiles pid, pid + NUM_PROGRAMS, ... into this rank's block of the result; PUSH: also into every peer's
    c; RELEASE: then flag = ``seq``; ``GATE`` (``P.enter_aside``): stores wait for the begin (``P.ready``)."""
    rank, world, bases = P.rank(call), P.world(call), P.bases(call)
    col = tl.cast(rank, tl.int64) * N * stride_cn  # this rank's column block
    o_ptr, c_ptr = o_ptr + col, c_ptr + col
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    a_op, b_op = gemm_operands(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                               BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR)
    live = P.gate_start(seq, GATE)
    for tile_id in tl.range(pid, num_pid_m * num_pid_n, NUM_PROGRAMS, warp_specialize=WARP_SPEC):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        acc = gemm_tile(a_op, b_op, scales, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                        BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA, B_KMAJOR)  # [BM, BN] fp32
        offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N)
        if GATE:
            live = P.ready(call, seq)
        if live:
            store_tile(o_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn)
            if PUSH:
                push_tile(c_ptr, acc, offs_m, offs_n, M, N, stride_cm, stride_cn, rank, world, bases, FIRST=1)
            if RELEASE:
                # Release: pairs with the acquire in push_ready_tiles on this rank.
                tile_release(flags_ptr + tile_id, seq, rank, rank, bases)


@triton.jit
def push_ready_tiles(
    o_ptr, c_ptr, flags_ptr, M, N, stride_cm, stride_cn,  # as compute_tiles'
    call, seq, cid,  # the call and its sequence number; this program among NUM_PROGRAMS
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
    WAIT: tl.constexpr = True,
):
    """Tiles cid, cid + NUM_PROGRAMS, ... (``WAIT``: once the tile's flag is set) from the result to every peer's c."""
    rank, world, bases = P.rank(call), P.world(call), P.bases(call)
    col = tl.cast(rank, tl.int64) * N * stride_cn  # this rank's column block
    o_ptr, c_ptr = o_ptr + col, c_ptr + col
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    for tile_id in range(cid, num_pid_m * num_pid_n, NUM_PROGRAMS):
        ok = True
        if WAIT:
            # Acquire: pairs with the release in compute_tiles (RELEASE) on this rank.
            ok = tile_acquire(flags_ptr + tile_id, seq, rank, rank, P.ctl(call), bases, world)
        if ok:
            pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
            offs_m, offs_n = tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N)
            tile = load_tile(o_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn)  # [BM, BN]
            push_tile(c_ptr, tile, offs_m, offs_n, M, N, stride_cm, stride_cn, rank, world, bases, FIRST=1)


@kernel
def scatter_kernel(
    o_ptr, c_ptr, flags_ptr, M, N, stride_cm, stride_cn,  # as compute_tiles'
    call, exit_programs,  # the call; the programs that end it together (END)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
    ENTER: tl.constexpr, END: tl.constexpr, WAIT: tl.constexpr,
):
    """:func:`push_ready_tiles` on its own programs (bulk_sync's scatter, producer_consumer's consumer);
    ``END``: the last program passes the closing barrier (every peer's tiles have landed in c)."""
    seq, live = P.enter(call, ENTER)
    if live:
        push_ready_tiles(o_ptr, c_ptr, flags_ptr, M, N, stride_cm, stride_cn, call, seq, tl.program_id(0),
                         BLOCK_M, BLOCK_N, GROUP_M, NUM_PROGRAMS, WAIT)
    P.exit(call, seq, live, exit_programs, END, BARRIER=True)


# Tiles of the copy out of c: rows, columns.
COPY_BLOCK_M, COPY_BLOCK_N = 32, 128


@kernel
def copy_peer_blocks(
    dst_ptr, stride_dm, stride_dn,  # the result [M, world * N]
    src_ptr, stride_sm, stride_sn,  # c [M, world * N] on the heap, where the peers' blocks landed
    M, N, cur_rank, world,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """``dst[:, peer block] = src[:, peer block]`` for every peer's [M, N] column block (after the barrier)."""
    prog, programs = tl.program_id(0), tl.num_programs(0)
    for i in range(1, world):
        col = tl.cast((cur_rank + i) % world, tl.int64) * N
        copy_pieces(dst_ptr + col * stride_dn, stride_dm, stride_dn, src_ptr + col * stride_sn, stride_sm, stride_sn,
                    M, N, prog, programs, BLOCK_M, BLOCK_N)


def launch_copy_peer_blocks(dst, src, M: int, N: int, rank: int, world: int) -> None:
    """Queue :func:`copy_peer_blocks`: one program per tile, at most two per multiprocessor."""
    tiles = (world - 1) * triton.cdiv(M, COPY_BLOCK_M) * triton.cdiv(N, COPY_BLOCK_N)
    copy_peer_blocks[(max(1, min(tiles, 2 * hw.num_sms(dst.device))),)](
        dst, *dst.stride(), src, *src.stride(), M, N, rank, world,
        BLOCK_M=COPY_BLOCK_M, BLOCK_N=COPY_BLOCK_N, num_warps=4)
