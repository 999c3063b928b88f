"""gemm_all_reduce with the fused residual-add + RMSNorm epilogue (``residual=``, ``norm_weight=``):
every variant and plain against the global fp32 composition (outputs and every gradient), ragged N,
poisoned workspaces and outputs, the same bits on every rank, torch.compile(fullgraph=True), CUDA
graph capture (GPU only), and ``tilefuse.nn.fuse_allreduce_norm`` on a tiny HF Llama."""

import pytest
import torch
from ophelpers import assert_matches, dtypes, poison_workspaces, randn
from test_autograd import _gather

import tilefuse
from tilefuse.ops.gemm_all_reduce.norm import add_rms_norm, add_rms_norm_torch

VARIANTS = ("bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized")
EPS = 1e-5
SHAPES = [(5, 40, 24), (3, 72, 16)]  # (M, N, K_loc): N ragged against the 64-wide blocks


def _bits(t):
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _inputs(ctx, M, N, K, dtype, seed, residual=True, bias=False):
    """This rank's ``a``, ``b`` (A scaled by rank + 1: a dropped or doubled partial shows), and the
    replicated ``residual``, ``bias``, ``norm_weight`` and output gradients ``dy``, ``ds``."""
    dev = ctx.device
    a = randn((M, K), dtype, dev, seed=seed * 100 + ctx.rank + 1, scale=ctx.rank + 1)
    b = randn((K, N), dtype, dev, seed=seed * 100 + 50 + ctx.rank)
    shared = dict(
        residual=randn((M, N), dtype, dev, seed=seed * 100 + 97, scale=3.0) if residual else None,
        bias=randn((N,), dtype, dev, seed=seed * 100 + 98) if bias else None,
        norm_weight=1.0 + 0.5 * randn((N,), dtype, dev, seed=seed * 100 + 99),
    )
    grads = (randn((M, N), dtype, dev, seed=seed * 100 + 95), randn((M, N), dtype, dev, seed=seed * 100 + 96))
    return a, b, shared, grads


def _reference(ctx, a, b, shared, grads=None):
    """``(y, s, {name: grad})`` of the global fp32 composition: sum over ranks of ``a_r @ b_r``, bias,
    residual, RMSNorm; the gradients of ``<y, dy> + <s, ds>`` (dy, ds the same on every rank: the
    replicated output counts once), rank r's for a and b."""
    As = [t.requires_grad_() for t in _gather(ctx, a)]
    Bs = [t.requires_grad_() for t in _gather(ctx, b)]
    leaves = {k: v.detach().float().clone().requires_grad_() for k, v in shared.items() if v is not None}
    s = sum(x @ y for x, y in zip(As, Bs))
    if "bias" in leaves:
        s = s + leaves["bias"]
    if "residual" in leaves:
        s = s + leaves["residual"]
    y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS) * leaves["norm_weight"]
    out = {}
    if grads is not None:
        ((y * grads[0].float()).sum() + (s * grads[1].float()).sum()).backward()
        out = {"a": As[ctx.rank].grad, "b": Bs[ctx.rank].grad, **{k: v.grad for k, v in leaves.items()}}
    return y.detach(), s.detach(), out


def _check(ctx, got, ref, dtype, K, what, scale=None):
    scale = ctx.world * (ctx.world + 1) / 2 if scale is None else scale
    assert_matches(got, ref.to(dtype), dtype, ctx.world * K, ctx.on_gpu, what, scale=scale)


