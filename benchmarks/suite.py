"""Every op and variant at world W against its baselines, on named shape sets, in the same run.

    python -m benchmarks suite --ops all --sets iris,llama3-8b,llama3-70b,decode --world W
                               [--variants ...] [--dtype bfloat16] [--csv PATH] [--plots DIR]
    torchrun --nproc-per-node W -m benchmarks.suite ...        (then --world is ignored)

Per op and shape (``tilefuse/tuning/shapes.json`` sets, or ``--shapes MxNxK``: per-rank operands
``a [M, K] @ b [K, N]``) the methods below are checked against ``variant="reference"`` on inputs of
their own (outputs and new workspaces NaN first), then timed with their calls interleaved
(:func:`benchmarks.timing.bench_interleaved`); a method that raises is recorded and the run goes on.
At world 1 nothing moves between GPUs, so a variant's time over ``gemm``'s is its fusion tax.

========== ================================================================================
gemm       torch.matmul of this rank's GEMM alone (all_gather_gemm: over the gathered ``W*M`` rows)
comm       the collective alone with torch.distributed (NCCL when each rank has its own GPU)
plain      the op with ``variant="plain"``: torch.matmul + the torch.distributed collective
torch_fused torch's async-TP op where one exists; skipped, with the reason in ``note``, elsewhere
<variant>  every tilefuse variant (or ``--variants``: ``plain_again`` times plain once more, a
           control; ``core`` the GEMM core alone, ``tilefuse.matmul``; ``copy_engine`` the form)
auto       the public op with ``variant="auto"``; its rows' ``note`` says what it ran
ideal      derived: ``max(t_gemm, t_comm)``, perfect overlap of the two
========== ================================================================================

Derived metrics: ``speedup_vs_plain = t_plain / t``, ``ideal_speedup = (t_gemm + t_comm) /
max(t_gemm, t_comm)``, ``frac_of_ideal``, ``TFLOP/s``, ``busbw_GB/s``, ``host_ms`` (calls timed one
at a time: W > 1 or ``--sync-each``); with ``--graphs``, each method replayed in a CUDA graph too
(``graph_ms``, ``graph_speedup_vs_plain``). The CSV's columns and metrics: docs/BENCHMARKS.md.

``--fp8 tensorwise`` or ``rowwise``: float8 (e4m3) operands with float32 scales of that kind, ``b`` a
float8 Linear weight's transpose, results in bfloat16 (float16 on the CPU). Then ``gemm`` is
``torch._scaled_mm`` as a user calls it (K and N padded to multiples of 16 where needed), ``comm``
moves what the plain path moves (float8 rows as bytes; the reducing ops' fp32 partials), and
``torch_fused`` is ``fused_all_gather_scaled_matmul`` / ``fused_scaled_matmul_reduce_scatter``.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import statistics
import sys
import traceback
import warnings
import zlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F

import tilefuse
from tilefuse.runtime import set_debug_poison
from tilefuse.tuning.shapes import OPS, local_shapes, shape_sets

from .checks import cuda_alive, error_text, poison, rel_error, tolerance
from .launch import is_main_process, launch, under_torchrun
from .results import COLUMNS, Progress, parse_bytes, parse_dtype, print_table, row, run_info, write_csv
from .timing import Cycle, bench_interleaved, bench_max, capture_graph, rotating, settle

BASELINES = ("gemm", "comm", "plain", "torch_fused")
CSV_COLUMNS = COLUMNS + ["set", "shape"]
# ``--variants ...,plain_again``: the plain path timed once more at that place in the order, a
# control for position effects (its speedup over plain should be 1.00 within the spread).
CONTROL = "plain_again"
# ``--variants ...,core``: tilefuse's GEMM core alone (tilefuse.matmul) on the gemm operands.
CORE = "core"
# ``--variants ...,copy_engine``: the named forms some ops have besides the four variants
# (all_gather_gemm's copy_engine: rows moved by copy engines, the GEMM on every SM but one).
FORMS = {"all_gather_gemm": ("copy_engine",)}
CUSTOM_SET = "custom"  # the set name of --shapes MxNxK entries
GPU_SETS = "iris,llama3-8b,llama3-70b,decode"
CPU_SETS = "tiny"
TORCH_FUSED = {"all_gather_gemm": "fused_all_gather_matmul",
               "gemm_reduce_scatter": "fused_matmul_reduce_scatter"}
TORCH_FUSED_FP8 = {"all_gather_gemm": "fused_all_gather_scaled_matmul",
                   "gemm_reduce_scatter": "fused_scaled_matmul_reduce_scatter"}
SCALINGS = ("tensorwise", "rowwise")
E4M3 = torch.float8_e4m3fn


# ---------------------------------------------------------------------------------------------
# What each op computes and moves
# ---------------------------------------------------------------------------------------------


def gemm_rows(op: str, M: int, world: int) -> int:
    """Rows of the op's local GEMM: all_gather_gemm multiplies the gathered ``W*M`` rows."""
    return world * M if op == "all_gather_gemm" else M


