"""Where gemm_reduce_scatter and gemm_all_reduce lose time: each one's parts timed alone, in one run.

    python -m benchmarks breakdown --world 2 [--ops gemm_reduce_scatter,gemm_all_reduce]
                                   [--shapes MxNxK,...] [--variants ...] [--csv PATH]
    torchrun --nproc-per-node 2 -m benchmarks.breakdown ...        (then --world is ignored)
    python -m benchmarks breakdown --smoke --world 2               (CPU ranks: the plumbing only)

M, N, K are the per-rank operands ``a [M, K_loc] @ b [K_loc, N]``. Every part below runs on the same
inputs, its calls interleaved one by one with every other part's (a round calls each part once, in an
order rotated by one each round), so the GPU's clock swings reach all parts alike. The parts use the
op's own kernels, launched directly, with fused_sequential's config (the heuristic one the suite and
``variant="fused_sequential"`` run); nothing in the kernels is switched off but gemm_all_reduce's
in-kernel sum, which its fused-kernel parts leave to the reduce part. Rows name the part
(``component``) and the variant whose kernels and config it uses (``variant``):

==================  =================================================================================
matmul              torch.matmul of the rank's ``[M, N]`` partial (cuBLAS)
nccl                the collective alone on the partial: reduce_scatter_tensor (grs), all_reduce (gar)
plain               the registry's plain path: torch.matmul + the collective
core                tilefuse's persistent GEMM (``common.gemm.matmul``), the variant's tiles and program
                    count, into an ordinary ``[M, N]`` tensor: the GEMM core without any staging
gemm_stage_local    the variant's fused kernel with every peer address mapped to this rank's own heap:
                    the GEMM, its tile order and every partial store, but nothing crosses a link
                    (gar stores each tile W times locally)
gemm_push           the variant's fused kernel as the op runs it: GEMM + partials pushed to the owners
                    (gar: without the sum that follows in the same kernel)
stage_local         the fused kernel with K = 0 and peer addresses mapped home: the stores alone
push                the fused kernel with K = 0: the tile loop's stores alone, (W-1)/W of them over the
                    link (gar: W-1 of W copies), from all programs at once
push@P              the same from P programs only (``--push-programs``): link bandwidth against the
                    number of programs that push at once
reduce              the reduction pass alone, every partial in this rank's stage (fused_sequential's)
reduce_pull         the reduction pass reading the peers' stages (bulk_sync's): link reads
empty_call          the op with M = 0: the host path and the begin kernel (pairing, the cross-GPU
                    barrier), nothing else
whole               the variant as a user calls it (``variant`` = each of ``--variants``)
==================  =================================================================================

Derived rows (``variant`` = ``derived``, device time): ``gemm_tax = core - matmul``, ``stage_tax =
gemm_stage_local - core`` (tile order by owner and the partial stores), ``push_exposed = gemm_push -
gemm_stage_local`` (what peer traffic adds to the fused kernel), ``host_exposed`` of each whole variant
(``ms - device_ms``).

Metrics: ``ms``, the suite's method: each call starts on an idle GPU after a device sync and a host
barrier (an L2 clear before), CUDA events around it, so the host's work before the first kernel counts;
``device_ms``: the same call queued behind a GPU sleep longer than the call's host work, so the events
time the GPU alone; ``host_ms``: host time from the start event to the call's return; ``model_ms``: a
roofline estimate (``--tflops``, ``--hbm-gbs``, ``--link-gbs``; the note says which bound); for whole
variants and plain, ``rel_err`` and ``ok`` against the op's reference (inputs of their own, workspaces
poisoned with NaN first), and ``vs_plain`` (plain's time over the part's, both times). All times are
the cross-rank maximum of per-rank medians over ``--reps`` rounds.
CSV columns: :data:`CSV_COLUMNS` (long format, one row per measurement).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import math
import os
import statistics
import sys
import time
import traceback
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

import tilefuse
from tilefuse.ops import registry
from tilefuse.ops.common import arena
from tilefuse.ops.common import launch as oplaunch
from tilefuse.ops.common.collectives import all_reduce_sum, reduce_scatter_rows
from tilefuse.ops.common.gemm import matmul as tf_matmul
from tilefuse.runtime import hw
from tilefuse.tuning.autotune import cuda_ms_per_call

from .checks import error_text, poison_workspaces, rel_error, tolerance
from .launch import is_main_process, launch, under_torchrun
from .results import COLUMNS, parse_bytes, parse_dtype, print_table, row, run_info, write_csv
from .suite import _agree
from .timing import Cycle, _flush_l2, rotating

OPS = ("gemm_reduce_scatter", "gemm_all_reduce")
CSV_COLUMNS = COLUMNS[:2] + ["component"] + COLUMNS[2:] + ["shape"]
# Per-rank M x N x K_loc of the TP-2 row-parallel linears (Llama-3 o and down projections) and two Iris
# shapes (docs/perf: 2026-11-30_h200x2_ws2_suite_*.csv).
GPU_SHAPES = {"8b-o": (8192, 4096, 2048), "8b-down": (8192, 4096, 7168), "70b-o": (8192, 8192, 4096),
              "70b-down": (8192, 8192, 14336), "iris-4096x12288": (8192, 4096, 6144),
              "iris-3584x14336": (8192, 3584, 7168)}
SMOKE_SHAPES = {"smoke": (48, 48, 24)}  # M divisible by W = 1..4
PARTS_VARIANT = "fused_sequential"  # whose kernels and config the parts use
DERIVED = "derived"


# ---------------------------------------------------------------------------------------------
# Roofline
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Roof:
    tflops: float
    hbm_gbs: float
    link_gbs: float

    def note(self) -> str:
        return f"{self.tflops:g} TFLOP/s, HBM {self.hbm_gbs:g} GB/s, link {self.link_gbs:g} GB/s"

    def gemm(self, M, N, K) -> float:
        return 2.0 * M * N * K / (self.tflops * 1e12) * 1e3

    def hbm(self, nbytes) -> float:
        return nbytes / (self.hbm_gbs * 1e9) * 1e3

    def link(self, nbytes) -> float:
        return nbytes / (self.link_gbs * 1e9) * 1e3


def models(op: str, M: int, N: int, K: int, W: int, itemsize: int, roof: Roof) -> dict:
    """``{component: (model_ms, bound)}``: roofline estimates of the parts on one rank."""
    part = M * N * itemsize  # this rank's partial, input dtype
    gemm = roof.gemm(M, N, K)
    if op == "gemm_reduce_scatter":
        sent = part * (W - 1) / W  # every owner's rows but this rank's own
        staged = part  # the fused kernel stores every tile once (W-1 of W remote)
        reduce_bytes = part + part / W  # read W slots of M/W rows, write c
        nccl = roof.link(sent)
        nccl_bound = "link: (W-1)/W of the partial"
    else:
        sent = part * (W - 1)  # one-shot: every tile to every peer
        staged = part * W
        reduce_bytes = part * W + part  # read W slots of M rows, write c
        nccl = roof.link(2 * part * (W - 1) / W)
        nccl_bound = "link: ring all-reduce, 2(W-1)/W of the partial"
    link = roof.link(sent)
    out = {
        "matmul": (gemm, "tensor cores"),
        "core": (gemm, "tensor cores"),
        "nccl": (nccl, nccl_bound),
        "plain": (gemm + nccl, "matmul + nccl, serial"),
        "gemm_stage_local": (max(gemm, roof.hbm(staged)), "tensor cores"),
        "gemm_push": (max(gemm, link), "max(tensor cores, link)"),
        "stage_local": (roof.hbm(staged), "HBM writes"),
        "push": (link, "link"),
        "reduce": (roof.hbm(reduce_bytes), "HBM"),
        "reduce_pull": (max(roof.hbm(reduce_bytes), roof.link(sent)), "max(HBM, link reads)"),
    }
    ideal = max(gemm, nccl)
    for v in registry.VARIANTS:
        out[v] = (ideal, "max(matmul, nccl): perfect overlap")
    return out


# ---------------------------------------------------------------------------------------------
# The parts
# ---------------------------------------------------------------------------------------------


@dataclass
class Operands:
    a: torch.Tensor
    b: torch.Tensor
    partial: torch.Tensor  # a @ b, what the collective alone moves


@dataclass
class Part:
    component: str
    variant: str
    call: object  # fn(Operands)
    checked: bool = False  # compared with the op's reference
    error: str = ""
    ms: list = dataclasses.field(default_factory=list)
    device_ms: list = dataclasses.field(default_factory=list)
    host_ms: list = dataclasses.field(default_factory=list)

    @property
    def label(self) -> str:
        return self.variant if self.component == "whole" else self.component


def _local_bases(heap) -> torch.Tensor:
    """heap_bases with every rank's entry set to this rank's: peer stores land in the own heap."""
    bases = heap.heap_bases.clone()
    bases.fill_(int(heap.heap_bases[heap.rank].item()))
    return bases


def _gemm_args(s: Operands, K: int | None = None) -> tuple:
    """The fused kernels' first arguments: A, B, their (unscaled) scales, sizes and strides."""
    from tilefuse.ops.common.scaled import kernel_scales

    a, b = s.a, s.b
    k = a.shape[1] if K is None else K
    return (a, b, kernel_scales(None, None, a.device), a.shape[0], b.shape[1], k, a.stride(0), a.stride(1),
            b.stride(0), b.stride(1))


