"""The shared GEMM core (tilefuse.ops.common): matmul on both operand paths, tile helpers, config, checks.

Runs on a GPU when one is available, otherwise in Triton's interpreter (single process, small shapes).
"""

import os

import torch

if not torch.cuda.is_available():
    # Must happen before any module defining @triton.jit kernels is imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import dataclasses  # noqa: E402

import pytest  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tilefuse.ops.common import (  # noqa: E402
    Config,
    check_config_fits,
    check_divisible,
    check_dtypes,
    check_inner_dim,
    check_matrix,
    check_same_device,
    default_config,
    gemm_layout,
    matmul,
)
from tilefuse.ops.common.config import (  # noqa: E402
    MAX_SPLIT_K,
    MID_M_STAGES,
    MIN_SLICE_STEPS,
    ONE_WAVE_SPLIT_K,
    SPLIT_K_VARIANTS,
    check_variant_config,
    pointer_tiles,
    split_k_for,
)
from tilefuse.ops.common.gemm import GemmLaunch  # noqa: E402
from tilefuse.ops.common.scaled import kernel_scales  # noqa: E402
from tilefuse.ops.common.split_k import SPLIT_K_SCRATCH  # noqa: E402
from tilefuse.ops.common.tiles import load_tile, store_tile, tile_coords, tile_offsets  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICE = "cpu" if INTERPRET else "cuda"

# Relative Frobenius-norm error bounds. fp32 inputs go through tf32 tensor cores on NVIDIA GPUs and
# are exact fp32 products in the interpreter.
TOL = {torch.float16: 5e-3, torch.bfloat16: 2e-2, torch.float32: 1e-5 if INTERPRET else 5e-3}

DTYPES = [
    torch.float16,
    torch.float32,
    pytest.param(
        torch.bfloat16,
        marks=pytest.mark.skipif(INTERPRET, reason="bf16 arithmetic is wrong in Triton's interpreter"),
    ),
]
SHAPES = [(100, 72, 56), (10, 200, 40), (64, 64, 64)]  # (M, N, K): ragged, tall-thin, aligned

# 64-wide blocks and fewer programs than tiles, so the persistent loop runs several tiles per program.
CFG = Config(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_M=2, num_warps=4, num_stages=1 if INTERPRET else 3,
             GEMM_SMS=3, COMM_SMS=0)

NAN = float("nan")

# In the interpreter an out-of-bounds load reads whatever memory lies there; numpy then often warns
# (overflow, invalid value). Make that a failure, so a kernel that reads past its operands shows.
# Bits of kernel results are compared across tilings here: `.ci/run` runs these again under a
# second OpenBLAS core type (see harness.install_fixed_order_dot).
pytestmark = [pytest.mark.filterwarnings("error::RuntimeWarning"), pytest.mark.bits]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


def _randn(shape, dtype, gen):
    return torch.randn(shape, dtype=torch.float32, device=DEVICE, generator=gen).to(dtype)


def _padded_view(rows, cols, dtype, gen):
    """A [rows, cols] view at the top-left of a NaN buffer with extra rows and columns.

    The row stride stays a multiple of 16 bytes, so the view still qualifies for tensor
    descriptors; any read outside the view turns the result into NaN.
    """
    width = triton.cdiv(cols + 1, 8) * 8
    full = torch.full((rows + 3, width), NAN, dtype=dtype, device=DEVICE)
    full[:rows, :cols] = _randn((rows, cols), dtype, gen)
    return full[:rows, :cols]


def _assert_matches(out, a, b, dtype):
    assert not torch.isnan(out).any(), "output has unwritten (NaN) elements"
    ref = a.double() @ b.double()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err <= TOL[dtype], f"relative error {err:.2e} > {TOL[dtype]:.0e}"


@pytest.fixture(params=["tma", "pointer"])
def path(request):
    """The operands' path: "pointer" runs matmul with ``tma=False``."""
    return request.param


