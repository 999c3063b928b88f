"""Launch configuration shared by every op variant, and the heuristic used for untuned shapes."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import triton

_NUM_WARPS = (1, 2, 4, 8, 16)
MAX_SPLIT_K = 16
# Variants whose kernels take SPLIT_K > 1: those whose GEMM is ops.common.gemm.matmul.
SPLIT_K_VARIANTS = ("bulk_sync",)
# (op, variant) whose own kernel takes SPLIT_K > 1 where every program has at most one K slice (the
# op's set-up checks that): the slice that completes a tile sums the slices and runs its epilogue.
ONE_WAVE_SPLIT_K = (("gemm_all_reduce", "fused_sequential"),)
# Variants whose tile loops can be warp-specialized (Config.WARP_SPEC): those that set no per-tile flag
# (one consumer group's release could be seen before the other group's half of the tile is stored).
WARP_SPEC_VARIANTS = {
    "gemm_all_scatter": ("bulk_sync", "fused_sequential"),
    "all_gather_gemm": ("bulk_sync",),
    "gemm_reduce_scatter": ("bulk_sync", "fused_sequential"),
    "gemm_all_reduce": ("bulk_sync",),
}
_MAX_BLOCK = 256  # tensor-descriptor (TMA) boxes hold at most 256 elements per dimension


@dataclass(frozen=True)
class Config:
    """Tile shape, launch parameters and the split of the multiprocessors between GEMM and communication.

    ``GEMM_SMS`` programs compute tiles; ``COMM_SMS`` programs move data (0 for variants without
    communication programs). Blocks are powers of two in [16, 256]. ``SPLIT_K`` (1 to
    ``MAX_SPLIT_K``): each tile's K steps are split into slices on different programs, the last one
    summing them in slice order (taken by ``SPLIT_K_VARIANTS`` and ``ONE_WAVE_SPLIT_K``).
    ``WARP_SPEC`` (0 or 1): the tile loop is warp-specialized (the same sums); it takes ``num_warps =
    4``, ``BLOCK_M >= 64`` and ``BLOCK_N <= 2 * BLOCK_M``, and is honoured with ``SPLIT_K = 1`` on the
    descriptor path on NVIDIA GPUs by ``WARP_SPEC_VARIANTS``; elsewhere the tiles run unspecialized.
    """

    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    GROUP_M: int
    num_warps: int
    num_stages: int
    GEMM_SMS: int
    COMM_SMS: int
    SPLIT_K: int = 1
    WARP_SPEC: int = 0

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"Config.{f.name} must be an int, got {value!r} ({type(value).__name__})")
        for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
            value = getattr(self, name)
            if value < 16 or value > _MAX_BLOCK or value & (value - 1):
                raise ValueError(f"Config.{name} must be a power of two in [16, {_MAX_BLOCK}], got {value}")
        for name, ok, want in (
            ("GROUP_M", self.GROUP_M >= 1, ">= 1"), ("num_warps", self.num_warps in _NUM_WARPS, f"one of {_NUM_WARPS}"),
            ("num_stages", self.num_stages >= 1, ">= 1"), ("GEMM_SMS", self.GEMM_SMS >= 1, ">= 1"),
            ("COMM_SMS", self.COMM_SMS >= 0, ">= 0"),
            ("SPLIT_K", 1 <= self.SPLIT_K <= MAX_SPLIT_K, f"in [1, {MAX_SPLIT_K}]"),
            ("WARP_SPEC", self.WARP_SPEC in (0, 1), "0 or 1"),
        ):
            if not ok:
                raise ValueError(f"Config.{name} must be {want}, got {getattr(self, name)}")
        if self.WARP_SPEC and (self.num_warps != 4 or self.BLOCK_M < 64 or self.BLOCK_N > 2 * self.BLOCK_M):
            # For sm_90 with Triton 3.7: 64x64 to 256x128 specialize; 64x256 fails to compile.
            raise ValueError(f"Config.WARP_SPEC=1 takes num_warps=4 (the size of a warp group) and tiles with BLOCK_M "
                             f">= 64 and BLOCK_N <= 2 * BLOCK_M, got num_warps={self.num_warps}, "
                             f"{self.BLOCK_M}x{self.BLOCK_N}")

    def replace(self, **changes) -> Config:
        """A copy with some fields changed (validated again)."""
        unknown = sorted(set(changes) - _FIELD_NAMES)
        if unknown:
            raise ValueError(f"Config.replace: unknown field(s) {unknown}; fields are {sorted(_FIELD_NAMES)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def for_shape(cls, M: int, N: int, K: int, dtype: torch.dtype = torch.bfloat16, *,
                  device: torch.device | None = None, comm: bool = True, core: bool = False) -> Config:
        """The default config of an ``M x N x K`` GEMM on ``device``, e.g.
        ``Config.for_shape(4096, 8192, 4096).replace(COMM_SMS=16)``. ``comm``: for a variant with
        communication programs (producer_consumer, wg_specialized); ``core``: for the GEMM core alone
        (``tilefuse.matmul``), whose few-tile shapes split K (``default_config``)."""
        from ...runtime import hw

        return default_config(M, N, K, dtype, num_sms=hw.num_sms(device), interpreter=hw.interpreting(), comm=comm,
                              core=core)

    @classmethod
    def from_dict(cls, d: dict) -> Config:
        """Inverse of :meth:`to_dict`; every field without a default is required, unknown keys are an error."""
        unknown = sorted(set(d) - _FIELD_NAMES)
        missing = sorted(_REQUIRED - set(d))
        if unknown:
            raise ValueError(f"Config.from_dict: unknown key(s) {unknown}; fields are {sorted(_FIELD_NAMES)}")
        if missing:
            raise ValueError(f"Config.from_dict: missing key(s) {missing}")
        return cls(**d)


_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(Config))
_REQUIRED = frozenset(f.name for f in dataclasses.fields(Config) if f.default is dataclasses.MISSING)


def _pow2_between(x: int, lo: int, hi: int) -> int:
    """The smallest power of two >= x, clamped to [lo, hi]."""
    return max(lo, min(hi, triton.next_power_of_2(max(1, x))))


# Split-K: K steps a slice keeps at least; shared memory and most stages of the small-M tiles' pipelines.
MIN_SLICE_STEPS = 4
_STAGE_SMEM_BYTES = 160 * 1024
_MAX_SMALL_M_STAGES = 6


def split_k_for(tiles: int, steps: int, programs: int) -> int:
    """The most K slices per tile that fit ``tiles`` in one wave, each keeping ``MIN_SLICE_STEPS``."""
    split = 1
    while (split < MAX_SPLIT_K and tiles * (split + 1) <= programs
           and steps >= (split + 1) * MIN_SLICE_STEPS):
        split += 1
    return split


_DEFAULT_MAX_SPLIT = 8  # most K slices default_config picks: more run slower on small-M shapes
CORE_MAX_SPLIT = 4  # most K slices of the GEMM core's few-tile shapes (default_config's ``core``)
DECODE_WAVE_SHARE = 0.7  # without SPLIT_K at M <= 64: the widest tile that still fills this share of a wave
SMALL_M_MAX = 256  # without SPLIT_K, 64 < M <= this: tiles from _small_m_tiles
# (BLOCK_M, BLOCK_N, BLOCK_K, stages), 4 warps, largest first (at equal area the wider one).
SMALL_M_TILES = ((128, 128, 64, 6), (64, 128, 128, 4), (128, 64, 128, 4), (64, 64, 128, 6))
SMALL_M_WAVE_USE = 0.8  # the largest of SMALL_M_TILES whose tiles keep this share of their waves busy


def narrow_decode(M: int, dtype: torch.dtype, interpreter: bool) -> bool:
    """Whether :func:`default_config` without split-K takes its small-M tile classes (not to narrow)."""
    return not interpreter and M <= SMALL_M_MAX and dtype.itemsize <= 2


def _small_m_tiles(M: int, N: int, K: int, programs: int) -> tuple:
    """``(BM, BN, BK, warps, stages)`` for 64 < M <= ``SMALL_M_MAX`` without SPLIT_K (16-bit): the
    largest of ``SMALL_M_TILES`` keeping ``SMALL_M_WAVE_USE`` of its waves busy, else the busiest."""
    best = None
    for bm, bn, bk, stages in SMALL_M_TILES:
        bn = _pow2_between(min(N, bn), 16, bn)
        bk = _pow2_between(min(K, bk), 16, bk)
        use = wave_use(-(-M // bm) * -(-N // bn), programs)
        if use >= SMALL_M_WAVE_USE:
            return bm, bn, bk, 4, stages
        if best is None or use > best[0]:
            best = (use, (bm, bn, bk, 4, stages))
    return best[1]


def _narrow_decode_tiles(M: int, N: int, K: int, itemsize: int, programs: int) -> tuple:
    """``(BM, BN, BK, warps, stages)`` for M <= 64 without SPLIT_K: the widest tiles filling
    ``DECODE_WAVE_SHARE`` of a wave, the deepest K steps and stages within 200 KiB (B is streamed once)."""
    block_m = _pow2_between(M, 16, 64)
    rows = -(-M // block_m)
    for block_n in (128, 64, 32, 16):
        if rows * -(-N // block_n) >= DECODE_WAVE_SHARE * programs:
            break
    block_n = _pow2_between(min(N, block_n), 16, block_n)
    max_k = _pow2_between(K, 16, 256)
    # A float8 K step of 256 is half the bytes of a 16-bit one: 6 stages of it fit, and keep B streaming.
    deepest = ((256, 6),) if itemsize == 1 else ()
    for block_k, stages in (*deepest, (256, 4), (256, 3), (128, 6), (128, 4), (64, 4)):
        if block_k <= max_k and stages * (block_m + block_n) * block_k * itemsize <= 200 * 1024:
            break
    else:
        block_k, stages = min(64, max_k), 4
    return block_m, block_n, block_k, 4, stages


# The GEMM core's split-K tiles past M = 64 where 128x128 tiles are few: (BLOCK_M, BLOCK_N, stages),
# 4 warps, largest first, each split into at most FEW_TILES_MAX_SPLIT K slices that fill a wave.
FEW_TILES = ((128, 128, 4), (128, 64, 5), (64, 128, 4), (64, 64, 6))
FEW_TILES_MAX_SPLIT = 4
FEW_TILES_FILL = 0.85

# The GEMM core's split-K tiles up to M = 16 (16-bit, K's rows 16-byte multiples), loaded through pointers
# (faster there than descriptors): 16 x N tiles, K steps, stages.
POINTER_DECODE_N, POINTER_DECODE_K, POINTER_DECODE_STAGES = 64, 256, 3

# Stages of 128x128x64 tiles of 16-bit values past the small-M classes (192 KiB of shared memory).
MID_M_STAGES = 6

# Float8 rows up to which the decode tiles (64 rows at most, 256-deep K steps, through pointers) run,
# past 64 rows while they take one wave.
FLOAT8_DECODE_MAX_M = 128
# Float8 past M = 128: the share of the last wave 128x128 tiles must keep busy beyond what 128x256 ones do.
FLOAT8_NARROW_GAIN = 0.1

SPLIT_FREE_WAVE_USE = 0.7  # with split-K at 64 <= M <= 128: the whole-K tiles while they keep this busy


def _whole_tile_instead_of_split(M: int, N: int, K: int, dtype: torch.dtype, programs: int,
                                 interpreter: bool) -> tuple | None:
    """At 64 <= M <= 128: the tile without split-K where it fills the SMs, else None."""
    if interpreter or dtype.itemsize > 2 or not 64 <= M <= 128:
        return None
    tile = _narrow_decode_tiles(M, N, K, dtype.itemsize, programs) if M <= 64 else _small_m_tiles(M, N, K, programs)
    bm, bn = tile[0], tile[1]
    return tile if wave_use(-(-M // bm) * -(-N // bn), programs) >= SPLIT_FREE_WAVE_USE else None


def pointer_tiles(config: Config, dtype: torch.dtype) -> bool:
    """Whether the GEMM core loads ``config``'s tiles through pointers even where descriptors fit: 256-deep
    K steps of 16-row tiles of 16-bit values (the ``POINTER_DECODE_*`` tiles) or of float8 tiles up to 64
    rows (the decode tiles), where making the descriptors costs more than they save. A rule of the config
    and dtype, never of the shape."""
    if config.BLOCK_K < POINTER_DECODE_K:
        return False
    return config.BLOCK_M == 16 if dtype.itemsize == 2 else dtype.itemsize == 1 and config.BLOCK_M <= 64


def wave_use(tiles: int, programs: int) -> float:
    """The share of ``programs`` busy over the waves ``tiles`` take (1.0: the last wave is full)."""
    return tiles / (-(-tiles // programs) * programs)


def _split_k_tiles(M: int, N: int, K: int, block_k: int, itemsize: int, programs: int):
    """``(BM, BN, warps, stages, SPLIT_K, WARP_SPEC)`` for the GEMM core (see default_config)."""
    steps = -(-K // block_k)
    tiles = lambda bm, bn: -(-M // bm) * -(-N // bn)
    split = lambda bm, bn: min(_DEFAULT_MAX_SPLIT, split_k_for(tiles(bm, bn), steps, programs))
    narrow = lambda bn: _pow2_between(min(N, bn), 16, bn)
    if M <= 64:
        # Decode sizes, bound by reading B: one row of tiles (B read once) and deep pipelines.
        block_m = _pow2_between(M, 16, 64)
        block_n = narrow(128)
        if block_m == 64:
            # 64-row tiles: 128 columns while they nearly fill a wave, else 64 columns and K slices.
            if tiles(block_m, block_n) < 0.75 * programs:
                block_n = narrow(64)
        elif split(block_m, block_n) > 4:
            block_n = narrow(64)  # few 128-column tiles: more tiles rather than more slices
        stage = (block_m + block_n) * block_k * itemsize
        stages = max(3, min(_MAX_SMALL_M_STAGES, _STAGE_SMEM_BYTES // stage))
        return block_m, block_n, 4, stages, split(block_m, block_n), 0
    wide_stages = MID_M_STAGES if itemsize <= 2 else 4  # 128x128 tiles of 16-bit values: 6 stages (192 KiB)
    if M <= 128 or tiles(128, narrow(128)) < programs // 2:
        # Few tiles: the largest of FEW_TILES whose tiles, each split into at most FEW_TILES_MAX_SPLIT
        # K slices, keep FEW_TILES_FILL of a wave busy; else the one that keeps the most busy.
        best = None
        for bm, bn, stages in FEW_TILES:
            if (bm, bn) == (128, 128) and (K * itemsize) % 16 == 0:  # the descriptor path only
                stages = wide_stages
            bn = narrow(bn)
            slices = min(FEW_TILES_MAX_SPLIT, split_k_for(tiles(bm, bn), steps, programs))
            use = wave_use(tiles(bm, bn) * slices, programs)
            if use >= FEW_TILES_FILL:
                return bm, bn, 4, stages, slices, 0
            if best is None or use > best[0]:
                best = (use, (bm, bn, 4, stages, slices, 0))
        return best[1]
    if itemsize > 2:  # fp32 (tf32): the tiles of the path without split-K
        block_n = narrow(256)
        if M < 1000 or (block_n == 256 and 2 * tiles(128, 256) < programs):
            return 128, narrow(128), 4, 4, 1, 0
        return 128, block_n, 8, 3, 1, 0
    # 16-bit values: warp-specialized 128x256 tiles (4 warps a group, 4 stages) unless 128x128 tiles
    # (4 warps, MID_M_STAGES stages) keep clearly more of the last wave busy.
    if N >= 256 and wave_use(tiles(128, 256), programs) >= wave_use(tiles(128, narrow(128)), programs) - 0.02:
        return 128, 256, 4, 4, 1, 1
    return 128, narrow(128), 4, wide_stages, 1, 0


def default_config(
    M: int, N: int, K: int, dtype: torch.dtype, *, num_sms: int, interpreter: bool, comm: bool,
    split_k: bool = False, core: bool = False,
) -> Config:
    """Heuristic config for a shape that no table covers. ``num_sms``: the device's multiprocessors;
    ``comm``: the variant runs ``COMM_SMS`` communication programs beside the GEMM's; ``split_k``: the
    caller's kernel takes ``SPLIT_K > 1`` (``SPLIT_K_VARIANTS``), else ``SPLIT_K`` is 1; ``core``: the GEMM
    core's own launch (``tilefuse.matmul``): the tiles of ``split_k=False``, but where they fill at most half
    a wave their K steps split into at most ``CORE_MAX_SPLIT`` slices. Tile classes by M, below;
    interpreter: at most 64-wide blocks and a handful of programs (its cost grows with the operations).
    """
    if num_sms < 1:
        raise ValueError(f"default_config: num_sms must be >= 1, got {num_sms}")
    if interpreter:
        comm_sms = 2 if comm else 0
        gemm_sms = max(1, min(4, num_sms - comm_sms))
        block_m, block_n, block_k = _pow2_between(M, 16, 64), _pow2_between(N, 16, 64), _pow2_between(K, 16, 64)
        split = split_k_for(-(-M // block_m) * -(-N // block_n), -(-K // block_k), gemm_sms) if split_k else 1
        return Config(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, num_warps=4, num_stages=1,
                      GEMM_SMS=gemm_sms, COMM_SMS=comm_sms, SPLIT_K=split)
    comm_sms = max(1, num_sms // 8) if comm else 0
    gemm_sms = num_sms - comm_sms
    if gemm_sms < 1:
        raise ValueError(f"default_config: {num_sms} multiprocessors leave none for the GEMM next to "
                         f"{comm_sms} communication programs")
    # K steps of 128 bytes a row (fp32: 32 elements): a float8 tile takes the shared memory of a 16-bit one.
    max_k = 32 if dtype.itemsize >= 4 else (128 if dtype.itemsize == 1 else 64)
    block_k = _pow2_between(K, 16, max_k)
    split, warp_spec = 1, 0
    whole = _whole_tile_instead_of_split(M, N, K, dtype, gemm_sms, interpreter) if split_k else None
    if whole is not None:
        block_m, block_n, block_k, warps, stages = whole
    elif split_k and M <= 16 and dtype.itemsize == 2 and (K * dtype.itemsize) % 16 == 0:
        # Decode sizes whose K rows suit either path: the pointer-loaded decode tiles.
        block_m, warps, stages = 16, 4, POINTER_DECODE_STAGES
        block_n = _pow2_between(min(N, POINTER_DECODE_N), 16, POINTER_DECODE_N)
        block_k = _pow2_between(K, 16, POINTER_DECODE_K)
        split = min(_DEFAULT_MAX_SPLIT, split_k_for(-(-N // block_n), -(-K // block_k), gemm_sms))
    elif split_k:
        block_m, block_n, warps, stages, split, warp_spec = _split_k_tiles(M, N, K, block_k, dtype.itemsize, gemm_sms)
    else:
        # 4 stages for every tile but 128x256 (which has no room for a fourth).
        decode_max_m = FLOAT8_DECODE_MAX_M if dtype.itemsize == 1 else 64
        decode = _narrow_decode_tiles(M, N, K, dtype.itemsize, gemm_sms) \
            if narrow_decode(M, dtype, interpreter) and M <= decode_max_m else None
        if decode is not None and (M <= 64 or -(-M // 64) * -(-N // decode[1]) <= gemm_sms):
            block_m, block_n, block_k, warps, stages = decode
        elif decode is not None and (K * dtype.itemsize) % 16 == 0:
            # float8, 64 < M <= 128, more decode tiles than a wave, rows on the descriptor path: 128x128 tiles
            # of 256-deep K steps (off it, the 64-row tiles of M <= 128 below)
            block_m, block_n, block_k, warps, stages = 128, _pow2_between(min(N, 128), 16, 128), 256, 4, 3
        elif narrow_decode(M, dtype, interpreter) and decode is None:
            block_m, block_n, block_k, warps, stages = _small_m_tiles(M, N, K, gemm_sms)
        elif M <= 128:
            block_m, block_n, warps, stages = _pow2_between(M, 16, 64), 128, 4, 4
        elif M < 1000 and dtype.itemsize > 1:
            block_m, block_n, warps, stages = 128, 128, 4, MID_M_STAGES if dtype.itemsize == 2 else 4
        else:  # float8 past M = 128 (below M = 1000 with a fourth stage), everything from M = 1000
            block_m, block_n, warps, stages = 128, 256, 8, 4 if M < 1000 else 3
        block_n = _pow2_between(min(N, block_n), 16, block_n)
        narrow_stages = MID_M_STAGES if M < 1000 else 4  # 128x128 tiles in place of 128x256 ones
        # Under half as many tiles as GEMM programs: halve the wide tile so more programs get work (a
        # nearly full wave of 128x256 tiles still beats a full one of 128x128).
        if block_n == 256 and 2 * triton.cdiv(M, block_m) * triton.cdiv(N, block_n) < gemm_sms:
            block_n, warps, stages = 128, 4, narrow_stages
        elif block_n == 256 and dtype.itemsize == 1 and wave_use(triton.cdiv(M, 128) * triton.cdiv(N, 128), gemm_sms) \
                >= wave_use(triton.cdiv(M, 128) * triton.cdiv(N, 256), gemm_sms) + FLOAT8_NARROW_GAIN:
            # Float8: 128x128 tiles where they keep clearly more of their last wave busy than 128x256 ones.
            block_n, warps, stages = 128, 4, narrow_stages
    if dtype.itemsize >= 4 and stages > 3 and not (split_k and M <= 64):
        stages = 3  # fp32 tiles take twice the shared memory (the small-M stages count bytes already)
    if core and not split_k:  # the GEMM core's own launch: few tiles take K slices
        tiles = triton.cdiv(M, block_m) * triton.cdiv(N, block_n)
        if 2 * tiles <= gemm_sms:
            split = min(CORE_MAX_SPLIT, split_k_for(tiles, triton.cdiv(K, block_k), gemm_sms))
    return Config(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, num_warps=warps, num_stages=stages,
                  GEMM_SMS=gemm_sms, COMM_SMS=comm_sms, SPLIT_K=split, WARP_SPEC=warp_spec)


# Rows up to which decode_split_config gives a config, and its tile heights (32-row tiles split slower).
DECODE_SPLIT_MAX_M = 64
DECODE_SPLIT_BLOCK_M = (16, 64)
# The K decode_split_config decides for: only the wave limits the slices (not a rank's K shard).
_DECODE_SPLIT_REF_K = 1 << 20


@functools.lru_cache(maxsize=4096)  # asked on every call without a config
def decode_split_config(M: int, N: int, K: int, dtype: torch.dtype, *, num_sms: int,
                        interpreter: bool) -> Config | None:
    """For ``ONE_WAVE_SPLIT_K`` kernels: the GEMM core's split-K config where its slices fill one wave,
    its tiles have ``DECODE_SPLIT_BLOCK_M`` rows and a tile's sum fits in registers; else None."""
    if interpreter or M > DECODE_SPLIT_MAX_M or dtype.itemsize != 2:
        return None
    config = default_config(M, N, _DECODE_SPLIT_REF_K, dtype, num_sms=num_sms, interpreter=False, comm=False,
                            split_k=True)
    tiles = -(-M // config.BLOCK_M) * -(-N // config.BLOCK_N)
    if not (config.SPLIT_K > 1 and config.BLOCK_M in DECODE_SPLIT_BLOCK_M and tiles * config.SPLIT_K <= num_sms
            and sum_rows(config) == config.BLOCK_M):
        return None
    return dataclasses.replace(config, BLOCK_K=_pow2_between(K, 16, config.BLOCK_K))


def launch_shape(config: Config, specialized: bool) -> tuple[int, int]:
    """``(num_warps, num_stages)`` of a launch of ``config``, specialized or not."""
    if not config.WARP_SPEC or specialized:
        return config.num_warps, config.num_stages
    return min(16, 2 * config.num_warps), min(3, config.num_stages)


def side_warps(config: Config) -> int:
    """Warps of the kernels beside the GEMM's tile loop (reductions, copies): its unspecialized launch's."""
    return launch_shape(config, False)[0]


def sum_rows(config: Config) -> int:
    """Rows of a ``[rows, BLOCK_N]`` fp32 block a reduction sums at once (about 32 values a thread)."""
    return max(1, min(config.BLOCK_M, 1024 * side_warps(config) // config.BLOCK_N))


def check_variant_config(op: str, variant: str, config: Config) -> None:
    """Raise ValueError if ``config`` splits K for a variant whose kernels do not."""
    if config.SPLIT_K > 1 and variant not in SPLIT_K_VARIANTS and (op, variant) not in ONE_WAVE_SPLIT_K:
        raise ValueError(f"{op}: Config.SPLIT_K={config.SPLIT_K} is for the variants whose GEMM is the split-K core "
                         f"({', '.join(SPLIT_K_VARIANTS)}); {variant} computes whole tiles: use SPLIT_K=1")


def check_config_fits(config: Config, num_sms: int, where: str = "this device") -> None:
    """Raise ValueError unless GEMM_SMS + COMM_SMS programs can all be resident at once."""
    total = config.GEMM_SMS + config.COMM_SMS
    if total > num_sms:
        raise ValueError(f"GEMM_SMS + COMM_SMS = {total} exceeds the {num_sms} multiprocessors of {where} "
                         f"(GEMM_SMS={config.GEMM_SMS}, COMM_SMS={config.COMM_SMS}): programs that wait on each "
                         "other must all be resident at once, or they deadlock")