def job_variants(ctx, variants, shapes, dtype_list, grad_variant=None, bias=False):
    """Per variant, shape, dtype and residual or not: ``(y, s)`` against the global composition after
    poisoned workspaces; the results returned for the cross-rank bit comparison. ``grad_variant``:
    its gradients (fp32) against the composition's too."""
    outs = []
    seed = 0
    for variant in variants:
        for M, N, K in shapes:
            for dtype in dtype_list:
                for residual in (True, False):
                    seed += 1
                    a, b, shared, _ = _inputs(ctx, M, N, K, dtype, seed, residual, bias)
                    y_ref, s_ref, _ = _reference(ctx, a, b, shared)
                    poison_workspaces()
                    y, s = tilefuse.gemm_all_reduce(a, b, variant=variant, eps=EPS, **shared)
                    tilefuse.synchronize()
                    what = f"{variant} M={M} N={N} K={K} {dtype} residual={residual}"
                    _check(ctx, s, s_ref, dtype, K, f"{what}: new_residual")
                    _check(ctx, y, y_ref, dtype, K, f"{what}: y", scale=2.0)
                    y_c = add_rms_norm_torch(s, None, shared["norm_weight"], EPS)[0]
                    _check(ctx, y, y_c, dtype, K, f"{what}: y against torch's norm of the returned s", scale=1.0)
                    outs += [y, s]
    if grad_variant is not None:
        for residual in (True, False):
            M, N, K = shapes[0]
            a, b, shared, grads = _inputs(ctx, M, N, K, torch.float32, 90 + residual, residual, bias=True)
            _, _, ref = _reference(ctx, a, b, shared, grads)
            leaves = {"a": a.requires_grad_(), "b": b.requires_grad_(),
                      **{k: v.requires_grad_() for k, v in shared.items() if v is not None}}
            y, s = tilefuse.gemm_all_reduce(a, b, variant=grad_variant, eps=EPS, **shared)
            ((y * grads[0]).sum() + (s * grads[1]).sum()).backward()
            for name, leaf in leaves.items():
                assert leaf.grad is not None, f"{grad_variant}: no gradient of {name}"
                _check(ctx, leaf.grad, ref[name], torch.float32, K, f"{grad_variant} grad of {name}",
                       scale=max(1.0, float(ref[name].abs().max())))
    tilefuse.barrier()
    return outs


def _same_bits(results, what):
    for rank, outs in enumerate(results[1:], start=1):
        for i, (x, y) in enumerate(zip(results[0], outs)):
            differ = (_bits(x) != _bits(y)).sum().item()
            assert differ == 0, f"{what}: output {i}: rank {rank} differs from rank 0 in {differ} elements"


def test_norm_fused_and_plain_world2(pools):
    """W = 2: a fused variant and plain, each with and without a residual, fp32 with a bias; the
    fused variant's gradients of a, b, bias, residual and norm_weight."""
    results = pools.run(2, job_variants, ("fused_sequential", "plain"), SHAPES[:1], [torch.float32],
                        grad_variant="fused_sequential", bias=True)
    _same_bits(results, "W=2")


def test_norm_world3(pools):
    """W = 3 (not a power of two), fp16, a flagged variant, with and without a residual."""
    _same_bits(pools.run(3, job_variants, ("wg_specialized",), SHAPES[1:], [torch.float16]), "W=3")


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_norm_every_variant(pools, world, on_gpu):
    """Every variant, plain, reference and auto; both shapes, every dtype; plain's gradients."""
    variants = VARIANTS + ("plain", "reference", "auto")
    results = pools.run(world, job_variants, variants, SHAPES, dtypes(on_gpu), grad_variant="plain",
                        bias=world == 3)
    _same_bits(results, f"W={world}")


def job_variants_agree(ctx):
    """The four variants sum in one order: their ``new_residual`` are the same bits, and so are the
    ``y`` of the three that norm in ``norm.py``'s kernel (fused_sequential's own norm sums the
    squares in another fixed order: its ``y`` agrees to rounding)."""
    a, b, shared, _ = _inputs(ctx, 5, 40, 24, torch.float16, 7, residual=True, bias=True)
    got = dict(zip(VARIANTS, [tilefuse.gemm_all_reduce(a, b, variant=v, eps=EPS, **shared) for v in VARIANTS]))
    tilefuse.synchronize()
    y0, s0 = got["bulk_sync"]
    for v, (y, s) in got.items():
        assert torch.equal(_bits(s), _bits(s0)), v
        if v == "fused_sequential":
            torch.testing.assert_close(y, y0, rtol=2e-3, atol=1e-3, msg=lambda m, v=v: f"{v}: {m}")
        else:
            assert torch.equal(_bits(y), _bits(y0)), v
    tilefuse.barrier()
    return True


@pytest.mark.slow
def test_norm_variants_bit_identical(pools):
    assert all(pools.run(2, job_variants_agree))


# ---------------------------------------------------------------------------------------------
# fused_sequential: the residual add and the norm inside its one kernel
# ---------------------------------------------------------------------------------------------