@pytest.mark.parametrize("storage", ["contiguous", "views"])
@pytest.mark.parametrize("b_layout", ["row", "col"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_matmul(dtype, shape, b_layout, storage, path):
    """C = A @ B for row-/column-major B; "views": A, B inside NaN-padded buffers, C a column block."""
    M, N, K = shape
    gen = _gen(hash((M, N, K)) % 2**31)
    if storage == "contiguous":
        a = _randn((M, K), dtype, gen)
        b = _randn((K, N), dtype, gen) if b_layout == "row" else _randn((N, K), dtype, gen).t()
        c_full = torch.full((M, N), NAN, dtype=dtype, device=DEVICE)
        c = c_full
    else:
        a = _padded_view(M, K, dtype, gen)
        b = _padded_view(K, N, dtype, gen) if b_layout == "row" else _padded_view(N, K, dtype, gen).t()
        c_full = torch.full((M, 3 * N), NAN, dtype=dtype, device=DEVICE)
        c = c_full[:, N:2 * N]

    use_tma, b_kmajor = gemm_layout(a, b)
    assert use_tma
    assert b_kmajor == (b_layout == "col")

    assert matmul(a, b, c, CFG, tma=path == "tma") is c
    _assert_matches(c, a, b, dtype)
    if storage == "views":
        assert torch.isnan(c_full[:, :N]).all() and torch.isnan(c_full[:, 2 * N:]).all(), \
            "matmul wrote outside its column block of C"


def test_matmul_column_major_a_and_misaligned_views(path):
    """Layouts that tensor descriptors cannot take fall back to the pointer path and stay correct."""
    M, N, K = 72, 40, 48
    gen = _gen(1)
    a_col = _randn((K, M), torch.float16, gen).t()  # column-major A
    b = _randn((K, N), torch.float16, gen)
    assert gemm_layout(a_col, b) == (False, False)
    c = torch.full((M, N), NAN, dtype=torch.float16, device=DEVICE)
    _assert_matches(matmul(a_col, b, c, CFG, tma=path == "tma"), a_col, b, torch.float16)

    a_off = _randn((M, K + 1), torch.float16, gen)[:, 1:]  # base 2 bytes past a 16-byte boundary
    assert gemm_layout(a_off, b) == (False, False)
    b_odd = _randn((K, N + 1), torch.float16, gen)[:, :N]  # row stride 82 bytes
    assert gemm_layout(a_col.contiguous(), b_odd) == (False, False)
    c.fill_(NAN)
    _assert_matches(matmul(a_off, b_odd, c, CFG, tma=path == "tma"), a_off, b_odd, torch.float16)


@pytest.mark.parametrize("K, dtype, align", [(60, torch.float16, 4), (58, torch.float32, 2), (59, torch.float16, 1)])
def test_matmul_pointer_path_aligned_loads(K, dtype, align, monkeypatch):
    """Rows of K elements that are not 16-byte multiples keep A and a Linear weight's ``w.t()`` off
    the descriptor path; ``ALIGN`` tells the kernel how far their starts are aligned. The bits must
    be those of the kernel told nothing (ALIGN = 1), and right against the reference."""
    from tilefuse.ops.common import gemm

    M, N = 70, 90
    gen = _gen(K)
    a = _randn((M, K), dtype, gen)
    b = _randn((N, K), dtype, gen).t()  # column-major, leading stride K
    assert gemm_layout(a, b) == (False, False)
    assert gemm.pointer_align(a, b) == align
    assert gemm.pointer_align(a.t().contiguous().t(), b) == 1  # column-major A: no claim
    assert gemm.pointer_align(a, b.contiguous()) == 1  # row-major B: no claim
    c = torch.full((M, N), NAN, dtype=dtype, device=DEVICE)
    _assert_matches(matmul(a, b, c, CFG), a, b, dtype)
    monkeypatch.setattr(gemm, "pointer_align", lambda a, b: 1)
    plain = torch.full((M, N), NAN, dtype=dtype, device=DEVICE)
    matmul(a, b, plain, CFG)
    assert torch.equal(c, plain)


def test_padded_copies_are_exact_with_16_byte_rows():
    """``gemm._padded`` (operands copied onto the descriptor path) keeps every element's bits, row- or
    column-major, whether the rows copy as 8-, 4-byte words or element by element (an odd address)."""
    from tilefuse.ops.common.gemm import _padded

    gen = torch.Generator().manual_seed(3)
    for dtype in (torch.float8_e4m3fn, torch.bfloat16, torch.float32):
        for rows, cols in ((5, 3500), (7, 33), (3, 36)):
            base = torch.randn(rows * cols + 1, generator=gen).to(dtype)
            for t in (base[:-1].view(rows, cols), base[1:].view(rows, cols), base[:-1].view(cols, rows).t()):
                unit = 1 if t.stride(1) == 1 else 0
                got = _padded(t, unit)
                assert got.shape == t.shape and got.stride(unit) == 1
                assert (got.stride(1 - unit) * got.element_size()) % 16 == 0
                assert torch.equal(got.view(torch.uint8) if dtype.itemsize == 1 else got,
                                   t.view(torch.uint8) if dtype.itemsize == 1 else t), (dtype, rows, cols)


def test_matmul_unaligned_rows_past_the_pad_thresholds():
    """Operands whose rows are not 16-byte multiples, with rows past the GEMM core's pad thresholds (float8
    from ``FLOAT8_PAD_MIN_M`` rows, 16-bit from ``PAD_MIN_M``; on a GPU they are padded onto the descriptor
    path every call), right against the reference, twice through one ``GemmLaunch``."""
    from tilefuse.ops.common.gemm import FLOAT8_PAD_MIN_M, PAD_MIN_M

    gen = torch.Generator().manual_seed(9)
    for dtype, M in ((torch.float8_e4m3fn, FLOAT8_PAD_MIN_M + 44), (torch.float16, PAD_MIN_M + 4)):
        N, K = 24, 100  # rows of 100 (float8) or 200 bytes
        a = (torch.randn(M, K, generator=gen) * 2).to(dtype).to(DEVICE)
        w = (torch.randn(N, K, generator=gen) * 2).to(dtype).to(DEVICE)
        out = torch.full((M, N), NAN, dtype=torch.float32 if dtype.itemsize == 1 else dtype, device=DEVICE)
        cfg = Config.for_shape(M, N, K, dtype, device=a.device, comm=False)
        scales = kernel_scales(torch.tensor(0.5, device=DEVICE), torch.tensor(2.0, device=DEVICE), out.device) \
            if dtype.itemsize == 1 else None
        launch = GemmLaunch(a, w.t(), out, cfg)
        for _ in range(2):
            out.fill_(NAN)
            launch.run(a, w.t(), out, scales=scales)
            ref = a.float() @ w.t().float()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            # A float8 MMA on the GPU adds into an accumulator of fewer than fp32's bits (about 1e-4 off)
            assert err <= (2e-2 if dtype.itemsize == 2 else 1e-5 if INTERPRET else 1e-3), (dtype, err)


def test_matmul_decode_tiles_load_through_pointers(monkeypatch):
    """16-row tiles with 256-deep K steps of 16-bit values (``config.pointer_tiles``: the decode tiles)
    on a Linear weight (column-major B) run the pointer path although their operands fit descriptors,
    whole or split in K, with ragged M, N and K, right against the reference; other tiles of the same
    operands, and the same tiles on a row-major B, keep the descriptors.
    The default config picks them up to M = 16 where K's rows are 16-byte multiples, and not past
    M = 16, off that path or in fp32."""
    from tilefuse.ops.common import gemm

    seen = []
    real = gemm.matmul_kernel

    class Spy:
        jit_fn = real.jit_fn

        def __getitem__(self, grid):
            def launch(*args, **kw):
                seen.append(kw["USE_TMA"])
                return real[grid](*args, **kw)
            return launch

    monkeypatch.setattr(gemm, "matmul_kernel", Spy())
    M, N, K = 5, 72, 520  # rows of 1040 bytes: descriptors fit
    gen = _gen(16)
    dtype = torch.float16
    a = _randn((M, K), dtype, gen)
    b = _randn((N, K), dtype, gen).t()
    assert gemm_layout(a, b) == (True, True)
    decode = Config(BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, GROUP_M=1, num_warps=4, num_stages=3, GEMM_SMS=4,
                    COMM_SMS=0)
    for cfg in (decode, decode.replace(SPLIT_K=2)):
        assert pointer_tiles(cfg, dtype)
        _assert_matches(matmul(a, b, torch.full((M, N), NAN, dtype=dtype, device=DEVICE), cfg), a, b, dtype)
    other = decode.replace(BLOCK_K=64)
    assert not pointer_tiles(other, dtype) and not pointer_tiles(decode, torch.float32)
    _assert_matches(matmul(a, b, torch.full((M, N), NAN, dtype=dtype, device=DEVICE), other), a, b, dtype)
    row_major = b.contiguous()  # not a Linear weight's layout: not measured, the descriptors stay
    _assert_matches(matmul(a, row_major, torch.full((M, N), NAN, dtype=dtype, device=DEVICE), decode), a, b, dtype)
    assert seen == [False, False, True, True], seen

    for m in (1, 16):
        cfg = default_config(m, 4096, 4096, torch.bfloat16, num_sms=132, interpreter=False, comm=False,
                             split_k=True)
        assert pointer_tiles(cfg, torch.bfloat16) and (cfg.BLOCK_N, cfg.BLOCK_K, cfg.SPLIT_K) == (64, 256, 2), cfg
    for args in ((32, 4096, 4096, torch.bfloat16), (16, 5000, 3500, torch.bfloat16), (16, 4096, 4096, torch.float32)):
        cfg = default_config(*args, num_sms=132, interpreter=False, comm=False, split_k=True)
        assert not pointer_tiles(cfg, args[3]), (args, cfg)

    # Float8 decode tiles at 64 rows or fewer: 256-deep K steps in 6 stages, through pointers.
    e4 = torch.float8_e4m3fn
    for m, tile in ((16, (16, 32, 256, 6)), (64, (64, 64, 256, 6))):
        cfg = default_config(m, 6144 if m == 64 else 4096, 4096, e4, num_sms=132, interpreter=False, comm=False)
        assert (cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K, cfg.num_stages) == tile and pointer_tiles(cfg, e4), cfg
    # Past 64 rows up to 128 while the 64-row decode tiles take one wave; 16-bit values not past 64 rows.
    for m, n, e, wanted in ((128, 4096, e4, True), (96, 6144, e4, True), (128, 14336, e4, False),
                            (129, 4096, e4, False), (128, 4096, torch.bfloat16, False)):
        cfg = default_config(m, n, 4096, e, num_sms=132, interpreter=False, comm=False)
        assert pointer_tiles(cfg, e) == wanted and (cfg.BLOCK_M == 64) >= wanted, (m, n, e, cfg)
    # ... else (float8) 128x128 tiles with 256-deep K steps on the descriptors; rows off them (K = 3500 bytes):
    # 64x128 tiles of 128-deep steps (the 128x128 tiles of 256-deep steps are for the descriptor path).
    cfg = default_config(128, 14336, 4096, e4, num_sms=132, interpreter=False, comm=False)
    assert (cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K, cfg.num_stages) == (128, 128, 256, 3), cfg
    cfg = default_config(128, 5000, 3500, e4, num_sms=132, interpreter=False, comm=False)
    assert (cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K, cfg.num_stages) == (64, 128, 128, 4), cfg
    # Float8 past M = 128: 128x128 tiles where they fill clearly more of the last wave than 128x256 ones (8 warps;
    # a fourth stage below M = 1000, where 128x128 tiles take MID_M_STAGES); 16-bit values below M = 1000 keep
    # 128x128 tiles.
    for m, n, e, width in ((1000, 6144, e4, 128), (1000, 5000, e4, 128), (1000, 4096, e4, 256), (4096, 6144, e4, 256),
                           (1000, 6144, torch.bfloat16, 256), (333, 6144, e4, 256), (512, 14336, e4, 256),
                           (768, 4096, e4, 256), (333, 4096, e4, 128), (333, 14336, e4, 128), (768, 6144, e4, 128),
                           (512, 4096, e4, 128), (512, 14336, torch.bfloat16, 128)):
        cfg = default_config(m, n, 4096, e, num_sms=132, interpreter=False, comm=False)
        assert cfg.BLOCK_N == width, (m, n, e, cfg)
        if e == e4:
            wide, narrow = (256, 8, 4 if m < 1000 else 3), (128, 4, MID_M_STAGES if m < 1000 else 4)
            assert (cfg.BLOCK_N, cfg.num_warps, cfg.num_stages) == (wide if width == 256 else narrow), (m, n, cfg)
    seen.clear()
    a8, w8 = (a * 4).to(e4), (b.t() * 4).to(e4)
    sa, sb = torch.tensor(0.5, device=DEVICE), torch.tensor(0.25, device=DEVICE)
    out = torch.full((M, N), NAN, dtype=torch.float32, device=DEVICE)
    matmul(a8, w8.t(), out, decode, scales=kernel_scales(sa, sb, out.device))
    ref = (a8.float() * sa) @ (w8.t().float() * sb)
    assert seen == [False] and (out - ref).norm() <= 1e-4 * ref.norm(), seen


def test_matmul_warp_spec_config_is_a_compile_hint(monkeypatch):
    """``WARP_SPEC = 1`` is honoured only where it can be (descriptor path, no split K, a GPU), and
    never changes the result: the bits of the same config without it."""
    from tilefuse.ops.common import gemm
    from tilefuse.ops.common.gemm import warp_specialized

    with monkeypatch.context() as m:
        m.setattr(gemm, "_interpreting", lambda: False)
        assert warp_specialized(CFG.replace(WARP_SPEC=1), True, torch.device("cuda"))
        assert not warp_specialized(CFG.replace(WARP_SPEC=1), True, torch.device("cpu"))

    cfg = CFG.replace(WARP_SPEC=1)
    gpu = torch.device("cuda")
    assert warp_specialized(cfg, True, gpu) is (not INTERPRET)
    assert not warp_specialized(cfg, False, gpu)
    assert not warp_specialized(cfg.replace(SPLIT_K=2), True, gpu)
    assert not warp_specialized(CFG, True, gpu)
    M, N, K = 200, 160, 96
    gen = _gen(7)
    dtype = torch.float16
    a = _randn((M, K), dtype, gen)
    b = _randn((N, K), dtype, gen).t()
    got = matmul(a, b, torch.full((M, N), NAN, dtype=dtype, device=DEVICE), cfg)
    _assert_matches(got, a, b, dtype)
    assert torch.equal(got, matmul(a, b, torch.empty_like(got), CFG))


@pytest.mark.parametrize("warp_spec", [False, pytest.param(True, marks=pytest.mark.skipif(
    INTERPRET, reason="the interpreter has no warps: a warp-specialized loop runs as the plain one"))])
@pytest.mark.parametrize("layout", ["contiguous", "column_block", "misaligned"])
def test_matmul_flattened_loop_and_descriptor_stores_keep_the_bits(layout, warp_spec):
    """``flatten`` and ``tma_store`` (the tiles schedule's loop flattened, tiles stored through a
    descriptor of C, whole or in two halves) give the bits of the plain tiles loop, with ragged
    edges, in a column block of a wider C (stored through a descriptor of its strides) and where C's
    rows are not 16-byte aligned (then stored by pointers); the columns around the block stay
    untouched. On a GPU also for a warp-specialized 128x256 loop (never flattened, nor stored in
    halves: whole tiles)."""
    M, N, K = 200, 72 if not warp_spec else 520, 96
    gen = _gen(11)
    dtype = torch.float16
    a = _randn((M, K), dtype, gen)
    b = _randn((N, K), dtype, gen).t()
    width = {"contiguous": N, "column_block": 3 * N, "misaligned": N + 1}[layout]
    first = {"contiguous": 0, "column_block": N, "misaligned": 1}[layout]

    cfg = CFG if not warp_spec else CFG.replace(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=4, num_stages=3,
                                                  WARP_SPEC=1)

    def run(**kw):
        full = torch.full((M, width), NAN, dtype=dtype, device=DEVICE)
        matmul(a, b, full[:, first:first + N], cfg, **kw)
        return full

    plain = run(flatten=False, tma_store=0)
    _assert_matches(plain[:, first:first + N], a, b, dtype)
    for kw in ({"flatten": True}, {"tma_store": 1}, {"flatten": True, "tma_store": 1}, {"tma_store": 2},
               {"flatten": True, "tma_store": 2}):
        got = run(**kw)
        assert torch.equal(got[:, first:first + N], plain[:, first:first + N]), kw
        outside = torch.cat([got[:, :first], got[:, first + N:]], dim=1)
        assert torch.isnan(outside).all(), f"{kw}: matmul wrote outside its block of C"


def test_matmul_default_config():
    M, N, K = 96, 80, 72
    gen = _gen(2)
    a, b = _randn((M, K), torch.float16, gen), _randn((K, N), torch.float16, gen)
    num_sms = 8 if INTERPRET else torch.cuda.get_device_properties(DEVICE).multi_processor_count
    cfg = default_config(M, N, K, torch.float16, num_sms=num_sms, interpreter=INTERPRET, comm=False)
    c = torch.full((M, N), NAN, dtype=torch.float16, device=DEVICE)
    _assert_matches(matmul(a, b, c, cfg), a, b, torch.float16)


def test_public_matmul_float8_scales():
    """tilefuse.matmul with float8 operands and tensor-wise or row-wise scales against the fp32
    product of the dequantized operands; out_dtype, out's dtype, and the scales' checks."""
    import tilefuse

    M, N, K = 20, 24, 40
    gen = torch.Generator().manual_seed(5)
    a = (torch.randn(M, K, generator=gen) * 2).to(torch.float8_e4m3fn).to(DEVICE)
    b = (torch.randn(N, K, generator=gen) * 2).to(torch.float8_e4m3fn).to(DEVICE).t()  # column-major
    dtype = torch.float16 if INTERPRET else torch.bfloat16
    for sa, sb in ((torch.tensor(0.75), torch.tensor(1.25)),
                   (torch.rand(M, 1, generator=gen) + 0.5, torch.rand(1, N, generator=gen) + 0.5)):
        sa, sb = sa.to(DEVICE), sb.to(DEVICE)
        ref = (a.float() * sa) @ (b.float() * sb)
        got = tilefuse.matmul(a, b, scale_a=sa, scale_b=sb, out_dtype=dtype)
        assert got.dtype == dtype and (got.float() - ref).norm() <= 1e-2 * ref.norm()
        out = torch.full((M, N), NAN, dtype=torch.float32, device=DEVICE)
        assert tilefuse.matmul(a, b, scale_a=sa, scale_b=sb, out=out) is out
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="scale_b"):
        tilefuse.matmul(a, b, scale_a=sa)
    with pytest.raises(TypeError, match="float8"):
        tilefuse.matmul(a.float(), b.float(), scale_a=sa, scale_b=sb)


# (M, N, K, BLOCK_K): K steps not a multiple of SPLIT_K for 2, 3 and 4 (200 / 32 -> 7 steps, the
# last one ragged); 3 steps of 16 (the 4th slice is empty); one row of tiles over a wide N.
SPLIT_SHAPES = [(100, 72, 200, 32), (10, 130, 40, 16), (33, 200, 120, 16)]


def _split_cfg(split, block_k, programs=5):
    return CFG.replace(BLOCK_K=block_k, SPLIT_K=split, GEMM_SMS=programs)


def _counts_are_zero():
    return all(int(counts.count_nonzero()) == 0 for _, counts in SPLIT_K_SCRATCH._sets.values())


@pytest.mark.parametrize("split", [2, 3, 4])
@pytest.mark.parametrize("shape", SPLIT_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=lambda d: str(d).removeprefix("torch."))
def test_matmul_split_k(dtype, shape, split, path):
    """Split-K against an fp64 reference; NaN-padded operands, C a column block of a NaN matrix; the
    same bits on a second run; the per-tile counts back at zero."""
    M, N, K, block_k = shape
    gen = _gen(hash((M, N, K, split)) % 2**31)
    a = _padded_view(M, K, dtype, gen)
    b = _padded_view(N, K, dtype, gen).t()  # column-major, as a Linear weight
    c_full = torch.full((M, 3 * N), NAN, dtype=dtype, device=DEVICE)
    c = c_full[:, N:2 * N]
    cfg = _split_cfg(split, block_k)
    assert matmul(a, b, c, cfg) is c
    _assert_matches(c, a, b, dtype)
    assert torch.isnan(c_full[:, :N]).all() and torch.isnan(c_full[:, 2 * N:]).all(), \
        "matmul wrote outside its column block of C"
    assert _counts_are_zero(), "a tile's count was left behind"
    again = torch.full((M, N), NAN, dtype=dtype, device=DEVICE)
    assert torch.equal(matmul(a, b, again, cfg), c), "split-K results differ between runs"


def test_matmul_split_tiles_summed_in_row_blocks():
    """One warp: the last slice sums a 64x64 tile in [16, 64] row blocks (1024 * warps // BLOCK_N),
    the ragged last row of tiles in fewer of them."""
    M, N, K = 100, 70, 200
    gen = _gen(6)
    a, b = _randn((M, K), torch.float16, gen), _randn((K, N), torch.float16, gen)
    c = torch.full((M, N), NAN, dtype=torch.float16, device=DEVICE)
    _assert_matches(matmul(a, b, c, CFG.replace(BLOCK_K=32, num_warps=1, GEMM_SMS=5, SPLIT_K=3)), a, b, torch.float16)
    assert _counts_are_zero()


def test_matmul_split_k_programs_and_tiles():
    """One program for every slice of every tile, and one program for all of them; the sum of the
    slices does not depend on which program finishes a tile last (fixed order)."""
    M, N, K = 70, 90, 160
    gen = _gen(3)
    a, b = _randn((M, K), torch.float32, gen), _randn((K, N), torch.float32, gen)
    results = []
    for programs in (1, 2 * 2 * 4, 7):
        c = torch.full((M, N), NAN, device=DEVICE)
        matmul(a, b, c, _split_cfg(4, 32, programs))
        _assert_matches(c, a, b, torch.float32)
        results.append(c)
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])
    assert _counts_are_zero()


