"""The benchmarks on the CPU: every mode runs tiny, checks what it times, and writes its CSV.

Timings in Triton's interpreter mean nothing; what is tested is that every method runs and is
checked, that a wrong or raising method is recorded without stopping the run, that the derived
metrics follow their definitions, that the CSVs and plots come out stamped with their run facts, and
that the modes use tilefuse's public API only.
"""

from __future__ import annotations

import ast
import contextlib
import io
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from ophelpers import needs_working_interpreter

from benchmarks import __main__ as entry
from benchmarks import checks, gemm, launch, plot, results, suite, timing, tune
from tilefuse.ops import registry
from tilefuse.tuning.shapes import OPS, local_shapes

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 3600


def _value(df, op, shape, variant, metric):
    hit = df[(df["op"] == op) & (df["shape"] == shape) & (df["variant"] == variant) & (df["metric"] == metric)]
    assert len(hit) == 1, f"{op} {shape} {variant} {metric}: {len(hit)} rows"
    return float(hit["value"].iloc[0])


def test_derived_metrics_follow_their_definitions():
    times = {"gemm": 3.0, "comm": 1.0, "plain": 4.2, "bulk_sync": 4.0, "fused_sequential": 3.5}
    out = suite.derive("gemm_reduce_scatter", 64, 32, 16, 2, 2, times)
    ideal_speedup = (3.0 + 1.0) / 3.0
    assert out["ideal"]["ms"] == 3.0
    assert out["ideal"]["ideal_speedup"] == pytest.approx(ideal_speedup)
    assert out["ideal"]["speedup_vs_plain"] == pytest.approx(4.2 / 3.0)
    assert out["fused_sequential"]["speedup_vs_plain"] == pytest.approx(4.2 / 3.5)
    assert out["fused_sequential"]["frac_of_ideal"] == pytest.approx((4.2 / 3.5) / ideal_speedup)
    assert out["plain"]["speedup_vs_plain"] == 1.0
    assert "speedup_vs_plain" not in out["gemm"] and "speedup_vs_plain" not in out["comm"]
    assert out["gemm"]["TFLOP/s"] == pytest.approx(2 * 64 * 32 * 16 / 3e-3 / 1e12)
    assert out["comm"]["busbw_GB/s"] == pytest.approx(64 * 32 * 2 * 0.5 / 1e-3 / 1e9)  # RS of [M, N] fp16
    # all_gather_gemm's GEMM runs over the gathered W*M rows.
    agg = suite.derive("all_gather_gemm", 64, 32, 16, 4, 2, {"gemm": 1.0})
    assert agg["gemm"]["TFLOP/s"] == pytest.approx(2 * 4 * 64 * 32 * 16 / 1e-3 / 1e12)
    # All-reduce bus bytes: a reduce-scatter and an all-gather of the [M, N] partial.
    assert suite.comm_bytes("gemm_all_reduce", 64, 32, 16, 4, 2) == pytest.approx(2 * 64 * 32 * 2 * 3 / 4)


@needs_working_interpreter
@pytest.mark.slow
def test_world2_cli_writes_checked_rows_table_and_plots(tmp_path):
    """The CLI at world 2 on the tiny set: every method ok, torch_fused skipped with its reason."""
    csv, plot_dir = tmp_path / "suite.csv", tmp_path / "plots"
    env = dict(os.environ, TILEFUSE_BACKEND="cpu", TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.suite", "--ops", "all", "--sets", "tiny",
                           "--world", "2", "--variants", "bulk_sync", "--csv", str(csv), "--plots", str(plot_dir),
                           "--no-progress"], cwd=REPO, env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "suite: world 2" in proc.stdout and "frac_ideal" in proc.stdout
    df = pd.read_csv(csv)
    assert list(df.columns) == suite.CSV_COLUMNS
    assert (df["world"] == 2).all() and (df["dtype"] == "float16").all()
    assert df[["device", "torch", "triton", "commit", "date"]].notna().all().all()
    for op in OPS:
        expected = local_shapes(op, "tiny", 2)
        got = df[df["op"] == op].drop_duplicates("shape")
        assert sorted(got["shape"]) == sorted(e["name"] for e in expected)
        for e in expected:
            name = e["name"]
            sub = df[(df["op"] == op) & (df["shape"] == name)]
            assert (sub[["M", "N", "K"]].values == [e["M"], e["N"], e["K"]]).all()
            for method in ("gemm", "comm", "plain", "bulk_sync"):
                assert _value(df, op, name, method, "ok") == 1.0, (op, name, method)
                assert _value(df, op, name, method, "ms") > 0
            skip = sub[(sub["variant"] == "torch_fused") & (sub["metric"] == "skipped")]
            assert len(skip) == 1 and skip["note"].iloc[0], (op, name)
            assert "auto" not in set(sub["variant"])  # --variants names what runs
            t_gemm, t_comm = (_value(df, op, name, m, "ms") for m in ("gemm", "comm"))
            t_plain, t_bulk = (_value(df, op, name, m, "ms") for m in ("plain", "bulk_sync"))
            assert _value(df, op, name, "ideal", "ms") == pytest.approx(max(t_gemm, t_comm))
            frac = (t_plain / t_bulk) / ((t_gemm + t_comm) / max(t_gemm, t_comm))
            assert _value(df, op, name, "bulk_sync", "frac_of_ideal") == pytest.approx(frac)
    pngs = sorted(p.name for p in plot_dir.glob("*.png"))
    assert pngs == sorted(f"speedup_{op}_w2_float16.png" for op in OPS)