def _configs(rank):
    """``{name: (config, N)}`` of the in-kernel checks at M = 20 (two row blocks, the last ragged).
    ``"many"``: 16 x 16 tiles, five a row block at N = 72 (the last ragged), 4 programs for 10 tiles
    (``reduce_tiles``; a program finishes several). ``"paths"``: 16 x 128 tiles at N = 200 through
    different paths of the kernel on different ranks, which must give the same bits (even ranks: 1
    warp, so the sum walks 8-row blocks in ``reduce_tiles``; odd ranks: 2 warps and another
    BLOCK_K, each program summing its one tile from registers). ``"split"``: 16 x 64 tiles at N =
    72, K split in two slices. ``"tail"``: one 16 x 64 tile a row block at N = 40, a program a tile.
    """
    from tilefuse import Config

    return {"tail": (Config(16, 64, 16, 1, 4, 1, GEMM_SMS=4, COMM_SMS=0), 40),
            "many": (Config(16, 16, 16, 1, 4, 1, GEMM_SMS=4, COMM_SMS=0), 72),
            "paths": (Config(16, 128, 16 * (1 + rank % 2), 1, 1 + rank % 2, 1, GEMM_SMS=4, COMM_SMS=0), 200),
            "split": (Config(16, 64, 16, 1, 4, 1, GEMM_SMS=8, COMM_SMS=0, SPLIT_K=2), 72)}