def op_flops(op: str, M: int, N: int, K: int, world: int) -> float:
    """Floating-point operations of one rank's GEMM."""
    return 2.0 * gemm_rows(op, M, world) * N * K


def comm_bytes(op: str, M: int, N: int, K: int, world: int, itemsize: int) -> float:
    """Bus bytes per rank of the collective (NCCL's busbw convention: ``(W-1)/W`` of the large side)."""
    if op == "gemm_all_scatter":
        full = world * M * N  # all-gather of the [M, N] products
    elif op == "all_gather_gemm":
        full = world * M * K  # all-gather of a
    elif op == "gemm_all_reduce":
        return 2 * M * N * itemsize * (world - 1) / world  # all-reduce: a reduce-scatter and an all-gather
    else:
        full = M * N  # reduce-scatter of the [M, N] partial
    return full * itemsize * (world - 1) / world


@dataclass
class Operands:
    """One input set on this rank."""

    a: torch.Tensor
    b: torch.Tensor
    gemm_a: torch.Tensor  # the A of the local GEMM (the gathered rows for all_gather_gemm)
    comm_in: torch.Tensor  # what the collective moves (the local product, or a)
    scaling: dict = field(default_factory=dict)  # float8: the op's scale_a, scale_b, out_dtype
    gemm_scaling: dict | None = None  # float8: the local GEMM's (all_gather_gemm: the gathered rows' scales)


@dataclass
class Method:
    label: str
    call: object  # fn(Operands) -> tensor
    expect: str  # which reference the result is checked against: "op", "gemm", "gathered"
    skip: str = ""  # why it is not run ("" = run it)
    note: str = ""  # added to every row of the method (e.g. what auto runs)
    status: str = "ok"
    times: list = field(default_factory=list)
    host: list = field(default_factory=list)  # host ms of each timed call (calls timed one at a time)


def auto_note(op: str, a: torch.Tensor, b: torch.Tensor) -> str:
    """What ``variant="auto"`` runs for ``op(a, b)`` and where the decision came from, e.g.
    ``auto -> wg_specialized (tuned (saved in ...))`` (:func:`tilefuse.auto_choice`). Ask after
    auto's calls: the first call of a bucket decides it."""
    variant, source = tilefuse.auto_choice(op, a, b)
    return f"auto -> {variant} ({source})"


def all_gather_rows(x: torch.Tensor) -> torch.Tensor:
    """``[W * rows, cols]``: every rank's ``x`` stacked in rank order (torch.distributed, any backend)."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """The fp32 sum of every rank's ``x``."""
    y = x.float().clone()
    dist.all_reduce(y)
    return y


def reduce_scatter_rows(x: torch.Tensor) -> torch.Tensor:
    """This rank's row block of the fp32 sum of every rank's ``x`` (gloo has no reduce-scatter)."""
    return all_reduce_sum(x).chunk(dist.get_world_size())[dist.get_rank()]