@needs_working_interpreter
def test_world2_float8_rows_are_checked_against_the_dequantized_reference(tmp_path):
    """--fp8 rowwise at world 2: float8 operands with row scales (all_gather_gemm gathers them), every
    method checked against the op's reference and timed; torch's scaled fused ops named where they run."""
    csv = tmp_path / "fp8.csv"
    rc = suite.main(["--ops", "all_gather_gemm,gemm_reduce_scatter", "--sets", "tiny", "--shapes", "tiny-b",
                     "--world", "2", "--fp8", "rowwise", "--variants", "fused_sequential", "--csv", str(csv),
                     "--no-progress"])
    assert rc == 0
    df = pd.read_csv(csv).fillna({"note": ""})
    assert (df["dtype"] == "float8_e4m3fn_rowwise").all()
    for op in ("all_gather_gemm", "gemm_reduce_scatter"):
        for method in ("gemm", "comm", "plain", "fused_sequential"):
            assert _value(df, op, "tiny-b", method, "ok") == 1.0, (op, method)
            assert _value(df, op, "tiny-b", method, "ms") > 0
        skip = df[(df["op"] == op) & (df["variant"] == "torch_fused") & (df["metric"] == "skipped")]
        assert len(skip) == 1 and "NCCL" in skip["note"].iloc[0]
    assert suite.torch_fused(None, "gemm_all_scatter", fp8=True) == (None, "torch has no fused op for it")
    assert suite.TORCH_FUSED_FP8["all_gather_gemm"] == "fused_all_gather_scaled_matmul"


def job_torch_fused_binds(ctx) -> list:
    """torch's fused ops as the suite calls them, on meta tensors: their meta implementations bind the
    arguments (the schemas' order) and give the result's shape and dtype."""
    import torch.distributed as dist
    import torch.distributed._symmetric_memory  # noqa: F401  (registers torch.ops.symm_mem)

    M, N, K, out = 32, 48, 64, []
    for op in ("all_gather_gemm", "gemm_reduce_scatter"):
        for fp8, rowwise in ((False, False), (True, False), (True, True)):
            dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
            a, b = torch.empty(M, K, dtype=dtype, device="meta"), torch.empty(N, K, dtype=dtype, device="meta").t()
            scaling = {} if not fp8 else {
                "scale_a": torch.empty((M, 1) if rowwise else (), device="meta"),
                "scale_b": torch.empty((1, N) if rowwise else (), device="meta"), "out_dtype": torch.bfloat16}
            got = suite.fused_call(op, fp8, dist.group.WORLD.group_name)(a, b, **scaling)
            out.append((op, fp8, rowwise, tuple(got.shape), got.dtype))
    return out


def test_torch_fused_ops_are_called_as_their_schemas_read(pools):
    [got] = pools.run(1, job_torch_fused_binds)
    assert [g[3:] for g in got] == [((32, 48), torch.bfloat16)] * 6, got


def _untouched_out(a, b, *, config=None, group=None, out=None, **scaling):
    """A gemm_all_scatter 'variant' that writes nothing: returns the (poisoned) out buffer. ``scaling``:
    the scale_a, scale_b, out_dtype (None) a call with ``out=`` hands every variant."""
    return out


def _raises(a, b, *, config=None, group=None):
    raise ValueError("boom from a broken variant")