def job_in_kernel(ctx):
    """fused_sequential norms in its own kernel: ragged shapes, with and without residual and bias,
    after poisoned workspaces and scratch, against the global composition and against bulk_sync's
    call with the same config (the same ``new_residual`` bits, ``y`` to rounding); no launch of
    ``norm.py``'s kernel (bulk_sync's are counted, so the count works); every row-block count back
    at zero after each call (calls follow each other on one stream); a call whose ranks disagree
    (residual on one rank only) aborts with NaN outputs, and the next call works. The split tail a
    GPU takes (``norm.OWN_TAIL``: the row block's programs wait for its ``rstd``) runs on CPU ranks
    too with one tile a row block (no program waits): the same bits as the tail that waits on
    nobody. On a GPU, ``"paths"`` pairs the two tails across ranks (odd ranks sum from registers)."""
    import triton.language as tl

    from tilefuse.ops.gemm_all_reduce import _prepare, _tiles
    from tilefuse.ops.gemm_all_reduce import norm as norm_mod

    launches = []
    real_kernel, real_start = norm_mod._add_rms_norm_kernel, _prepare.Prepared.start_norm

    class Counted:
        def __getitem__(self, grid):
            launches.append(grid)
            return real_kernel[grid]

    started = []

    def start_norm(self, a, b):
        out = real_start(self, a, b)
        started.append(out[2:4])
        return out

    def counts_zero():
        return all(int(c.abs().sum()) == 0 for _, c in norm_mod.NORM_SCRATCH._sets.values())

    outs = []
    M, K = 20, 24
    norm_mod._add_rms_norm_kernel, _prepare.Prepared.start_norm = Counted(), start_norm
    try:
        cases = [("tail", True, True, torch.float16), ("many", True, True, torch.float16),
                 ("paths", True, False, torch.float16), ("paths", False, True, torch.float16),
                 ("split", True, False, torch.float16), ("split", False, True, torch.float32)]
        for seed, (name, residual, bias, dtype) in enumerate(cases, start=60):
            cfg, N = _configs(ctx.rank)[name]
            a, b, shared, _ = _inputs(ctx, M, N, K, dtype, seed, residual, bias)
            y_ref, s_ref, _ = _reference(ctx, a, b, shared)
            poison_workspaces()
            for part, _ in norm_mod.NORM_SCRATCH._sets.values():
                part.fill_(float("nan"))
            del launches[:]
            y, s = tilefuse.gemm_all_reduce(a, b, variant="fused_sequential", config=cfg, eps=EPS, **shared)
            tilefuse.synchronize()
            what = f"in-kernel {name} {dtype} residual={residual} bias={bias}"
            assert not launches, f"{what}: norm.py's kernel launched {len(launches)} times"
            assert counts_zero(), f"{what}: a row-block count was left behind"
            _check(ctx, s, s_ref, dtype, K, f"{what}: new_residual")
            _check(ctx, y, y_ref, dtype, K, f"{what}: y", scale=2.0)
            _check(ctx, y, add_rms_norm_torch(s, None, shared["norm_weight"], EPS)[0], dtype, K,
                   f"{what}: y against torch's norm of the returned s", scale=1.0)
            # bulk_sync on the same config: the same partials and sums, norm.py's kernel after them.
            y_b, s_b = tilefuse.gemm_all_reduce(a, b, variant="bulk_sync", config=cfg, eps=EPS, **shared)
            tilefuse.synchronize()
            assert launches, f"{what}: bulk_sync launched no norm kernel (the count does not work)"
            assert torch.equal(_bits(s), _bits(s_b)), f"{what}: new_residual differs from bulk_sync's"
            torch.testing.assert_close(y, y_b, rtol=2e-3, atol=1e-3, msg=lambda m, what=what: f"{what}: {m}")
            outs += [y, s]
            if name == "tail" and not ctx.on_gpu:  # (a compiled kernel keeps the global it was compiled with)
                own_tail, _tiles.OWN_TAIL = _tiles.OWN_TAIL, tl.constexpr(not _tiles.OWN_TAIL)
                try:
                    y_t, s_t = tilefuse.gemm_all_reduce(a, b, variant="fused_sequential", config=cfg, eps=EPS,
                                                        **shared)
                    tilefuse.synchronize()
                finally:
                    _tiles.OWN_TAIL = own_tail
                assert torch.equal(_bits(y_t), _bits(y)) and torch.equal(_bits(s_t), _bits(s)), \
                    f"{what}: the split tail's bits differ"
                assert counts_zero(), f"{what}: the split tail left a row-block count behind"
        # auto whose choice is fused_sequential (a table's pick, stood in for here): the epilogue in its kernel.
        from tilefuse.ops import library

        real_resolve = library.resolve_auto
        cfg, N = _configs(ctx.rank)["tail"]
        library.resolve_auto = lambda *args: ("fused_sequential", None, cfg)
        try:
            a, b, shared, _ = _inputs(ctx, M, N, K, torch.float16, 69, residual=True)
            y_ref, s_ref, _ = _reference(ctx, a, b, shared)
            del launches[:]
            y, s = tilefuse.gemm_all_reduce(a, b, variant="auto", eps=EPS, **shared)
            tilefuse.synchronize()
        finally:
            library.resolve_auto = real_resolve
        assert not launches, "auto choosing fused_sequential: norm.py's kernel launched"
        _check(ctx, y, y_ref, torch.float16, K, "auto choosing fused_sequential: y", scale=2.0)
        outs += [y, s]
        # Ranks that disagree on the residual: a mismatch on every rank, both outputs NaN.
        cfg, N = _configs(ctx.rank)["split"]
        a, b, shared, _ = _inputs(ctx, M, N, K, torch.float16, 70, residual=True)
        if ctx.rank == 1:
            shared["residual"] = None
        del started[:]
        with pytest.raises(tilefuse.CallMismatchError):
            tilefuse.gemm_all_reduce(a, b, variant="fused_sequential", config=cfg, eps=EPS, **shared)
            tilefuse.synchronize()
        assert len(started) == 1 and all(bool(t.isnan().all()) for t in started[0]), "aborted call: outputs not NaN"
        assert counts_zero(), "aborted call: a row-block count was left behind"
    finally:
        norm_mod._add_rms_norm_kernel, _prepare.Prepared.start_norm = real_kernel, real_start
    a, b, shared, _ = _inputs(ctx, M, N, K, torch.float16, 71, residual=True)
    y_ref, s_ref, _ = _reference(ctx, a, b, shared)
    y, s = tilefuse.gemm_all_reduce(a, b, variant="fused_sequential", config=cfg, eps=EPS, **shared)
    tilefuse.synchronize()
    _check(ctx, y, y_ref, torch.float16, K, "the call after the mismatch: y", scale=2.0)
    tilefuse.barrier()
    return outs + [y, s]


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_norm_in_fused_kernel(pools, world):
    _same_bits(pools.run(world, job_in_kernel), f"in-kernel W={world}")