class Case:
    """One op on one per-rank shape on this rank: inputs, buffers, references and the methods."""

    def __init__(self, ctx, op: str, M: int, N: int, K: int, dtype: torch.dtype, heap_out: bool,
                 fp8: str | None = None):
        self.ctx, self.op, self.M, self.N, self.K, self.dtype, self.fp8 = ctx, op, M, N, K, dtype, fp8
        # float8 results (and what the gather of gemm_all_scatter moves): bf16 on a GPU, fp16 in the interpreter
        self.out_dtype = dtype if fp8 is None else (torch.bfloat16 if ctx.on_gpu else torch.float16)
        self.world = W = ctx.world
        dev = ctx.device
        self.nccl = ctx.pg_backend == "nccl" and ctx.on_gpu
        self.gen = torch.Generator(device=dev).manual_seed(zlib.crc32(f"{op} {M} {N} {K} {ctx.rank}".encode()))
        itemsize = torch.empty((), dtype=dtype).element_size()
        rows = gemm_rows(op, M, W)
        gathered = rows * K if op == "all_gather_gemm" else 0
        per_set = (M * K + K * N + gathered + (0 if op == "all_gather_gemm" else M * N)) * itemsize
        self.sets = rotating(self._make, per_set, dev)
        self.c_gemm = torch.empty(rows, N, dtype=self.out_dtype, device=dev)
        self.c_core = None  # made by methods() when the core is timed
        self.comm_out = None
        if self.nccl and op != "gemm_all_reduce":  # the all-reduce runs in place
            comm_in = self.sets[0].comm_in
            shape = (M // W, N) if op == "gemm_reduce_scatter" else (W * M, comm_in.shape[1])
            self.comm_out = torch.empty(shape, dtype=comm_in.dtype, device=dev)
        self.heap_out = None
        if op == "gemm_all_scatter" and heap_out:
            self.heap_out = tilefuse.empty(M, W * N, dtype=self.out_dtype)  # same heap offset on every rank

    def _make(self, _) -> Operands:
        M, N, K, dev, dt = self.M, self.N, self.K, self.ctx.device, self.dtype
        if self.fp8 is not None:
            return self._make_float8()
        a = torch.randn(M, K, generator=self.gen, device=dev, dtype=torch.float32).to(dt)
        b = torch.randn(K, N, generator=self.gen, device=dev, dtype=torch.float32).to(dt)
        if self.op == "all_gather_gemm":
            return Operands(a, b, all_gather_rows(a), a)
        return Operands(a, b, a, torch.matmul(a, b))

    def _make_float8(self) -> Operands:
        """Float8 operands with scales of the ``--fp8`` kind; ``b`` a Linear weight's transpose."""
        M, N, K, dev, g = self.M, self.N, self.K, self.ctx.device, self.gen
        a = torch.randn(M, K, generator=g, device=dev).to(E4M3)
        b = torch.randn(N, K, generator=g, device=dev).to(E4M3).t()
        shapes = ((M, 1), (1, N)) if self.fp8 == "rowwise" else ((), ())
        sa, sb = (torch.rand(shape, generator=g, device=dev) / K ** 0.5 + 0.01 for shape in shapes)
        scaling = {"scale_a": sa, "scale_b": sb, "out_dtype": self.out_dtype}
        if self.op == "all_gather_gemm":  # the rows travel as bytes, with their row scales
            gathered = all_gather_rows(a.view(torch.uint8)).view(E4M3)
            gathered_sa = all_gather_rows(sa) if sa.numel() > 1 else sa
            return Operands(a, b, gathered, a.view(torch.uint8), scaling, dict(scaling, scale_a=gathered_sa))
        # what the plain path's collective moves: the product (gemm_all_scatter), else fp32 partials
        moved = scaling if self.op == "gemm_all_scatter" else dict(scaling, out_dtype=torch.float32)
        return Operands(a, b, a, scaled_mm(a, b, **moved), scaling, scaling)

    # -- the methods -------------------------------------------------------------------------

    def gemm(self, s: Operands) -> torch.Tensor:
        if s.gemm_scaling is not None:  # float8: torch._scaled_mm as a user calls it
            return scaled_mm(s.gemm_a, s.b, **s.gemm_scaling)
        return torch.matmul(s.gemm_a, s.b, out=self.c_gemm)

    def core(self, s: Operands) -> torch.Tensor:
        return tilefuse.matmul(s.gemm_a, s.b, out=self.c_core, **(s.gemm_scaling or {}))

    def comm(self, s: Operands) -> torch.Tensor:
        """The collective alone, gathered along rows (gemm_all_scatter's column order is restored
        only for the check: the reshuffle is not communication)."""
        x = s.comm_in
        if self.op == "gemm_all_reduce":
            # In place: the timed sets' partials grow by W every call (no effect on the time); the
            # check runs on a fresh set first.
            if self.nccl:
                dist.all_reduce(x)
                return x
            return all_reduce_sum(x).to(x.dtype)
        if self.op == "gemm_reduce_scatter":
            if self.nccl:
                dist.reduce_scatter_tensor(self.comm_out, x)
                return self.comm_out
            return reduce_scatter_rows(x).to(x.dtype)
        if self.nccl:
            dist.all_gather_into_tensor(self.comm_out, x)
            return self.comm_out
        return all_gather_rows(x)

    def _as_result(self, label: str, got: torch.Tensor) -> torch.Tensor:
        if label == "comm" and self.op == "gemm_all_scatter":  # [W*M, N] row blocks -> [M, W*N]
            return got.view(self.world, self.M, self.N).permute(1, 0, 2).reshape(self.M, self.world * self.N)
        if label == "comm" and got.dtype == torch.uint8:  # float8 rows gathered as bytes
            return got.view(E4M3)
        return got

    def methods(self, variants: list) -> list:
        op = self.op
        out_kw = {"out": self.heap_out} if self.heap_out is not None else {}
        plain = functools.partial(getattr(tilefuse, op), variant="plain")
        fused, why = torch_fused(self.ctx, op, self.fp8 is not None)
        methods = [
            Method("gemm", self.gemm, "gemm"),
            Method("comm", self.comm, "gathered" if op == "all_gather_gemm" else "op"),
            Method("plain", lambda s: plain(s.a, s.b, **s.scaling), "op"),
            Method("torch_fused", (lambda s: fused(s.a, s.b, **s.scaling)) if fused else None, "op", skip=why),
        ]
        for v in variants:
            if v == CONTROL:  # the plain path timed a second time, where it stands in --variants
                methods.append(Method(CONTROL, lambda s: plain(s.a, s.b, **s.scaling), "op"))
            elif v == CORE:
                self.c_core = torch.empty_like(self.c_gemm)
                methods.append(Method(CORE, self.core, "gemm"))
            elif v == "auto":
                fn = functools.partial(getattr(tilefuse, op), variant="auto", **out_kw)
                # The note is filled in once auto has run (run_shape): its first call decides the bucket.
                methods.append(Method("auto", lambda s, fn=fn: fn(s.a, s.b, **s.scaling), "op",
                                      note="auto -> undecided"))
            else:  # a variant, or a named form on its default config
                fn = functools.partial(getattr(tilefuse, op), variant=v, **out_kw)
                methods.append(Method(v, lambda s, fn=fn: fn(s.a, s.b, **s.scaling), "op"))
        return methods

    def references(self, s: Operands) -> dict:
        """fp32 results of the check inputs ``s`` (collective: every rank calls it)."""
        g = s.gemm_scaling or {"scale_a": 1.0, "scale_b": 1.0}  # float8: the dequantized operands' product
        gemm = (s.gemm_a.float() * g["scale_a"]) @ (s.b.float() * g["scale_b"])
        out = {"gemm": gemm, "op": getattr(tilefuse, self.op)(s.a, s.b, variant="reference", **s.scaling)}
        if self.op == "all_gather_gemm":
            out["gathered"] = s.gemm_a
        return out

    def poison(self) -> None:
        """NaN into every buffer a method writes in place (collective)."""
        buffers = (self.c_gemm, self.c_core, self.comm_out, self.heap_out)
        poison(*(buf for buf in buffers if buf is not None))


def pad16(t: torch.Tensor, dims=(0, 1)) -> torch.Tensor:
    """``t`` (2-D) zero-padded to a multiple of 16 along ``dims`` (``t`` itself if it is one): one ``F.pad``."""
    pad = (0, -t.shape[1] % 16 if 1 in dims else 0, 0, -t.shape[0] % 16 if 0 in dims else 0)
    return t if not any(pad) else F.pad(t.view(torch.uint8) if t.element_size() == 1 else t, pad).view(t.dtype)


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a, scale_b, out_dtype) -> torch.Tensor:
    """``torch._scaled_mm`` as a user calls it: K and N zero-padded to multiples of 16 where needed, then
    the result sliced; on the CPU, where it does not run, the fp32 product of the dequantized operands."""
    if not a.is_cuda:
        return ((a.float() * scale_a) @ (b.float() * scale_b)).to(out_dtype)
    sb = pad16(scale_b, (1,)) if scale_b.numel() > 1 else scale_b
    return torch._scaled_mm(pad16(a, (1,)), pad16(b.t()).t(), scale_a=scale_a, scale_b=sb,
                            out_dtype=out_dtype)[:, :b.shape[1]]


