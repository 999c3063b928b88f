"""Float8 operands with scales (``scale_a=``, ``scale_b=``, ``out_dtype=``): every op and variant
against the fp32 reference of the dequantized operands, tensor-wise and row-wise, ragged shapes; the
errors of bad scales; forward only; torch.compile of a float8 call.

On the CPU the kernels run in Triton's interpreter (float16 and float32 results: it computes bfloat16
wrong); on GPUs (``TILEFUSE_TEST_DEVICE=cuda``, ranks sharing one GPU) the results are bfloat16.
"""

import contextlib
import functools

import pytest
import torch
from ophelpers import assert_matches, poison_workspaces

import tilefuse
from tilefuse.ops import registry

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
OPS = ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce")


def _quantized(shape, seed, dtype=E4M3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 2).to(dtype)


def _scale(shape, seed) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) + 0.5).float()


def _operands(ctx, op: str, rowwise: bool, seed: int, b_dtype=E4M3) -> tuple:
    """``(a, b, scale_a, scale_b)`` of rank ``ctx.rank`` for ``op``, ragged: replicated operands (and
    their scales) the same on every rank, sharded ones differing by rank (K shards of differing sizes
    for gemm_all_reduce)."""
    W, r = ctx.world, ctx.rank
    mine = seed * 100 + r + 1
    if op == "gemm_all_scatter":  # a replicated, b a column shard
        (M, K, N), a_seed, b_seed = (20, 40, 24), seed, mine
    elif op == "all_gather_gemm":  # a a row shard, b replicated
        (M, K, N), a_seed, b_seed = (12, 40, 24), mine, seed
    elif op == "gemm_reduce_scatter":  # K shards
        (M, K, N), a_seed, b_seed = (10 * W, 40, 24), mine, mine + 50
    else:
        (M, K, N), a_seed, b_seed = (20, 24 + 8 * r, 40), mine, mine + 50
    a, b = _quantized((M, K), a_seed), _quantized((K, N), b_seed, b_dtype)
    if rowwise:
        scale_a, scale_b = _scale((M, 1), a_seed + 7), _scale((1, N), b_seed + 7)
    else:
        scale_a, scale_b = _scale((), a_seed + 7), _scale((), b_seed + 7)
    return a.to(ctx.device), b.to(ctx.device), scale_a.to(ctx.device), scale_b.to(ctx.device)


def _out_dtypes(ctx) -> tuple:
    return (torch.bfloat16,) if ctx.on_gpu else (torch.float32, torch.float16)


def job_against_reference(ctx, cases) -> int:
    """Each ``(op, variant, rowwise)`` of ``cases`` on this rank against the reference; the number
    checked."""
    seed = 0
    for op, variant, rowwise in cases:
        for out_dtype in _out_dtypes(ctx):
            seed += 1
            b_dtype = E5M2 if seed % 3 == 0 else E4M3  # one operand may be e5m2
            a, b, sa, sb = _operands(ctx, op, rowwise, seed, b_dtype)
            kw = dict(scale_a=sa, scale_b=sb, out_dtype=out_dtype)
            ref = registry.get(op, "reference")(a, b, **kw)
            poison_workspaces()
            if variant == "auto":  # the public function (auto: plain where nothing was measured)
                got = getattr(tilefuse, op)(a, b, **kw)
            else:
                got = registry.get(op, variant)(a, b, **kw)
            tilefuse.synchronize()
            mode = "row-wise" if rowwise else "tensor-wise"
            what = f"{op} {variant} {mode} {tuple(a.shape)}x{tuple(b.shape)} {b_dtype} -> {out_dtype}"
            assert_matches(got, ref, out_dtype, a.shape[1], ctx.on_gpu, what, scale=8 * ctx.world)
            if op == "gemm_all_scatter" and variant != "auto":  # into a heap out= of out_dtype
                out = tilefuse.empty(*ref.shape, dtype=out_dtype)
                assert registry.get(op, variant)(a, b, out=out, **kw) is out, what
                tilefuse.synchronize()
                assert_matches(out, ref, out_dtype, a.shape[1], ctx.on_gpu, f"{what} out=", scale=8 * ctx.world)
            if op == "all_gather_gemm" and variant != "auto":  # the gathered float8 rows, bit for bit
                got, gathered = registry.get(op, variant)(a, b, return_gathered=True, **kw)
                ref_gathered = registry.get(op, "reference")(a, b, return_gathered=True, **kw)[1]
                assert gathered.dtype == a.dtype and torch.equal(gathered.view(torch.uint8),
                                                                 ref_gathered.view(torch.uint8)), what
                assert_matches(got, ref, out_dtype, a.shape[1], ctx.on_gpu, f"{what} return_gathered",
                               scale=8 * ctx.world)
            if op == "gemm_all_reduce":  # the same bits on every rank
                every = [torch.empty_like(got) for _ in range(ctx.world)]
                torch.distributed.all_gather(every, got.contiguous(), group=ctx.heap.group)
                assert all(torch.equal(x, got) for x in every), f"{what}: ranks differ"
    tilefuse.barrier()
    return len(cases)