def test_matmul_split_k_scratch_grows_per_stream():
    """A larger split-K launch after a smaller one on the same stream gets larger scratch."""
    gen = _gen(4)
    for M, N in ((20, 30), (150, 140)):
        a, b = _randn((M, 64), torch.float16, gen), _randn((64, N), torch.float16, gen)
        c = torch.full((M, N), NAN, dtype=torch.float16, device=DEVICE)
        _assert_matches(matmul(a, b, c, _split_cfg(2, 16, programs=3)), a, b, torch.float16)
    parts, counts = next(iter(SPLIT_K_SCRATCH._sets.values()))
    assert counts.numel() >= 3 * 3 and parts.numel() >= 9 * 2 * 64 * 64


def test_matmul_default_split_k_config():
    """default_config(split_k=True) splits a few tiles over the programs, and matmul runs it (K deep
    enough for the GPU's 256-deep decode K steps to split)."""
    M, N, K = 16, 48, 4096
    num_sms = 8 if INTERPRET else torch.cuda.get_device_properties(DEVICE).multi_processor_count
    cfg = default_config(M, N, K, torch.float16, num_sms=num_sms, interpreter=INTERPRET, comm=False, split_k=True)
    assert cfg.SPLIT_K > 1
    gen = _gen(5)
    a, b = _randn((M, K), torch.float16, gen), _randn((K, N), torch.float16, gen)
    c = torch.full((M, N), NAN, dtype=torch.float16, device=DEVICE)
    _assert_matches(matmul(a, b, c, cfg), a, b, torch.float16)


