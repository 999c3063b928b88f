"""Llama decoder layers with tensor parallelism: tilefuse's ParallelStyles against torch's own, timed.

Every rank builds the same stack of Hugging Face ``LlamaDecoderLayer`` s (random weights, config from
the arguments: Llama-3-8B's shapes by default, no download) and parallelizes two copies with
``torch.distributed.tensor.parallel.parallelize_module`` on a 1-D DeviceMesh over the ranks:

* ``tilefuse``: tilefuse's styles (:mod:`tilefuse.nn.styles`);
* ``torch``: torch's own ``ColwiseParallel`` / ``RowwiseParallel`` / ``PrepareModuleInput``;
* ``torch_async_tp`` (``--async-tp``, GPUs with NCCL): torch's styles compiled with Inductor's
  micro-pipelined TP (``_micro_pipeline_tp``: fused all-gather / reduce-scatter matmuls on symmetric
  memory);
* ``tilefuse_compiled`` (``--compile``, sequence-parallel layout): tilefuse's styles under
  ``torch.compile`` (Inductor on GPUs, ``aot_eager`` on CPU ranks), so that the norms, rotary
  embeddings and activations around the fused ops are compiled as in torch's async-TP.

Two layouts:

* ``sequence_parallel``: forward + backward of ``[1, T/W, H]`` per rank (T tokens split along the
  sequence), tilefuse's plan :func:`tilefuse.nn.llama_sequence_parallel_plan` (attention input
  gathered once, o_proj ``gemm_reduce_scatter``, gate/up ``all_gather_gemm``, down
  ``gemm_reduce_scatter``) against torch's equivalent SP plan;
* ``decode``: forward of ``[M, 1, H]`` (M sequences, one new token each; the attention sees only
  that token: no KV cache, so the step times the linears, norms and communication), the replicated
  layout (HF's ``tp_plan``: colwise local GEMMs, rowwise ``gemm_all_reduce``), eagerly and, on GPUs,
  captured in a CUDA graph (``*_graph`` methods; torch's styles only with NCCL). tilefuse's step runs
  :func:`tilefuse.nn.fuse_allreduce_norm`: each o_proj and down_proj, its residual add and the RMSNorm
  after it (post_attention_layernorm, the next layer's input_layernorm, the stack's final norm) are
  one ``gemm_all_reduce(..., residual=, norm_weight=)`` call; ``tilefuse_unfused`` is the same styles
  without it.

Before timing, each method's output (and input gradient) is checked against the unsharded layers run
on all tokens (tilefuse's must agree; a torch method whose collectives cannot run is reported "not
run" with the reason).
Times: per round, each method's ``--calls`` back-to-back calls between CUDA events (host time on CPU
ranks), the maximum over ranks; the median over ``--rounds`` rounds, the methods' order alternating.
One long-format CSV row per (layout, M, method, metric). The example is self-contained (its own
rank set-up and timing; it imports only torch, transformers and tilefuse).

    torchrun --nproc-per-node 2 examples/tp_llama.py --csv tp_llama.csv   # a GPU per rank, NCCL
    python examples/tp_llama.py --world 2 --csv tp_llama.csv               # spawned ranks (share GPUs: gloo)
    python examples/tp_llama.py --smoke                                    # 2 CPU ranks, tiny config

``--smoke``: two CPU ranks in Triton's interpreter, hidden 64, 2 layers, a few tokens, fp32; it
proves the example runs and agrees with torch, not speed.
"""

from __future__ import annotations

import argparse
import copy
import csv
import datetime
import os
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

LLAMA3_8B = dict(hidden=4096, heads=32, kv_heads=8, inter=14336)
SMOKE = dict(hidden=64, heads=4, kv_heads=2, inter=128, layers=2, tokens=8, decode="1,4", world=2)
COLUMNS = ["layout", "M", "method", "world", "layers", "hidden", "inter", "heads", "kv_heads", "dtype", "metric",
           "value", "note", "device", "torch", "commit"]


class Stack(nn.Module):
    """``layers`` HF Llama decoder layers, applied in turn with the same rotary embeddings, then the
    final RMSNorm (as in ``LlamaModel``)."""

    def __init__(self, cfg, layers: int):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm

        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, layer_idx=i) for i in range(layers))
        self.norm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def forward(self, x, pos):
        for layer in self.layers:
            x = layer(x, position_embeddings=pos)
            x = x[0] if isinstance(x, tuple) else x
        return self.norm(x)


# Ranks: spawned here, or started by torchrun -----------------------------------------------------