def _cases(variants, modes=(False, True)) -> list:
    return [(op, v, rw) for op in OPS for v in variants(op) for rw in modes]


def _all_variants(op):
    return tuple(v for v in registry.variants(op) if v != "reference") + ("auto",)


# make test: every op at W = 2, one fused variant each, both scalings, and the plain and public
# (auto) paths (one rank launch).
QUICK = [(op, v, rw) for op, v in (("gemm_all_scatter", "fused_sequential"), ("all_gather_gemm", "producer_consumer"),
                                   ("gemm_reduce_scatter", "wg_specialized"), ("gemm_all_reduce", "fused_sequential"))
         for rw in (False, True)] + [("all_gather_gemm", "plain", True), ("gemm_reduce_scatter", "auto", False),
                                     ("gemm_all_scatter", "plain", True)]


def test_every_op_matches_reference_quick(pools):
    assert pools.run(2, job_against_reference, QUICK) == [len(QUICK)] * 2
    alone = _cases(lambda op: ("plain",))  # one rank: the plain path is the matmul alone
    assert pools.run(1, job_against_reference, alone) == [len(alone)]


def job_all_reduce_with_bias(ctx, variants) -> list:
    """gemm_all_reduce in float8 with a bias: the fp32 sum plus the bias, rounded once, the same bits on
    every rank; per variant the largest difference from the reference."""
    errors = []
    for i, variant in enumerate(variants):
        a, b, sa, sb = _operands(ctx, "gemm_all_reduce", i % 2 == 1, 40 + i)
        out_dtype = _out_dtypes(ctx)[-1]
        bias = (torch.randn(b.shape[1], generator=torch.Generator().manual_seed(9)) * 4).to(out_dtype).to(ctx.device)
        kw = dict(bias=bias, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
        ref = registry.get("gemm_all_reduce", "reference")(a, b, **kw)
        got = registry.get("gemm_all_reduce", variant)(a, b, **kw)
        tilefuse.synchronize()
        assert_matches(got, ref, out_dtype, a.shape[1], ctx.on_gpu, f"{variant} + bias", scale=8 * ctx.world)
        every = [torch.empty_like(got) for _ in range(ctx.world)]
        torch.distributed.all_gather(every, got.contiguous(), group=ctx.heap.group)
        assert all(torch.equal(x, got) for x in every), f"{variant} + bias: ranks differ"
        errors.append((got.float() - ref.float()).abs().max().item())
    tilefuse.barrier()
    return errors


def test_all_reduce_with_bias(pools):
    assert len(pools.run(2, job_all_reduce_with_bias, ("plain", "fused_sequential"))[0]) == 2


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_every_variant_matches_reference(pools, world):
    cases = _cases(_all_variants)
    assert pools.run(world, job_against_reference, cases) == [len(cases)] * world


def _bad_calls(ctx) -> list:
    """``(what, call, error type, message pattern)`` of float8 calls every rank makes wrong alike."""
    a, b, sa, sb = _operands(ctx, "gemm_all_reduce", True, 1)
    half = torch.randn(b.shape, device=ctx.device).half()
    return [
        ("no scales", dict(), ValueError, "float8 operands need both scale_a= and scale_b=.*scale_a and scale_b"),
        ("scale_a only", dict(scale_a=sa), ValueError, "scale_b missing"),
        ("fp16 scale", dict(scale_a=sa.half(), scale_b=sb), TypeError, "scale_a must be float32, got torch.float16"),
        ("scale shape", dict(scale_a=sa, scale_b=sb[:, :-1]), ValueError,
         r"scale_b has shape \(1, 39\); expected one element \(tensor-wise\) or \[1, 40\] \(row-wise\)"),
        ("scale a tensor", dict(scale_a=2.0, scale_b=sb), TypeError, "scale_a must be a torch.Tensor, got float"),
        ("out_dtype", dict(scale_a=sa, scale_b=sb, out_dtype=torch.int8), TypeError, "out_dtype must be one of"),
        ("float16 b", dict(b=half, scale_a=sa, scale_b=sb), TypeError,
         "b has dtype torch.float16 next to the float8 a"),
        ("float16 a", dict(a=a.half()), TypeError, "a has dtype torch.float16 next to the float8 b"),
        ("scales of float16", dict(a=a.half(), b=half, scale_a=sa, scale_b=sb), TypeError,
         "scale_a is for float8 operands"),
        ("two e5m2", dict(a=a.to(E5M2), b=b.to(torch.float32).to(E5M2), scale_a=sa, scale_b=sb), TypeError,
         "both operands are float8_e5m2"),
    ], (a, b, sa, sb)


def job_bad_inputs(ctx, variants) -> int:
    """Every bad call of :func:`_bad_calls` raises its error on this rank, for each of ``variants``
    (the public function for "auto"), and a good call works after them."""
    import re

    bad, (a, b, sa, sb) = _bad_calls(ctx)
    checked = 0
    for variant in variants:
        fn = functools.partial(tilefuse.gemm_all_reduce, variant=variant)
        for what, kw, error, pattern in bad:
            kw = dict(kw)
            x, y = kw.pop("a", a), kw.pop("b", b)
            with pytest.raises(error) as info:
                fn(x, y, **kw)
            assert re.search(pattern, str(info.value)), f"{variant} {what}: {info.value}"
            checked += 1
        if not ctx.on_gpu and variant not in ("plain", "auto"):  # kernels here (auto: plain, nothing measured)
            with pytest.raises(TypeError, match="bfloat16 on the CPU backend"):  # the interpreter's bf16 is wrong
                fn(a, b, scale_a=sa, scale_b=sb)  # out_dtype's default: bfloat16
        out_dtype = _out_dtypes(ctx)[0]
        got = fn(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
        ref = registry.get("gemm_all_reduce", "reference")(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
        assert_matches(got, ref, out_dtype, a.shape[1], ctx.on_gpu, f"{variant} after the bad calls", scale=8)
    tilefuse.barrier()
    return checked


def test_bad_scales_raise_on_every_rank(pools):
    variants = ("fused_sequential", "plain", "auto")
    assert pools.run(2, job_bad_inputs, variants) == [10 * len(variants)] * 2


@pytest.mark.parametrize("rowwise", [False, True])
def test_plain_pads_k_and_n_as_scaled_mm_needs(rowwise, monkeypatch):
    """The plain path's ``torch._scaled_mm`` arguments on a GPU: a row-major and b column-major, K and N
    zero-padded to the multiples of 16 that the GPU's ``_scaled_mm`` checks (M as it is), row-wise scales
    alongside; the CPU's ``_scaled_mm`` (which checks none of that) of them, cut to N columns, is the
    product of the dequantized operands. Where a GPU is present, its ``_scaled_mm`` takes them: the plain
    path's matmul calls it and does not fall back to the fp32 product."""
    from tilefuse.ops.common.scaled import Scaled, scaled_matmul, scaled_mm_args

    gpu = torch.cuda.is_available()
    if gpu:
        calls, real = [], torch._scaled_mm

        def counted(*args, **kw):  # the calls _scaled_mm returned from (one that raises is not counted)
            c = real(*args, **kw)
            calls.append(1)
            return c

        monkeypatch.setattr(torch, "_scaled_mm", counted)

    for seed, (M, K, N) in enumerate(((20, 40, 24), (33, 48, 32), (16, 35, 17), (7, 64, 80))):
        a, b = _quantized((M, K), seed), _quantized((K, N), seed + 50)
        sa, sb = (_scale((M, 1), seed), _scale((1, N), seed + 1)) if rowwise else (_scale((), seed), _scale((), 9))
        ref = (a.float() * sa) @ (b.float() * sb)
        for b_layout in (b, b.t().contiguous().t()):  # row-major, column-major
            x, y, psa, psb = scaled_mm_args(a, b_layout, Scaled(sa, sb, torch.bfloat16))
            Kp, Np = K + -K % 16, N + -N % 16
            assert x.shape == (M, Kp) and x.is_contiguous() and y.shape == (Kp, Np) and y.t().is_contiguous()
            assert (psa.shape, psb.shape) == (((M, 1), (1, Np)) if rowwise else ((), ()))
            if gpu:  # bfloat16 results (every build's _scaled_mm), and float32 ones (the reducing ops' partials)
                for out_dtype, tol in ((torch.bfloat16, 1e-2), (torch.float32, 1e-3)):
                    got = scaled_matmul(a.cuda(), b_layout.cuda(), Scaled(sa.cuda(), sb.cuda(), out_dtype))
                    assert got.shape == (M, N) and got.dtype == out_dtype, (M, K, N, got.shape, got.dtype)
                    assert len(calls) == 1 or out_dtype == torch.float32, f"{M}x{K}x{N}: _scaled_mm calls {calls}"
                    calls.clear()
                    torch.testing.assert_close(got.float().cpu(), ref, rtol=tol, atol=tol * ref.abs().max().item())
                continue
            got = torch._scaled_mm(x, y, scale_a=psa, scale_b=psb, out_dtype=torch.float32)[:, :N]
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def job_backward_refused(ctx) -> bool:
    a, b, sa, sb = _operands(ctx, "gemm_all_reduce", False, 2)
    out_dtype = _out_dtypes(ctx)[0]
    a.requires_grad_()
    c = tilefuse.gemm_all_reduce(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype, variant="fused_sequential")
    assert c.requires_grad and c.dtype == out_dtype
    with pytest.raises(NotImplementedError, match="float8 calls .* are forward-only"):
        c.float().sum().backward()
    tilefuse.barrier()
    return True


def job_compiled(ctx) -> int:
    """torch.compile(fullgraph=True) of float8 calls (a fused variant and auto): one graph, the
    reference's values, no recompile for new data."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    cnt = CompileCounterWithBackend("inductor" if ctx.on_gpu else "aot_eager")
    out_dtype = _out_dtypes(ctx)[0]

    def fn(a, b, sa, sb, a2, b2, sa2, sb2):
        c = tilefuse.all_gather_gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype, variant="fused_sequential")
        d = tilefuse.gemm_reduce_scatter(a2, b2, scale_a=sa2, scale_b=sb2, out_dtype=out_dtype)
        return c, d

    compiled = torch.compile(fn, fullgraph=True, backend=cnt)
    for step in range(2):
        x = _operands(ctx, "all_gather_gemm", True, 10 + step)  # row-wise
        y = _operands(ctx, "gemm_reduce_scatter", False, 20 + step)  # tensor-wise
        c, d = compiled(*x, *y)
        for got, op, (a, b, sa, sb) in ((c, "all_gather_gemm", x), (d, "gemm_reduce_scatter", y)):
            ref = registry.get(op, "reference")(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
            assert_matches(got, ref, out_dtype, a.shape[1], ctx.on_gpu, f"compiled {op} step {step}", scale=8)
    assert cnt.frame_count == 1, f"{cnt.frame_count} graphs"
    tilefuse.barrier()
    return cnt.op_count


def test_backward_refused_and_compile_fullgraph(pools):
    assert all(pools.run(2, job_backward_refused))
    assert all(n >= 2 for n in pools.run(2, job_compiled))


def job_graph_replay(ctx, replays: int) -> int:
    """Every op's float8 call (its first fused variant, both scalings) captured in a CUDA graph after
    an eager call, replayed with new operands and scales copied into the static ones."""
    variants = {"gemm_all_scatter": "fused_sequential", "all_gather_gemm": "producer_consumer",
                "gemm_reduce_scatter": "wg_specialized", "gemm_all_reduce": "fused_sequential"}
    checked = 0
    for op, variant in variants.items():
        for rowwise in (False, True):
            static = [t.clone() for t in _operands(ctx, op, rowwise, 1)]
            fn = functools.partial(registry.get(op, variant), out_dtype=torch.bfloat16)
            fn(*static[:2], scale_a=static[2], scale_b=static[3])  # eager: the workspaces
            torch.cuda.synchronize()
            tilefuse.barrier()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = fn(*static[:2], scale_a=static[2], scale_b=static[3])
            tilefuse.barrier()
            for i in range(replays):
                fresh = _operands(ctx, op, rowwise, 100 + i)
                for t, x in zip(static, fresh):
                    t.copy_(x)
                g.replay()
                torch.cuda.synchronize()
                a, b, sa, sb = fresh
                ref = registry.get(op, "reference")(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
                assert_matches(out, ref, torch.bfloat16, a.shape[1], True, f"{op} {variant} replay {i}", scale=8)
                checked += 1
            tilefuse.synchronize()
            tilefuse.barrier()
            del g
    return checked


def test_graph_capture_replay(pools, on_gpu):
    if not on_gpu:
        pytest.skip("CUDA graphs need a GPU")
    assert pools.run(2, job_graph_replay, 5) == [8 * 5] * 2

# ------------------------------------------------------------------------------------------------
# Every kernel a float8 call launches compiles for sm_90 (Hopper's fp8 MMA), in a process without the
# interpreter (Triton's CUDA backend compiles without a GPU).
# ------------------------------------------------------------------------------------------------

_POINTERS = {"bfloat16": "*bf16", "float16": "*fp16", "float32": "*fp32", "int64": "*i64", "int32": "*i32",
             "uint8": "*u8", "int8": "*i8", "float8_e4m3fn": "*fp8e4nv", "float8_e5m2": "*fp8e5"}


def _arg_type(value):
    if type(value) in (tuple, list) and not (len(value) == 2 and value[0] == "ptr"):
        return tuple(_arg_type(v) for v in value)
    if type(value) in (tuple, list):
        return _POINTERS[value[1]]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    return "fp32"


def _described(value):
    if type(value) is tuple:
        return [_described(v) for v in value]
    if hasattr(value, "data_ptr"):
        return ["ptr", str(value.dtype).removeprefix("torch.")]
    return value


@contextlib.contextmanager
def _recording(records: list):
    """Appends ``(module, kernel, {argument: value}, options)`` of every launch inside the block to ``records``."""
    from tilefuse.runtime import launcher

    saved = launcher.FastKernel.__getitem__

    def getitem(self, grid):
        inner = saved(self, grid)

        def launch(*args, **kwargs):
            bound = self._bind(args, kwargs)
            values = None if bound is None else bound[0]
            if values is not None:
                fn = self.jit_fn.fn
                records.append((fn.__module__, fn.__name__, {n: _described(v) for n, v in zip(self._names, values)},
                                {k: v for k, v in kwargs.items() if k not in self._index}))
            return inner(*args, **kwargs)
        return launch

    launcher.FastKernel.__getitem__ = getitem
    try:
        yield records
    finally:
        launcher.FastKernel.__getitem__ = saved


def job_record_launches(ctx, cases) -> list:
    """``(module, kernel, {argument: value}, options)`` of every launch the float8 ``cases`` make."""
    with _recording([]) as records:
        job_against_reference(ctx, cases)
    return records


# GPU default tiles of float8 calls (Config.for_shape on an H200) by class: 64-row decode tiles of 256-deep K
# steps (6 and 4 stages), 128x128 tiles of 256-deep K steps past one wave of them, 128x256 tiles of 4 stages
# (512 rows), and the 1000-row class.
DEFAULT_TILE_SHAPES = ((128, 4096, 4096), (96, 6144, 4096), (128, 14336, 4096), (512, 14336, 4096),
                       (1000, 6144, 4096))


def job_default_tiles(ctx) -> list:
    """Every op x variant in float8 with the GPU default config of each ``DEFAULT_TILE_SHAPES`` (on small
    operands, a handful of programs) against the reference; the launches, recorded."""
    from tilefuse.ops.common.config import default_config

    with _recording([]) as records:
        for shape in DEFAULT_TILE_SHAPES:
            for op in OPS:
                for variant in tilefuse.VARIANTS:
                    comm = variant in ("producer_consumer", "wg_specialized")
                    cfg = default_config(*shape, E4M3, num_sms=132, interpreter=False, comm=comm)
                    cfg = cfg.replace(GEMM_SMS=4, COMM_SMS=2 if comm else 0)
                    M = 128 * ctx.world if op == "gemm_reduce_scatter" else 128
                    mine = ctx.rank + 1  # the replicated operand (a of gemm_all_scatter, b of all_gather_gemm): 0
                    a = _quantized((M, 512), 0 if op == "gemm_all_scatter" else mine).to(ctx.device)
                    b = _quantized((512, 256), 0 if op == "all_gather_gemm" else mine + 10).to(ctx.device)
                    out_dtype = _out_dtypes(ctx)[0]
                    kw = dict(scale_a=_scale((), 3).to(ctx.device), scale_b=_scale((), 4).to(ctx.device),
                              out_dtype=out_dtype)
                    got = registry.get(op, variant)(a, b, config=cfg, **kw)
                    ref = registry.get(op, "reference")(a, b, **kw)
                    assert_matches(got, ref, out_dtype, 512, ctx.on_gpu, f"{op} {variant} {shape}: {cfg}",
                                   scale=8 * ctx.world)
    tilefuse.barrier()
    return records


# The most shared memory one block may take on sm_90 (227 KiB).
SM90_SHARED_BYTES = 232448


def compile_for_hopper(record, whole: bool = False) -> str:
    """Compile a recorded launch for sm_90 up to TTGIR (``whole``: to a binary, ptxas included, within
    ``SM90_SHARED_BYTES`` of shared memory); '' or the error."""
    import importlib

    import triton
    from test_warp_spec_compile import _ttgir
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, name, args, options = record
    jit = getattr(importlib.import_module(module), name).jit_fn
    signature, constants = {}, {}
    for param in jit.params:
        value = args[param.name]
        if param.is_constexpr:
            signature[param.name], constants[param.name] = "constexpr", value
        elif value is None:
            signature[param.name], constants[param.name] = "constexpr", None
        else:
            signature[param.name] = _arg_type(value)
    src, target = ASTSource(jit, signature, constants), GPUTarget("cuda", 90, 32)
    try:
        if not whole:
            _ttgir(src, target, options)
            return ""
        shared = triton.compile(src, target=target, options=options).metadata.shared
    except Exception as err:  # noqa: BLE001 - reported per kernel
        return f"{type(err).__name__}: {str(err)[:2000]}"
    return "" if shared <= SM90_SHARED_BYTES else f"{shared} bytes of shared memory ({SM90_SHARED_BYTES} at most)"


def _compile_apart(records: list, tmp_path, whole: bool) -> dict:
    """Compile each distinct record for sm_90 in a process off the interpreter; ``{kernel: error}``."""
    import json
    import os
    import subprocess
    import sys

    unique = {json.dumps(r, sort_keys=True): r for r in records}
    assert any(r[1] == "matmul_kernel" for r in unique.values())
    path = tmp_path / "launches.json"
    path.write_text(json.dumps(list(unique.values())))
    env = dict(os.environ, TRITON_INTERPRET="0", TILEFUSE_BACKEND="cuda")
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(here), here, env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, os.path.abspath(__file__), str(path)] + ["whole"] * whole, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    failed = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.stdout.count(": ok\n") + len(failed) == len(unique)
    return failed


@pytest.mark.slow
def test_float8_kernels_compile_for_hopper(pools, tmp_path):
    from test_warp_spec_compile import _hopper_compiler

    why = _hopper_compiler()
    if why:
        pytest.skip(why)
    failed = _compile_apart(pools.run(2, job_record_launches, _cases(_all_variants))[0], tmp_path, whole=False)
    assert not failed, f"kernels of float8 calls that do not compile for sm_90: {failed}"


@pytest.mark.slow
def test_float8_default_tiles_are_right_and_fit_hopper(pools, tmp_path):
    """The GPU default tiles of float8 calls (``DEFAULT_TILE_SHAPES``), every op x variant: right against the
    reference here, and each kernel they launch compiles for sm_90 whole within its shared memory."""
    from test_warp_spec_compile import _hopper_compiler

    records = pools.run(2, job_default_tiles)[0]
    why = _hopper_compiler()
    if why:
        pytest.skip(f"checked against the reference; not compiled: {why}")
    failed = _compile_apart(records, tmp_path, whole=True)
    assert not failed, f"float8 default tiles that do not fit sm_90: {failed}"


def main(path: str, whole: bool) -> None:
    import json

    failed = {}
    for record in json.loads(open(path).read()):
        error = compile_for_hopper(record, whole)
        print(f"{record[0]}.{record[1]}: {error or 'ok'}", flush=True)
        if error:
            failed[f"{record[0]}.{record[1]}"] = error
    print(json.dumps(failed))


if __name__ == "__main__":
    import sys

    main(sys.argv[1], sys.argv[2:] == ["whole"])