def test_kernel_poisoned_outputs_ragged_and_chunked(on_gpu):
    """The epilogue kernel alone: NaN-filled outputs all written, ragged N, rows walked in one block
    and in several (``max_block``), against torch's composition; bad arguments refused."""
    from tilefuse.ops.gemm_all_reduce.norm import check_norm_args

    g = torch.Generator().manual_seed(0)
    dev = "cuda" if on_gpu else "cpu"
    for N, max_block in ((40, 64), (100, 32)):
        for dtype in (torch.float16, torch.float32):
            c = (torch.randn(3, N, generator=g) * 4).to(dev, dtype)
            res = torch.randn(3, N, generator=g).to(dev, dtype)
            w = torch.randn(N, generator=g).to(dev, dtype)
            for residual in (res, None):
                out = (torch.full_like(c, float("nan")), torch.full_like(c, float("nan")))
                y, s = add_rms_norm(c, residual, w, EPS, out=out, max_block=max_block)
                y_ref, s_ref = add_rms_norm_torch(c, residual, w, EPS)
                what = f"N={N} block={max_block} {dtype} residual={residual is not None}"
                assert torch.equal(s, s_ref), f"{what}: s"  # one fp32 add, one rounding: exact
                # (a GPU's rsqrt is within a few ulp of torch's)
                torch.testing.assert_close(y, y_ref, rtol=2e-3 if dtype == torch.float16 else 1e-4, atol=1e-5,
                                           msg=lambda m, what=what: f"{what}: {m}")
    a, b = torch.zeros(4, 8), torch.zeros(8, 16)
    with pytest.raises(ValueError, match=r"norm_weight must have shape \(16,\)"):
        check_norm_args("op", a, b, None, torch.ones(8), EPS)
    with pytest.raises(ValueError, match=r"residual must have shape \(4, 16\)"):
        check_norm_args("op", a, b, torch.zeros(4, 8), torch.ones(16), EPS)
    with pytest.raises(TypeError, match=r"residual has dtype"):
        check_norm_args("op", a, b, torch.zeros(4, 16, dtype=torch.float16), torch.ones(16), EPS)
    with pytest.raises(ValueError, match=r"eps"):
        check_norm_args("op", a, b, None, torch.ones(16), -1.0)
    with pytest.raises(ValueError, match=r"pass norm_weight= with it"):  # before any communication
        tilefuse.gemm_all_reduce(a, b, residual=torch.zeros(4, 16))


