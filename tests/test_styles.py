"""tilefuse.nn.ColwiseParallel / RowwiseParallel under parallelize_module, against unsharded HF Llama modules.

Every rank builds the same full module (same seed), parallelizes a deep copy on a 1-D DeviceMesh
over the pool's ranks and compares the output and every gradient with the full module's: a DTensor
parameter's local gradient with the matching slice of the full gradient, a replicated tensor's
gradient whole. fp32 throughout (the interpreter's bf16 is not trustworthy).
"""

import copy
import importlib.util
import os
import subprocess
import sys

import harness
import pytest
import torch
from ophelpers import assert_matches
from torch import nn

import tilefuse
from tilefuse.nn import (
    LLAMA_PLAN,
    ColwiseParallel,
    RowwiseParallel,
    from_hf_plan,
    llama_sequence_parallel_plan,
    parallelize,
    style_from_name,
)

HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
# torch's DTensor redistributions of the sequence-parallel layout (and DTensor outputs) crash the rank
# processes (SIGSEGV) with gloo process groups on CUDA tensors (torch 2.11); under NCCL, one rank per
# GPU, the same tests pass (docs/perf/2026-11-30_h200x2_gpu_tests.txt). The GPU scripts run this file
# under NCCL too (benchmarks/runs/gpu_tests.sh).
needs_nccl_on_gpu = pytest.mark.skipif(
    harness.TEST_DEVICE == "cuda" and harness.PG_BACKEND == "gloo",
    reason="DTensor's sequence-parallel redistributions crash under gloo on CUDA tensors; run with "
           "TILEFUSE_TEST_PG=nccl (one GPU per rank)")
needs_hf = pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="transformers is not installed (pip install "
                              "transformers, or the tilefuse[hf] extra): the HF Llama checks need it")
HIDDEN, HEADS, INTER = 64, 4, 128
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mesh(ctx):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(ctx.device.type, (ctx.world,))


def _rand(shape, seed, device):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(device)


def _close(ctx, got, ref, K, what):
    scale = max(1.0, float(ref.abs().max()))
    assert_matches(got, ref, torch.float32, K, ctx.on_gpu, f"rank {ctx.rank}/{ctx.world}: {what}", scale=scale)


def _check_param_grads(ctx, tp, full, K, what):
    """Every parameter of ``tp`` has the gradient the unsharded ``full`` has (its shard, for DTensors)."""
    from torch.distributed.tensor import DTensor, Shard

    seen = 0
    for name, p in tp.named_parameters():
        ref = full.get_parameter(name).grad
        assert p.grad is not None, f"{what}: {name} got no gradient"
        got = p.grad
        if isinstance(p, DTensor):
            assert isinstance(got, DTensor) and got.placements == p.placements, \
                f"{what}: {name} grad placements {getattr(got, 'placements', None)} != {p.placements}"
            got = got.to_local()
            if isinstance(p.placements[0], Shard):
                ref = ref.chunk(ctx.world, p.placements[0].dim)[ctx.rank]
            seen += 1
        _close(ctx, got, ref, K, f"{what}: {name} grad")
    assert seen, f"{what}: no DTensor parameter (nothing was parallelized)"


def _llama_config(kv_heads):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER, num_attention_heads=HEADS,
                       num_key_value_heads=kv_heads, num_hidden_layers=1, vocab_size=32, hidden_act="silu",
                       attn_implementation="sdpa")


def _layer_plan(cfg, variant):
    """HF's base_model_tp_plan for one decoder layer ("layers.*." dropped), as tilefuse styles."""
    plan = {k.removeprefix("layers.*."): v for k, v in cfg.base_model_tp_plan.items()}
    assert set(plan.values()) == {"colwise", "rowwise"}, plan
    return from_hf_plan(plan, variant=variant)


# ---------------------------------------------------------------------------------------------
# A Llama decoder layer, replicated layout (HF's plan)
# ---------------------------------------------------------------------------------------------


