"""Smoke test of the benchmark suite's plumbing on the CPU: launch, checks, CSV, table, plots.

Timings in Triton's interpreter mean nothing; what is tested is that every method runs and is
checked, that a wrong or raising method is recorded without stopping the run, that the derived
metrics follow their definitions, and that the CSV and the plots come out.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from ophelpers import needs_working_interpreter

from benchmarks import checks, launch, plots, results, suite, timing
from tilefuse.ops import registry
from tilefuse.tuning.shapes import local_shapes

REPO = Path(__file__).resolve().parents[1]


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
    for op in registry.OPS:
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
    assert pngs == sorted(f"{kind}_{op}_w2_float16.png" for op in registry.OPS for kind in ("speedup", "vs_ideal"))


def _untouched_out(a, b, *, config=None, group=None, out=None):
    """A gemm_all_scatter 'variant' that writes nothing: returns the (poisoned) out buffer."""
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


def test_plots_skip_without_matplotlib_and_progress_without_tqdm(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(plots, "_pyplot", lambda: None)
    assert plots.make_plots(pd.DataFrame(columns=suite.CSV_COLUMNS), tmp_path) == []
    assert "matplotlib is not installed" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm now raises ImportError
    bar = results.Progress(3, desc="x", every_s=0.0)
    bar.update(2, "step")
    bar.close()
    assert "x [2/3] step" in capsys.readouterr().err
    silent = results.Progress(3, desc="y", enabled=False)
    silent.update(3)
    assert capsys.readouterr().err == ""


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


def test_suite_control_method_is_accepted_in_place():
    from benchmarks import suite

    got = suite.tilefuse_variants("gemm_reduce_scatter", ["auto", suite.CONTROL, "no_such_variant", "bulk_sync"])
    assert got == ["auto", suite.CONTROL, "bulk_sync"]


def test_suite_warp_spec_methods(tmp_path):
    """``<variant>.ws``: offered where the variant honours WARP_SPEC (gemm_all_reduce's one-shot
    fused_sequential does not), and run on the warp-specialized tile, checked against the reference."""
    got = suite.tilefuse_variants("gemm_all_reduce", ["fused_sequential.ws", "bulk_sync.ws"])
    assert got == ["bulk_sync.ws"]
    csv = tmp_path / "ws.csv"
    rc = suite.main(["--ops", "gemm_reduce_scatter", "--sets", "tiny", "--shapes", "tiny-b", "--world", "1",
                     "--variants", "fused_sequential.ws,bulk_sync.ws", "--csv", str(csv), "--no-progress"])
    assert rc == 0
    df = pd.read_csv(csv)
    for method in ("fused_sequential.ws", "bulk_sync.ws"):
        assert _value(df, "gemm_reduce_scatter", "tiny-b", method, "ok") == 1.0
        assert _value(df, "gemm_reduce_scatter", "tiny-b", method, "ms") > 0


@pytest.mark.slow  # three timed layer stacks end to end (the GPU scripts run it)
def test_tp_mlp_times_tilefuse_plain_module_and_torch_tp(tmp_path):
    csv = tmp_path / "tp.csv"
    env = dict(os.environ, TILEFUSE_BACKEND="cpu", TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.tp_mlp", "--size", "tiny", "--world", "1",
                           "--csv", str(csv)], cwd=REPO, env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    df = pd.read_csv(csv)
    ms = df[df.metric == "ms"]
    assert set(ms.variant) == {"plain", "tilefuse[auto]", "torch_tp"} and (ms.value > 0).all()
    assert float(df[df.metric == "rel_err"].value.iloc[0]) < 1e-4


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


def test_entry_point_dispatches_by_mode_and_names_missing_modules(monkeypatch, capsys):
    from benchmarks import __main__ as entry

    assert entry.main([]) == 2 and "world1" in capsys.readouterr().out
    assert entry.main(["no-such-mode"]) == 2 and "unknown mode 'no-such-mode'" in capsys.readouterr().err
    assert entry.resolve("tp_mlp") is entry.MODES["tp"]  # a module's own name works too
    assert entry.main(["launch"]) == 2 and "unknown mode 'launch'" in capsys.readouterr().err  # plumbing
    monkeypatch.setitem(entry.MODES, "ghost", entry.Mode("no_such_module", "a mode whose module is missing"))
    assert entry.main(["ghost"]) == 2
    assert "benchmarks/no_such_module.py is not in this checkout" in capsys.readouterr().err
    assert entry.main(["world1", "--world", "2"]) == 2 and "runs at world 1" in capsys.readouterr().err
    got = []
    monkeypatch.setattr(suite, "main", lambda argv: got.append(argv) or 0)
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the entry point sets argparse's prog there
    assert entry.main(["world1", "--ops", "all"]) == 0 and got[-1] == ["--world", "1", "--ops", "all"]
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert entry.main(["suite", "--sets", "tiny"]) == 0
    assert got[-1][:2] == ["--world", str(entry._default_world())] and entry._default_world() >= 2
    assert entry.main(["suite", "--world=3"]) == 0 and got[-1] == ["--world=3"]


def test_world1_mode_times_custom_shapes_and_the_gemm_core(tmp_path, capsys):
    """``--shapes MxNxK`` needs no shape set; ``core`` (the GEMM core alone) is checked like a variant."""
    from benchmarks import __main__ as entry

    csv = tmp_path / "w1.csv"
    rc = entry.main(["world1", "--ops", "gemm_reduce_scatter", "--shapes", "64x48x40", "--variants", "core,plain_again",
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
    """benchmarks host --tiny at worlds 1 and 2 on CPU ranks: torch, plain, auto, plain's entry and
    custom op and a fused variant (launches made no-ops), each with host µs per call; at world 1 the
    calls timed alone too; no errors."""
    from benchmarks import host

    env = dict(os.environ, TILEFUSE_BACKEND="cpu", TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    names = ["torch", "plain", "auto", "plain_entry", "plain_custom_op", "fused_sequential"]
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


def test_decode_gemm_smoke_checks_and_times_every_method(tmp_path, monkeypatch):
    """benchmarks.decode_gemm --smoke in the interpreter: torch, the GEMM core, the read of the
    weight, both split-K candidates and the GEMM core on a candidate's schedule (descriptor and
    pointer path) each get ms and ratio rows (ratio = torch's ms over the method's); a candidate that
    computes a wrong result is recorded as an error, not timed."""
    from benchmarks import decode_gemm

    csv = tmp_path / "decode.csv"
    assert decode_gemm.main(["--smoke", "--csv", str(csv)]) == 0
    df = pd.read_csv(csv, dtype={"note": str})
    assert set(df["M"]) == {1, 5} and (df["metric"] != "error").all()
    methods = {"torch", "core", "read"} | {decode_gemm.label(c) for c in decode_gemm.candidates(1, smoke=True)}
    methods |= {"core_" + decode_gemm.label(c).removeprefix("splitk_") + tail
                for c in decode_gemm.core_candidates(1, smoke=True) for tail in ("", "_ptr")}
    for M in (1, 5):
        at = df[df["M"] == M]
        assert set(at["variant"]) == methods
        ms = at[at["metric"] == "ms"].set_index("variant")["value"]
        ratio = at[at["metric"] == "ratio"].set_index("variant")["value"]
        for name in methods:
            assert ms[name] > 0 and ratio[name] == pytest.approx(ms["torch"] / ms[name])

    real = decode_gemm.splitk
    monkeypatch.setattr(decode_gemm, "splitk", lambda a, b, ws, cfg: real(a, b, ws, cfg) * (2 if cfg[3] == 3 else 1))
    assert decode_gemm.main(["--smoke", "--csv", str(csv)]) == 0
    df = pd.read_csv(csv, dtype={"note": str})
    bad = decode_gemm.label(decode_gemm.candidates(1, smoke=True)[1])
    errors = df[df["metric"] == "error"]
    assert set(errors["variant"]) == {bad} and errors["note"].str.contains("relative error").all()
    assert bad not in set(df[df["metric"] == "ms"]["variant"])


def test_composite_tiles_smoke_checks_and_times_every_candidate(tmp_path, monkeypatch):
    """benchmarks.composite_tiles --smoke in the interpreter: tiles of two blocks (32 + 16 columns
    over ragged M and N) compute the product right (no error rows: every candidate was checked
    against torch.matmul on NaN-filled outputs), and torch, the GEMM core and each candidate get ms
    and ratio rows; a candidate with a wrong result is recorded as an error, not timed."""
    from benchmarks import composite_tiles

    csv = tmp_path / "composite.csv"
    assert composite_tiles.main(["--smoke", "--csv", str(csv)]) == 0
    df = pd.read_csv(csv, dtype={"note": str})
    assert set(df["M"]) == {37, 5} and (df["metric"] != "error").all()
    names = [composite_tiles.label(c) for c in composite_tiles.candidates(smoke=True)]
    for M in (37, 5):
        at = df[df["M"] == M]
        ms = at[at["metric"] == "ms"].set_index("variant")["value"]
        ratio = at[at["metric"] == "ratio"].set_index("variant")["value"]
        assert set(ms.index) == {"torch", "core", *names}
        for name in ms.index:
            assert ms[name] > 0 and ratio[name] == pytest.approx(ms["torch"] / ms[name])
    tiles = df[(df["metric"] == "tiles") & (df["M"] == 37)].set_index("variant")["value"]
    assert tiles[names[0]] == 2 * 2  # 37 rows in 32-row tiles, 72 columns in 48-wide ones

    real = composite_tiles.composite
    monkeypatch.setattr(composite_tiles, "composite",
                        lambda a, b, c, cand, programs: real(a, b, c, cand, programs) * (2 if cand[1] == 16 else 1))
    assert composite_tiles.main(["--smoke", "--csv", str(csv)]) == 0
    df = pd.read_csv(csv, dtype={"note": str})
    errors = df[df["metric"] == "error"]
    assert set(errors["variant"]) == {names[1]} and errors["note"].str.contains("relative error").all()
    assert names[1] not in set(df[df["metric"] == "ms"]["variant"])


@pytest.mark.slow
def test_host_overhead_plot_one_figure_per_world(tmp_path):
    """plots --host-overhead: a figure per world size from host_overhead CSVs, the comparison-only forms
    (begin kernel, plain's custom op and entry) left out; nothing without matplotlib."""
    if plots._pyplot() is None:
        pytest.skip("matplotlib is not installed")
    rows = []
    for world in (1, 2):
        for op in ("gemm_all_scatter", "gemm_all_reduce"):
            for variant in ("plain", "torch", "bulk_sync", "bulk_sync+begin_kernel", "plain_entry", "auto"):
                for M in (1, 16):
                    for mode in ("eager", "graph"):
                        for metric in ("host_us", "wall_us"):
                            rows.append(dict(op=op, variant=variant, M=M, N=64, K=32, dtype="bf16", world=world,
                                             mode=mode, metric=metric, value=10.0 + M, device="cpu",
                                             commit="63924e7", note=""))  # a commit that reads as a number
    csv = tmp_path / "host.csv"
    pd.DataFrame(rows).to_csv(csv, index=False)
    seen, figs = [], []
    real = plots._pyplot()

    class Spy:
        def __getattr__(self, name):
            return getattr(real, name)

        def subplots(self, *args, **kwargs):
            fig, axes = real.subplots(*args, **kwargs)
            seen.append(axes)
            figs.append(fig)
            return fig, axes

    paths = plots.plot_host_overhead([csv], tmp_path / "out", plt=Spy())
    assert sorted(p.name for p in paths) == ["host_overhead_w1.png", "host_overhead_w2.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    labels = {t.get_text() for axes in seen for t in axes[0][1].get_legend().get_texts()}
    assert labels == {"plain", "torch", "bulk_sync", "auto"}, labels
    titles = [fig._suptitle.get_text() for fig in figs]
    assert all(t.endswith("commit 63924e7") for t in titles), titles


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


# ----------------------------------------------------------------------------- soak
def _soak_opts(tmp_path, *extra) -> dict:
    from benchmarks import soak

    argv = ["--calls", "500", "--check-every", "3", "--repeat-every", "2", "--warmup", "2", "--max-m", "16",
            "--max-n", "16", "--max-k", "16", "--variants", "bulk_sync,plain", "--csv", str(tmp_path / "soak.csv"),
            "--no-progress", *extra]
    return soak._options(soak.parse_args(argv), on_gpu=False)


def job_soak(ctx, opts, slow_rank, delay_s):
    """The soak's rank function in a pool, rank ``slow_rank`` ``delay_s`` slower per call; also
    whether every function the soak wrapped was given back afterwards."""
    import gc as gc_module

    import tilefuse
    from benchmarks import soak
    from tilefuse.runtime import hostsync
    from tilefuse.runtime import world as tf_world

    originals = (hostsync.all_gather_object, gc_module.collect, tf_world.device_barrier)
    make_inputs = soak._inputs

    def slow_inputs(*args, **kwargs):
        time.sleep(delay_s)
        return make_inputs(*args, **kwargs)

    if ctx.rank == slow_rank:
        soak._inputs = slow_inputs
    try:
        out = soak.run_soak(ctx, opts)
    finally:
        soak._inputs = make_inputs
        tilefuse.clear_workspaces()
    restored = (originals == (hostsync.all_gather_object, gc_module.collect, tf_world.device_barrier)
                and "check_symmetric" not in vars(ctx.heap))
    return out["mine"], restored


@pytest.mark.slow  # a timed soak on every rank (make test's 5-minute budget)
def test_soak_budget_stops_every_rank_at_the_same_call(pools, tmp_path):
    """World 2, rank 1 slower per call (its clock and rank 0's differ): both ranks stop after the same
    call once the slowest clock is past the budget; a warm repeat makes no workspace, a new shape's
    host steps are counted; rank 0 leaves a CSV as it goes."""
    from benchmarks import soak

    budget = 4.0
    opts = _soak_opts(tmp_path, "--budget-s", str(budget), "--report-s", "0.5", "--variants", "bulk_sync",
                      "--repeat-every", "1")
    records = []
    for rec, restored in pools.run(2, job_soak, opts, 1, 0.4, timeout=120):
        assert restored, "the soak left a wrapped function behind"
        records.append(rec)
    r0, r1 = records
    assert not r0["error"] and not r1["error"], (r0["error"], r1["error"])
    assert r0["stopped_by"] == r1["stopped_by"] == "budget"
    assert r0["calls"] == r1["calls"] and 1 <= r0["calls"] < opts["calls"]
    slowest = max(r0["seconds"], r1["seconds"])
    assert budget <= slowest < budget + 30  # the slowest clock decides; the stop comes soon after
    assert r0["budget_checks"] == r1["budget_checks"] >= 1
    assert r0["repeats"] == r0["calls"]  # every call made twice
    costs = r0["costs"]
    new_fused = costs["new fused"]
    # A new shape makes workspaces without a cyclic collection (only diverged heap offsets collect).
    assert new_fused["workspaces"] >= 1 and new_fused["gc_collect_count"] == 0, new_fused
    assert new_fused["host_collective_count"] >= 1 and new_fused["device_barrier_count"] >= 1
    assert costs["second fused"]["n"] >= 1
    assert new_fused["n"] + sum(costs[c]["n"] for c in ("second fused", "later fused") if c in costs) == 2 * r0["calls"]
    for cls in ("second fused", "later fused"):  # a warm shape makes no workspace
        if cls in costs:
            assert costs[cls]["workspaces"] == 0 and costs[cls]["gc_collect_count"] == 0, (cls, costs[cls])
    rows, text, ok, _ = soak.summarize(records, opts, 2, results.run_info())
    assert ok and f"stopped by the {budget:g} s budget" in text and "new fused" in text
    metrics = {r["metric"]: r["value"] for r in rows if not r["op"] and not r["note"]}
    assert metrics["calls"] == r0["calls"] and metrics["requested"] == opts["calls"]
    df = pd.read_csv(opts["csv"])  # rank 0's own CSV, written as it went
    run = df[df["op"].isna()].set_index("metric")["value"]
    assert run["complete"] == 0 and run["calls"] == r0["calls"]
    from benchmarks import summary

    line = summary.soak_summary(Path(opts["csv"]))[0]
    assert f"{r0['calls']}/{opts['calls']} calls (budget, UNFINISHED" in line and "new fused" in line


def test_soak_progress_lines_and_csv_on_error_or_a_failed_launch(tmp_path, monkeypatch, capsys):
    """World 1 in this process: progress lines on stderr without the bar; a raising variant stops the
    run with its error in the CSV; a launch that fails still leaves a CSV that says why."""
    from benchmarks import soak

    def raises(a, b, *, config=None, group=None):
        raise ValueError("boom from a broken variant")

    monkeypatch.setitem(registry._TABLE["gemm_reduce_scatter"], "bulk_sync", raises)
    csv = tmp_path / "soak.csv"
    # The shape draw pinned (min-dim, align, pool, fresh: the CPU's defaults), so the same calls run on a GPU.
    argv = ["--world", "1", "--calls", "40", "--variants", "bulk_sync", "--min-dim", "1", "--max-m", "16",
            "--max-n", "16", "--max-k", "16", "--align", "1", "--pool", "6", "--fresh", "0.05", "--report-s", "0.001",
            "--repeat-every", "0", "--csv", str(csv), "--no-progress"]
    assert soak.main(argv) == 1
    out, err = capsys.readouterr()
    assert "soak: [1/40] calls" in err and "workspaces made" in err
    assert "2/40 calls (stopped by an error)" in out and "boom from a broken variant" in out
    df = pd.read_csv(csv).fillna({"note": ""})
    run = df[df["op"].isna()].set_index("metric")
    assert run.loc["complete", "value"] == 1 and run.loc["calls", "value"] == 2
    assert run.loc["failed", "value"] == 1 and "boom from a broken variant" in run.loc["failed", "note"]
    assert run.loc["stopped_by_budget", "note"] == "error"
    from benchmarks import summary

    text = "\n".join(summary.soak_summary(csv))
    assert "2/40 calls (error)" in text and "failed 1" in text and "boom from a broken variant" in text

    def failed_launch(*args, **kwargs):
        raise launch.LaunchError("1 rank(s) failed\n--- rank 1 ---\nRuntimeError: a rank went away")

    monkeypatch.setattr(soak.common, "launch", failed_launch)
    assert soak.main(argv) == 1
    assert "soak: stopped after" in capsys.readouterr().out
    df = pd.read_csv(csv).fillna({"note": ""})
    last = df.iloc[-1]
    assert last["metric"] == "complete" and last["value"] == 0 and "a rank went away" in last["note"]


def test_soak_shape_draw_is_seeded_pooled_and_aligned():
    from benchmarks import soak

    ops = ["gemm_all_scatter", "gemm_reduce_scatter"]
    variants = {op: ["bulk_sync", "plain"] for op in ops}

    def sequence(pool, fresh, seed=3, align=64, lo=64):
        draw = soak.ShapeDraw(seed, ops, variants, 2, (lo, 300, 200, 100), pool, fresh, align)
        return draw, [draw(ops[i % 2]) for i in range(400)]

    draw, calls = sequence(4, 0.0)
    assert calls == sequence(4, 0.0)[1] and calls != sequence(4, 0.0, seed=4)[1]
    for shapes in draw.pools.values():
        assert len(shapes) == 4 and all(d % 64 == 0 and d >= 64 for shape in shapes for d in shape)
    gas = {c[1:] for c in calls[0::2]}
    assert len(gas) <= 4  # only pool shapes
    grs = calls[1::2]
    assert all(a[0] % 2 == 0 and a[1] == b[0] for _, a, b in grs)  # a [W*m, K_loc], b [K_loc, N]
    _, aligned = sequence(4, 0.5)  # half the calls fresh, still on the grid
    assert len({c[1:] for c in aligned}) > 12 and all(d % 64 == 0 for c in aligned for d in c[1] + c[2])
    _, fresh = sequence(0, 0.0, align=1, lo=1)
    assert len({c[1:] for c in fresh}) > 300 and any(c[1][0] % 16 for c in fresh)  # ragged, nearly all new
    assert {c[0] for c in calls} == {"bulk_sync", "plain"}


def test_soak_budget_rule_uses_the_slowest_rank(monkeypatch):
    """Every rank applies the rule to the gathered elapsed times: the slowest rank's clock decides,
    and the next check comes after about half the calls the remaining time allows at the slower of
    the run's pace and the last interval's (at most 50)."""
    from benchmarks import soak
    from tilefuse.runtime import hostsync

    peers = {"elapsed": 0.0}
    monkeypatch.setattr(hostsync, "all_gather_object",
                        lambda obj, group=None, *, what, timeout=None: [obj, peers["elapsed"]])
    ctx = launch.RankCtx(rank=0, world=2, device=torch.device("cpu"), heap=type("H", (), {"group": None})(),
                         pg_backend="gloo", host_group=None)
    budget = soak.Budget(ctx, 10.0, timeout_s=5.0)
    assert budget.due(1) and not budget.due(0)
    peers["elapsed"] = 2.0  # the peer is slower: 2 s for 10 calls, 8 s left -> 40 calls left, check in 20
    assert budget.check(10, 1.0) is False and budget.next_check == 30
    peers["elapsed"] = 0.1
    assert budget.check(30, 9.0) is False and budget.next_check == 31  # 1 s left at 0.3 s a call -> 1 call
    peers["elapsed"] = 10.5
    assert budget.check(31, 9.5) is True  # the peer is past the budget: both stop
    assert soak.Budget(ctx, None, 5.0).due(10**6) is False
    slowing = soak.Budget(ctx, 100.0, timeout_s=5.0)
    peers["elapsed"] = 0.0
    assert slowing.check(10, 1.0) is False and slowing.next_check == 60  # 0.1 s a call: at most 50 calls on
    assert slowing.check(60, 81.0) is False  # 1.6 s a call since then (1.35 over the run): 19 s left
    assert slowing.next_check == 65


# ----------------------------------------------------------------------------- breakdown
BREAKDOWN_PARTS = {"matmul", "nccl", "plain", "core", "gemm_stage_local", "gemm_push", "stage_local", "push", "push@1",
                   "reduce", "reduce_pull", "empty_call", "whole", "gemm_tax", "stage_tax", "push_exposed"}


def job_breakdown(ctx, argv):
    """benchmarks.breakdown's rank function in a pool (no spawn per test): its CSV rows."""
    import torch.distributed as dist

    from benchmarks import breakdown
    from benchmarks.launch import RankCtx

    args = breakdown.parse_options(argv, on_gpu=ctx.on_gpu)
    bctx = RankCtx(ctx.rank, ctx.world, ctx.device, ctx.heap, dist.get_backend(), dist.group.WORLD)
    return breakdown.run_rank(bctx, args)["rows"]


def test_breakdown_smoke_times_every_part_and_checks_the_whole_calls(pools, tmp_path, on_gpu):
    """--smoke at world 2 on gemm_reduce_scatter: every part timed, the whole calls (two variants)
    checked against the reference, derived rows, roofline rows, the CSV as returned.
    On a GPU the derived rows are of device times, and each whole variant adds its host_exposed row."""
    from benchmarks import breakdown

    csv = tmp_path / "breakdown.csv"
    argv = ["--smoke", "--ops", "gemm_reduce_scatter", "--variants", "fused_sequential,bulk_sync",
            "--push-programs", "1", "--min-reps", "1", "--max-reps", "2", "--csv", str(csv)]
    rows = pools.run(2, job_breakdown, argv)[0]
    df = pd.DataFrame(rows)
    assert (df["metric"] != "error").all(), df[df["metric"] == "error"]["note"].tolist()
    assert set(df["component"]) == BREAKDOWN_PARTS | ({"host_exposed"} if on_gpu else set())
    whole = df[df["component"] == "whole"]
    assert set(whole["variant"]) == {"fused_sequential", "bulk_sync"}
    ok = df[df["metric"] == "ok"]
    assert set(ok["variant"]) == {"plain", "fused_sequential", "bulk_sync"} and (ok["value"] == 1.0).all()
    timed = df[(df["metric"] == "ms") & (df["variant"] != breakdown.DERIVED)]
    assert set(timed["component"]) == BREAKDOWN_PARTS - {"gemm_tax", "stage_tax", "push_exposed"}
    assert (timed["value"] > 0).all() and timed["value"].map(math.isfinite).all()
    ms = {(r.component, r.variant): r.value for r in timed.itertuples()}
    kind = "device_ms" if on_gpu else "ms"  # what the derived rows subtract
    src = {(r.component, r.variant): r.value for r in df[df["metric"] == kind].itertuples()}
    derived = df[df["variant"] == breakdown.DERIVED]
    assert set(derived["metric"]) == {kind}
    derived = derived.set_index("component")["value"]
    assert derived["push_exposed"] == pytest.approx(src[("gemm_push", "fused_sequential")]
                                                    - src[("gemm_stage_local", "fused_sequential")])
    exposed = df[df["component"] == "host_exposed"]
    if on_gpu:
        assert set(exposed["variant"]) == {"fused_sequential", "bulk_sync"}, exposed
        for r in exposed.itertuples():
            assert r.metric == "device_ms" and r.value == pytest.approx(ms[("whole", r.variant)]
                                                                        - src[("whole", r.variant)])
    else:
        assert exposed.empty, exposed
    model = df[df["metric"] == "model_ms"].set_index("component")
    assert {"core", "push", "push@1", "reduce", "nccl"} <= set(model.index) and (model["value"] > 0).all()
    on_disk = pd.read_csv(csv, dtype={"note": str})
    assert list(on_disk.columns) == breakdown.CSV_COLUMNS and len(on_disk) == len(df)
    text = breakdown.compact(csv)
    assert "push_exp" in text and "bulk_sync" in text and "smoke" in text


def test_breakdown_options_reject_bad_input(capsys):
    from benchmarks import __main__ as entry
    from benchmarks import breakdown

    assert entry.resolve("breakdown").module == "breakdown"
    for argv in (["--ops", "gemm_all_scatter"], ["--variants", "bulk_sync,nope"], ["--shapes", "8x0x4"],
                 ["--shapes", "70b-o,12x4"], ["--push-programs", "0"], ["--reps", "0"]):
        with pytest.raises(SystemExit):
            breakdown.parse_options(argv, on_gpu=False)
    args = breakdown.parse_options(["--shapes", "70b-o,x=64x32x16"], on_gpu=False)
    assert args.shapes == {"70b-o": (8192, 8192, 4096), "x": (64, 32, 16)} and args.dtype == torch.float16
    roof = breakdown.Roof(tflops=1.0, hbm_gbs=1.0, link_gbs=1.0)
    # grs at W = 2 sends half of the [M, N] partial; gar's one-shot sends all of it.
    grs = breakdown.models("gemm_reduce_scatter", 4, 8, 2, 2, 2, roof)
    gar = breakdown.models("gemm_all_reduce", 4, 8, 2, 2, 2, roof)
    assert grs["push"][0] == pytest.approx(4 * 8 * 2 / 2 / 1e9 * 1e3)
    assert gar["push"][0] == pytest.approx(4 * 8 * 2 / 1e9 * 1e3)
    assert grs["core"][0] == pytest.approx(2 * 4 * 8 * 2 / 1e12 * 1e3)


# ----------------------------------------------------------------------------- bandwidth
def job_bandwidth(ctx, sizes, csv):
    """benchmarks.bandwidth's rank function in a pool, and its check given a copy that writes nothing."""
    import torch.distributed as dist

    from benchmarks import bandwidth

    rctx = launch.RankCtx(rank=ctx.rank, world=ctx.world, device=ctx.device, heap=ctx.heap,
                          pg_backend=dist.get_backend(), host_group=dist.group.WORLD)
    out = bandwidth.run_rank(rctx, sizes, 1.0, 1.0, 1, csv, False, max_reps=5)
    dst = ctx.heap.empty(1024, dtype=torch.int32)
    try:
        unwritten = bandwidth._check_and_time(
            rctx, lambda: None, dst, lambda: torch.arange(1024, dtype=torch.int32, device=ctx.device),
            {"warmup_ms": 1.0, "rep_ms": 1.0, "cpu_reps": 1, "max_reps": 5})
    finally:
        del dst
    return out["rows"], unwritten, rctx.pg_backend


def test_bandwidth_all_peers_and_the_all_gather_are_checked_and_summarized(pools, tmp_path):
    """World 2: one-peer rows at d = 0 and 1, the all-peer methods and the process group's all-gather
    (gloo on the CPU: marked), every copy's data checked; bus bandwidth by NCCL's convention; the
    summary's all-peer table and per-size ratio lines; a copy that writes nothing fails its check."""
    from benchmarks import bandwidth, summary

    size = 16 << 10
    csv = tmp_path / "bandwidth.csv"
    (rows, unwritten, pg), (rows1, unwritten1, _) = pools.run(2, job_bandwidth, [size], str(csv), timeout=120)
    coll = f"{pg}_all_gather"
    bad = [(r["variant"], r["N"], r["note"]) for r in rows if r["metric"] == "ok" and r["value"] != 1.0]
    assert not bad, bad
    got = {(r["variant"], r["N"], r["metric"]): r for r in rows}
    for d in (0, 1):
        for method in ("store", "load", "put", "get", "torch") + (("triton",) if d == 0 else ()):
            assert got[(method, d, "GB/s")]["value"] > 0, (method, d)
    for method in bandwidth.ALL_PEERS + (coll,):
        ms = got[(method, -1, "ms")]["value"]
        busbw = got[(method, -1, "busbw_GB/s")]["value"]
        assert ms > 0 and busbw == pytest.approx((2 - 1) * size / (ms * 1e-3) / 1e9), method
        assert got[(method, -1, "ok")]["value"] == 1.0
    if pg != "nccl":
        assert "not NCCL" in got[(coll, -1, "ms")]["note"]
    assert [(r["variant"], r["metric"]) for r in rows1] == [(r["variant"], r["metric"]) for r in rows]
    for ok, _ms, note in (unwritten, unwritten1):
        assert ok is False and "1024 of 1024 words differ" in note
    lines = bandwidth.all_peers_lines(rows)
    assert len(lines) == 1 and lines[0].startswith("bandwidth all peers 16K: put_all") and coll in lines[0]
    text = "\n".join(summary.bandwidth_summary(csv))
    assert "all peers: bus bandwidth" in text and f"put_all/{coll}" in text and "store_all" in text
    assert "bandwidth all peers 16K" in text


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
    for name in ("CollectiveCall enter + exit", "torch.empty(M, N)",
                 "registry gemm_all_reduce.wg_specialized(a, b)"):
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


def test_peer_block_copy_checks_its_kernel_and_writes_both_methods(tmp_path):
    """benchmarks.peer_block_copy: the kernel's copy is checked against the source before timing, and
    both methods land in the CSV."""
    from benchmarks import peer_block_copy

    csv = tmp_path / "copy.csv"
    assert peer_block_copy.main(["--world-sizes", "3", "--M", "5", "--N", "40", "--dtype", "fp32",
                                 "--csv", str(csv)]) == 0
    frame = pd.read_csv(csv)
    assert set(frame["method"]) == {"kernel", "torch"} and set(frame["metric"]) == {"us", "GB/s"}
    assert (frame["value"] > 0).all()


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


def test_suite_markdown_shows_the_variants_other_forms(tmp_path):
    """summary --markdown: a variant's other form (copy_engine, <variant>.ws, ...) gets a column after
    the four variants and can be the bold best; the baselines (plain, gemm, comm, ideal) are no method
    columns."""
    from benchmarks import summary

    base = dict(op="gemm_reduce_scatter", shape="8b-o", M=64, N=32, K=16, dtype="bfloat16", world=1,
                device="cpu", commit="abc1234", note="")
    rows = [dict(base, variant=v, metric="ms", value=1.0) for v in ("gemm", "comm", "plain")]
    rows += [dict(base, variant=v, metric="speedup_vs_plain", value=x)
             for v, x in (("plain", 1.0), ("bulk_sync", 0.84), ("fused_sequential", 0.83), ("copy_engine", 0.93),
                          ("bulk_sync.ws", 0.82), ("plain_again", 1.0), ("ideal", 1.11))]
    rows.append(dict(base, variant="ideal", metric="ideal_speedup", value=1.11))
    csv = tmp_path / "suite.csv"
    pd.DataFrame(rows).to_csv(csv, index=False)
    text = "\n".join(summary.suite_markdown(csv))
    head = next(line for line in text.splitlines() if line.startswith("| shape"))
    assert [c.strip() for c in head.strip("|").split("|")][5:] == [
        "bulk_sync", "fused_sequential", "copy_engine", "bulk_sync.ws", "plain_again", "ideal"]
    assert "| **0.93** |" in text and "| 0.84 |" in text