def torch_fused(ctx, op: str, fp8: bool = False):
    """(fn(a, b, **scaling) -> result, "") for torch's async-TP op of ``op`` (``fp8``: its scaled form),
    or (None, why not)."""
    name = (TORCH_FUSED_FP8 if fp8 else TORCH_FUSED).get(op)
    if name is None:
        return None, "torch has no fused op for it"
    if ctx.world == 1:
        return None, "world 1: nothing to overlap"
    if not (ctx.on_gpu and ctx.pg_backend == "nccl"):
        return None, f"needs NCCL and a GPU per rank (have {ctx.pg_backend} on {ctx.device.type})"
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError as err:
        return None, f"torch {torch.__version__} lacks symmetric memory ({error_text(err)})"
    if not hasattr(torch.ops.symm_mem, name):
        return None, f"torch {torch.__version__} lacks torch.ops.symm_mem.{name}"
    group_name = dist.group.WORLD.group_name
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None:  # needed before torch 2.11, deprecated (a no-op need) since, gone later
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            enable(group_name)
    return fused_call(op, fp8, group_name), ""


def fused_call(op: str, fp8: bool, group_name: str):
    """``fn(a, b, **scaling)``: torch's async-TP op of ``op`` (all_gather_gemm or gemm_reduce_scatter) on the
    group ``group_name``, its scaled form for ``fp8``."""
    ops = torch.ops.symm_mem
    if fp8 and op == "all_gather_gemm":  # a row-wise scale_a is this rank's rows' (sharded)
        def fn(a, b, scale_a, scale_b, out_dtype):
            return ops.fused_all_gather_scaled_matmul(a, [b], scale_a, [scale_b], 0, group_name, [None], [None],
                                                      [out_dtype], [False])[1][0]
    elif fp8:
        def fn(a, b, scale_a, scale_b, out_dtype):
            return ops.fused_scaled_matmul_reduce_scatter(a, b, scale_a, scale_b, "sum", 0, 0, group_name,
                                                          [a.shape[0], b.shape[1]], None, None, out_dtype, False)
    elif op == "all_gather_gemm":
        def fn(a, b):
            return ops.fused_all_gather_matmul(a, [b], 0, group_name, return_A=False)[1][0]
    else:
        def fn(a, b):
            return ops.fused_matmul_reduce_scatter(a, b, "sum", 0, group_name)
    return fn


# ---------------------------------------------------------------------------------------------
# Check, time, derive
# ---------------------------------------------------------------------------------------------


def _attempt(ctx, what: str, fn, failed=None) -> tuple:
    """``(fn(), None)``, or ``(failed, the error's text)`` with the traceback printed, naming the
    rank and ``what``."""
    try:
        return fn(), None
    except Exception as exc:
        print(f"[rank {ctx.rank} {what}] {traceback.format_exc()}", file=sys.stderr, flush=True)
        return failed, error_text(exc)