def test_world1_records_wrong_and_raising_methods_and_goes_on(tmp_path, monkeypatch):
    """In-process world 1. fused_sequential first leaves a correct result in the heap out= buffer:
    only the poisoning makes the do-nothing bulk_sync fail its check."""
    monkeypatch.setitem(registry._TABLE["gemm_all_scatter"], "bulk_sync", _untouched_out)
    monkeypatch.setitem(registry._TABLE["gemm_reduce_scatter"], "bulk_sync", _raises)
    csv = tmp_path / "w1.csv"
    rc = suite.main(["--ops", "gemm_all_scatter,gemm_reduce_scatter", "--sets", "tiny", "--shapes", "tiny-b",
                     "--world", "1", "--variants", "fused_sequential,bulk_sync", "--csv", str(csv),
                     "--no-progress"])
    assert rc == 1
    df = pd.read_csv(csv).fillna({"note": ""})
    gas, grs = "gemm_all_scatter", "gemm_reduce_scatter"
    assert _value(df, gas, "tiny-b", "fused_sequential", "ok") == 1.0
    assert _value(df, gas, "tiny-b", "bulk_sync", "ok") == 0.0
    assert math.isnan(_value(df, gas, "tiny-b", "bulk_sync", "rel_err"))
    err = df[(df["op"] == grs) & (df["variant"] == "bulk_sync") & (df["metric"] == "error")]
    assert len(err) == 1 and "boom from a broken variant" in err["note"].iloc[0]
    raised = df[(df["op"] == grs) & (df["variant"] == "bulk_sync")]
    assert set(raised["metric"]) == {"error"}  # caught at the check: no rel_err/ok, not timed
    # The run went on: the methods after the broken one were checked and timed.
    for op in (gas, grs):
        for method in ("gemm", "comm", "plain", "fused_sequential"):
            assert _value(df, op, "tiny-b", method, "ok") == 1.0
            assert _value(df, op, "tiny-b", method, "ms") > 0
        skip = df[(df["op"] == op) & (df["variant"] == "torch_fused") & (df["metric"] == "skipped")]
        assert len(skip) == 1
    assert "world 1" in skip["note"].iloc[0]
    bad_note = df[(df["op"] == gas) & (df["variant"] == "bulk_sync") & (df["metric"] == "ms")]["note"].iloc[0]
    assert bad_note.startswith("FAIL")
    records = suite.summarize(df.to_dict("records"))
    status = {(r["op"], r["method"]): r["status"] for r in records}
    assert status[(gas, "bulk_sync")] == "FAIL" and status[(grs, "bulk_sync")].startswith("ERROR")