def test_matmul_degenerate_and_mismatched_shapes():
    a = torch.randn(8, 0, device=DEVICE)
    c = torch.full((8, 4), NAN, device=DEVICE)
    assert torch.equal(matmul(a, torch.randn(0, 4, device=DEVICE), c, CFG), torch.zeros(8, 4, device=DEVICE))
    empty = torch.empty(0, 4, device=DEVICE)
    assert matmul(torch.randn(0, 3, device=DEVICE), torch.randn(3, 4, device=DEVICE), empty, CFG) is empty
    with pytest.raises(ValueError, match=r"a \(8, 3\) @ b \(3, 4\) -> c \(8, 5\)"):
        matmul(torch.randn(8, 3, device=DEVICE), torch.randn(3, 4, device=DEVICE),
               torch.empty(8, 5, device=DEVICE), CFG)


def test_gemm_launch_made_once_runs_every_call_of_its_layouts():
    """A GemmLaunch (what a bulk_sync variant holds per call signature) computes each call's own operands;
    one made to begin or end a collective call refuses a call without one."""
    gen = _gen(11)
    a0, b0 = _randn((40, 24), torch.float16, gen), _randn((24, 56), torch.float16, gen)
    launch = GemmLaunch(a0, b0, torch.empty(40, 56, dtype=torch.float16, device=DEVICE), CFG)
    for _ in range(2):  # new operands and outputs of the same layouts
        a, b = _randn((40, 24), torch.float16, gen), _randn((24, 56), torch.float16, gen)
        c = torch.full((40, 56), NAN, dtype=torch.float16, device=DEVICE)
        assert launch.run(a, b, c) is c
        _assert_matches(c, a, b, torch.float16)
    in_call = GemmLaunch(a0, b0, c, CFG, in_call=True, ends=True, enter=True)
    with pytest.raises(ValueError, match="runs with its call"):
        in_call.run(a0, b0, c, torch.zeros(8, dtype=torch.int64, device=DEVICE))


def test_gemm_layout_row_and_column_major_b():
    a = torch.randn(32, 32, device=DEVICE)
    assert gemm_layout(a, a) == (True, False)
    assert gemm_layout(a, a.t()) == (True, True)


# ------------------------------------------------------------------------------------------------
# Split-K in the ops: bulk_sync's GEMM is the core; the other variants refuse SPLIT_K > 1
# ------------------------------------------------------------------------------------------------

SPLIT_OPS = ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce")


def job_ops_split_k(ctx, cases):
    """Every op's bulk_sync with ``(dtype, SPLIT_K)`` in ``cases`` against its reference
    (NaN-poisoned workspaces and outputs), and every other variant refusing the split config on
    every rank."""
    from ophelpers import assert_matches, poison_workspaces, randn

    import tilefuse
    import tilefuse.ops.gemm_all_reduce  # noqa: F401  (registers the op)
    from tilefuse.ops import registry

    # M divisible by W = 2 and 3; K = 7 steps of 32, a multiple of no SPLIT_K > 1; ragged N.
    M, N, K = 48, 40, 200
    seed = 0
    for op in SPLIT_OPS:
        for dtype, split in cases:
            seed += 1
            # Every rank's operands differ, rank r's A scaled by (r + 1): a misrouted block shows.
            a = randn((M, K), dtype, ctx.device, seed=seed * 100 + ctx.rank + 1, scale=ctx.rank + 1)
            b = randn((K, N), dtype, ctx.device, seed=seed * 100 + 50 + ctx.rank)
            ref = registry.get(op, "reference")(a, b)
            cfg = Config(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=2, num_warps=4, num_stages=1,
                         GEMM_SMS=3, COMM_SMS=0, SPLIT_K=split)
            poison_workspaces()
            got = registry.get(op, "bulk_sync")(a, b, config=cfg)
            tilefuse.synchronize()
            assert_matches(got, ref, dtype, K, ctx.on_gpu, f"{op} bulk_sync SPLIT_K={split} {dtype}",
                           scale=ctx.world * (ctx.world + 1) / 2)
        for variant in ("producer_consumer", "fused_sequential", "wg_specialized"):
            # gemm_all_reduce's fused_sequential splits K where the slices fit one wave (not here:
            # test_gemm_all_reduce.py runs it), and says so.
            why = ("fused_sequential with SPLIT_K=2 needs a K slice a program" if (op, variant) in ONE_WAVE_SPLIT_K
                   else f"Config.SPLIT_K=2 is for .*{variant} computes whole")
            with pytest.raises(ValueError, match=f"^{op}: {why}"):
                registry.get(op, variant)(a, b, config=cfg.replace(SPLIT_K=2, COMM_SMS=2))
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("world, cases", [
    (2, ((torch.float16, 2), (torch.float32, 4))),
    pytest.param(3, ((torch.float16, 3), (torch.float32, 2)), marks=pytest.mark.slow),
], ids=["W2", "W3"])
def test_ops_bulk_sync_split_k(pools, world, cases):
    assert all(pools.run(world, job_ops_split_k, cases))


def job_ops_split_k_empty(ctx):
    """Every op's bulk_sync with a split-K config where there is nothing to split: K = 0
    (the result is zeros) and no rows; the GEMM that begins and ends the call still runs on every
    rank, so the call neither raises nor hangs."""
    from ophelpers import poison_workspaces

    import tilefuse
    import tilefuse.ops.gemm_all_reduce  # noqa: F401  (registers the op)
    from tilefuse.ops import registry

    for op in SPLIT_OPS:
        for M, K in ((4 * ctx.world, 0), (0, 40)):
            a = torch.randn(M, K, device=ctx.device)
            b = torch.randn(K, 24, device=ctx.device)
            ref = registry.get(op, "reference")(a, b)
            for split in (1, 2):
                cfg = Config(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=2, num_warps=4, num_stages=1,
                             GEMM_SMS=3, COMM_SMS=0, SPLIT_K=split)
                poison_workspaces()
                got = registry.get(op, "bulk_sync")(a, b, config=cfg)
                tilefuse.synchronize()
                what = f"{op} bulk_sync M={M} K={K} SPLIT_K={split}"
                assert got.shape == ref.shape, (what, tuple(got.shape), tuple(ref.shape))
                assert torch.equal(got, torch.zeros_like(got)), what
    tilefuse.barrier()
    return True


def test_ops_bulk_sync_split_k_nothing_to_split(pools):
    assert all(pools.run(2, job_ops_split_k_empty))


def job_ops_wide_tile_bits(ctx):
    """Every op's variants with a warp-specialized 128x256 config (``WARP_SPEC = 1``), which bulk_sync
    (the GEMM core) and the flag-free fused loops run specialized and the other variants with 8 warps
    (``launch_shape``): right against the reference, and, where the op promises it, the same bits from
    every variant."""
    import warnings

    from ophelpers import assert_matches, randn

    import tilefuse
    import tilefuse.ops.gemm_all_reduce  # noqa: F401  (registers the op)
    from tilefuse.ops import registry

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _wide_tile_runs(ctx, assert_matches, randn, registry)
    # Every kernel these configs specialize compiled specialized (launcher.check_specialized).
    said = [str(w.message) for w in seen if "did not warp-specialize" in str(w.message)]
    assert not said, said
    tilefuse.barrier()
    return True


def _wide_tile_runs(ctx, assert_matches, randn, registry):
    import tilefuse

    K = 512
    sms = torch.cuda.get_device_properties(ctx.device).multi_processor_count
    wide = Config(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4,
                  GEMM_SMS=sms, COMM_SMS=0, WARP_SPEC=1)
    for op in SPLIT_OPS:
        # Per-rank GEMMs of 8 x 9 tiles of 128x256; outputs that fit the tests' 64 MiB heaps.
        M, N = (1024 * ctx.world, 2304) if op == "gemm_reduce_scatter" else (1024, 2304)
        a = randn((M, K), torch.bfloat16, ctx.device, seed=11 + ctx.rank, scale=ctx.rank + 1)
        b = randn((K, N), torch.bfloat16, ctx.device, seed=21 + ctx.rank)
        ref = registry.get(op, "reference")(a, b)
        first = None
        runs = [(v, {}) for v in ("bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized")]
        for variant, kwargs in runs:
            comm = variant in ("producer_consumer", "wg_specialized")
            cfg = wide.replace(GEMM_SMS=sms - 16, COMM_SMS=16) if comm else wide
            got = registry.get(op, variant)(a, b, config=cfg, **kwargs)
            tilefuse.synchronize()
            what = f"{op} {variant} {kwargs}"
            assert_matches(got, ref, torch.bfloat16, K, True, what, scale=ctx.world * (ctx.world + 1) / 2)
            if op in ("gemm_reduce_scatter", "gemm_all_reduce"):  # their contract: the same bits
                if first is None:
                    first = got
                assert torch.equal(got, first), f"{what} differs from bulk_sync"