@dataclass
class Rank:
    rank: int
    world: int
    device: torch.device
    host_group: object  # gloo: host barriers and the maximum of times over ranks

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def barrier(self) -> None:
        if self.on_gpu:
            torch.cuda.synchronize(self.device)
        dist.barrier(group=self.host_group)

    def max(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.host_group)
        return float(t.item())


def _setup(rank: int, world: int, init_method: str, local_rank: int, heap_size) -> Rank:
    """This process as rank ``rank``: its GPU, the process group (NCCL where every rank has a GPU of
    its own, else gloo) and tilefuse's heap."""
    import tilefuse

    gpus = torch.cuda.device_count() if os.environ.get("TILEFUSE_BACKEND") != "cpu" else 0
    if gpus:
        torch.cuda.set_device(local_rank % gpus)
    backend = "nccl" if gpus >= world else "gloo"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    host_group = dist.new_group(backend="gloo") if backend != "gloo" else dist.group.WORLD
    heap = tilefuse.init(heap_size=heap_size)
    return Rank(rank, world, heap.device, host_group)


def _close() -> None:
    import tilefuse

    try:
        tilefuse.shutdown()
    finally:
        dist.destroy_process_group()


def _spawned(rank: int, world: int, port: int, args, heap_size, results) -> None:
    try:
        ctx = _setup(rank, world, f"tcp://127.0.0.1:{port}", rank, heap_size)
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
        return
    try:
        results.put((rank, "ok", _rank_main(ctx, args)))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
    finally:
        _close()


def launch(args, heap_size) -> list:
    """Every rank's rows: this rank's under torchrun, else ``args.world`` spawned ranks'."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        ctx = _setup(rank, world, "env://", int(os.environ.get("LOCAL_RANK", rank)), heap_size)
        try:
            return [_rank_main(ctx, args)]
        finally:
            _close()
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    spawn = mp.get_context("spawn")
    results = spawn.Queue()
    procs = [spawn.Process(target=_spawned, args=(r, args.world, port, args, heap_size, results), daemon=True)
             for r in range(args.world)]
    for proc in procs:
        proc.start()
    got = {}
    while len(got) < args.world:
        rank, status, value = results.get(timeout=3600)
        got[rank] = (status, value)
        if status == "error":
            for proc in procs:
                proc.join(timeout=30)
            raise RuntimeError(f"rank {rank} failed:\n{value}")
    for proc in procs:
        proc.join(timeout=60)
    return [got[r][1] for r in range(args.world)]


def time_interleaved(ctx: Rank, fns: list, calls: int, rounds: int) -> list:
    """Per function, ms per call: the median over rounds of the maximum over ranks of ``calls``
    back-to-back calls (CUDA events on a GPU, the host clock on CPU ranks); methods interleaved."""
    times = [[] for _ in fns]
    for r in range(rounds):
        order = list(range(len(fns))) if r % 2 == 0 else list(reversed(range(len(fns))))
        for i in order:
            fns[i]()  # warm
            ctx.barrier()
            if ctx.on_gpu:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(calls):
                    fns[i]()
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end) / calls
            else:
                t0 = time.perf_counter()
                for _ in range(calls):
                    fns[i]()
                ms = (time.perf_counter() - t0) * 1e3 / calls
            times[i].append(ctx.max(ms))
    return [statistics.median(t) for t in times]


def run_info(device: torch.device) -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu-interpreter"
    return {"device": name, "torch": torch.__version__, "commit": commit}


def parse_bytes(text: str) -> int:
    """``512M``, ``8G`` or a byte count."""
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)


def torch_sp_plan():
    """torch's own sequence-parallel plan for one decoder layer (the norms on local tokens)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

    return {
        "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                        desired_input_kwarg_layouts={"hidden_states": Replicate()}),
        "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
    }


def layer_plans(cfg, variant: str, mlp_input: str) -> dict:
    """Per-layer plans: {(layout, method): plan}."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from tilefuse.nn import from_hf_plan, llama_sequence_parallel_plan

    hf = {k.removeprefix("layers.*."): v for k, v in cfg.base_model_tp_plan.items()}
    torch_rep = {k: ColwiseParallel() if v == "colwise" else RowwiseParallel() for k, v in hf.items()}
    return {("sequence_parallel", "tilefuse"): llama_sequence_parallel_plan(variant, mlp_input=mlp_input),
            ("sequence_parallel", "torch"): torch_sp_plan(),
            ("decode", "tilefuse"): from_hf_plan(hf, variant=variant),
            ("decode", "torch"): torch_rep}


def parallelized(full: Stack, mesh, plan: dict) -> Stack:
    from torch.distributed.tensor.parallel import parallelize_module

    model = copy.deepcopy(full)
    for layer in model.layers:
        parallelize_module(layer, mesh, plan)
    return model


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))


def _graph(ctx, fn):
    """``fn`` captured in a CUDA graph (after eager calls on a side stream); returns the replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    ctx.barrier()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    ctx.barrier()
    return g.replay