def _agree(ctx, local_error: str | None) -> str | None:
    """The first rank's error text (prefixed with its rank when W > 1), or None when no rank failed."""
    errors = ctx.all_gather_object(local_error)
    for r, text in enumerate(errors):
        if text:
            return text if ctx.world == 1 else f"rank {r}: {text}"
    return None


def derive(op: str, M: int, N: int, K: int, world: int, itemsize: int, times: dict) -> dict:
    """Per-method metrics from the median times ``times[label]`` (ms); label ``ideal`` is added.

    Returns ``{label: {metric: value}}``.
    """
    out: dict = {}
    t_gemm, t_comm, t_plain = times.get("gemm"), times.get("comm"), times.get("plain")
    flops = op_flops(op, M, N, K, world)
    ideal = ideal_speedup = None
    if t_gemm is not None and t_comm is not None:
        ideal = max(t_gemm, t_comm)
        ideal_speedup = (t_gemm + t_comm) / ideal if ideal > 0 else float("nan")
    for label, ms in times.items():
        m = out[label] = {"ms": ms}
        if label == "comm":
            m["busbw_GB/s"] = comm_bytes(op, M, N, K, world, itemsize) / (ms * 1e-3) / 1e9 if ms > 0 else float("nan")
            continue
        m["TFLOP/s"] = flops / (ms * 1e-3) / 1e12 if ms > 0 else float("nan")
        if label == "gemm" or t_plain is None:
            continue
        m["speedup_vs_plain"] = t_plain / ms if ms > 0 else float("nan")
        if ideal_speedup is not None:
            m["frac_of_ideal"] = m["speedup_vs_plain"] / ideal_speedup
    if ideal is not None:
        m = out["ideal"] = {"ms": ideal, "ideal_speedup": ideal_speedup}
        if t_plain is not None and ideal > 0:
            m["speedup_vs_plain"] = t_plain / ideal
    return out


def run_shape(ctx, op: str, entry: dict, dtype, variants: list, args, progress: Progress) -> list:
    """Check and time every method on one shape; returns CSV rows (the same on every rank)."""
    M, N, K, W = entry["M"], entry["N"], entry["K"], ctx.world
    extra = {"set": entry["set"], "shape": entry["name"]}
    rows: list = []
    fp8 = args.fp8
    dtype_name = dtype_label(dtype, fp8)

    def add(label, metric, value, note=""):
        rows.append({**row(op, label, M, N, K, dtype_name, W, metric, value, note), **extra})

    case = Case(ctx, op, M, N, K, dtype, heap_out=not args.no_heap_out, fp8=fp8)
    methods = case.methods(variants)
    tol = tolerance(case.out_dtype, ctx.on_gpu)
    where = f"{op} {entry['name']} {M}x{N}x{K}"

    def fail(m, text):
        m.status = "ERROR " + text
        add(m.label, "error", float("nan"), text)

    # Check: inputs of their own, poisoned outputs, the op's reference.
    chk = case._make(None)
    refs = case.references(chk)
    old_poison = set_debug_poison(True)  # the workspaces the checked calls make start as NaN
    try:
        for m in methods:
            if m.skip:
                m.status = "skipped: " + m.skip
                add(m.label, "skipped", float("nan"), m.skip)
                progress.update(1 + args.reps, f"{where} {m.label}")
                continue

            def check(m=m, chk=chk, refs=refs):
                case.poison()
                got = case._as_result(m.label, m.call(chk))
                tilefuse.synchronize()
                if m.label == "auto":  # its first call decided
                    m.note = auto_note(op, chk.a, chk.b)
                return rel_error(got, refs[m.expect])

            err, local = _attempt(ctx, f"{where} {m.label}", check, float("nan"))
            text = _agree(ctx, local)
            if text:
                fail(m, text)
            else:
                err = ctx.max(err)
                ok = err <= tol  # NaN fails
                m.status = "ok" if ok else f"FAIL rel_err {err:.3g} > {tol:g}"
                add(m.label, "rel_err", err, m.note)
                add(m.label, "ok", float(ok), m.note)
            progress.update(1, f"{where} {m.label} check")
            if text and ctx.on_gpu and not cuda_alive(ctx):
                raise RuntimeError(f"{where} {m.label}: the GPU context is broken: {text}")
    finally:
        set_debug_poison(old_poison)
    chk = refs = check = None  # the checks' inputs are freed before the timing

    # Time: the methods' calls interleaved one by one (bench_interleaved), after the GPU's clocks
    # settle under this shape's GEMM (docs/RESULTS.md, "Method"); --reps rounds of that.
    cycle = Cycle(case.sets)
    settle(ctx, lambda: case.gemm(cycle()))
    kw = dict(warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, cpu_reps=1, sync_each=args.sync_each)
    for _ in range(args.reps):
        live = [m for m in methods if not m.skip and not m.status.startswith("ERROR")]
        host: list = [[] for _ in live]
        got, local = _attempt(ctx, f"{where} interleaved", lambda live=live, host=host: bench_interleaved(
            ctx, [lambda m=m: m.call(cycle()) for m in live], host_ms=host, **kw))
        if _agree(ctx, local) is None:
            for m, t, h in zip(live, got, host):
                m.times.append(t)
                m.host.extend(h)
            progress.update(len(live), f"{where} round")
            continue
        if ctx.on_gpu and not cuda_alive(ctx):
            raise RuntimeError(f"{where}: the GPU context is broken: {local}")
        for m in live:  # a method raised: time them one at a time to find it, and go on
            t, local = _attempt(ctx, f"{where} {m.label}", lambda m=m: bench_max(
                ctx, lambda: m.call(cycle()), host_ms=m.host if ctx.on_gpu else None, **kw), float("nan"))
            text = _agree(ctx, local)
            if text:
                fail(m, text)
                if ctx.on_gpu and not cuda_alive(ctx):
                    raise RuntimeError(f"{where} {m.label}: the GPU context is broken: {text}")
            else:
                m.times.append(t)
            progress.update(1, f"{where} {m.label}")

    if args.graphs:
        time_graphs(ctx, case, methods, args, add)

    # Derive. auto's note says what it ran in the timed calls: asked after them.
    by_label = {m.label: m for m in methods}
    auto = by_label.get("auto")
    if auto is not None and auto.times:
        auto.note = auto_note(op, case.sets[0].a, case.sets[0].b)
    medians = {m.label: statistics.median(m.times) for m in methods if m.times and not m.status.startswith("ERROR")}
    itemsize = case.sets[0].comm_in.element_size()  # what the collective moves
    for label, metrics in derive(op, M, N, K, W, itemsize, medians).items():
        m = by_label.get(label)
        note = "" if m is None else "; ".join(x for x in (m.status if m.status != "ok" else "", m.note) if x)
        if m is not None:
            metrics = dict(metrics, spread_pct=100.0 * (max(m.times) - min(m.times)) / metrics["ms"]
                           if metrics["ms"] > 0 else float("nan"))
            if m.host:  # the host's share: what the GPU waits for when a call starts on an idle GPU
                metrics["host_ms"] = ctx.max(statistics.median(m.host))
        for metric, value in metrics.items():
            add(label, metric, value, note)
    return rows