@pytest.mark.skipif(INTERPRET, reason="warp specialization is compiled for GPUs: the interpreter has no warps")
def test_ops_wide_tile_bits_with_warp_specialization(pools):
    assert all(pools.run(2, job_ops_wide_tile_bits))


def job_ops_small_m_default_tiles(ctx):
    """Every op's variants without a config at 64 < M <= 256 per rank, in bf16 (the swept small-M
    tiles: 128-row tiles with 6 stages, 64-row tiles with 128-deep K steps), and at M = 333 (128x128
    with MID_M_STAGES stages: the most shared memory of any default): right against the
    reference (the variants with communication programs may pick other tiles than those without:
    no bit comparison between them)."""
    from ophelpers import assert_matches, randn

    import tilefuse
    import tilefuse.ops.gemm_all_reduce  # noqa: F401  (registers the op)
    from tilefuse.ops import registry
    from tilefuse.ops.common.config import default_config

    K = 1024
    seen = set()
    for op in SPLIT_OPS:
        for M, N in ((128, 4096), (256, 4096), (128, 14336), (333, 4096)):
            rows = M * ctx.world if op == "gemm_reduce_scatter" else M
            a = randn((rows, K), torch.bfloat16, ctx.device, seed=31 + ctx.rank, scale=ctx.rank + 1)
            b = randn((K, N), torch.bfloat16, ctx.device, seed=41 + ctx.rank)
            cfg = default_config(M, N, K, torch.bfloat16, num_sms=132, interpreter=False, comm=False)
            seen.add((cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K, cfg.num_stages))
            ref = registry.get(op, "reference")(a, b)
            for variant in ("bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized"):
                got = registry.get(op, variant)(a, b)
                tilefuse.synchronize()
                what = f"{op} {variant} M={M} N={N}"
                assert_matches(got, ref, torch.bfloat16, K, True, what, scale=ctx.world * (ctx.world + 1) / 2)
    tilefuse.barrier()
    return sorted(seen)


@pytest.mark.skipif(INTERPRET, reason="the small-M tiles are GPU defaults (the interpreter's tiles are narrower)")
def test_ops_small_m_default_tiles(pools):
    seen = pools.run(2, job_ops_small_m_default_tiles)[0]
    from tilefuse.ops.common.config import MID_M_STAGES

    # 64x64 and 64x128 tiles, and 128x128 with MID_M_STAGES (up to M = 256 and past it)
    assert seen == [(64, 64, 128, 6), (64, 128, 128, 4), (128, 128, 64, MID_M_STAGES)], seen


def test_launch_shape_of_a_warp_specialized_config():
    """A WARP_SPEC config launches as given where the kernel specializes, else with its consumer
    groups' warps and at most 3 stages; the kernels beside the tile loop take the latter's warps."""
    from tilefuse.ops.common.config import launch_shape, side_warps

    wide = Config(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4,
                  GEMM_SMS=132, COMM_SMS=0, WARP_SPEC=1)
    assert launch_shape(wide, True) == (4, 4)
    assert launch_shape(wide, False) == (8, 3)
    assert launch_shape(wide.replace(WARP_SPEC=0), False) == (4, 4)
    assert side_warps(wide) == 8 and side_warps(CFG) == 4
    big = default_config(8192, 8192, 8192, torch.bfloat16, num_sms=132, interpreter=False, comm=True)
    assert launch_shape(big.replace(num_warps=4, num_stages=4, WARP_SPEC=1), False) == \
        (big.num_warps, big.num_stages)  # the variants' default wide tile, unspecialized
    fp32 = default_config(8192, 8192, 8192, torch.float32, num_sms=132, interpreter=False, comm=False)
    assert (fp32.num_warps, fp32.num_stages, fp32.WARP_SPEC) == (8, 3, 0)


# ------------------------------------------------------------------------------------------------
# Tile helpers, through small kernels
# ------------------------------------------------------------------------------------------------