def _rank_main(ctx, args) -> list:
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from tilefuse.nn import fuse_allreduce_norm

    W, dev = ctx.world, ctx.device
    if args.log_level:  # tilefuse's decisions: DEBUG names each auto decision and its source, INFO each tuning
        import logging

        logging.basicConfig(level=args.log_level.upper(), format=f"[rank {dist.get_rank()}] %(message)s")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    if not ctx.on_gpu:
        dtype = torch.float32  # the interpreter's bf16 arithmetic is wrong
        torch.set_num_threads(1)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    cfg = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.inter, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, num_hidden_layers=args.layers, vocab_size=128,
                      max_position_embeddings=max(args.tokens, 8192), attn_implementation="sdpa")
    mesh = init_device_mesh(dev.type, (W,))
    torch.manual_seed(0)
    with torch.device(dev):
        full = Stack(cfg, args.layers).to(dtype)
        rope = LlamaRotaryEmbedding(cfg)
    plans = layer_plans(cfg, args.variant, args.mlp_input)
    info = run_info(dev)
    base = dict(world=W, layers=args.layers, hidden=args.hidden, inter=args.inter, heads=args.heads,
                kv_heads=args.kv_heads, dtype=str(dtype).removeprefix("torch."), device=info["device"],
                torch=info["torch"], commit=info["commit"])
    rows = []

    def add(layout, M, method, metric, value, note=""):
        rows.append({**base, "layout": layout, "M": M, "method": method, "metric": metric, "value": value,
                     "note": note})

    def check(layout, M, method, what, got, ref):
        """``got`` against the unsharded stack's ``ref``; tilefuse must agree, torch's is recorded."""
        err = rel_error(got, ref)
        add(layout, M, method, f"rel_err_{what}", err, "against the unsharded layers")
        if method.startswith("tilefuse") and not err <= tol:
            raise AssertionError(f"{layout} M={M}: tilefuse's {what} differs from the unsharded layers': "
                                 f"relative error {err:.3g} > {tol:g}")

    def build(layout, M):
        """The parallelized copies; torch's may fail where its collectives cannot run (gloo on GPUs).
        In the decode layout tilefuse's runs each row-parallel projection and the norm after it as one
        call (``fuse_allreduce_norm``); ``tilefuse_unfused`` is the same styles without it."""
        models = {"tilefuse": parallelized(full, mesh, plans[(layout, "tilefuse")])}
        if layout == "decode":
            models["tilefuse_unfused"] = models["tilefuse"]
            models["tilefuse"] = fuse_allreduce_norm(parallelized(full, mesh, plans[(layout, "tilefuse")]))
        if ctx.on_gpu and dist.get_backend() != "nccl":
            # Ranks sharing a GPU use gloo, whose collectives on CUDA tensors can kill the process
            # under DTensor (see the sequence-parallel layout below): torch's styles are not run.
            add(layout, M, "torch", "ms", float("nan"), "not run: torch's styles need NCCL on GPUs (ranks "
                "sharing a GPU use gloo)")
            return models
        try:
            models["torch"] = parallelized(full, mesh, plans[(layout, "torch")])
        except Exception as err:
            add(layout, M, "torch", "ms", float("nan"), f"not run: {type(err).__name__}: {err}"[:200])
        return models

    def first_calls(layout, M, models, call):
        """One checked call of each method; a torch method that raises is dropped with a row saying why."""
        outs = {}
        for method, model in list(models.items()):
            try:
                outs[method] = call(model)
            except Exception as err:
                if method == "tilefuse":
                    raise
                add(layout, M, method, "ms", float("nan"), f"not run: {type(err).__name__}: {err}"[:200])
                del models[method]
        return outs

    reps = dict(calls=args.calls, rounds=args.rounds)
    if "sequence_parallel" in args.layouts and ctx.on_gpu and dist.get_backend() != "nccl":
        # Ranks sharing a GPU use gloo, and DTensor's sequence-parallel redistributions (the inputs of
        # the norms and attention) kill the processes with a segmentation fault under gloo on CUDA
        # tensors (torch 2.11; tests/test_styles.py skips them likewise): say so instead.
        why = "not run: the sequence-parallel layout needs one GPU per rank (NCCL); ranks sharing a GPU use gloo"
        for method in ("tilefuse", "torch") + (("tilefuse_compiled",) if args.compile else ()):
            add("sequence_parallel", args.tokens, method, "ms", float("nan"), why)
        if ctx.rank == 0:
            print(f"tp_llama: sequence_parallel {why}", file=sys.stderr, flush=True)
    elif "sequence_parallel" in args.layouts:
        layout, T = "sequence_parallel", args.tokens
        if T % W:
            raise ValueError(f"--tokens {T} must be divisible by the world size {W}")
        g = torch.Generator(device=dev).manual_seed(1)
        x_full = torch.randn(1, T, args.hidden, device=dev, dtype=dtype, generator=g)
        dy_full = torch.randn(1, T, args.hidden, device=dev, dtype=dtype, generator=g)
        rows_r = slice(ctx.rank * (T // W), (ctx.rank + 1) * (T // W))
        x, dy = x_full[:, rows_r].contiguous(), dy_full[:, rows_r].contiguous()
        pos = rope(x_full, torch.arange(T, device=dev)[None])
        xf = x_full.clone().requires_grad_()
        y_ref = full(xf, pos)
        y_ref.backward(dy_full)
        y_ref, dx_ref = y_ref.detach()[:, rows_r], xf.grad[:, rows_r]
        del xf
        full.zero_grad(set_to_none=True)

        def step(model):
            def run():
                xi = x.detach().requires_grad_()
                y = model(xi, pos)
                y.backward(dy)
                return y.detach(), xi.grad
            return run

        models = build(layout, T)
        outs = first_calls(layout, T, models, lambda model: step(model)())
        for method, (y, dx) in outs.items():
            check(layout, T, method, "output", y, y_ref)
            check(layout, T, method, "input_grad", dx, dx_ref)
        fns = {m: step(model) for m, model in models.items()}
        if args.compile:
            fns.update(_compiled(ctx, models["tilefuse"], step, add, check, layout, T, y_ref, dx_ref))
        if args.async_tp and "torch" in models:
            fns.update(_async_tp(ctx, models["torch"], step, add, layout, T))
        for method, ms in zip(fns, time_interleaved(ctx, list(fns.values()), **reps)):
            add(layout, T, method, "ms", ms, "forward + backward")
        del models, outs, fns
    if "decode" in args.layouts:
        layout = "decode"
        models = build(layout, 0)
        for M in args.decode:
            g = torch.Generator(device=dev).manual_seed(M)
            x = torch.randn(M, 1, args.hidden, device=dev, dtype=dtype, generator=g)
            pos = rope(x, torch.full((M, 1), args.tokens - 1, device=dev))
            with torch.no_grad():
                y_ref = full(x, pos)
                outs = first_calls(layout, M, models, lambda model, x=x, pos=pos: model(x, pos))
                for method, y in outs.items():
                    check(layout, M, method, "output", y, y_ref)
                fns = {m: (lambda model=model, x=x, pos=pos: model(x, pos)) for m, model in models.items()}
                if ctx.on_gpu and dist.get_backend() != "nccl" and args.variant in ("auto", "plain"):
                    # Ranks sharing a GPU: the plain path's gloo collectives go through the host, which a
                    # CUDA graph cannot capture (auto runs it where the table says plain).
                    add(layout, M, "tilefuse_graph", "ms", float("nan"), f"not run: variant {args.variant!r} "
                        "may run the plain path, whose gloo collectives a graph cannot capture (ranks sharing "
                        "a GPU); name a fused variant (--variant)")
                elif ctx.on_gpu:
                    fns["tilefuse_graph"] = _graph(ctx, fns["tilefuse"])
                    fns["tilefuse_unfused_graph"] = _graph(ctx, fns["tilefuse_unfused"])
                    if "torch" in models and dist.get_backend() == "nccl":
                        fns["torch_graph"] = _graph(ctx, fns["torch"])
                    else:
                        add(layout, M, "torch_graph", "ms", float("nan"), "not run: torch's styles need NCCL "
                            "(ranks sharing a GPU use gloo, whose collectives cannot be captured)")
                for method, ms in zip(fns, time_interleaved(ctx, list(fns.values()), **reps)):
                    add(layout, M, method, "ms", ms, "forward, CUDA graph replay" if method.endswith("_graph")
                        else "forward, eager")
    return rows if ctx.rank == 0 else []


def _compiled(ctx, model, step, add, check, layout, T, y_ref, dx_ref) -> dict:
    """tilefuse's styles under torch.compile (Inductor on GPUs, aot_eager on CPU ranks), checked like
    the eager layers; a row ``graphs`` says how many graphs Dynamo made (1: no graph break)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor" if ctx.on_gpu else "aot_eager")
    run = step(torch.compile(model, backend=counter))
    y, dx = run()
    check(layout, T, "tilefuse_compiled", "output", y, y_ref)
    check(layout, T, "tilefuse_compiled", "input_grad", dx, dx_ref)
    run()  # fresh inputs of the same shapes: no recompile expected
    add(layout, T, "tilefuse_compiled", "graphs", float(counter.frame_count),
        "graphs Dynamo compiled for forward + backward, two calls (1: no graph break, no recompile)")
    return {"tilefuse_compiled": run}


def _async_tp(ctx, torch_model, step, add, layout, T) -> dict:
    """torch's styles compiled with micro-pipelined TP, where it can run (GPUs, NCCL)."""
    if not ctx.on_gpu or dist.get_backend() != "nccl":
        add(layout, T, "torch_async_tp", "ms", float("nan"), "not run: needs a GPU per rank and NCCL")
        return {}
    try:
        import torch._inductor.config as inductor_config
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        inductor_config._micro_pipeline_tp = True
        enable_symm_mem_for_group(dist.group.WORLD.group_name)
        run = step(torch.compile(torch_model, fullgraph=False))
        run()
        return {"torch_async_tp": run}
    except Exception as err:  # a torch build without symmetric memory: the row says why
        add(layout, T, "torch_async_tp", "ms", float("nan"), f"not run: {type(err).__name__}: {err}"[:200])
        return {}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=None, help="ranks to spawn (default: all GPUs, or 2)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=LLAMA3_8B["hidden"])
    p.add_argument("--heads", type=int, default=LLAMA3_8B["heads"])
    p.add_argument("--kv-heads", type=int, default=LLAMA3_8B["kv_heads"])
    p.add_argument("--inter", type=int, default=LLAMA3_8B["inter"])
    p.add_argument("--tokens", type=int, default=8192, help="sequence-parallel tokens T (all ranks together)")
    p.add_argument("--decode", default="1,8,16,32,64", help="decode batch sizes M, comma-separated")
    p.add_argument("--layouts", default="sequence_parallel,decode")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--variant", default="auto", help="tilefuse op variant (auto, plain or one of tilefuse.VARIANTS)")
    p.add_argument("--mlp-input", default="fused", choices=("fused", "gather"),
                   help="SP layout: gate/up as all_gather_gemm (fused) or local GEMMs behind one all-gather")
    p.add_argument("--async-tp", action="store_true", help="also time torch's styles with micro-pipelined TP")
    p.add_argument("--compile", action="store_true",
                   help="also time tilefuse's styles under torch.compile (sequence-parallel layout)")
    p.add_argument("--heap", default=None, help="tilefuse heap bytes per rank, e.g. 8G (default: tilefuse's)")
    p.add_argument("--calls", type=int, default=20, help="back-to-back calls per timing")
    p.add_argument("--rounds", type=int, default=5, help="timings per method, the methods interleaved")
    p.add_argument("--csv", default=None, help="write the rows to this CSV file")
    p.add_argument("--log-level", default=None, choices=("debug", "info", "warning"),
                   help="log tilefuse's messages at this level (debug: every auto decision and its source)")
    p.add_argument("--smoke", action="store_true", help="two CPU ranks, tiny config (a test runs it)")
    args = p.parse_args(argv)
    if args.smoke:
        os.environ["TILEFUSE_BACKEND"] = "cpu"
        os.environ["TRITON_INTERPRET"] = "1"
        for key, value in SMOKE.items():
            setattr(args, key, value)
        args.calls, args.rounds = 1, 1
        args.compile = True
    args.decode = [int(m) for m in str(args.decode).split(",") if m.strip()]
    args.layouts = [s.strip() for s in args.layouts.split(",") if s.strip()]
    unknown = set(args.layouts) - {"sequence_parallel", "decode"}
    if unknown:
        p.error(f"unknown layouts {sorted(unknown)}; choose from sequence_parallel, decode")
    if args.world is None:
        args.world = max(2, torch.cuda.device_count()) if os.environ.get("TILEFUSE_BACKEND") != "cpu" else 2
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    results = launch(args, parse_bytes(args.heap) if args.heap else None)
    rows = [r for rank_rows in results for r in rank_rows]
    if not rows:  # under torchrun only rank 0 reports
        return 0
    for r in rows:
        value = r["value"]
        shown = f"{value:.4g}" if isinstance(value, float) else value
        print(f"{r['layout']:>17} M={r['M']:<5} {r['method']:<15} {r['metric']:<16} {shown}  {r['note']}")
    if args.csv:
        path = Path(args.csv)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {len(rows)} rows to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