def dtype_label(dtype: torch.dtype, fp8: str | None) -> str:
    """The CSV's ``dtype``: the operands' dtype, with the scaling of a float8 run (``float8_e4m3fn_rowwise``)."""
    name = str(dtype).replace("torch.", "")
    return name if fp8 is None else f"{name}_{fp8}"


def time_graphs(ctx, case, methods: list, args, add) -> None:
    """Every method that ran, captured in a CUDA graph on one input set (after its eager calls), then
    the replays timed with their calls interleaved: ``graph_ms`` and ``graph_speedup_vs_plain``, what a
    call costs once its host work is gone. A method whose capture fails gets a ``graph_error`` row."""
    if not ctx.on_gpu:
        return
    graphs: dict = {}
    first = case.sets[0]
    for m in methods:
        if m.skip or m.status.startswith("ERROR"):
            continue
        local = None
        try:
            graphs[m.label] = capture_graph(ctx.device, lambda m=m: m.call(first), warmup=2)
        except Exception as exc:
            local = error_text(exc)
        text = _agree(ctx, local)
        if text:
            graphs.pop(m.label, None)
            add(m.label, "graph_error", float("nan"), text)
    if graphs:
        times = bench_interleaved(ctx, [g.replay for g in graphs.values()], warmup_ms=args.warmup_ms,
                                  rep_ms=args.rep_ms)
        got = dict(zip(graphs, times))
        for label, ms in got.items():
            add(label, "graph_ms", ms)
            if "plain" in got and ms > 0:
                add(label, "graph_speedup_vs_plain", got["plain"] / ms)
    graphs.clear()
    ctx.barrier()