@triton.jit
def _coords_kernel(out_ptr, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    tile_id = tl.program_id(0)
    pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
    tl.store(out_ptr + 2 * tile_id, pid_m)
    tl.store(out_ptr + 2 * tile_id + 1, pid_n)


@pytest.mark.parametrize("num_pid_m, num_pid_n, group_m", [(5, 3, 2), (3, 4, 8), (4, 2, 1)])
def test_tile_coords_is_a_grouped_permutation(num_pid_m, num_pid_n, group_m):
    num_tiles = num_pid_m * num_pid_n
    out = torch.full((num_tiles, 2), -1, dtype=torch.int32, device=DEVICE)
    _coords_kernel[(num_tiles,)](out, num_pid_m, num_pid_n, GROUP_M=group_m)
    coords = [tuple(x) for x in out.tolist()]
    assert sorted(coords) == [(m, n) for m in range(num_pid_m) for n in range(num_pid_n)]
    # Tile ids walk down a band of group_m row blocks before moving to the next column block.
    band = min(group_m, num_pid_m)
    assert coords[:band] == [(m, 0) for m in range(band)]
    assert all(m < band for m, _ in coords[: band * num_pid_n])


@triton.jit
def _copy_kernel(
    src_ptr, dst_ptr,
    LOAD_M, LOAD_N, STORE_M, STORE_N,
    stride_sm, stride_sn, stride_dm, stride_dn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    offs_m, offs_n = tile_offsets(tl.program_id(0), tl.program_id(1), BLOCK_M, BLOCK_N)
    tile = load_tile(src_ptr, offs_m, offs_n, LOAD_M, LOAD_N, stride_sm, stride_sn)  # [BM, BN]
    store_tile(dst_ptr, tile, offs_m, offs_n, STORE_M, STORE_N, stride_dm, stride_dn)


def test_load_store_tile_strides_masks_and_cast():
    """Copy a transposed fp16 view into a column block of a wider fp32 matrix; loads past the edge are 0."""
    load_m, load_n, store_m, store_n = 40, 30, 45, 34
    src = torch.randn(load_n, load_m, dtype=torch.float16, device=DEVICE).t()  # [40, 30], strides (1, 40)
    dst_full = torch.full((store_m, store_n + 10), NAN, dtype=torch.float32, device=DEVICE)
    dst = dst_full[:, 5:5 + store_n]
    grid = (triton.cdiv(store_m, 32), triton.cdiv(store_n, 16))
    _copy_kernel[grid](src, dst, load_m, load_n, store_m, store_n, *src.stride(), *dst.stride(),
                       BLOCK_M=32, BLOCK_N=16)
    expected = torch.zeros(store_m, store_n, device=DEVICE)
    expected[:load_m, :load_n] = src.float()
    assert torch.equal(dst, expected)
    assert torch.isnan(dst_full[:, :5]).all() and torch.isnan(dst_full[:, 5 + store_n:]).all()


# ------------------------------------------------------------------------------------------------
# Config
# ------------------------------------------------------------------------------------------------


def test_config_round_trip_and_replace():
    d = CFG.to_dict()
    assert list(d) == ["BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages",
                       "GEMM_SMS", "COMM_SMS", "SPLIT_K", "WARP_SPEC"]
    assert Config.from_dict(d) == CFG
    del d["SPLIT_K"]  # a field with a default may be left out
    assert Config.from_dict(d).SPLIT_K == 1
    d["SPLIT_K"] = 1
    assert CFG.replace(COMM_SMS=2).COMM_SMS == 2 and CFG.COMM_SMS == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        CFG.BLOCK_M = 128
    with pytest.raises(ValueError, match="unknown field"):
        CFG.replace(BLOCK=32)
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['block_m'\]"):
        Config.from_dict({**d, "block_m": 64})
    d.pop("GEMM_SMS")
    with pytest.raises(ValueError, match=r"missing key\(s\) \['GEMM_SMS'\]"):
        Config.from_dict(d)


@pytest.mark.parametrize("field, value, error", [
    ("BLOCK_M", 48, ValueError),
    ("BLOCK_N", 8, ValueError),
    ("BLOCK_K", 512, ValueError),
    ("GROUP_M", 0, ValueError),
    ("num_warps", 3, ValueError),
    ("num_stages", 0, ValueError),
    ("GEMM_SMS", 0, ValueError),
    ("COMM_SMS", -1, ValueError),
    ("SPLIT_K", 0, ValueError),
    ("SPLIT_K", MAX_SPLIT_K + 1, ValueError),
    ("SPLIT_K", 2.0, TypeError),
    ("WARP_SPEC", 2, ValueError),
    ("BLOCK_M", 64.0, TypeError),
    ("num_warps", True, TypeError),
])
def test_config_validation_names_the_field(field, value, error):
    with pytest.raises(error, match=f"Config.{field}"):
        CFG.replace(**{field: value})


@pytest.mark.parametrize("changes", [dict(num_warps=8), dict(BLOCK_M=32), dict(BLOCK_M=64, BLOCK_N=256)],
                         ids=["8_warps", "32_rows", "64x256"])
def test_warp_spec_config_takes_a_warp_group_and_a_tile_that_specializes(changes):
    CFG.replace(WARP_SPEC=1)  # 64x64, 4 warps
    Config.from_dict({**CFG.to_dict(), "BLOCK_M": 128, "BLOCK_N": 256, "WARP_SPEC": 1})
    with pytest.raises(ValueError, match=r"Config.WARP_SPEC=1 takes num_warps=4"):
        CFG.replace(WARP_SPEC=1, **changes)


def test_default_config_heuristic():
    big = default_config(8192, 8192, 8192, torch.bfloat16, num_sms=132, interpreter=False, comm=False)
    assert (big.BLOCK_M, big.BLOCK_N, big.BLOCK_K, big.GROUP_M) == (128, 256, 64, 8)
    assert (big.num_warps, big.num_stages, big.GEMM_SMS, big.COMM_SMS, big.WARP_SPEC) == (8, 3, 132, 0, 0)

    comm = default_config(8192, 8192, 8192, torch.bfloat16, num_sms=132, interpreter=False, comm=True)
    assert comm.COMM_SMS == 16 and comm.GEMM_SMS == 116
    assert default_config(8192, 8192, 8192, torch.float32, num_sms=132, interpreter=False,
                          comm=False).BLOCK_K == 32
    small = default_config(1024, 1024, 1024, torch.float16, num_sms=132, interpreter=False, comm=False)
    assert (small.BLOCK_M, small.BLOCK_N, small.num_warps) == (128, 128, 4)
    skinny = default_config(16, 4096, 4096, torch.float16, num_sms=132, interpreter=False, comm=False)
    assert skinny.BLOCK_M == 16

    cpu = default_config(100, 72, 20, torch.float16, num_sms=8, interpreter=True, comm=True)
    assert (cpu.BLOCK_M, cpu.BLOCK_N, cpu.BLOCK_K) == (64, 64, 32)
    assert (cpu.num_stages, cpu.GEMM_SMS, cpu.COMM_SMS) == (1, 4, 2)
    for cfg in (big, comm, small, skinny):
        check_config_fits(cfg, 132)
    check_config_fits(cpu, 8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_default_config_narrow_decode_tiles(dtype):
    """Without split-K at M <= 64 (the fused variants): BLOCK_N is the widest tile whose tiles fill
    DECODE_WAVE_SHARE of the GEMM programs (or 16), deep K steps, stages within 200 KiB."""
    from tilefuse.ops.common.config import DECODE_WAVE_SHARE

    for comm in (False, True):
        for M in (1, 5, 16, 33, 64):
            for N, K in ((4096, 8192), (8192, 4096), (14336, 4096), (6144, 4096), (1000, 8000), (64, 96)):
                cfg = default_config(M, N, K, dtype, num_sms=132, interpreter=False, comm=comm)
                check_config_fits(cfg, 132)
                assert cfg.SPLIT_K == 1 and cfg.BLOCK_M == max(16, triton.next_power_of_2(M)), (M, N, K, cfg)
                tiles = triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N)
                wider = triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(N, 2 * cfg.BLOCK_N)
                assert tiles >= DECODE_WAVE_SHARE * cfg.GEMM_SMS or cfg.BLOCK_N == 16 or N <= cfg.BLOCK_N, cfg
                assert cfg.BLOCK_N == 128 or wider < DECODE_WAVE_SHARE * cfg.GEMM_SMS, (M, N, K, cfg)
                assert cfg.BLOCK_K >= min(128, triton.next_power_of_2(K)), (M, N, K, cfg)
                stage_bytes = (cfg.BLOCK_M + cfg.BLOCK_N) * cfg.BLOCK_K * dtype.itemsize * cfg.num_stages
                assert stage_bytes <= 200 * 1024, (M, N, K, cfg)
    one = default_config(1, 4096, 8192, dtype, num_sms=132, interpreter=False, comm=False)
    assert (one.BLOCK_M, one.BLOCK_N, one.BLOCK_K, one.num_stages) == (16, 32, 256, 4)
    wide = default_config(64, 14336, 4096, dtype, num_sms=132, interpreter=False, comm=False)
    assert (wide.BLOCK_N, wide.BLOCK_K) == (128, 128)


def test_default_config_core_splits_few_tiles():
    """The GEMM core's default (``core``): the tiles of the config without split-K, and where they fill at
    most half a wave, 2 to CORE_MAX_SPLIT K slices that keep them in one wave; elsewhere, and in the
    interpreter, whole tiles."""
    from tilefuse.ops.common.config import CORE_MAX_SPLIT

    split = 0
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        for M in (16, 128, 333, 1000, 4096):
            for N, K in ((1000, 8000), (4096, 4096), (14336, 4096)):
                whole = default_config(M, N, K, dtype, num_sms=132, interpreter=False, comm=False)
                core = default_config(M, N, K, dtype, num_sms=132, interpreter=False, comm=False, core=True)
                check_config_fits(core, 132)
                assert core.replace(SPLIT_K=1) == whole, (M, N, K, dtype)
                tiles = triton.cdiv(M, whole.BLOCK_M) * triton.cdiv(N, whole.BLOCK_N)
                if 2 * tiles <= whole.GEMM_SMS:
                    assert 1 < core.SPLIT_K <= CORE_MAX_SPLIT and tiles * core.SPLIT_K <= whole.GEMM_SMS, core
                    split += 1
                else:
                    assert core.SPLIT_K == 1, (M, N, K, dtype, core)
    assert split >= 6  # the grid has few-tile shapes
    assert default_config(333, 1000, 8000, torch.bfloat16, num_sms=8, interpreter=True, comm=False,
                          core=True).SPLIT_K == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_default_config_small_m_tiles(dtype):
    """Without split-K at 64 < M <= 256: the largest SMALL_M_TILES tile whose tiles keep
    SMALL_M_WAVE_USE of their waves busy (else the best-filling one); on the six shapes of the sweep
    (docs/perf/2026-12-01_h200_ws1_gemm_small_no_split_bf16.csv) that is the tile that measured best."""
    from tilefuse.ops.common.config import SMALL_M_TILES, SMALL_M_WAVE_USE, wave_use

    measured_best = {(128, 4096, 8192): (64, 64, 128, 6), (128, 14336, 4096): (128, 128, 64, 6),
                     (128, 4096, 14336): (64, 64, 128, 6), (256, 4096, 8192): (64, 128, 128, 4),
                     (256, 14336, 4096): (128, 128, 64, 6), (256, 4096, 14336): (64, 128, 128, 4)}
    for (M, N, K), want in measured_best.items():
        cfg = default_config(M, N, K, dtype, num_sms=132, interpreter=False, comm=False)
        assert (cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K, cfg.num_stages, cfg.num_warps) == (*want, 4), (M, N, K, cfg)
    for comm in (False, True):
        for M in (65, 100, 128, 129, 200, 256):
            for N, K in ((4096, 8192), (8192, 4096), (14336, 4096), (1000, 8000), (64, 96)):
                cfg = default_config(M, N, K, dtype, num_sms=132, interpreter=False, comm=comm)
                check_config_fits(cfg, 132)
                assert cfg.SPLIT_K == 1 and not cfg.WARP_SPEC
                stage_bytes = (cfg.BLOCK_M + cfg.BLOCK_N) * cfg.BLOCK_K * dtype.itemsize * cfg.num_stages
                assert stage_bytes <= 200 * 1024, (M, N, K, cfg)
                cols = max(16, triton.next_power_of_2(N))  # a tile is never wider than N rounded up
                uses = [wave_use(triton.cdiv(M, bm) * triton.cdiv(N, min(bn, cols)), cfg.GEMM_SMS)
                        for bm, bn, _, _ in SMALL_M_TILES]
                shapes = [(bm, min(bn, cols)) for bm, bn, _, _ in SMALL_M_TILES]
                i = shapes.index((cfg.BLOCK_M, cfg.BLOCK_N))
                if uses[i] >= SMALL_M_WAVE_USE:  # the largest that fills enough
                    assert all(u < SMALL_M_WAVE_USE for u in uses[:i]), (M, N, cfg, uses)
                else:  # none fills enough: none fills more
                    assert uses[i] == max(uses), (M, N, cfg, uses)
    fp32 = default_config(128, 4096, 8192, torch.float32, num_sms=132, interpreter=False, comm=False)
    assert (fp32.BLOCK_M, fp32.BLOCK_N) == (64, 128)  # fp32 keeps the tiles of before
    interp = default_config(128, 4096, 8192, dtype, num_sms=132, interpreter=True, comm=False)
    assert interp.BLOCK_N <= 64


def test_default_config_split_k_takes_whole_tiles_at_small_m():
    """The GEMM core's split-K default at M = 64 and 128 takes the variants' whole-K tiles where
    they keep SPLIT_FREE_WAVE_USE of their waves busy: on the parity grid's shapes that is where
    they measured faster (docs/perf/2026-12-01_h200_ws1_gemm_parity_small_m_*.csv), split-K where
    the tiles are few (and at 128x5000x3500, where the few-tile split measured faster:
    docs/perf/2026-12-01_h200_ws1_gemm_few_tiles_bf16.csv)."""
    split_faster = {(64, 5000, 3500), (64, 1000, 8000), (128, 1000, 8000), (128, 5000, 3500)}
    for M in (64, 128):
        for N, K in PARITY_NK:
            cfg = default_config(M, N, K, torch.bfloat16, num_sms=132, interpreter=False, comm=False, split_k=True)
            plain = default_config(M, N, K, torch.bfloat16, num_sms=132, interpreter=False, comm=False)
            whole = (cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K, cfg.num_stages, cfg.SPLIT_K) == \
                (plain.BLOCK_M, plain.BLOCK_N, plain.BLOCK_K, plain.num_stages, 1)
            assert whole == ((M, N, K) not in split_faster), (M, N, K, cfg)
    for M in (32, 256, 1024):  # outside 64..128 (and past the pointer-loaded decode tiles) as before
        cfg = default_config(M, 1000, 8000, torch.bfloat16, num_sms=132, interpreter=False, comm=False, split_k=True)
        assert cfg.BLOCK_K == 64, (M, cfg)
    fp32 = default_config(128, 4096, 4096, torch.float32, num_sms=132, interpreter=False, comm=False, split_k=True)
    assert fp32.BLOCK_K == 32


def test_default_config_few_tiles_split_into_a_wave():
    """Past M = 64 where 128x128 tiles are few, the GEMM core's split-K default is the tile and K
    split that won the few-tile sweep (docs/perf/2026-12-01_h200_ws1_gemm_few_tiles_bf16.csv):
    128x128 in 2-4 slices from M = 333, 64x64 in 4 slices at 128x1000x8000, 128x128 in 3 slices at
    128x5000x3500; tiles x slices never exceed a wave, nor slices 4."""
    from tilefuse.ops.common.config import FEW_TILES_MAX_SPLIT

    expect = {(128, 1000, 8000): (64, 64, 4), (128, 5000, 3500): (128, 128, 3), (333, 1000, 8000): (128, 128, 4),
              (512, 1000, 8000): (128, 128, 4), (1000, 1000, 8000): (128, 128, 2), (1024, 1000, 8000): (128, 128, 2)}
    for (M, N, K), tile in expect.items():
        cfg = default_config(M, N, K, torch.bfloat16, num_sms=132, interpreter=False, comm=False, split_k=True)
        assert (cfg.BLOCK_M, cfg.BLOCK_N, cfg.SPLIT_K) == tile, (M, N, K, cfg)
        tiles = -(-M // cfg.BLOCK_M) * -(-N // cfg.BLOCK_N)
        assert tiles * cfg.SPLIT_K <= 132 and cfg.SPLIT_K <= FEW_TILES_MAX_SPLIT
    many = default_config(1024, 4096, 4096, torch.bfloat16, num_sms=132, interpreter=False, comm=False, split_k=True)
    assert many.SPLIT_K == 1  # enough tiles: no split


def test_default_config_mid_m_stages():
    """128x128 tiles of 16-bit values take MID_M_STAGES stages below M = 1000, with and without
    split-K (docs/perf/2026-12-01_h200_ws1_gemm_no_split_mid_bf16.csv); fp32 keeps fewer."""
    from tilefuse.ops.common.config import MID_M_STAGES

    for split_k in (False, True):
        cfg = default_config(333, 4096, 4096, torch.bfloat16, num_sms=132, interpreter=False, comm=False,
                             split_k=split_k)
        assert (cfg.BLOCK_M, cfg.BLOCK_N, cfg.num_stages) == (128, 128, MID_M_STAGES), cfg
    fp32 = default_config(333, 4096, 4096, torch.float32, num_sms=132, interpreter=False, comm=False)
    assert fp32.num_stages <= 4


# The parity grid of benchmarks/gemm.py: small M with large K, ragged N and K.
PARITY_MS = (16, 64, 128, 333, 512, 1000, 1024, 4096, 8192)
PARITY_NK = ((4096, 4096), (14336, 4096), (4096, 14336), (6144, 4096), (5000, 3500), (1000, 8000))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_default_config_split_k_rule(dtype):
    """Every split the heuristic picks fits one wave of GEMM programs, keeps MIN_SLICE_STEPS K steps
    per slice and is at most 8; decode sizes take one row of tiles and split where tiles are few,
    large M does not split; without split_k nothing changes."""
    from tilefuse.ops.common.config import _whole_tile_instead_of_split

    for comm in (False, True):
        for M in PARITY_MS:
            for N, K in PARITY_NK:
                cfg = default_config(M, N, K, dtype, num_sms=132, interpreter=False, comm=comm, split_k=True)
                check_config_fits(cfg, 132)
                tiles = triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N)
                steps = triton.cdiv(K, cfg.BLOCK_K)
                assert cfg.SPLIT_K <= 8, (M, N, K, cfg)
                if cfg.SPLIT_K > 1:
                    assert tiles * cfg.SPLIT_K <= cfg.GEMM_SMS, (M, N, K, cfg)
                    assert steps >= cfg.SPLIT_K * MIN_SLICE_STEPS, (M, N, K, cfg)
                whole = _whole_tile_instead_of_split(M, N, K, dtype, cfg.GEMM_SMS, False)
                if whole is not None:  # the variants' whole-K tile (its own test)
                    assert cfg.SPLIT_K == 1 and (cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K) == whole[:3], (M, N, K, cfg)
                elif M <= 64:
                    assert cfg.BLOCK_M == max(16, triton.next_power_of_2(M)) and cfg.BLOCK_N in (64, 128)
                if M >= 4096:
                    assert cfg.SPLIT_K == 1, (M, N, K, cfg)
                stage_bytes = (cfg.BLOCK_M + cfg.BLOCK_N) * cfg.BLOCK_K * dtype.itemsize * cfg.num_stages
                assert stage_bytes <= 200 * 1024, (M, N, K, cfg)
                plain = default_config(M, N, K, dtype, num_sms=132, interpreter=False, comm=comm)
                assert plain.SPLIT_K == 1
    decode = default_config(16, 4096, 4096, dtype, num_sms=132, interpreter=False, comm=False, split_k=True)
    if dtype.itemsize == 2:  # the pointer-loaded decode tiles, split within a wave
        assert (decode.BLOCK_M, decode.BLOCK_N, decode.BLOCK_K, decode.num_stages, decode.SPLIT_K) == \
            (16, 64, 256, 3, 2), decode
        assert pointer_tiles(decode, dtype)
    else:
        assert decode.SPLIT_K == 4 and (decode.BLOCK_M, decode.BLOCK_N) == (16, 128)
        assert not pointer_tiles(decode, dtype)
    narrow = default_config(16, 1000, 8000, dtype, num_sms=132, interpreter=False, comm=False, split_k=True)
    assert (narrow.BLOCK_N, narrow.SPLIT_K) == (64, 8)  # 8 tiles of 128 would need 16 slices
    down = default_config(128, 1000, 8000, dtype, num_sms=132, interpreter=False, comm=False, split_k=True)
    assert (down.BLOCK_M, down.BLOCK_N, down.SPLIT_K) == (64, 64, 4)  # few tiles: K slices (FEW_TILES)
    few = default_config(512, 1000, 8000, dtype, num_sms=132, interpreter=False, comm=False, split_k=True)
    assert (few.BLOCK_M, few.BLOCK_N, few.SPLIT_K) == (128, 128, 4)
    if dtype.itemsize <= 2:
        assert few.num_stages == MID_M_STAGES  # 128x128 slices of 16-bit values: the mid-M stages
    # K's rows off the descriptor path (3500 values of 2 bytes): the 4 stages measured there
    ragged = default_config(128, 5000, 3500, dtype, num_sms=132, interpreter=False, comm=False, split_k=True)
    assert (ragged.BLOCK_M, ragged.BLOCK_N, ragged.SPLIT_K) == (128, 128, 3)
    if dtype.itemsize == 2:
        assert ragged.num_stages == 4
    big = default_config(8192, 8192, 8192, dtype, num_sms=132, interpreter=False, comm=False, split_k=True)
    assert big.SPLIT_K == 1 and (big.BLOCK_M, big.BLOCK_N) == (128, 256)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_default_config_warp_specialized_tiles(dtype):
    """The GEMM core's tiles above the small-M classes (16-bit dtypes): warp-specialized 128x256 (4
    warps a group, 4 stages) unless 128x128 tiles (MID_M_STAGES stages) keep over 2 % more of their
    last wave busy; fp32 never specializes; the configs without split-K (the variants') never do."""
    from tilefuse.ops.common.config import MID_M_STAGES, wave_use

    assert wave_use(132, 132) == 1.0 and wave_use(133, 132) == 133 / 264 and wave_use(66, 132) == 0.5
    seen = set()
    for M in PARITY_MS:
        for N, K in PARITY_NK:
            cfg = default_config(M, N, K, dtype, num_sms=132, interpreter=False, comm=False, split_k=True)
            plain = default_config(M, N, K, dtype, num_sms=132, interpreter=False, comm=True)
            assert plain.WARP_SPEC == 0, (M, N, K, plain)
            if dtype == torch.float32 or M <= 128:
                assert cfg.WARP_SPEC == 0, (M, N, K, cfg)
                continue
            if cfg.WARP_SPEC:
                assert (cfg.BLOCK_M, cfg.BLOCK_N, cfg.num_warps, cfg.num_stages, cfg.SPLIT_K) == (128, 256, 4, 4, 1)
                use = wave_use(triton.cdiv(M, 128) * triton.cdiv(N, 256), 132)
                assert use >= wave_use(triton.cdiv(M, 128) * triton.cdiv(N, 128), 132) - 0.02, (M, N, K)
            elif cfg.BLOCK_M == 128 and cfg.SPLIT_K == 1:
                assert (cfg.BLOCK_N, cfg.num_warps, cfg.num_stages) == (128, 4, MID_M_STAGES), (M, N, K, cfg)
            seen.add((cfg.BLOCK_N, cfg.WARP_SPEC))
    if dtype != torch.float32:
        assert seen == {(128, 0), (256, 1)}, seen
        # 1000 x 14336: 448 tiles of 128x256 fill 85 % of their last wave, 896 of 128x128 97 %.
        mid = default_config(1000, 14336, 4096, dtype, num_sms=132, interpreter=False, comm=False, split_k=True)
        assert (mid.BLOCK_N, mid.WARP_SPEC, mid.num_stages) == (128, 0, MID_M_STAGES)
        wide = default_config(4096, 4096, 4096, dtype, num_sms=132, interpreter=False, comm=False, split_k=True)
        assert (wide.BLOCK_N, wide.WARP_SPEC) == (256, 1)


def test_matmul_warp_spec_tile_without_specialization_gets_the_consumer_warps(monkeypatch):
    """A warp-specialized config that cannot specialize (the interpreter, or operands off the
    descriptor path) runs with twice its warps: the two consumer groups' warps it would have had."""
    from tilefuse.ops.common import gemm

    seen = {}

    class Fake:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.update(kwargs)

    monkeypatch.setattr(gemm, "matmul_kernel", Fake())
    a = torch.zeros(8, 16, device=DEVICE)
    b = torch.zeros(16, 8, device=DEVICE)
    c = torch.zeros(8, 8, device=DEVICE)
    matmul(a, b, c, CFG.replace(WARP_SPEC=1), tma=False)
    assert (seen["num_warps"], seen["WARP_SPEC"]) == (8, False)
    matmul(a, b, c, CFG, tma=False)
    assert (seen["num_warps"], seen["WARP_SPEC"]) == (4, False)


def test_split_k_for():
    assert split_k_for(tiles=32, steps=64, programs=132) == 4
    assert split_k_for(tiles=33, steps=64, programs=132) == 4
    assert split_k_for(tiles=34, steps=64, programs=132) == 3
    assert split_k_for(tiles=200, steps=64, programs=132) == 1
    assert split_k_for(tiles=1, steps=1000, programs=132) == MAX_SPLIT_K
    assert split_k_for(tiles=1, steps=2 * MIN_SLICE_STEPS + 1, programs=132) == 2  # slices keep their steps


def test_check_variant_config():
    check_variant_config("op", "fused_sequential", CFG)
    for variant in SPLIT_K_VARIANTS:
        check_variant_config("op", variant, CFG.replace(SPLIT_K=3))
    with pytest.raises(ValueError, match="^gemm_all_scatter: Config.SPLIT_K=3 is for .*wg_specialized computes"):
        check_variant_config("gemm_all_scatter", "wg_specialized", CFG.replace(SPLIT_K=3))
    for op, variant in ONE_WAVE_SPLIT_K:  # split-K in the variant's own kernel (its set-up checks the rest)
        check_variant_config(op, variant, CFG.replace(SPLIT_K=3))
    with pytest.raises(ValueError, match="^gemm_reduce_scatter: Config.SPLIT_K=3 is for .*fused_sequential computes"):
        check_variant_config("gemm_reduce_scatter", "fused_sequential", CFG.replace(SPLIT_K=3))


def test_check_config_fits():
    cfg = CFG.replace(GEMM_SMS=128, COMM_SMS=8)
    check_config_fits(cfg, 136)
    msg = r"GEMM_SMS \+ COMM_SMS = 136 exceeds the 132 multiprocessors of cuda:0"
    with pytest.raises(ValueError, match=msg):
        check_config_fits(cfg, 132, "cuda:0")


# ------------------------------------------------------------------------------------------------
# Argument checks
# ------------------------------------------------------------------------------------------------


def test_checks_pass_on_good_inputs():
    a, b = torch.randn(64, 56), torch.randn(56, 8)
    check_matrix("op", "a", a)
    check_same_device("op", a=a, b=b)
    check_dtypes("op", a=a, b=b)
    check_inner_dim("op", a, b)
    check_divisible("op", "M", 64, 4, "the world size")


def test_check_errors_name_the_argument():
    a, b = torch.randn(64, 64), torch.randn(56, 8)
    msg = r"^gemm_all_scatter: b has 56 rows but a has 64 columns \(K must match\)$"
    with pytest.raises(ValueError, match=msg):
        check_inner_dim("gemm_all_scatter", a, b)
    with pytest.raises(ValueError, match="^op: w has 56 rows but x has 64 columns"):
        check_inner_dim("op", a, b, a_name="x", b_name="w")
    with pytest.raises(TypeError, match="^op: a must be a torch.Tensor, got list$"):
        check_matrix("op", "a", [[1.0]])
    with pytest.raises(ValueError, match=r"^op: b must be a 2-D matrix, got shape \(2, 3, 4\)$"):
        check_matrix("op", "b", torch.randn(2, 3, 4))
    with pytest.raises(TypeError, match="^op: b has dtype torch.float16 but a has dtype torch.float32$"):
        check_dtypes("op", a=a, b=b.half())
    with pytest.raises(TypeError, match="^op: a has dtype torch.float64; supported dtypes are float16, bf"):
        check_dtypes("op", a=a.double(), b=b.double())
    with pytest.raises(ValueError, match=r"^op: M = 100 must be divisible by the world size \(3\)$"):
        check_divisible("op", "M", 100, 3, "the world size")
    with pytest.raises(ValueError, match="^op: b is on meta but a is on cpu$"):
        check_same_device("op", a=a, b=torch.empty(1, device="meta"))


def test_matmul_takes_the_call_tuple(monkeypatch):
    """``matmul``'s ``call`` (``launch.call_arg``'s 11-tuple) reaches the kernel as its one ``call``
    argument, which then begins (``enter``) and ends the call; with ``ctl`` alone (a begin kernel
    began the call) the kernel reads only the control block, through a stand-in tuple."""
    from tilefuse.ops.common import gemm

    seen = {}

    class Fake:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.update(args=args, kwargs=kwargs)

    monkeypatch.setattr(gemm, "matmul_kernel", Fake())
    a, b, c = torch.zeros(8, 16, device=DEVICE), torch.zeros(16, 8, device=DEVICE), torch.zeros(8, 8, device=DEVICE)
    ctl = torch.zeros(16, dtype=torch.int64, device=DEVICE)
    call = (torch.zeros(2, dtype=torch.int64, device=DEVICE), ctl, 1, 2, 7, 3, c, 64, c, 0, ctl)
    matmul(a, b, c, CFG, ctl, call=call, enter=True, barrier=True, tma=False)
    flags = {k: seen["kwargs"][k] for k in ("IN_CALL", "ENTER", "END", "BARRIER")}
    assert seen["args"][10] is call and all(flags.values()), flags
    matmul(a, b, c, CFG, ctl, enter=True, barrier=True, tma=False)
    flags = {k: seen["kwargs"][k] for k in ("IN_CALL", "ENTER", "END", "BARRIER")}
    assert len(seen["args"][10]) == 11 and seen["args"][10][1] is ctl
    assert flags == {"IN_CALL": True, "ENTER": False, "END": False, "BARRIER": False}, flags


def test_common_kernels_take_at_most_30_parameters():
    """No Triton function in ops/common takes more than 30 parameters, and the GEMM core's kernel
    takes the call protocol as its one ``call`` argument, none of the protocol's parts."""
    import ast
    import pathlib

    import tilefuse.ops.common as common

    params = {}
    for path in pathlib.Path(common.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            decorators = [ast.unparse(d) for d in getattr(node, "decorator_list", [])]
            if isinstance(node, ast.FunctionDef) and any("jit" in d or d.endswith("kernel") for d in decorators):
                params[f"{path.name}:{node.name}"] = [arg.arg for arg in node.args.args]
    assert "gemm.py:matmul_kernel" in params
    assert {name: len(p) for name, p in params.items() if len(p) > 30} == {}
    flat = {"heap_bases", "ctl_ptr", "cur_rank", "world", "sig", "gen", "out0_ptr", "n_out0", "out1_ptr", "n_out1",
            "status_ptr"}
    assert "call" in params["gemm.py:matmul_kernel"] and not flat & set(params["gemm.py:matmul_kernel"])