def _no_k_meta(meta: dict) -> dict:
    """GEMM meta-parameters for K = 0: the pointer path (no descriptor of an empty extent)."""
    return dict(meta, USE_TMA=False, B_KMAJOR=False)


class Case:
    """One op on one per-rank shape on this rank: inputs, the heap workspace and the parts."""

    def __init__(self, ctx, op: str, M: int, N: int, K: int, dtype: torch.dtype, push_programs: list):
        self.ctx, self.op, self.M, self.N, self.K, self.dtype = ctx, op, M, N, K, dtype
        self.W = ctx.world
        self.nccl = ctx.pg_backend == "nccl" and ctx.on_gpu
        self.push_programs = push_programs
        self.gen = torch.Generator(device=ctx.device).manual_seed(zlib.crc32(f"{op} {M} {N} {K} {ctx.rank}".encode()))
        per_set = (M * K + K * N + M * N) * dtype.itemsize
        self.sets = rotating(self._make, per_set, ctx.device)
        self.c_mm = torch.empty(M, N, dtype=dtype, device=ctx.device)
        self.c_core = torch.empty(M, N, dtype=dtype, device=ctx.device)
        self.c_rs = torch.empty(M // self.W, N, dtype=dtype, device=ctx.device) if op == "gemm_reduce_scatter" else None

    def _make(self, _) -> Operands:
        M, N, K, dev, dt = self.M, self.N, self.K, self.ctx.device, self.dtype
        a = (torch.randn(M, K, generator=self.gen, device=dev, dtype=torch.float32) / math.sqrt(K)).to(dt)
        b = torch.randn(K, N, generator=self.gen, device=dev, dtype=torch.float32).to(dt)
        return Operands(a, b, torch.matmul(a, b))

    # -- baselines -----------------------------------------------------------------------------

    def matmul(self, s: Operands):
        return torch.matmul(s.a, s.b, out=self.c_mm)

    def collective(self, s: Operands):
        x = s.partial
        if self.op == "gemm_reduce_scatter":
            if self.nccl:
                dist.reduce_scatter_tensor(self.c_rs, x)
                return self.c_rs
            return reduce_scatter_rows(x)
        if self.nccl:
            dist.all_reduce(x)  # in place: the partial grows every call, the time does not change
            return x
        return all_reduce_sum(x)

    # -- the variant's own kernels, launched alone ---------------------------------------------

    def setup_parts(self) -> None:
        """One real call's set-up (checks, config, the stage workspace, the begin kernel), kept for
        the direct launches (collective)."""
        s = self.sets[0]
        if self.op == "gemm_reduce_scatter":
            from tilefuse.ops.gemm_reduce_scatter._prepare import prepare

            def setup(a, b):
                p = prepare(PARTS_VARIANT, a, b, None, None)
                self.c_reduce = oplaunch.new_output((p.rows, p.N), a.dtype, a.device)
                oplaunch.begin(p.sig, self.c_reduce)
                return p

            self.call = oplaunch.collective(self.op)(setup)(s.a, s.b)
        else:
            from tilefuse.ops.gemm_all_reduce._prepare import prepare
            from tilefuse.ops.gemm_all_reduce.fused_sequential import _launch

            def begun(a, b):
                p = prepare(PARTS_VARIANT, a, b, None, None, None, comm=False, flags=False, launch=_launch)
                self.c = oplaunch.new_output((p.M, p.N), a.dtype, a.device)
                oplaunch.begin(p.sig, self.c)
                return p

            self.call = oplaunch.collective(self.op)(begun)(s.a, s.b)
        tilefuse.synchronize()
        heap = self.call.heap
        self.local_bases = _local_bases(heap)
        cfg = self.call.config
        tiles = (self.W * self.call.tiles_per_owner if self.op == "gemm_reduce_scatter"
                 else self.call.num_tiles * cfg.SPLIT_K)  # work items: K slices of tiles
        self.programs = min(cfg.GEMM_SMS + cfg.COMM_SMS, tiles)
        self.core_config = cfg.replace(GEMM_SMS=cfg.GEMM_SMS + cfg.COMM_SMS, COMM_SMS=0)

    def core(self, s: Operands):
        return tf_matmul(s.a, s.b, self.c_core, self.core_config)

    def fused(self, s: Operands, *, local: bool, no_k: bool, programs: int | None = None):
        """The variant's fused kernel: the GEMM (or none, K = 0) and the partial stores (to the owners,
        or all to this rank's heap)."""
        call, heap = self.call, self.call.heap
        gemm_meta = (dict(call.meta, WARP_SPEC=call.warp_spec) if self.op == "gemm_reduce_scatter"
                     else call.gemm_meta)
        meta = _no_k_meta(gemm_meta) if no_k else gemm_meta
        bases = self.local_bases if local else heap.heap_bases
        n = programs or self.programs
        ctl = oplaunch.ctl(heap)
        if self.op == "gemm_reduce_scatter":
            from tilefuse.ops.gemm_reduce_scatter.fused_sequential import _fused_kernel

            _fused_kernel[(n,)](*_gemm_args(s, 0 if no_k else None), call.stage, *call.stage_strides,
                                (bases, ctl, heap.rank, heap.world_size, *oplaunch.enter_args(None)),
                                NUM_PROGRAMS=n, ENTER=False, **meta)
        else:
            from tilefuse.ops.gemm_all_reduce.fused_sequential import _fused_kernel, split_arg

            # The GEMM and the stores only (SUM=False): the summing is the reduce part's.
            g = _gemm_args(s, 0 if no_k else None)
            _fused_kernel[(n,)](*g[:6], g[6:8], g[8:10], call.stage, call.stage, call.stride_s, self.c, self.c,
                                call.stride_c, (bases,) + oplaunch.call_arg(heap, None)[1:], split_arg(call, self.c),
                                **dict(call.launch, **meta, NUM_PROGRAMS=n, HAS_BIAS=False, SUM=False, ENTER=False,
                                       OWN_SUM=False))
        return call.stage

    def reduce(self, s: Operands, *, pull: bool):
        call = self.call
        if self.op == "gemm_reduce_scatter":
            from tilefuse.ops.gemm_reduce_scatter._tiles import launch_reduce

            programs = min(self.programs, call.tiles_per_owner)
            launch_reduce(call, oplaunch.call_arg(call.heap, None), self.c_reduce, programs, pull=pull, wait=False)
            return self.c_reduce
        else:
            from tilefuse.ops.gemm_all_reduce._tiles import reduce_kernel

            reduce_kernel[(self.programs,)](call.stage, call.stage, call.stride_s, self.c, self.c, call.stride_c,
                                            call.M, call.N, oplaunch.call_arg(call.heap, None), self.programs,
                                            **call.reduce_meta(self.programs, pull=pull, wait=False))
            return self.c
        return call.c

    def empty_call(self, s: Operands):
        return registry.get(self.op, PARTS_VARIANT)(s.a[:0], s.b)

    # -- the list ------------------------------------------------------------------------------

    def parts(self, variants: list) -> list:
        op = self.op
        plain = registry.get(op, "plain")
        out = [Part("matmul", "torch", self.matmul), Part("nccl", "torch", self.collective),
               Part("plain", "plain", lambda s: plain(s.a, s.b), checked=True)]
        v = PARTS_VARIANT
        out += [Part("core", v, self.core),
                Part("gemm_stage_local", v, functools.partial(self.fused, local=True, no_k=False)),
                Part("gemm_push", v, functools.partial(self.fused, local=False, no_k=False)),
                Part("stage_local", v, functools.partial(self.fused, local=True, no_k=True)),
                Part("push", v, functools.partial(self.fused, local=False, no_k=True))]
        for n in self.push_programs:
            if n < self.programs:
                out.append(Part(f"push@{n}", v, functools.partial(self.fused, local=False, no_k=True, programs=n)))
        out += [Part("reduce", v, functools.partial(self.reduce, pull=False)),
                Part("reduce_pull", "bulk_sync", functools.partial(self.reduce, pull=True)),
                Part("empty_call", v, self.empty_call)]
        for name in variants:
            fn = registry.get(op, name)
            out.append(Part("whole", name, lambda s, fn=fn: fn(s.a, s.b), checked=True))
        return out


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------

@functools.cache
def _sleep_cycles_per_ms(index: int) -> float:
    """GPU clock cycles of ``torch.cuda._sleep`` per ms on device ``index`` (measured)."""
    cycles = 20_000_000
    rates = []
    for _ in range(3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.cuda._sleep(cycles)
        e.record()
        torch.cuda.synchronize()
        rates.append(cycles / max(s.elapsed_time(e), 1e-3))
    return statistics.median(rates)


def time_parts(ctx, parts: list, cycle: Cycle, *, rep_ms: float, min_reps: int, max_reps: int,
               cpu_reps: int) -> None:
    """Append each part's per-call times to its lists (this rank's); collective.

    GPU: every round calls each part twice, once on an idle GPU (``ms``) and once behind a GPU sleep
    (``device_ms``); the round's order is rotated by one each round. CPU: the host clock, ``ms`` only
    (the check call before built the interpreter's kernels).
    """
    live = [p for p in parts if not p.error]
    if not ctx.on_gpu:
        for p in live:
            for _ in range(cpu_reps):
                ctx.barrier()
                t0 = time.perf_counter()
                p.call(cycle())
                p.ms.append((time.perf_counter() - t0) * 1e3)
        return
    host_est = []
    for p in live:  # compile, then the host time of a call and the GPU time of three
        p.call(cycle())
        ctx.barrier()
        t0 = time.perf_counter()
        p.call(cycle())
        host_est.append(time.perf_counter() - t0)
    ctx.barrier()
    estimate = 0.0
    for p in live:
        estimate += ctx.max(cuda_ms_per_call(lambda p=p: p.call(cycle()), 3))
    n_rep = max(min_reps, min(max_reps, int(rep_ms / max(estimate / len(live), 1e-3))))
    # The sleep covers the slowest part's host work twice over (at least 0.5 ms, at most 30 ms).
    sleep_ms = min(30.0, max(0.5, 2e3 * ctx.max(max(host_est)) + 0.2))
    cycles = int(sleep_ms * _sleep_cycles_per_ms(ctx.device.index or 0))
    k = len(live)
    events = {}
    for r in range(n_rep):
        for j in range(k):
            i = (r + j) % k
            for hidden in (False, True):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                _flush_l2(ctx.device)
                ctx.barrier()
                if hidden:
                    torch.cuda._sleep(cycles)
                s.record()
                t0 = time.perf_counter()
                live[i].call(cycle())
                t1 = time.perf_counter()
                e.record()
                events.setdefault((i, hidden), []).append((s, e))
                if not hidden:
                    live[i].host_ms.append((t1 - t0) * 1e3)
    ctx.sync()
    for i, p in enumerate(live):
        p.ms += [s.elapsed_time(e) for s, e in events[(i, False)]]
        p.device_ms += [s.elapsed_time(e) for s, e in events[(i, True)]]


# ---------------------------------------------------------------------------------------------
# One shape
# ---------------------------------------------------------------------------------------------


def _reference(op: str, s: Operands) -> torch.Tensor:
    return registry.get(op, "reference")(s.a, s.b)


def _median_max(ctx, values: list) -> float:
    return ctx.max(statistics.median(values)) if values else float("nan")


def run_shape(ctx, op: str, name: str, M: int, N: int, K: int, dtype, variants: list, args, roof: Roof) -> list:
    """Check and time every part of ``op`` on one shape; the CSV rows (the same on every rank)."""
    W = ctx.world
    rows_out: list = []

    def add(p_variant, component, metric, value, note=""):
        rows_out.append({**row(op, p_variant, M, N, K, dtype, W, metric, value, note),
                         "component": component, "shape": name})

    case = Case(ctx, op, M, N, K, dtype, args.push_programs)
    case.setup_parts()
    wanted = list(variants)
    parts = case.parts(wanted)

    # Check the whole calls: inputs of their own, poisoned workspaces, the op's reference.
    chk = case._make(None)
    ref = _reference(op, chk)
    tol = tolerance(dtype, ctx.on_gpu)
    for p in parts:
        local, err = None, float("nan")
        try:
            if p.checked:
                poison_workspaces()
                got = p.call(chk)
                tilefuse.synchronize()
                err = rel_error(got, ref)
            else:
                p.call(chk)
                tilefuse.synchronize()
        except Exception as exc:
            local = error_text(exc)
            print(f"[rank {ctx.rank} {op} {name} {p.label}] {traceback.format_exc()}", file=sys.stderr, flush=True)
        text = _agree(ctx, local)
        if text:
            p.error = text
            add(p.variant, p.component, "error", float("nan"), text)
        elif p.checked:
            err = ctx.max(err)
            add(p.variant, p.component, "rel_err", err)
            add(p.variant, p.component, "ok", float(err <= tol))
    del chk, ref

    cycle = Cycle(case.sets)
    for _ in range(args.reps):
        time_parts(ctx, parts, cycle, rep_ms=args.rep_ms, min_reps=args.min_reps, max_reps=args.max_reps,
                   cpu_reps=1)

    model = models(op, M, N, K, W, dtype.itemsize, roof)
    times, device = {}, {}
    for p in parts:
        if p.error:
            continue
        ms, dev = _median_max(ctx, p.ms), _median_max(ctx, p.device_ms)
        times[p.label], device[p.label] = ms, dev
        add(p.variant, p.component, "ms", ms)
        if p.device_ms:
            add(p.variant, p.component, "device_ms", dev)
        if p.host_ms:
            add(p.variant, p.component, "host_ms", _median_max(ctx, p.host_ms))
        key = p.label if p.component == "whole" else p.component.split("@")[0]
        if key in model:
            add(p.variant, p.component, "model_ms", model[key][0], f"{model[key][1]}; {roof.note()}")
    plain_ms, plain_dev = times.get("plain"), device.get("plain")
    for p in parts:
        if p.error or p.label not in times or not (p.component == "whole" or p.component == "plain"):
            continue
        if plain_ms:
            add(p.variant, p.component, "vs_plain", plain_ms / times[p.label])
        if plain_dev and not math.isnan(plain_dev):
            add(p.variant, p.component, "vs_plain_device", plain_dev / device[p.label])
    src = device if ctx.on_gpu else times
    for component, (x, y) in {"gemm_tax": ("core", "matmul"), "stage_tax": ("gemm_stage_local", "core"),
                              "push_exposed": ("gemm_push", "gemm_stage_local")}.items():
        if x in src and y in src:
            add(DERIVED, component, "device_ms" if ctx.on_gpu else "ms", src[x] - src[y], f"{x} - {y}")
    if ctx.on_gpu:
        for p in parts:
            if p.component == "whole" and p.label in times:
                add(p.variant, "host_exposed", "device_ms", times[p.label] - device[p.label], "ms - device_ms")
    return rows_out


def run_rank(ctx, args) -> dict:
    """Every op and shape of ``args`` (:func:`parse_options`) on this rank; rank 0 writes the CSV and
    prints a table per shape as it goes."""
    info = run_info(ctx.device)
    rows: list = []
    append = args.append
    dtype = args.dtype
    for op in args.ops:
        for name, (M, N, K) in args.shapes.items():
            if M % ctx.world and op == "gemm_reduce_scatter":
                if ctx.rank == 0:
                    print(f"{op} {name}: M = {M} is not divisible by the world size {ctx.world}; skipped", flush=True)
                continue
            try:
                shape_rows = run_shape(ctx, op, name, M, N, K, dtype, args.variants, args, args.roof)
            except Exception as err:
                shape_rows = [{**row(op, "*", M, N, K, dtype, ctx.world, "error", float("nan"), error_text(err)),
                               "component": "*", "shape": name}]
                print(traceback.format_exc(), file=sys.stderr, flush=True)
            rows += shape_rows
            if ctx.rank == 0:
                write_csv(shape_rows, args.csv, info, append=append, columns=CSV_COLUMNS)
                print_table(summarize(shape_rows), TABLE_COLUMNS,
                            title=f"{op} {name} {M}x{N}x{K} world {ctx.world} {str(dtype).replace('torch.', '')}")
            append = True
            arena.clear_workspaces()
            gc.collect()
    return {"rows": rows, "info": info}


# ---------------------------------------------------------------------------------------------
# Terminal
# ---------------------------------------------------------------------------------------------

TABLE_COLUMNS = ["component", "variant", "ms", "device_ms", "host_ms", "model_ms", "vs_plain", "vs_plain_device",
                 "status"]


def summarize(rows: list) -> list:
    recs: dict = {}
    for r in rows:
        key = (r["op"], r["shape"], r["component"], r["variant"])
        rec = recs.setdefault(key, {"component": r["component"], "variant": r["variant"], "status": ""})
        if r["metric"] in TABLE_COLUMNS:
            rec[r["metric"]] = r["value"]
        elif r["metric"] == "ok":
            rec["status"] = "ok" if r["value"] == 1.0 else "FAIL"
        elif r["metric"] == "error":
            rec["status"] = ("ERROR " + r["note"])[:60]
    return list(recs.values())


def parse_shapes(text: str | None, smoke: bool) -> dict:
    """``{name: (M, N, K)}`` from ``MxNxK,...`` (or ``name=MxNxK``), else the defaults."""
    if not text:
        return dict(SMOKE_SHAPES if smoke else GPU_SHAPES)
    out = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, _, dims = item.rpartition("=")
        if item in GPU_SHAPES:
            out[item] = GPU_SHAPES[item]
            continue
        parts = dims.lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"--shapes: {item!r} is neither MxNxK (positive) nor one of {sorted(GPU_SHAPES)}")
        out[name or dims.lower()] = tuple(int(p) for p in parts)
    return out


PART_COLUMNS = {"matmul": "matmul", "nccl": "nccl", "plain": "plain", "core": "core", "gemm_stage_local": "stage",
                "gemm_push": "fused", "push": "push", "reduce": "reduce", "reduce_pull": "pull",
                "empty_call": "empty", "push_exposed": "push_exp"}


def compact(path) -> str:
    """Two small tables of a breakdown CSV (what a device run's output tail has room for): each part's
    device time (the idle-GPU time where there is none) per op and shape, and each whole call's
    idle-GPU and device times and speedups over plain."""
    from .results import format_table, read_csv

    df = read_csv(path)
    if df.empty:
        return f"{path}: empty"
    parts, whole = [], []
    for (op, shape), g in df.groupby(["op", "shape"], sort=False):
        def value(component, metric, variant=None, g=g):
            hit = g[(g["component"] == component) & (g["metric"] == metric)]
            if variant is not None:
                hit = hit[hit["variant"] == variant]
            return float(hit["value"].iloc[0]) if len(hit) else float("nan")

        first = g.iloc[0]
        rec = {"op": op.replace("gemm_reduce_scatter", "grs").replace("gemm_all_reduce", "gar"), "shape": shape,
               "MxNxK": f"{first['M']}x{first['N']}x{first['K']}"}
        for component, col in PART_COLUMNS.items():
            dev = value(component, "device_ms")
            rec[col] = dev if not math.isnan(dev) else value(component, "ms")
        parts.append(rec)
        for v in g[g["component"] == "whole"]["variant"].unique():
            whole.append({"op": rec["op"], "shape": shape, "variant": v, "ms": value("whole", "ms", v),
                          "device_ms": value("whole", "device_ms", v), "vs_plain": value("whole", "vs_plain", v),
                          "vs_plain_dev": value("whole", "vs_plain_device", v), "host_ms": value("whole", "host_ms", v),
                          "ok": value("whole", "ok", v)})
    return "\n\n".join([
        format_table(parts, ["op", "shape", "MxNxK"] + list(PART_COLUMNS.values()),
                     "parts: device ms (GPU time alone); fused = the variant's fused kernel as it runs, stage = the "
                     "same with every store local, push_exp = fused - stage"),
        format_table(whole, ["op", "shape", "variant", "ms", "device_ms", "host_ms", "vs_plain", "vs_plain_dev", "ok"],
                     "whole calls: ms on an idle GPU (host work included), device_ms behind a GPU sleep")])


def parse_options(argv=None, on_gpu: bool | None = None) -> argparse.Namespace:
    """The command line, checked and resolved: ``ops``, ``shapes``, ``variants``, ``dtype``, ``roof``,
    ``push_programs``, ``reps`` and the rest (``on_gpu`` defaults to whether this process has one)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks breakdown", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, of {list(OPS)}")
    parser.add_argument("--shapes", default=None,
                        help=f"per-rank MxNxK (or name=MxNxK, or a name of {sorted(GPU_SHAPES)}), comma-separated "
                             "(default: all of those; --smoke: one tiny shape)")
    parser.add_argument("--world", type=int, default=2, help="ranks to spawn (ignored under torchrun)")
    parser.add_argument("--variants", default=",".join(registry.VARIANTS),
                        help="whole variants timed (comma-separated)")
    parser.add_argument("--push-programs", default=None,
                        help="program counts of the push@P parts (default 16,33,66 on a GPU, 1 on the CPU)")
    parser.add_argument("--dtype", default=None, help="bfloat16 (default on a GPU) or float16 (default on the CPU)")
    parser.add_argument("--reps", type=int, default=None, help="timing rounds (default 2 on a GPU, 1 on the CPU)")
    parser.add_argument("--rep-ms", type=float, default=40.0, help="GPU time per part per round (sets the calls)")
    parser.add_argument("--min-reps", type=int, default=5)
    parser.add_argument("--max-reps", type=int, default=60)
    parser.add_argument("--tflops", type=float, default=700.0, help="roofline: achievable dense TFLOP/s")
    parser.add_argument("--hbm-gbs", type=float, default=4000.0, help="roofline: achievable HBM GB/s")
    parser.add_argument("--link-gbs", type=float, default=450.0, help="roofline: link GB/s per direction")
    parser.add_argument("--heap", default=None, help="symmetric heap per rank (default 4G on a GPU, 256M on the CPU)")
    parser.add_argument("--csv", default="bench_out/breakdown.csv")
    parser.add_argument("--append", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="one tiny shape, one round: the plumbing on CPU ranks")
    parser.add_argument("--summarize", default=None, metavar="CSV",
                        help="print the compact tables of a breakdown CSV and exit (nothing is run)")
    args = parser.parse_args(argv)
    if on_gpu is None:
        on_gpu = torch.cuda.is_available() and not hw.interpreting() and os.environ.get("TILEFUSE_BACKEND") != "cpu"
    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = sorted(set(args.ops) - set(OPS))
    if unknown or not args.ops:
        parser.error(f"--ops: unknown {unknown}; choose from {list(OPS)}")
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = sorted(set(args.variants) - set(registry.VARIANTS))
    if bad:
        parser.error(f"--variants: unknown {bad}; choose from {list(registry.VARIANTS)}")
    try:
        args.shapes = parse_shapes(args.shapes, args.smoke or not on_gpu)
        args.dtype = parse_dtype(args.dtype or ("bfloat16" if on_gpu else "float16"))
        args.heap = parse_bytes(args.heap) if args.heap else ((4 << 30) if on_gpu else (256 << 20))
    except ValueError as err:
        parser.error(str(err))
    try:
        args.push_programs = [int(x) for x in (args.push_programs or ("16,33,66" if on_gpu else "1")).split(",")
                              if x.strip()]
    except ValueError:
        parser.error("--push-programs: comma-separated integers")
    if any(n < 1 for n in args.push_programs):
        parser.error("--push-programs: every count must be >= 1")
    for name in ("reps", "min_reps", "max_reps"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    args.reps = args.reps or (1 if args.smoke or not on_gpu else 2)
    args.roof = Roof(args.tflops, args.hbm_gbs, args.link_gbs)
    return args


def main(argv=None) -> int:
    args = parse_options(argv)
    if args.summarize:
        print(compact(args.summarize))
        return 0
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else args.world
    results = launch(run_rank, world, args, heap_size=args.heap)
    if not is_main_process():
        return 0
    rows = results[0]["rows"]
    if not rows:
        print("nothing was run (no shape applies)")
        return 1
    print(f"csv: {args.csv}")
    bad_rows = [r for r in rows if r["metric"] == "error" or (r["metric"] == "ok" and r["value"] != 1.0)]
    if bad_rows:
        print(f"{len(bad_rows)} failed check(s) or error(s): see the tables and the CSV's note column")
    return 1 if bad_rows else 0


if __name__ == "__main__":
    sys.exit(main())