def parse_custom_shape(text: str) -> tuple[int, int, int] | None:
    """``(M, N, K)`` of an ``MxNxK`` item of ``--shapes`` (None when it is an entry name)."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    M, N, K = (int(p) for p in parts)
    if min(M, N, K) < 1:
        raise ValueError(f"--shapes {text}: every dimension must be >= 1")
    return M, N, K


def shape_entries(ops: list, sets: list, world: int, names: list | None) -> dict:
    """``{op: [{set, name, M, N, K}, ...]}``: per-rank shapes of the named sets (``names`` filters),
    then the ``MxNxK`` items of ``names`` as per-rank shapes of every op (set ``custom``)."""
    names = names or []
    custom = [(n, parse_custom_shape(n)) for n in names]
    custom = [(n, s) for n, s in custom if s is not None]
    named = [n for n in names if parse_custom_shape(n) is None]
    out = {}
    for op in ops:
        entries = []
        if sets and (named or not custom):
            for set_name in sets:
                for e in local_shapes(op, [set_name], world):
                    if not named or e["name"] in named:
                        entries.append({"set": set_name, **e})
        for name, (M, N, K) in custom:
            entries.append({"set": CUSTOM_SET, "name": name.lower(), "M": M, "N": N, "K": K})
        out[op] = entries
    return out


def tilefuse_variants(op: str, wanted: list | None) -> list:
    """The variants timed besides the baselines: every registered one but reference and plain, and auto."""
    registered = tilefuse.VARIANTS + FORMS.get(op, ())
    if wanted is None:
        return list(tilefuse.VARIANTS) + ["auto"]
    extra = ("auto", CONTROL, CORE)
    missing = [v for v in wanted if v not in registered and v not in extra]
    if missing:
        print(f"{op}: not registered, skipped: {missing}", flush=True)
    return [v for v in wanted if (v in registered or v in extra) and v not in BASELINES]


def run_rank(ctx, ops: list, shapes: dict, variants: list | None, dtype, args) -> dict:
    """Every op and shape on this rank; rank 0 appends each shape's rows to the CSV as it goes."""
    info = run_info(ctx.device)
    rows: list = []
    append = args.append
    plan = {op: tilefuse_variants(op, variants) for op in ops}
    total = sum(len(shapes[op]) * (len(BASELINES) + len(plan[op])) * (1 + args.reps) for op in ops)
    progress = Progress(total, desc=f"suite W={ctx.world}", enabled=ctx.rank == 0 and not args.no_progress)
    aborted = False
    try:
        for op in ops:
            if not shapes[op]:
                continue
            progress.write(f"{op}: {len(shapes[op])} shape(s), methods {list(BASELINES) + plan[op]}")
            for entry in shapes[op]:
                try:
                    shape_rows = run_shape(ctx, op, entry, dtype, plan[op], args, progress)
                except Exception as err:  # a set-up step failed, or the device is unusable
                    shape_rows = [{**row(op, "*", entry["M"], entry["N"], entry["K"],
                                         dtype_label(dtype, args.fp8), ctx.world, "error",
                                         float("nan"), error_text(err)), "set": entry["set"],
                                   "shape": entry["name"]}]
                    print(traceback.format_exc(), file=sys.stderr, flush=True)
                    aborted = ctx.on_gpu and not cuda_alive(ctx)
                rows += shape_rows
                if ctx.rank == 0:
                    write_csv(shape_rows, args.csv, info, append=append, columns=CSV_COLUMNS)
                append = True
                if aborted:
                    return {"rows": rows, "info": info, "aborted": True}
                tilefuse.clear_workspaces()  # collective: every shape's heap buffers go back
                gc.collect()
    finally:
        progress.close()
    return {"rows": rows, "info": info, "aborted": False}


# ---------------------------------------------------------------------------------------------
# Terminal
# ---------------------------------------------------------------------------------------------

TABLE_COLUMNS = ["op", "shape", "MxNxK", "method", "ms", "TFLOP/s", "busbw_GB/s", "vs_plain", "frac_ideal",
                 "rel_err", "status"]


def summarize(rows: list) -> list:
    """One record per (op, shape, method) for the terminal table."""
    recs: dict = {}
    rename = {"speedup_vs_plain": "vs_plain", "frac_of_ideal": "frac_ideal"}
    for r in rows:
        key = (r["op"], r.get("set"), r.get("shape"), r["M"], r["N"], r["K"], r["variant"])
        rec = recs.setdefault(key, {"op": r["op"], "shape": r.get("shape", ""),
                                    "MxNxK": f"{r['M']}x{r['N']}x{r['K']}", "method": r["variant"],
                                    "status": ""})
        metric = r["metric"]
        if metric in ("ms", "TFLOP/s", "busbw_GB/s", "speedup_vs_plain", "frac_of_ideal", "rel_err"):
            rec[rename.get(metric, metric)] = r["value"]
        elif metric == "ok":
            rec["status"] = "ok" if r["value"] == 1.0 else "FAIL"
        elif metric == "error":
            rec["status"] = ("ERROR " + r["note"])[:60]
        elif metric == "skipped":
            rec["status"] = ("skipped: " + r["note"])[:60]
        if r["variant"] == "auto" and r["note"].startswith("auto ->") and rec["status"] == "ok":
            rec["status"] = "ok, ran " + r["note"].split(" (")[0].removeprefix("auto -> ")
    return list(recs.values())