def test_plot_skips_without_matplotlib_and_progress_without_tqdm(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(plot, "_pyplot", lambda: None)
    assert plot.plot([tmp_path / "none.csv"], tmp_path) == []
    assert "matplotlib is not installed" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm now raises ImportError
    bar = results.Progress(3, desc="x", every_s=0.0)
    bar.update(2, "step")
    bar.close()
    assert "x [2/3] step" in capsys.readouterr().err
    silent = results.Progress(3, desc="y", enabled=False)
    silent.update(3)
    assert capsys.readouterr().err == ""


def test_modes_cap_and_their_help(monkeypatch, capsys):
    """At most six modes; each (and the plot tool) answers --help; unknown and missing modes are named."""
    assert len(entry.MODES) <= 6
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the entry point sets argparse's prog there
    for name in [*entry.MODES, *entry.TOOLS]:
        with pytest.raises(SystemExit) as done:
            entry.main([name, "--help"])
        assert done.value.code == 0 and f"python -m benchmarks {name}" in capsys.readouterr().out, name
    assert entry.main([]) == 2 and "suite" in capsys.readouterr().out
    assert entry.main(["no-such-mode"]) == 2 and "unknown mode 'no-such-mode'" in capsys.readouterr().err
    assert entry.resolve("tune") is entry.MODES["tune"] and entry.resolve("plot") is entry.TOOLS["plot"]
    assert entry.main(["launch"]) == 2 and "unknown mode 'launch'" in capsys.readouterr().err  # plumbing
    monkeypatch.setitem(entry.MODES, "ghost", entry.Mode("no_such_module", "a mode whose module is missing"))
    assert entry.main(["ghost"]) == 2
    assert "benchmarks/no_such_module.py is not in this checkout" in capsys.readouterr().err
    got = []
    monkeypatch.setattr(suite, "main", lambda argv: got.append(argv) or 0)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert entry.main(["suite", "--sets", "tiny"]) == 0
    assert got[-1][:2] == ["--world", str(entry._default_world())] and entry._default_world() >= 2
    assert entry.main(["suite", "--world=3"]) == 0 and got[-1] == ["--world=3"]


def _private_imports(path: Path) -> list:
    """Imports of tilefuse that are not its public API: a module or name starting with ``_``, or
    anything under ``tilefuse.ops`` (the public names are re-exported by ``tilefuse``)."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tilefuse"):
            names = [node.module + "." + a.name for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("tilefuse")]
        else:
            continue
        bad += [n for n in names if n.startswith("tilefuse.ops") or any(p.startswith("_") for p in n.split("."))]
    return bad


def test_benchmarks_use_the_public_api_and_stay_small():
    files = [p for p in sorted((REPO / "benchmarks").rglob("*")) if p.is_file() and p.suffix in (".py", ".sh")]
    for path in files:
        if path.suffix == ".py":
            assert not _private_imports(path), (path.name, _private_imports(path))
    lines = sum(len(p.read_text().splitlines()) for p in files)
    assert lines <= MAX_LINES, f"benchmarks/ holds {lines} lines"
    assert _private_imports(REPO / "tests" / "test_benchmarks.py")  # the scan finds what it looks for


def test_gemm_mode_checks_and_compares_the_core(tmp_path, capsys):
    """gemm: the core against torch.matmul per shape, a config field changed by --set, a summary row."""
    csv = tmp_path / "gemm.csv"
    assert gemm.main(["--shapes", "10x40x64,33x24x40", "--set", "SPLIT_K=1", "--csv", str(csv)]) == 0
    df = results.read_csv(csv)
    ratio = df[(df.metric == "ratio") & (df.M != "all")]
    assert len(ratio) == 2 and (ratio.value > 0).all() and ratio.note.str.contains("SPLIT_K=1").all()
    assert (df[df.metric == "rel_err"].value.astype(float) < 1e-2).all()
    assert {"ratio_median", "ratio_worst"} <= set(df.metric)
    assert df[["device", "torch", "triton", "commit"]].notna().all().all()
    assert "ratio_median" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        gemm.main(["--set", "SPLIT_K", "--csv", str(csv)])


def test_gemm_mode_fp8_checks_each_scaling(tmp_path):
    """gemm --fp8: the float8 core per scaling, checked against the fp32 product of the dequantized
    operands, then timed. torch._scaled_mm does not run on the CPU: there ``torch_ms`` times that fp32
    product (the note says so); the zero padding of _scaled_mm's operands is checked alone."""
    csv = tmp_path / "fp8.csv"
    assert gemm.main(["--shapes", "20x24x40", "--fp8", "tensorwise,rowwise", "--csv", str(csv)]) == 0
    df = results.read_csv(csv)
    assert set(df.dtype) == {"float8_e4m3fn"}
    for scaling in ("tensorwise", "rowwise"):
        mine = df[df.variant == scaling]
        assert (mine[mine.metric == "rel_err"].value.astype(float) < 1e-2).all()
        assert {"ms", "torch_ms", "ratio", "ratio_median", "ratio_worst", "user_ratio",
                "user_ratio_worst"} <= set(mine.metric), scaling
        if (mine.device == "cpu-interpreter").all():  # on a GPU torch_ms is torch._scaled_mm's own
            assert mine[mine.metric == "torch_ms"].note.str.contains("dequantized").all()
    t = torch.arange(3 * 17.0).reshape(3, 17)
    padded = suite.pad16(t)
    assert padded.shape == (16, 32) and torch.equal(padded[:3, :17], t) and padded[3:].eq(0).all()
    assert suite.pad16(t, (0,)).shape == (16, 17) and suite.pad16(padded) is padded
    with pytest.raises(SystemExit):
        gemm.main(["--fp8", "blockwise", "--csv", str(csv)])


def test_tp_mode_times_the_three_forms(tmp_path):
    csv = tmp_path / "tp.csv"
    assert entry.main(["tp", "--size", "tiny", "--world", "1", "--csv", str(csv)]) == 0
    df = pd.read_csv(csv)
    ms = df[df.metric == "ms"]
    assert set(ms.variant) == {"plain", "tilefuse[auto]", "torch_tp"} and (ms.value > 0).all()
    assert float(df[df.metric == "rel_err"].value.iloc[0]) < 1e-4


def test_plot_draws_each_kind_and_stamps_its_run(tmp_path):
    """plot: a suite, a host and a decode CSV each become their figures, titled with the device, torch,
    triton and commit of their rows (a commit that reads as a number stays text); --fill gives a fact a
    CSV lacks; an unknown CSV is refused."""
    if plot._pyplot() is None:
        pytest.skip("matplotlib is not installed")
    facts = dict(device="H200", torch="2.11.0", triton="3.6.0", commit="63924e7")
    rows = [dict(op="gemm_all_scatter", variant=v, M=64, N=32, K=16, dtype="bfloat16", world=2, metric=m, value=x,
                 shape="8b-qkv", **facts)
            for v, m, x in (("plain", "ms", 1.0), ("plain", "speedup_vs_plain", 1.0), ("bulk_sync", "ms", 0.8),
                            ("bulk_sync", "speedup_vs_plain", 1.25), ("ideal", "ideal_speedup", 1.5))]
    pd.DataFrame(rows).to_csv(tmp_path / "suite.csv", index=False)
    for what, metrics in {"host": ("host_us", "wall_us"), "decode": ("us_per_call",)}.items():
        rows = [dict(op="gemm_all_reduce", variant=v, M=M, N=64, K=32, dtype="bf16", world=2, mode=mode, metric=m,
                     value=10.0 + M, device="H200", commit="63924e7")
                for v in ("plain", "fused_sequential") for M in (1, 16) for mode in ("eager", "graph") for m in metrics]
        frame = pd.DataFrame(rows)
        if what == "decode":  # the decode mode's columns: a shape and a method per row, no op
            frame = frame.drop(columns="op").rename(columns={"variant": "method"}).assign(shape="8b.o_proj")
        frame.to_csv(tmp_path / f"{what}.csv", index=False)
    titles = []
    real = plot._pyplot()
    savefig = real.Figure.savefig

    def spy(fig, path, **kw):
        titles.append(" ".join(t.get_text() for t in [fig._suptitle, *(ax.title for ax in fig.axes)] if t))
        return savefig(fig, path, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(real.Figure, "savefig", spy)
        paths = plot.plot([tmp_path / f"{k}.csv" for k in ("suite", "host", "decode")], tmp_path / "out",
                          {"triton": "3.6.0", "torch": "2.11.0"})
    assert [p.name for p in paths] == ["speedup_gemm_all_scatter_w2_bfloat16.png", "host_w2.png", "decode_w2.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    for title in titles:
        assert "H200, torch 2.11.0, triton 3.6.0, commit 63924e7" in title, title
    (tmp_path / "other.csv").write_text("op,metric,value\nx,bandwidth,1.0\n")
    with pytest.raises(ValueError, match="not a suite, host or decode CSV"):
        plot.plot([tmp_path / "other.csv"], tmp_path / "out")


@pytest.mark.slow  # a fresh copy of the tracked files, and a process per mode
def test_every_mode_answers_help_from_a_fresh_clone(tmp_path):
    tracked = subprocess.run(["git", "ls-files", "benchmarks"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    for name in tracked:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    for name in [*entry.MODES, *entry.TOOLS]:
        proc = subprocess.run([sys.executable, "-m", "benchmarks", name, "--help"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "usage:" in proc.stdout, (name, proc.stderr[-2000:])


def job_tune(ctx, n, budget_s, out):
    return tune._job(ctx, ["gemm_all_scatter", "gemm_reduce_scatter"], n, "float16", True, tune.HELDOUT_SEED, None,
                     budget_s=budget_s, out=out)


def test_tune_mode_checks_auto_and_summarizes(tmp_path):
    """tune at world 1 in process: auto checked and timed against plain on held-out shapes, round robin
    over the ops, a summary of its ratios; shapes are seeded and in no tuning set."""
    [(rows, notes)] = launch.launch(job_tune, 1, 1, None, str(tmp_path / "t.csv"), heap_size=64 << 20)
    timed = [r["op"] for r in rows if r["metric"] == "ms" and r["variant"] == "plain"]
    assert timed == ["gemm_all_scatter", "gemm_reduce_scatter"]
    summary = tune.summarize(rows, min_ms=0.0)
    assert {"worst_speedup_vs_plain", "median_speedup_vs_plain_plain_ge_0ms"} <= {r["metric"] for r in summary}
    assert set(pd.read_csv(tmp_path / "t.csv")["op"]) == {"gemm_all_scatter", "gemm_reduce_scatter"}
    assert tune.heldout_shapes("gemm_all_reduce", 2, 4) == tune.heldout_shapes("gemm_all_reduce", 2, 4)


def test_progress_bar_on_a_terminal(monkeypatch):
    pytest.importorskip("tqdm")

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    bar = results.Progress(4, desc="suite")
    bar.update(4, "last step")
    bar.close()
    assert "suite" in tty.getvalue() and "4/4" in tty.getvalue()


def test_tolerance_and_rel_error_reject_nan():
    assert checks.tolerance(torch.float16, on_gpu=True) == 1e-2
    a = torch.ones(4, 4)
    assert checks.rel_error(a, a) == 0.0
    assert math.isnan(checks.rel_error(torch.full((4, 4), float("nan")), a))
    assert math.isnan(checks.rel_error(a[:2], a))


def test_suite_graphs_time_each_captured_method_and_record_a_failed_capture(monkeypatch):
    """--graphs' bookkeeping (the capture itself needs a GPU): every method that ran is captured and its
    replays timed; one whose capture raises gets a graph_error row and no time."""
    class Ctx:
        on_gpu, world, device = True, 1, torch.device("cuda", 0)

        def barrier(self):
            pass

        def all_gather_object(self, obj):
            return [obj]

    class Graph:
        def __init__(self, label):
            self.replay = lambda: label

    def capture(device, fn, warmup):
        label = fn()
        if label == "broken":
            raise RuntimeError("operation not permitted when stream is capturing")
        return Graph(label)

    monkeypatch.setattr(suite, "capture_graph", capture)
    monkeypatch.setattr(suite, "bench_interleaved", lambda ctx, fns, **kw: [{"plain": 2.0}.get(f(), 1.0) for f in fns])
    methods = [suite.Method(label, lambda s, label=label: label, "op") for label in ("plain", "bulk_sync", "broken")]
    methods.append(suite.Method("torch_fused", None, "op", skip="none in torch"))
    rows = []
    case = type("Case", (), {"sets": [None]})()
    suite.time_graphs(Ctx(), case, methods, type("Args", (), {"warmup_ms": 1.0, "rep_ms": 1.0})(),
                      lambda label, metric, value, note="": rows.append((label, metric, value, note)))
    got = {(label, metric): value for label, metric, value, _ in rows}
    assert got == {("plain", "graph_ms"): 2.0, ("plain", "graph_speedup_vs_plain"): 1.0,
                   ("bulk_sync", "graph_ms"): 1.0, ("bulk_sync", "graph_speedup_vs_plain"): 2.0,
                   ("broken", "graph_error"): pytest.approx(float("nan"), nan_ok=True)}
    assert "stream is capturing" in [n for label, _, _, n in rows if label == "broken"][0]


def test_suite_control_method_is_accepted_in_place():
    got = suite.tilefuse_variants("gemm_reduce_scatter", ["auto", suite.CONTROL, "no_such_variant", "bulk_sync"])
    assert got == ["auto", suite.CONTROL, "bulk_sync"]


def test_bench_interleaved_times_each_function_call_by_call(monkeypatch):
    """The GPU path of bench_interleaved with CUDA events on a fake clock that only the timed
    functions advance (no GPU here; real sleeps would measure the machine's load)."""
    clock = [0.0]  # ms

    class FakeEvent:
        def __init__(self, enable_timing=True):
            self.t = None

        def record(self):
            self.t = clock[0]

        def elapsed_time(self, end):
            return end.t - self.t

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(timing, "_flush_l2", lambda device: None)
    ctx = launch.RankCtx(rank=0, world=1, device=torch.device("cuda", 0), heap=None, pg_backend="gloo",
                         host_group=None)
    order = []

    def worker(i, ms):
        def fn():
            order.append(i)
            clock[0] += ms
        return fn

    host = [[], []]
    got = timing.bench_interleaved(ctx, [worker(0, 1.0), worker(1, 4.0)], warmup_ms=5, rep_ms=20,
                                   sync_each=True, host_ms=host)
    assert got == pytest.approx([1.0, 4.0]), got
    timed = order[-2 * len(host[0]):]  # the timed calls alternate, the first of each pair rotating
    assert timed[:4] == [0, 1, 1, 0], timed[:4]
    assert len(host[0]) == len(host[1]) >= 5


def test_world1_mode_times_custom_shapes_and_the_gemm_core(tmp_path, capsys):
    """``--shapes MxNxK`` needs no shape set; ``core`` (the GEMM core alone) is checked like a variant."""
    from benchmarks import __main__ as entry

    csv = tmp_path / "w1.csv"
    rc = entry.main(["suite", "--world", "1", "--ops", "gemm_reduce_scatter", "--shapes", "64x48x40",
                     "--variants", "core,plain_again",
                     "--csv", str(csv), "--no-progress"])
    assert rc == 0, capsys.readouterr().out[-3000:]
    df = pd.read_csv(csv)
    assert set(df["set"]) == {"custom"} and set(df["shape"]) == {"64x48x40"}
    assert (df[["M", "N", "K"]].values == [64, 48, 40]).all()
    for method in ("gemm", "plain", "core", "plain_again"):
        assert _value(df, "gemm_reduce_scatter", "64x48x40", method, "ok") == 1.0, method
        assert _value(df, "gemm_reduce_scatter", "64x48x40", method, "ms") > 0
    with pytest.raises(SystemExit):
        suite.main(["--shapes", "64x0x40", "--csv", str(csv)])
    assert "every dimension must be >= 1" in capsys.readouterr().err


def _fails_on_rank_1(ctx, message):
    if ctx.rank == 1:
        raise RuntimeError(message)
    ctx.barrier()  # rank 0 waits for a rank that never comes: the launcher must not wait for it forever
    return ctx.rank


@pytest.mark.slow
def test_launcher_reports_a_failing_rank_and_does_not_wait_for_a_stuck_one():
    """World 2 (spawned ranks; the successful path is the CLI test's). ~20 s: two fresh processes."""
    start = time.monotonic()
    with pytest.raises(launch.LaunchError, match="boom on rank one") as err:
        launch.launch(_fails_on_rank_1, 2, "boom on rank one", heap_size=16 << 20, timeout=120, error_grace_s=3)
    assert "--- rank 1 ---" in str(err.value)
    assert time.monotonic() - start < 60, "the launcher waited for the stuck rank past its grace"
    with pytest.raises(ValueError, match="world must be >= 1"):
        launch.launch(_fails_on_rank_1, 0, "never runs")


@needs_working_interpreter
@pytest.mark.slow
def test_host_tiny_writes_every_method(tmp_path):
    """benchmarks host --tiny at worlds 1 and 2 on CPU ranks: torch, plain, auto, plain's custom op
    and a fused variant (launches made no-ops), each with host µs per call; at world 1 the calls
    timed alone too; no errors."""
    from benchmarks import host

    env = dict(os.environ, TILEFUSE_BACKEND="cpu", TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    names = ["torch", "plain", "auto", "plain_custom_op", "fused_sequential"]
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "host", "--tiny", "--world", "1,2", "--ops",
                           "gemm_all_scatter", "--variants", ",".join(names), "--calls", "3", "--rounds", "2",
                           "--out", str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "plain" in proc.stdout and "auto" in proc.stdout
    for world in (1, 2):
        df = pd.read_csv(tmp_path / f"host_w{world}.csv", dtype={"note": str})
        assert list(df.columns) == host.CSV_COLUMNS
        assert (df["world"] == world).all() and (df["device"] == "cpu").all() and df["commit"].notna().all()
        assert (df["metric"] != "error").all(), df[df["metric"] == "error"]["note"].tolist()
        assert set(df["variant"]) == set(names)
        metrics = {"host_us", "alone_host_us"} if world == 1 else {"host_us"}
        for name in names:
            got = df[df["variant"] == name].set_index("metric")["value"]
            assert set(got.index) == metrics and (got > 0).all(), (world, name)
        assert df[df["variant"] == "auto"]["note"].str.contains("auto runs plain").all()


def test_random_shapes_are_seeded_and_in_range():
    from benchmarks.host import random_shapes

    shapes = random_shapes(24, 0)
    assert shapes == random_shapes(24, 0) and shapes != random_shapes(24, 1) and len(shapes) == 24
    for M, N, K, _ in shapes:
        assert 1 <= M <= 8192 and 1024 <= N <= 28672 and 1024 <= K <= 28672 and N % 128 == K % 128 == 0
    assert {d for *_, d in shapes} == {"bf16", "fp16"}


def test_run_scripts_parse_and_keep_nvlink_multicast_off():
    scripts = sorted((REPO / "benchmarks" / "runs").glob("*.sh"))
    assert {s.name for s in scripts} == {"prelude.sh", "gpu_tests.sh", "one_gpu.sh", "two_gpus.sh"}
    for script in scripts:
        text = script.read_text()
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, f"{script.name}: {proc.stderr}"
        if script.name != "prelude.sh" and 'prelude.sh"' in text:
            continue  # sourced: the prelude exports them
        for var in ("NCCL_NVLS_ENABLE=0", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1"):
            assert var in text, f"{script.name} neither sources prelude.sh nor sets {var}"
    # Every benchmark a script runs is a mode of the entry point (or the tuner, or an example).
    from benchmarks import __main__ as entry

    text = "\n".join(s.read_text() for s in scripts)
    for name in re.findall(r"-m benchmarks[ .]([a-z_-]+)", text):
        assert entry.resolve(name), name
    for path in re.findall(r"(examples/[a-z_]+\.py)", text):
        assert (REPO / path).exists(), path


@pytest.mark.slow
@needs_working_interpreter
def test_host_parts_times_the_parts_of_a_call(tmp_path):
    """benchmarks host --parts on a CPU rank: the parts of a call, each timed alone."""
    env = dict(os.environ, TILEFUSE_BACKEND="cpu", TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "host", "--parts", "--ops", "gemm_all_reduce",
                           "--variants", "wg_specialized", "--tiny", "--calls", "2"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    parts = out.split("parts of a call, each alone:")[1]
    for name in ("public tilefuse.gemm_all_reduce(a, b, variant='wg_specialized')", "torch.empty(M, N)",
                 "custom op torch.ops.tilefuse.gemm_all_reduce(a, b, 'wg_specialized')"):
        assert name in parts, (name, parts)


def job_host_path_checks(ctx):
    """benchmarks host's check of every timed method on new operands, with one method that is wrong."""
    from benchmarks import host

    real = host.methods

    def with_a_wrong_one(op, *args):
        out = real(op, *args)
        out["wrong"] = lambda a, b: out["plain"](a, b) * 2
        return out

    host.methods = with_a_wrong_one
    try:
        rows = host._check_methods(ctx, "gemm_all_reduce", 4, 8, 8, "fp32", ["plain", "bulk_sync", "wrong"])
    finally:
        host.methods = real
    return {r["variant"]: r["value"] for r in rows if r["metric"] == "ok"}


@pytest.mark.slow
def test_host_path_checks_every_method_on_new_operands(pools):
    [ok] = pools.run(1, job_host_path_checks, timeout=120)
    assert ok == {"plain": 1, "bulk_sync": 1, "wrong": 0}, ok


def test_interleaved_us_medians_per_method_in_rounds():
    """host.interleaved_us (benchmarks host's timer): methods run in turn each round, inside their
    context; the host µs per call and, with a sync, the µs until done are medians over rounds, floats
    per method."""
    from benchmarks.host import interleaved_us

    now, order, entered = [0.0], [], []

    def clock():
        return now[0]

    def method(name, cost):
        def fn():
            order.append(name)
            now[0] += cost
        return fn

    def sync():
        now[0] += 1e-6  # the device finishes 1 µs after the host

    @contextlib.contextmanager
    def context(name):
        entered.append(name)
        yield

    fns = {"plain": method("plain", 2e-6), "fused": method("fused", 5e-6)}
    host, done = interleaved_us(fns, calls=4, rounds=3, clock=clock, sync=sync, context=context)
    assert order == (["plain"] * 4 + ["fused"] * 4) * 3 and entered == ["plain", "fused"] * 3
    assert host == pytest.approx({"plain": 2.0, "fused": 5.0}) and all(type(v) is float for v in host.values())
    assert done == pytest.approx({"plain": 2.25, "fused": 5.25})
    host, done = interleaved_us(fns, calls=2, rounds=1, clock=clock)
    assert host == pytest.approx({"plain": 2.0, "fused": 5.0}) and done == {}


# ----------------------------------------------------------------------------- decode
def job_decode(ctx, argv, shape):
    """benchmarks.decode's rank function in a pool, on one of its smoke shapes: its rows."""
    import torch.distributed as dist

    from benchmarks import decode
    from benchmarks.launch import RankCtx

    opts = decode.parse_options(argv)
    opts.shapes = {shape: decode.SMOKE_SHAPES[shape]}
    bctx = RankCtx(ctx.rank, ctx.world, ctx.device, ctx.heap, dist.get_backend(), dist.group.WORLD)
    return decode.run_rank(bctx, opts)


def test_decode_smoke_checks_and_times_every_method(pools, on_gpu):
    """benchmarks.decode --smoke at world 2: the fused call with the epilogue and the cuBLAS + NCCL
    chain checked (same bits on every rank, small error) and timed; the symmetric-memory chain timed
    on a GPU with one per rank, else a ``skipped`` row saying why."""
    from benchmarks import decode

    rows = pools.run(2, job_decode, ["--smoke", "--M", "3", "--variants", "fused_sequential"], "tiny.o_proj")[0]
    df = pd.DataFrame(rows)
    assert (df["metric"] != "error").all(), df[df["metric"] == "error"]["note"].tolist()
    check = df[df["mode"] == "check"].set_index(["method", "metric"])["value"]
    for method in ("tilefuse.fused_sequential", "cublas_nccl"):
        for what in ("y", "s"):
            assert check[(method, f"same_bits_{what}")] == 1.0
            assert check[(method, f"rel_error_{what}")] < 1e-2
        timed = df[(df["method"] == method) & (df["metric"] == "us_per_call")]
        assert list(timed["mode"]) == ["eager"] and (timed["value"] > 0).all()
    symm = df[df["method"] == "cublas_symm_one_shot"]
    if not on_gpu:
        assert list(symm["metric"]) == ["skipped"] and "symmetric memory" in symm["note"].iloc[0]
    assert set(decode.BASELINES) <= set(df["method"])


def test_noop_launches_run_the_host_path_and_launch_nothing():
    """tilefuse.runtime.launcher.noop_launches (benchmarks host's no-op launches): inside the block a
    kernel writes nothing; after it the same call computes."""
    from harness import TEST_DEVICE

    import tilefuse
    from tilefuse.runtime.launcher import noop_launches

    dev = "cuda" if TEST_DEVICE == "cuda" else "cpu"
    a, b = torch.randn(16, 32, device=dev), torch.randn(32, 24, device=dev)
    out = torch.full((16, 24), float("nan"), device=dev)
    with noop_launches():
        tilefuse.matmul(a, b, out=out)
        tilefuse.matmul(a, b, out=out)  # a signature seen before: the lookup path
    assert out.isnan().all()
    tilefuse.matmul(a, b, out=out)
    assert torch.allclose(out, a @ b, atol=1e-2, rtol=1e-2)  # tf32 on a GPU