def job_decoder_layer(ctx, variant, layout="replicated", mlp_input="fused"):
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import parallelize_module
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    W = ctx.world
    cfg = _llama_config(kv_heads=2 if W == 2 else 4)
    torch.manual_seed(11)
    full = LlamaDecoderLayer(cfg, layer_idx=0).to(ctx.device)
    tp = copy.deepcopy(full)
    plan = (_layer_plan(cfg, variant) if layout == "replicated"
            else llama_sequence_parallel_plan(variant, mlp_input=mlp_input))
    parallelize_module(tp, _mesh(ctx), plan)
    q, o = tp.self_attn.q_proj, tp.self_attn.o_proj
    assert isinstance(q.weight, DTensor) and q.weight.placements == (Shard(0),)
    assert isinstance(o.weight, DTensor) and o.weight.placements == (Shard(1),)
    assert q.weight.to_local().shape == (HIDDEN // W, HIDDEN)
    if o.bias is not None:
        assert o.bias.placements == (Replicate(),)

    B, S = 2, 2 * W
    tok = slice(None) if layout == "replicated" else slice(2 * ctx.rank, 2 * ctx.rank + 2)  # this rank's S
    rope = LlamaRotaryEmbedding(cfg).to(ctx.device)
    x = _rand((B, S, HIDDEN), 1, ctx.device).requires_grad_()
    dy = _rand((B, S, HIDDEN), 2, ctx.device)
    pos = rope(x, torch.arange(S, device=ctx.device)[None].expand(B, S))
    y_ref = full(x, position_embeddings=pos)
    y_ref = y_ref[0] if isinstance(y_ref, tuple) else y_ref
    (y_ref * dy).sum().backward()
    x_tp = x.detach()[:, tok].clone().requires_grad_()
    y = tp(x_tp, position_embeddings=pos)
    y = y[0] if isinstance(y, tuple) else y
    _close(ctx, y, y_ref[:, tok], INTER, f"{layout} decoder layer output")
    (y * dy[:, tok]).sum().backward()
    _close(ctx, x_tp.grad, x.grad[:, tok], INTER, f"{layout} decoder layer input grad")
    if layout != "replicated":  # the norms saw this rank's tokens: their gradients sum over ranks
        for p in (tp.input_layernorm.weight, tp.post_attention_layernorm.weight):
            torch.distributed.all_reduce(p.grad)
    _check_param_grads(ctx, tp, full, B * S, f"{layout} decoder layer")
    tilefuse.barrier()
    return True


@needs_hf
@pytest.mark.parametrize("world,variant", [(2, "fused_sequential"), pytest.param(4, "plain", marks=pytest.mark.slow)])
def test_hf_decoder_layer_replicated(pools, world, variant):
    """HF LlamaDecoderLayer + HF's tp plan on tilefuse styles: output, input grad, every param grad."""
    assert all(pools.run(world, job_decoder_layer, variant))


@needs_hf
@needs_nccl_on_gpu
@pytest.mark.parametrize("mlp_input", ["fused", "gather"])
def test_hf_decoder_layer_sequence_parallel(pools, mlp_input):
    """HF LlamaDecoderLayer, [B, S, H] sharded along S (llama_sequence_parallel_plan): output, every grad."""
    assert all(pools.run(2, job_decoder_layer, "bulk_sync", "sequence_parallel", mlp_input))


# ---------------------------------------------------------------------------------------------
# A Llama MLP, sequence-parallel along S of [B, S, H]; compiled
# ---------------------------------------------------------------------------------------------


def _sp_plan(variant):
    from torch.distributed.tensor import Shard

    return {"gate_proj": ColwiseParallel(input_layouts=Shard(1), variant=variant),
            "up_proj": ColwiseParallel(input_layouts=Shard(1), variant=variant),
            "down_proj": RowwiseParallel(output_layouts=Shard(1), variant=variant)}


def _llama_mlp(ctx, bias, seed):
    from transformers.models.llama.modeling_llama import LlamaMLP

    cfg = _llama_config(kv_heads=HEADS)
    cfg.mlp_bias = bias
    torch.manual_seed(seed)
    return LlamaMLP(cfg).to(ctx.device)


def job_mlp_sequence_parallel(ctx, variant, bias, compiled):
    from torch.distributed.tensor.parallel import parallelize_module

    W, r = ctx.world, ctx.rank
    mesh = _mesh(ctx)
    full = _llama_mlp(ctx, bias, 21)
    sp = parallelize_module(copy.deepcopy(full), mesh, _sp_plan(variant))
    full_rep = _llama_mlp(ctx, bias, 22)
    mlp_plan = {k: v for k, v in LLAMA_PLAN.items() if k in ("gate_proj", "up_proj", "down_proj")}
    rep = parallelize(copy.deepcopy(full_rep), mlp_plan, variant=variant, mesh=mesh)

    def step(a, b):
        return sp(a), rep(b)

    if compiled:
        from torch._dynamo.testing import CompileCounterWithBackend

        torch._dynamo.reset()
        cnt = CompileCounterWithBackend("inductor" if ctx.on_gpu else "aot_eager")
        step = torch.compile(step, fullgraph=True, backend=cnt)
    B, S_loc = 2, 2
    S = W * S_loc
    rows = slice(r * S_loc, (r + 1) * S_loc)
    for it in range(2 if compiled else 1):
        x = _rand((B, S, HIDDEN), 30 + it, ctx.device).requires_grad_()
        dy = _rand((B, S, HIDDEN), 40 + it, ctx.device)
        xr = _rand((B, 3, HIDDEN), 50 + it, ctx.device).requires_grad_()
        dyr = _rand((B, 3, HIDDEN), 60 + it, ctx.device)
        for m in (full, full_rep, sp, rep):
            m.zero_grad(set_to_none=True)
        ((full(x) * dy).sum() + (full_rep(xr) * dyr).sum()).backward()
        x_loc = x.detach()[:, rows].clone().requires_grad_()
        xr_tp = xr.detach().clone().requires_grad_()
        y, yr = step(x_loc, xr_tp)
        y_ref = full(x.detach())[:, rows]
        _close(ctx, y, y_ref, INTER, f"SP MLP output (step {it})")
        _close(ctx, yr, full_rep(xr.detach()), INTER, f"replicated MLP output (step {it})")
        ((y * dy[:, rows]).sum() + (yr * dyr).sum()).backward()
        _close(ctx, x_loc.grad, x.grad[:, rows], INTER, f"SP MLP input grad (step {it})")
        _close(ctx, xr_tp.grad, xr.grad, INTER, f"replicated MLP input grad (step {it})")
        _check_param_grads(ctx, sp, full, B * S, f"SP MLP (step {it})")
        _check_param_grads(ctx, rep, full_rep, B * 3, f"replicated MLP (step {it})")
    if compiled:
        assert cnt.frame_count == 1, f"{cnt.frame_count} graphs (a graph break or a recompile)"
    tilefuse.barrier()
    return True


@needs_hf
@pytest.mark.parametrize("world,variant,bias", [(2, "producer_consumer", True)])
def test_hf_mlp_sequence_parallel(pools, world, variant, bias):
    """HF LlamaMLP with [B, S, H] sharded along S (Shard(1) styles) and LLAMA_PLAN strings: output, grads."""
    assert all(pools.run(world, job_mlp_sequence_parallel, variant, bias, False))


@needs_hf
def test_compile_fullgraph(pools):
    """torch.compile(fullgraph=True) of both parallelized MLPs: one graph, same results on fresh data."""
    assert all(pools.run(2, job_mlp_sequence_parallel, "auto", False, True))


# ---------------------------------------------------------------------------------------------
# Replicated-output colwise, replicated-input rowwise, DTensor in and out
# ---------------------------------------------------------------------------------------------


class _Pair(nn.Module):
    def __init__(self, h, f):
        super().__init__()
        self.up = nn.Linear(h, f, bias=True)
        self.down = nn.Linear(f, h, bias=True)

    def forward(self, x):
        return self.down(torch.tanh(self.up(x)))


def job_gather_and_split(ctx, variant):
    from torch.distributed.tensor import DTensor, Shard

    W = ctx.world
    mesh = _mesh(ctx)
    torch.manual_seed(7)
    full = _Pair(16, 8 * W).to(ctx.device)
    tp = parallelize(copy.deepcopy(full), {"up": "colwise_gather_output", "down": "rowwise_split_input"},
                     variant=variant, mesh=mesh)
    assert tp.up.weight.placements == (Shard(0),) and tp.down.weight.placements == (Shard(1),)
    x = _rand((5, 16), 3, ctx.device).requires_grad_()
    dy = _rand((5, 16), 4, ctx.device)
    y_ref = full(x)
    (y_ref * dy).sum().backward()
    x_tp = x.detach().clone().requires_grad_()
    y = tp(x_tp)
    _close(ctx, y, y_ref, 8 * W, "gathered/split output")
    (y * dy).sum().backward()
    _close(ctx, x_tp.grad, x.grad, 8 * W, "gathered/split input grad")
    _check_param_grads(ctx, tp, full, 5, "gathered/split")

    # DTensor in, DTensor out: a Shard(0) input is gathered to the style's Replicate() layout first.
    lin = ColwiseParallel(use_local_output=False, variant=variant)._apply(copy.deepcopy(full.up), mesh)
    x4 = _rand((2 * W, 16), 5, ctx.device)
    xd = DTensor.from_local(x4[2 * ctx.rank:2 * ctx.rank + 2], mesh, (Shard(0),), run_check=False)
    with torch.no_grad():
        yd, y4 = lin(xd), full.up(x4)
    assert isinstance(yd, DTensor) and yd.placements == (Shard(1),), yd
    _close(ctx, yd.to_local(), y4.chunk(W, -1)[ctx.rank], 16, "DTensor colwise output")
    _close(ctx, yd.full_tensor(), y4, 16, "DTensor colwise full output")
    tilefuse.barrier()
    return True


@needs_nccl_on_gpu
def test_gather_output_and_split_input(pools):
    """colwise_gather_output (gemm_all_scatter) + rowwise_split_input, with biases; DTensor in and out."""
    assert all(pools.run(2, job_gather_and_split, "wg_specialized"))


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


def job_bad_inputs(ctx):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard

    def raises(exc, match, fn, *args, **kwargs):
        with pytest.raises(exc, match=match):
            fn(*args, **kwargs)

    mesh = _mesh(ctx)
    # Like torch's styles (src_data_rank=0): every rank ends up with its shard of rank 0's layer.
    torch.manual_seed(100 + ctx.rank)
    mine = nn.Linear(4, 2 * ctx.world)
    torch.manual_seed(100)
    rank0 = nn.Linear(4, 2 * ctx.world)
    ColwiseParallel()._apply(mine, mesh)
    assert torch.equal(mine.weight.to_local().cpu(), rank0.weight.detach().chunk(ctx.world, 0)[ctx.rank])
    assert torch.equal(mine.bias.to_local().cpu(), rank0.bias.detach().chunk(ctx.world, 0)[ctx.rank])
    raises(ValueError, r"ColwiseParallel: input_layouts must be Replicate\(\) or Shard\(dim\), got P",
           ColwiseParallel, input_layouts=Partial())
    raises(ValueError, r"ColwiseParallel: output_layouts Shard\(0\): a colwise output is sharded along its last",
           ColwiseParallel, output_layouts=Shard(0))
    raises(ValueError, r"input_layouts S\(1\) with output_layouts Replicate\(\) is not supported", ColwiseParallel,
           input_layouts=Shard(1), output_layouts=Replicate())
    raises(ValueError, r"RowwiseParallel: input_layouts Shard\(1\): a rowwise input is sharded along its last",
           RowwiseParallel, input_layouts=Shard(1))
    raises(ValueError, r"RowwiseParallel: output_layouts must be Replicate\(\) or Shard\(dim\)", RowwiseParallel,
           output_layouts=Partial())
    raises(TypeError, r"variant must be a string, got int", RowwiseParallel, variant=3)
    raises(TypeError, r"tilefuse's styles parallelize nn.Linear .* got GELU", ColwiseParallel()._apply, nn.GELU(),
           mesh)
    raises(ValueError, r"ColwiseParallel: out_features = 7 must be divisible by the mesh size \(2\)",
           ColwiseParallel()._apply, nn.Linear(4, 7), mesh)
    raises(ValueError, r"RowwiseParallel: in_features = 5 must be divisible by the mesh size \(2\)",
           RowwiseParallel()._apply, nn.Linear(5, 4), mesh)
    mesh2 = init_device_mesh(ctx.device.type, (1, ctx.world), mesh_dim_names=("dp", "tp"))
    unnamed = init_device_mesh(ctx.device.type, (1, ctx.world))  # a 2-D mesh with no "tp" dimension
    raises(ValueError, r"expected a 1-D DeviceMesh or one with a dimension named 'tp'.*mesh\['tp'\]",
           ColwiseParallel()._apply, nn.Linear(4, 8), unnamed)

    class Custom(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    raises(TypeError, r"Custom overrides nn.Linear.forward", ColwiseParallel()._apply, Custom(4, 8), mesh)
    col = ColwiseParallel()._apply(nn.Linear(4, 8).to(ctx.device), mesh2["tp"])  # a sliced mesh is fine
    raises(ValueError, r"ColwiseParallel: input has 3 features in its last dimension, expected 4", col,
           torch.randn(2, 3, device=ctx.device))
    raises(ValueError, r"already parallelized", ColwiseParallel()._apply, col, mesh)
    seq = ColwiseParallel(input_layouts=Shard(-1))._apply(nn.Linear(4, 8).to(ctx.device), mesh)
    raises(ValueError, r"the input layout Shard\(-1\) shards the feature dimension of a 2-D activation", seq,
           torch.randn(2, 4, device=ctx.device))
    row = RowwiseParallel(output_layouts=Shard(1))._apply(nn.Linear(8, 4).to(ctx.device), mesh)
    raises(ValueError, r"token dimension \(dim 1 of the input, size 3\) must be divisible by the mesh size \(2\)",
           row, torch.randn(2, 3, 4, device=ctx.device))
    sub = torch.distributed.new_group([0])  # collective: every rank makes it
    if ctx.rank == 0:  # a mesh of another group: tilefuse initialises a heap of its own for it
        from torch.distributed.device_mesh import DeviceMesh

        ColwiseParallel()._apply(nn.Linear(4, 8).to(ctx.device), DeviceMesh.from_group(sub, ctx.device.type))
        assert tilefuse.get_heap(sub).world_size == 1 and tilefuse.get_heap().world_size == ctx.world
        tilefuse.shutdown(group=sub)
    # The sequence-parallel plan refuses a CUDA mesh over gloo (ranks sharing a GPU), where torch's
    # gathers would kill the processes; the test's own mesh goes through unless it is one (ranks
    # sharing a GPU in a GPU run), where it is refused the same way.
    class GlooCuda:
        device_type = "cuda"

        def get_all_groups(self):  # a mesh of any number of dimensions: every group is looked at
            return mesh.get_all_groups()

    refused = r"llama_sequence_parallel_plan: .* crashes the process under gloo on CUDA"
    gloo = torch.distributed.get_backend(mesh.get_group()) == "gloo"
    for gather in ("self_attn", "mlp"):
        style = llama_sequence_parallel_plan(mlp_input="gather")[gather]
        if gloo:
            raises(RuntimeError, refused, style._apply, nn.Identity(), GlooCuda())
        if gloo and mesh.device_type == "cuda":
            raises(RuntimeError, refused, style._apply, nn.Identity(), mesh)
        else:
            style._apply(nn.Identity(), mesh)
    raises(ValueError, r"'rowwise_seq' is not a style of torch's / HF's meaning", style_from_name, "rowwise_seq")
    raises(ValueError, r"entry 'norm': 'sequence_parallel' is not a style", from_hf_plan,
           {"norm": "sequence_parallel"})
    raises(TypeError, r"plan entry 'act' matches 'act', a GELU; only nn.Linear or nn.Embedding modules",
           parallelize, _Named(), {"act": ColwiseParallel()})
    tilefuse.barrier()
    return True


class _Named(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.GELU()


def test_bad_inputs(pools):
    assert all(pools.run(2, job_bad_inputs))


# ---------------------------------------------------------------------------------------------
# examples/tp_llama.py --smoke
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_tp_llama_example_smoke(tmp_path, on_gpu):
    """The example's --smoke mode: two CPU ranks, tiny config, both styles and tilefuse's compiled (one
    graph for the two decoder layers' forward + backward over two calls), a CSV with every method."""
    if on_gpu:
        pytest.skip("the smoke mode runs CPU ranks; the GPU run is the example's normal mode")
    if not HAVE_TRANSFORMERS:
        pytest.skip("transformers is not installed")
    out = tmp_path / "tp_llama.csv"
    env = {**os.environ, "TILEFUSE_BACKEND": "cpu", "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "tp_llama.py"), "--smoke", "--csv",
                           str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"tp_llama.py --smoke failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    text = out.read_text().splitlines()
    assert text[0].startswith("layout,"), text[:2]
    methods = {line.split(",")[2] for line in text[1:]}
    assert {"tilefuse", "tilefuse_unfused", "torch", "tilefuse_compiled"} <= methods, methods
    source = open(os.path.join(ROOT, "examples", "tp_llama.py")).read()
    assert "from benchmarks" not in source and "import benchmarks" not in source  # self-contained
    graphs = [line.split(",") for line in text[1:] if line.split(",")[2] == "tilefuse_compiled"
              and line.split(",")[10] == "graphs"]
    assert [float(row[11]) for row in graphs] == [1.0], graphs


# ---------------------------------------------------------------------------------------------
# A data x tensor mesh: tilefuse serves the TP dimension's group
# ---------------------------------------------------------------------------------------------


def group_two_dim_mesh(rank, world):
    """Ranks (dp, tp) of a 2 x 2 mesh: the first style's _apply initialises tilefuse on mesh["tp"]'s
    group; each data-parallel replica feeds its own tokens through its own TP pair."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tp_mesh, dp, tp = mesh["tp"], mesh.get_local_rank("dp"), mesh.get_local_rank("tp")
    assert not tilefuse.is_initialized()
    torch.manual_seed(4)
    full = _Pair(16, 32)
    model = parallelize_module(copy.deepcopy(full), tp_mesh, {"up": ColwiseParallel(variant="bulk_sync"),
                                                            "down": RowwiseParallel(variant="bulk_sync")})
    heap = tilefuse.get_heap()
    assert heap.group is tp_mesh.get_group() and heap.world_size == 2
    assert dist.get_process_group_ranks(heap.group) == [2 * dp, 2 * dp + 1]
    x = _rand((6, 16), 100 + dp, "cpu").requires_grad_()  # this replica's data
    y_ref = full(x)
    y_ref.sum().backward()
    x_tp = x.detach().clone().requires_grad_()
    y = model(x_tp)
    y.sum().backward()
    errs = [float((y - y_ref).abs().max()), float((x_tp.grad - x.grad).abs().max()),
            float((model.up.weight.grad.to_local() - full.up.weight.grad.chunk(2, 0)[tp]).abs().max()),
            float((model.down.weight.grad.to_local() - full.down.weight.grad.chunk(2, 1)[tp]).abs().max())]
    tilefuse.shutdown()
    dist.barrier()  # global rank 0 hosts the store the other TP pair's shutdown still reads
    dist.destroy_process_group()
    return errs


def test_two_dim_mesh(on_gpu):
    """dp x tp = 2 x 2: tilefuse initialised by the styles on each TP pair's group; output and grads."""
    if on_gpu:
        pytest.skip("CPU ranks (gloo, interpreter): the GPU image runs the same styles in the pools' tests")
    from harness import run_group

    res = run_group(group_two_dim_mesh, 4, timeout=240)
    for rank, (status, value) in sorted(res.items()):
        assert status == "ok", f"rank {rank}: {status}\n{value}"
        assert max(value) < 1e-4, f"rank {rank}: max errors (output, dx, d up, d down) {value}"