def failures(rows: list) -> list:
    return [r for r in rows if (r["metric"] == "ok" and r["value"] != 1.0) or r["metric"] == "error"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default="all", help=f"'all' or comma-separated ops of {list(OPS)}")
    parser.add_argument("--sets", default=None,
                        help=f"comma-separated shape sets (default {GPU_SETS} on a GPU, {CPU_SETS} on the CPU)")
    parser.add_argument("--shapes", default=None,
                        help="only these entries of the sets (comma-separated names), and/or per-rank shapes "
                             "MxNxK of every op (then no set is used unless --sets or a name is also given)")
    parser.add_argument("--world", type=int, default=1, help="ranks to spawn (ignored under torchrun)")
    parser.add_argument("--variants", default=None,
                        help=f"comma-separated tilefuse variants, auto, {CONTROL} and/or {CORE} (default: every "
                             "registered one but reference and plain, and auto); gemm, comm, plain, torch_fused "
                             "always run")
    parser.add_argument("--dtype", default=None,
                        help="bfloat16 (default on a GPU), float16 (default on the CPU: the interpreter's "
                             "bf16 is wrong) or float32")
    parser.add_argument("--fp8", default=None, choices=SCALINGS,
                        help="float8 (e4m3) operands with scales of this kind instead of --dtype; results in "
                             "bfloat16 (float16 on the CPU)")
    parser.add_argument("--reps", type=int, default=None, help="timing rounds (default 2 on a GPU, 1 on the CPU)")
    parser.add_argument("--warmup-ms", type=float, default=25.0)
    parser.add_argument("--rep-ms", type=float, default=100.0)
    parser.add_argument("--heap", default=None, help="symmetric heap per rank (default 8G on a GPU, 256M on CPU)")
    parser.add_argument("--no-heap-out", action="store_true",
                        help="gemm_all_scatter variants return a copy instead of writing a heap out= buffer")
    parser.add_argument("--csv", default="bench_out/suite.csv")
    parser.add_argument("--append", action="store_true", help="append to the CSV instead of replacing it")
    parser.add_argument("--plots", default=None, metavar="DIR", help="write PNG plots of the CSV to DIR")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--graphs", action="store_true",
                        help="also time every method replayed in a CUDA graph (GPU only): graph_ms, "
                             "graph_speedup_vs_plain")
    parser.add_argument("--sync-each", action="store_true",
                        help="world 1: time every call alone after a device sync (the method of W > 1) instead of "
                             "back to back; adds the metric host_ms")
    args = parser.parse_args(argv)

    ops = list(OPS) if args.ops.strip() == "all" else [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        parser.error(f"unknown op(s) {unknown}; ops are {list(OPS)}")
    on_gpu = torch.cuda.is_available() and os.environ.get("TILEFUSE_BACKEND", "") != "cpu"
    names = [s.strip() for s in args.shapes.split(",") if s.strip()] if args.shapes else None
    try:
        custom = [n for n in names or [] if parse_custom_shape(n) is not None]
    except ValueError as err:
        parser.error(str(err))
    only_custom = bool(names) and len(custom) == len(names)
    default_sets = "" if only_custom else (GPU_SETS if on_gpu else CPU_SETS)
    sets = [s.strip() for s in (args.sets or default_sets).split(",") if s.strip()]
    missing_sets = sorted(set(sets) - set(shape_sets()))
    if missing_sets:
        parser.error(f"unknown shape set(s) {missing_sets}; sets are {sorted(shape_sets())}")
    if args.fp8 and args.dtype:
        parser.error("--fp8 and --dtype: the float8 run's operands are float8_e4m3fn (its results bfloat16)")
    try:
        dtype = E4M3 if args.fp8 else parse_dtype(args.dtype or ("bfloat16" if on_gpu else "float16"))
    except ValueError as err:
        parser.error(str(err))
    if dtype == torch.bfloat16 and not on_gpu:
        print("warning: bf16 arithmetic is wrong in Triton's interpreter: expect failed checks", flush=True)
    args.reps = args.reps or (2 if on_gpu else 1)
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else args.world
    if names is not None:
        known = {e["name"] for set_name in sets for e in shape_sets()[set_name]}
        unknown_names = sorted(set(names) - known - set(custom))
        if unknown_names:
            parser.error(f"--shapes: {unknown_names} neither MxNxK nor entries of the sets {sets}; "
                         f"their entries are {sorted(known)}")
    shapes = shape_entries(ops, sets, world, names)
    for op in ops:
        if not shapes[op]:
            print(f"{op}: no shape of {sets} applies at world {world} (sharded dimension not divisible?)",
                  flush=True)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()] if args.variants else None
    heap = parse_bytes(args.heap) if args.heap else ((8 << 30) if on_gpu else (256 << 20))

    results = launch(run_rank, world, ops, shapes, variants, dtype, args, heap_size=heap)
    if not is_main_process():
        return 0
    result = results[0]
    rows, info = result["rows"], result["info"]
    print_table(summarize(rows), TABLE_COLUMNS,
                title=f"suite: world {world}, {dtype_label(dtype, args.fp8)}, {info['device']}, "
                      f"torch {info['torch']}, triton {info['triton']}, commit {info['commit']}")
    print("vs_plain = t_plain / t; frac_ideal = vs_plain / ((t_gemm + t_comm) / max(t_gemm, t_comm))")
    print(f"csv: {args.csv}")
    if args.plots:
        from .plot import plot

        for path in plot([args.csv], args.plots):
            print(f"plot: {path}")
    bad = failures(rows)
    if result["aborted"]:
        print("ABORTED: the device became unusable; later shapes were skipped")
    if bad:
        print(f"{len(bad)} failed check(s) or error(s): see status above and the CSV's note column")
    return 1 if bad or result["aborted"] else 0


if __name__ == "__main__":
    sys.exit(main())