def job_compile(ctx, variants):
    """torch.compile(fullgraph=True) of the fused calls (one graph, no recompile on new data),
    forward and backward against the composition."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    cnt = CompileCounterWithBackend("inductor" if ctx.on_gpu else "aot_eager")

    def fn(a, b, residual, w):
        return [tilefuse.gemm_all_reduce(a, b, variant=v, residual=residual, norm_weight=w, eps=EPS)
                for v in variants]

    compiled = torch.compile(fn, fullgraph=True, backend=cnt)
    M, N, K = SHAPES[0]
    for step in range(2):
        a, b, shared, grads = _inputs(ctx, M, N, K, torch.float32, 40 + step)
        _, _, ref = _reference(ctx, a, b, shared, grads)
        leaves = [t.requires_grad_() for t in (a, b, shared["residual"], shared["norm_weight"])]
        outs = compiled(*leaves)
        sum((y * grads[0]).sum() + (s * grads[1]).sum() for y, s in outs).backward()
        for leaf, name in zip(leaves, ("a", "b", "residual", "norm_weight")):
            _check(ctx, leaf.grad / len(variants), ref[name], torch.float32, K, f"compiled step {step}: grad of {name}",
                   scale=max(1.0, float(ref[name].abs().max())))
        assert cnt.frame_count == 1, f"{cnt.frame_count} graphs after step {step}"
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("variants", [("fused_sequential",), pytest.param(("plain", "auto"), marks=pytest.mark.slow)])
def test_norm_compile_fullgraph(pools, variants):
    assert all(pools.run(2, job_compile, variants))


def job_graph(ctx, variant, replays):
    """GPU: one call captured in a CUDA graph after an eager one, replayed on fresh inputs."""
    M, N, K = 16, 200, 128
    dtype = torch.bfloat16
    a, b, shared, _ = _inputs(ctx, M, N, K, dtype, 1)
    static = [a.clone(), b.clone(), shared["residual"].clone(), shared["norm_weight"].clone()]

    def call():
        return tilefuse.gemm_all_reduce(static[0], static[1], variant=variant, residual=static[2],
                                        norm_weight=static[3], eps=EPS)

    call()
    torch.cuda.synchronize()
    tilefuse.barrier()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y, s = call()
    tilefuse.barrier()
    outs = []
    for i in range(replays):
        fa, fb, fshared, _ = _inputs(ctx, M, N, K, dtype, 10 + i)
        for x, v in zip(static, (fa, fb, fshared["residual"], fshared["norm_weight"])):
            x.copy_(v)
        g.replay()
        torch.cuda.synchronize()
        y_ref, s_ref, _ = _reference(ctx, fa, fb, fshared)
        _check(ctx, s, s_ref, dtype, K, f"replay {i}: new_residual")
        _check(ctx, y, y_ref, dtype, K, f"replay {i}: y", scale=2.0)
        outs += [y.clone(), s.clone()]
    tilefuse.synchronize()
    tilefuse.barrier()
    del g
    return outs


@pytest.mark.parametrize("variant", VARIANTS)
def test_norm_graph_replay(pools, on_gpu, variant):
    if not on_gpu:
        pytest.skip("CUDA graphs need a GPU")
    _same_bits(pools.run(2, job_graph, variant, 5), f"{variant} graph")


# ---------------------------------------------------------------------------------------------
# tilefuse.nn.fuse_allreduce_norm on a tiny HF Llama, replicated layout
# ---------------------------------------------------------------------------------------------


def job_fuse_llama(ctx, variant):
    """A 2-layer LlamaModel (hidden 64, 4 heads; at W = 3 hidden 48 with 6 heads of 16, as HF wants the
    hidden size to be a multiple of the head count and the ranks take whole heads), parallelized by
    LLAMA_PLAN twice, one copy fused: the fused copy's output and every parameter's gradient against
    the unfused copy's, and each fused layer handing the next its normed input."""
    import copy

    from test_styles import _close, _rand
    from torch.distributed.tensor import DTensor
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaModel

    from tilefuse.nn import LLAMA_PLAN, Carried, fuse_allreduce_norm, parallelize

    H, heads, kv_heads = (64, 4, 2) if ctx.world == 2 else (48, 6, 3)
    cfg = LlamaConfig(hidden_size=H, intermediate_size=96, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      head_dim=16, num_hidden_layers=2, vocab_size=32, attn_implementation="sdpa")
    torch.manual_seed(3)
    full = LlamaModel(cfg).to(ctx.device)
    with torch.no_grad():  # norms that are not all ones: a weight applied twice or skipped shows
        for name, p in full.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * _rand(p.shape, len(name), ctx.device))
    unfused = parallelize(copy.deepcopy(full), LLAMA_PLAN, variant=variant)
    fused = fuse_allreduce_norm(parallelize(copy.deepcopy(full), LLAMA_PLAN, variant=variant))
    assert fused.layers[0]._tilefuse_next_norm is fused.layers[1].input_layernorm
    assert fused.layers[1]._tilefuse_next_norm is fused.norm
    ids = torch.randint(0, 32, (2, 3), generator=torch.Generator().manual_seed(4)).to(ctx.device)
    dy = _rand((2, 3, H), 5, ctx.device)
    outs = {}
    for what, model in (("unfused", unfused), ("fused", fused)):
        y = model(input_ids=ids).last_hidden_state
        (y * dy).sum().backward()
        outs[what] = y.detach()
    _close(ctx, outs["fused"], outs["unfused"], 96, "fused Llama output")
    grads = dict(unfused.named_parameters())
    for name, p in fused.named_parameters():
        ref = grads[name].grad
        assert p.grad is not None, f"fused: {name} got no gradient"
        got = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
        _close(ctx, got, ref.to_local() if isinstance(ref, DTensor) else ref, 96, f"fused: {name} grad")
    # The fused layer hands the next its normed input: one fused call per projection.
    with torch.no_grad():
        h = fused.embed_tokens(ids)
        pos = fused.rotary_emb(h, torch.arange(3, device=ctx.device)[None])
        carried = fused.layers[0](h, position_embeddings=pos)
        assert isinstance(carried, Carried)
        ref = unfused.layers[0](h, position_embeddings=pos)
        _close(ctx, carried.residual, ref, 96, "layer 0's residual stream")
        _close(ctx, carried.normed, unfused.layers[1].input_layernorm(ref), 96, "layer 0's normed output")
    tilefuse.barrier()
    return True


@pytest.mark.parametrize("world,variant", [pytest.param(2, "fused_sequential", marks=pytest.mark.slow),
                                           pytest.param(3, "wg_specialized", marks=pytest.mark.slow),
                                           pytest.param(2, "plain", marks=pytest.mark.slow)])
def test_fuse_allreduce_norm_llama(pools, world, variant):
    pytest.importorskip("transformers")
    assert all(pools.run(world, job_fuse_llama, variant))
