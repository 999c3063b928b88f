"""Config tables: schema, lookup (exact, M bucket), plain fallback, user override, tuner."""

import dataclasses
import json

import pytest
import torch
from ophelpers import needs_working_interpreter

import tilefuse
from tilefuse.ops import dispatch, registry
from tilefuse.ops.common.config import Config
from tilefuse.runtime import hw
from tilefuse.tuning import tables

CFG = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 4, "num_stages": 1,
       "GEMM_SMS": 2, "COMM_SMS": 2}


def _table(entries, op="gemm_all_scatter", arch="cpu", world=1):
    return {"schema": 1, "op": op, "arch": arch, "world_size": world,
            "provenance": {"device": "test"}, "entries": entries}


def _entry(M, N, K, variant="wg_specialized", dtype="float16", config=CFG):
    return {"M": M, "N": N, "K": K, "dtype": dtype, "variant": variant,
            "config": None if variant == "plain" else config, "time_ms": 1.0, "plain_ms": 2.0}


def _write(directory, data, op="gemm_all_scatter", arch="cpu", world=1):
    path = tables.table_path(directory, op, arch, world)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFUSE_CONFIG_DIR", str(tmp_path))
    return tmp_path


def test_exact_bucket_and_none(user_dir):
    _write(user_dir, _table([_entry(64, 64, 64), _entry(1024, 1024, 1024, variant="bulk_sync"),
                             _entry(800, 1024, 1024, variant="fused_sequential")]))
    exact = tables.lookup("gemm_all_scatter", "cpu", 1, 64, 64, 64, "float16")
    assert exact.variant == "wg_specialized" and exact.config.BLOCK_M == 32 and exact.source.startswith("exact")
    near = tables.lookup("gemm_all_scatter", "cpu", 1, 1000, 1024, 1024, "float16")  # bucket 769-1024
    assert near.variant == "bulk_sync" and near.source.startswith("bucket"), near
    assert tables.lookup("gemm_all_scatter", "cpu", 1, 700, 1024, 1024, "float16") is None, "another M bucket"
    assert tables.lookup("gemm_all_scatter", "cpu", 1, 1024, 1100, 1024, "float16") is None, "another N"
    assert tables.lookup("gemm_all_scatter", "cpu", 1, 8, 8192, 64, "float16") is None, "too far"
    assert tables.lookup("gemm_all_scatter", "cpu", 1, 64, 64, 64, "float32") is None, "other dtype"
    assert tables.lookup("gemm_all_scatter", "cpu", 2, 64, 64, 64, "float16") is None, "other world"


def test_user_table_overrides_shipped(user_dir, tmp_path_factory, monkeypatch):
    shipped = tmp_path_factory.mktemp("shipped")
    monkeypatch.setattr(tables, "SHIPPED_DIR", shipped)
    _write(shipped, _table([_entry(64, 64, 64, variant="bulk_sync"), _entry(256, 256, 256)]))
    _write(user_dir, _table([_entry(64, 64, 64, variant="fused_sequential")]))
    assert tables.lookup("gemm_all_scatter", "cpu", 1, 64, 64, 64, "float16").variant == "fused_sequential"
    # A shape only the shipped table has exactly still comes from it (exact beats nearest).
    got = tables.lookup("gemm_all_scatter", "cpu", 1, 256, 256, 256, "float16")
    assert got.variant == "wg_specialized" and str(shipped) in got.source


def test_choices_are_remembered_until_cleared(user_dir):
    path = _write(user_dir, _table([_entry(64, 64, 64, variant="bulk_sync")]))
    assert tables.lookup("gemm_all_scatter", "cpu", 1, 64, 64, 64, "float16").variant == "bulk_sync"
    path.write_text(json.dumps(_table([_entry(64, 64, 64, variant="fused_sequential")])))
    assert tables.lookup("gemm_all_scatter", "cpu", 1, 64, 64, 64, "float16").variant == "bulk_sync", \
        "a call signature's choice is remembered (no file access per op call)"
    tables.clear_cache()
    assert tables.lookup("gemm_all_scatter", "cpu", 1, 64, 64, 64, "float16").variant == "fused_sequential"


@pytest.mark.parametrize("mutate,match", [
    (lambda t: t.pop("entries"), "missing key 'entries'"),
    (lambda t: t["entries"][0].update(variant="turbo"), r"entry 0 \(64x64x64 float16\).*variant 'turbo'"),
    (lambda t: t["entries"][0]["config"].update(BLOCK_M=48), r"entry 0 .*bad config.*BLOCK_M"),
    (lambda t: t["entries"][0].pop("plain_ms"), "entry 0: missing key 'plain_ms'"),
    (lambda t: t["entries"].append(dict(t["entries"][0])), "entry 1 .*duplicate shape"),
    (lambda t: t.update(schema=7), "schema: version 7"),
])
def test_malformed_tables_name_file_and_entry(user_dir, mutate, match):
    data = _table([_entry(64, 64, 64, config=dict(CFG))])
    mutate(data)
    path = _write(user_dir, data)
    with pytest.raises(tables.TableError, match=match) as info:
        tables.lookup("gemm_all_scatter", "cpu", 1, 64, 64, 64, "float16")
    assert str(path) in str(info.value)


def test_bad_json_is_an_error(user_dir):
    path = _write(user_dir, "{not json")
    with pytest.raises(tables.TableError, match="not valid JSON"):
        tables.lookup("gemm_all_scatter", "cpu", 1, 64, 64, 64, "float16")
    assert path.exists()


def job_auto_uses_table(ctx, table_dir, M, N, K):
    import os

    os.environ["TILEFUSE_CONFIG_DIR"] = table_dir
    try:
        a = torch.randn(M, K).to(torch.float16).to(ctx.device)
        b = torch.randn(K, N).to(torch.float16).to(ctx.device)
        choice = dispatch.choose("gemm_all_scatter", a, b)
        got = tilefuse.gemm_all_scatter(a, b)
        ref = tilefuse.gemm_all_scatter(a, b, variant="reference")
        torch.testing.assert_close(got.float(), ref.float(), rtol=1e-2, atol=5e-2)
        return choice.variant, choice.source, choice.config.to_dict() if choice.config else None
    finally:
        del os.environ["TILEFUSE_CONFIG_DIR"]


def test_auto_runs_plain_where_the_table_says_so(pools, tmp_path, on_gpu):
    arch = hw.arch_name(torch.device("cuda", 0)) if on_gpu else "cpu"  # the ranks' arch names the table
    _write(tmp_path, _table([_entry(48, 40, 32, variant="plain"), _entry(64, 64, 64)], arch=arch), arch=arch)
    [(variant, source, _)] = pools.run(1, job_auto_uses_table, str(tmp_path), 48, 40, 32)
    assert variant == "plain" and source.startswith("exact")
    [(variant, _, cfg)] = pools.run(1, job_auto_uses_table, str(tmp_path), 64, 64, 64)
    defaults = {f.name: f.default for f in dataclasses.fields(Config) if f.default is not dataclasses.MISSING}
    assert variant == "wg_specialized" and cfg == {**defaults, **CFG} and cfg["SPLIT_K"] == 1, \
        "a table without the fields that have defaults (SPLIT_K, WARP_SPEC): their defaults"
    [(variant, source, _)] = pools.run(1, job_auto_uses_table, str(tmp_path), 8, 512, 16)
    assert source.startswith("default") and variant == "plain", "nothing measured: the plain path"


def job_auto_named_form_from_table(ctx, table_dir):
    """all_gather_gemm under auto where the table names its copy_engine form: the form runs (its
    workspace is the one allocated), and its result matches the reference."""
    import os

    from tilefuse.ops.common import arena

    os.environ["TILEFUSE_CONFIG_DIR"] = table_dir
    try:
        g = torch.Generator().manual_seed(ctx.rank)
        a = torch.randn(40, 24, generator=g).to(torch.float16).to(ctx.device)
        b = (torch.randn(24, 48, generator=g) / 5).to(torch.float16).to(ctx.device)
        tilefuse.clear_workspaces()
        choice = dispatch.choose("all_gather_gemm", a, b)
        for _ in range(2):
            got = tilefuse.all_gather_gemm(a, b)
        ref = tilefuse.all_gather_gemm(a, b, variant="reference")
        torch.testing.assert_close(got.float(), ref.float(), rtol=1e-2, atol=5e-2)
        used = sorted({k[1] for k in arena.workspace_keys() if k[0] == "all_gather_gemm"})
        return choice.variant, used
    finally:
        del os.environ["TILEFUSE_CONFIG_DIR"]


def test_a_table_entry_chooses_a_named_form_for_auto(pools, tmp_path, on_gpu):
    arch = hw.arch_name(torch.device("cuda", 0)) if on_gpu else "cpu"
    cfg = dict(CFG, GEMM_SMS=4, COMM_SMS=0)
    _write(tmp_path, _table([_entry(40, 48, 24, variant="copy_engine", config=cfg)], op="all_gather_gemm",
                            arch=arch, world=2), op="all_gather_gemm", arch=arch, world=2)
    for variant, used in pools.run(2, job_auto_named_form_from_table, str(tmp_path)):
        assert variant == "copy_engine" and used == ["copy_engine"], (variant, used)


def job_tune_then_auto(ctx, out_dir):
    from pathlib import Path

    from tilefuse.tuning import tuner as tune

    entry = tune.tune_shape("gemm_all_scatter", 48, 40, 32, torch.float16, quick=True, reps=2, keep=2)
    path = tune.write_table(Path(out_dir), "gemm_all_scatter", [entry], reps=2, commit="c0ffee1")
    data = json.loads(path.read_text())
    tables.validate_table(data, path)
    variant, source, cfg = job_auto_uses_table(ctx, out_dir, 48, 40, 32)
    own = json.loads(tune.write_table(Path(out_dir) / "own", "gemm_all_scatter", [entry], reps=2).read_text())
    return (entry["variant"], entry.get("config"), variant, source, cfg, len(entry["candidates"]),
            data["provenance"]["commit"], own["provenance"]["commit"])


def test_tiny_tune_end_to_end(pools, tmp_path):
    [(tuned, tuned_cfg, auto, source, cfg, n, commit, own)] = pools.run(1, job_tune_then_auto, str(tmp_path))
    assert n >= 4, "every variant was tried"
    assert source.startswith("exact") and auto == tuned and cfg == tuned_cfg
    assert commit == "c0ffee1", "the table names the commit it was given"
    assert own == "unknown" or len(own) >= 7, own  # git rev-parse of the checkout, where there is one


def test_shipped_tables_follow_the_schema():
    paths = sorted(tables.SHIPPED_DIR.glob("*/*.json"))
    assert paths, "the package ships tables"
    for path in paths:
        data = json.loads(path.read_text())
        tables.validate_table(data, path)
        assert path.parent.name == data["op"] and path.name == f"{data['arch']}_ws{data['world_size']}.json"


def test_arch_name_of_known_devices(monkeypatch):
    from tilefuse.runtime import hw

    class Props:
        name = "NVIDIA H200"

    monkeypatch.setattr(hw, "_cuda_props", lambda index: Props())
    hw._arch_of.cache_clear()  # the name is remembered per device index
    assert hw.arch_name(torch.device("cuda", 0)) == "nvidia-h200"
    Props.name = "NVIDIA H100 80GB HBM3"
    hw._arch_of.cache_clear()
    assert hw.arch_name(torch.device("cuda", 0)) == "nvidia-h100"
    hw._arch_of.cache_clear()


def job_tune_two_shapes_in_a_tight_heap(ctx):
    import gc

    from tilefuse.tuning import tuner as tune

    heap = ctx.heap
    shapes = ((64, 96), (64, 112))
    every_config = tune.candidate_configs

    def tune_one(M, N):
        tune.candidate_configs = lambda *a, **k: every_config(*a, **k)[:1]  # one config per variant
        try:
            return tune.tune_shape("gemm_all_scatter", M, N, 16, torch.float16, quick=True, reps=2, keep=1)
        finally:
            tune.candidate_configs = every_config


    need = []
    for M, N in shapes:
        tilefuse.clear_workspaces()
        gc.collect()
        before = heap.bytes_used
        tune_one(M, N)
        need.append(heap.bytes_used - before)
    tilefuse.clear_workspaces()
    gc.collect()
    # Fill the heap so that one shape's workspaces fit but not both: the tuner must give each back.
    room = max(need) + 4096
    fillers = []
    while heap.bytes_free > room:
        largest = max(length for _, length in heap._allocator._free)
        fillers.append(heap.empty(min(largest, heap.bytes_free - room), dtype=torch.uint8))
    try:
        entries = [tune_one(M, N) for M, N in shapes]
    finally:
        fillers.clear()
        gc.collect()
    return need, [[c.get("error", "") for c in e["candidates"]] for e in entries]


@pytest.mark.slow
def test_tuner_gives_workspaces_back_between_shapes(pools):
    [(need, errors)] = pools.run(1, job_tune_two_shapes_in_a_tight_heap)
    assert all(n > 0 for n in need), f"the shapes keep no workspace ({need}): the test would prove nothing"
    assert all(not e for shape in errors for e in shape), errors


def _clock(first: dict, final: dict, first_samples: int):
    """A replacement for autotune's clock: ``first[kind][name]`` for a candidate's first
    ``first_samples`` samples of a kind (the tuner's first pass), ``final[kind][name]`` after them
    (the decision and its confirmation); 3 ms for a name neither gives."""
    counts: dict = {}

    def clock(name, kind):
        n = counts[(name, kind)] = counts.get((name, kind), 0) + 1
        return (first if n <= first_samples else final)[kind].get(name, 3.0)
    return clock, counts


def job_decide_with_timer(ctx, first, finals, reps=2):
    """tune_shape (one config per variant) with autotune's clock replaced: ``first`` in the first pass,
    ``finals[rank]`` after it."""
    from tilefuse.tuning import autotune
    from tilefuse.tuning import tuner as tune

    every_config, queue_ms = tune.candidate_configs, autotune._queue_ms
    tune.candidate_configs = lambda *a, **k: every_config(*a, **k)[:1]
    # The clock gives calls alone and back to back; on a GPU short calls would also ask it for device
    # times (a CUDA-graph pick, not what this checks): off, as on the CPU.
    autotune._queue_ms = lambda *a, **k: None
    clock, counts = _clock(first, finals[ctx.rank], reps)
    autotune.set_timer(clock)
    try:
        e = tune.tune_shape("gemm_all_scatter", 48, 40, 32, torch.float16, quick=True, reps=reps, keep=2, decide_s=0.0)
    finally:
        tune.candidate_configs, autotune._queue_ms = every_config, queue_ms
        autotune.set_timer(None)
    return e, sorted(counts.items())


BOTH = {"call": {"plain": 1.0, "fused_sequential": 0.8, "bulk_sync": 1.2},
        "block": {"plain": 1.0, "fused_sequential": 0.8, "bulk_sync": 0.9}}


def _final(call: float, block: float) -> dict:
    return {"call": {"plain": 1.0, "fused_sequential": call}, "block": {"plain": 1.0, "fused_sequential": block}}


@pytest.mark.parametrize("case,finals,pick", [
    pytest.param("back to back only", [_final(1.05, 0.7)] * 2, "plain", marks=pytest.mark.slow),
    pytest.param("alone only", [_final(0.7, 1.05)] * 2, "plain", marks=pytest.mark.slow),
    pytest.param("inside the 2 % margin", [_final(0.985, 0.985)] * 2, "plain", marks=pytest.mark.slow),
    pytest.param("alone only on rank 1", [_final(0.8, 0.8), _final(1.1, 0.8)], "plain", marks=pytest.mark.slow),
    ("both ways, twice", [_final(0.8, 0.8)] * 2, "fused_sequential"),
])
def test_the_tuners_decision_is_first_call_tunings_rule(pools, case, finals, pick):
    """The first pass shortlists fused_sequential (faster both ways there); the table's pick must then
    win again alone and back to back, on every rank, by the margin, and in a confirmation round."""
    res = pools.run(2, job_decide_with_timer, BOTH, finals)
    assert len({json.dumps(e, sort_keys=True) for e, _ in res}) == 1, f"{case}: the ranks' entries differ"
    e, counts = res[0]
    assert e["variant"] == pick, (case, e["decision"])
    d = e["decision"]
    assert d["finalists"] == ["fused_sequential"], "bulk_sync lost alone in the first pass: not shortlisted"
    assert [r["round"] for r in d["rounds"]] == (["decision", "confirmation"] if pick != "plain" else ["decision"])
    assert d["pick"] == pick and d["margin"] == 0.02
    worst = {k: max(f[k]["fused_sequential"] for f in finals) for k in ("call", "block")}
    assert d["rounds"][0]["call_ms"] == {"plain": 1.0, "fused_sequential": worst["call"]}, "max over ranks"
    assert d["rounds"][0]["block_ms"] == {"plain": 1.0, "fused_sequential": worst["block"]}
    assert (e["plain_ms"], e["plain_block_ms"]) == (1.0, 1.0)
    assert (e["time_ms"], e["block_ms"]) == ((1.0, 1.0) if pick == "plain" else (0.8, 0.8))
    [fs] = [c for c in e["candidates"] if c["name"] == "fused_sequential"]
    assert fs["final"] and (fs["first_ms"], fs["time_ms"]) == (0.8, worst["call"])
    samples = dict(counts)
    assert samples[("bulk_sync", "call")] == 2, "a candidate left off the shortlist is not timed again"
    assert samples[("fused_sequential", "call")] == 2 + 3 * len(d["rounds"])


def test_no_shortlist_no_decision_round(pools):
    slow = {"call": {"plain": 1.0}, "block": {"plain": 1.0}}  # every variant 3 ms
    [(e, counts), _] = pools.run(2, job_decide_with_timer, slow, [slow] * 2)
    assert e["variant"] == "plain" and e["decision"]["finalists"] == [] and e["decision"]["rounds"] == []
    assert "no candidate" in e["decision"]["note"] and e["time_ms"] == e["plain_ms"] == 1.0
    assert all(n == 2 for n in dict(counts).values()), "the first pass only"


def test_budget_estimates_from_the_shapes_done(monkeypatch):
    from tilefuse.tuning import autotune, tuner

    now = [100.0]
    monkeypatch.setattr(tuner, "clock", lambda: now[0])
    monkeypatch.setattr(autotune, "all_gather", lambda obj, group, what: [obj])  # one rank
    b = tuner.Budget(30.0, None)
    assert b.fits() and b.estimate is None, "the first shape always runs"
    now[0] += 12.0  # shape 1: 12 s, 8 of them compiling
    assert b.fits(8.0) and b.estimate == 4.0  # 12 s spent + 4 s expected <= 30
    now[0] += 5.0
    assert b.fits(1.0) and b.estimate == 4.0  # 17 + 4
    now[0] += 9.0
    assert b.fits(0.0) and b.elapsed == 26.0 and b.estimate == 4.0  # costs 4, 4, 9: 26 + 4 <= 30
    now[0] += 4.0
    assert not b.fits(0.0) and b.elapsed == 30.0, "30 s spent + 4 s expected > 30"
    assert tuner.Budget(None, None).fits() and tuner.Budget(None, None, start=0.0).fits()
    with pytest.raises(ValueError, match="> 0 seconds"):
        tuner.Budget(0.0, None)


def job_tune_cli(ctx, argv, first_configs=1, timer=None, skew_s=0.0):
    """``python -m tilefuse.tune ARGV`` on this rank (tuner.run), with each variant's search cut to its
    first ``first_configs`` configs, autotune's clock replaced by
    ``timer(name, kind)`` and, on rank 1, the budget's clock running ``skew_s`` seconds ahead per reading.
    Returns the tuned shapes, those left out, the file written (rank 0) and what rank 0 printed."""
    import contextlib
    import io

    from tilefuse.tuning import autotune
    from tilefuse.tuning import tuner as tune

    every_config, real_clock, reads = tune.candidate_configs, tune.clock, [0]

    def cut(*a, **k):
        configs = every_config(*a, **k)
        return configs[:first_configs]

    def clock():
        reads[0] += 1
        return real_clock() + (skew_s * reads[0] if ctx.rank == 1 else 0.0)

    tune.candidate_configs, tune.clock = cut, clock
    autotune.set_timer(timer)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            entries, left_out, path = tune.run(argv)
    finally:
        tune.candidate_configs, tune.clock = every_config, real_clock
        autotune.set_timer(None)
    return ([(e["M"], e["N"], e["K"]) for e in entries], [s["name"] for s in left_out],
            None if path is None else str(path), printed.getvalue())


def _plain_wins(name, _kind):
    return 1.0 if name == "plain" else 3.0


def test_a_budget_stop_writes_the_shapes_done_and_the_ranks_agree(pools, tmp_path):
    """Rank 1's clock runs a minute ahead per reading: rank 0 alone would go on, rank 1 alone stops
    after the first shape (it expects another minute past the 100 s). The ranks take the maximum,
    stop together, and the table holds the first shape only."""
    argv = ["--op", "gemm_all_scatter", "--shapes", "", "--shape", "48x40x32", "--shape", "32x40x32",
            "--shape", "64x40x32", "--dtype", "float16", "--reps", "1", "--out", str(tmp_path), "--budget-s", "100"]
    res = pools.run(2, job_tune_cli, argv, 1, _plain_wins, 60.0)
    for tuned, left_out, _, _ in res:
        assert tuned == [(48, 40, 32)] and left_out == ["32x40x32", "64x40x32"], res
    path, printed = res[0][2], res[0][3]
    assert res[1][2] is None and "left out: 32x40x32 (32x40x32), 64x40x32 (64x40x32)" in printed, printed
    data = json.loads(open(path).read())
    assert [(e["M"], e["N"], e["K"]) for e in data["entries"]] == [(48, 40, 32)]
    assert "32x40x32" in data["provenance"]["left_out"]
    tables.validate_table(data, path)


def job_tune_all_reduce_then_auto(ctx, argv, out_dir):
    import os

    tuned, left_out, path, _ = job_tune_cli(ctx, argv, 1, lambda name, _kind: {"plain": 1.0, "wg_specialized": 0.6}
                                            .get(name, 3.0))
    table = tables.table_path(out_dir, "gemm_all_reduce", hw.arch_name(ctx.device), ctx.world)
    [entry] = tables.validate_table(json.loads(table.read_text()), table)
    g = torch.Generator().manual_seed(ctx.rank)  # each rank its own K shard
    a = torch.randn(40, 24, generator=g).to(torch.float16).to(ctx.device)
    b = (torch.randn(24, 48, generator=g) / 5).to(torch.float16).to(ctx.device)
    os.environ["TILEFUSE_CONFIG_DIR"] = out_dir
    dispatch.clear()
    tables.clear_cache()
    try:
        got = tilefuse.gemm_all_reduce(a, b)
        ref = tilefuse.gemm_all_reduce(a, b, variant="reference")
        torch.testing.assert_close(got.float(), ref.float(), rtol=1e-2, atol=5e-2)
        choice = dispatch.choose("gemm_all_reduce", a, b)
    finally:
        del os.environ["TILEFUSE_CONFIG_DIR"]
        dispatch.clear()
        tables.clear_cache()
    return (tuned, left_out, path, str(table), entry,
            (choice.variant, choice.config is not None, choice.source))


@pytest.mark.slow  # a whole tuner run (test_tiny_tune_end_to_end keeps one in make test)
def test_tune_gemm_all_reduce_end_to_end_then_auto_reads_it(pools, tmp_path):
    """``tune --op gemm_all_reduce --out DIR`` at W = 2 on CPU ranks: each variant's default is a
    candidate; wg_specialized wins (faked times); the table says so, and auto reads the table and
    runs it."""
    argv = ["--op", "gemm_all_reduce", "--shapes", "", "--shape", "40x48x24", "--dtype", "float16", "--reps", "2",
            "--decide-s", "0", "--out", str(tmp_path)]
    res = pools.run(2, job_tune_all_reduce_then_auto, argv, str(tmp_path))
    for rank, (tuned, left_out, path, table, entry, auto) in enumerate(res):
        assert tuned == [(40, 48, 24)] and left_out == []
        assert path == (table if rank == 0 else None), "rank 0 writes the table"
        names = {c["name"] for c in entry["candidates"]}
        assert set(tilefuse.VARIANTS) <= names, names
        assert entry["variant"] == "wg_specialized" and entry["config"]["COMM_SMS"] >= 1, entry["decision"]
        assert [r["round"] for r in entry["decision"]["rounds"]] == ["decision", "confirmation"]
        variant, has_config, source = auto
        assert (variant, has_config) == ("wg_specialized", True) and source.startswith("exact"), auto


def test_merged_table_entries_keep_the_run_that_tuned_them(tmp_path):
    first = {"commit": "aaa1111", "date": "2026-11-01"}
    tables.write_table(tmp_path, "gemm_all_scatter", "cpu", 1, [_entry(64, 64, 64), _entry(32, 32, 32)], first)
    second = {"commit": "bbb2222", "date": "2026-11-29"}
    path = tables.write_table(tmp_path, "gemm_all_scatter", "cpu", 1, [_entry(64, 64, 64, variant="plain")], second)
    data = json.loads(path.read_text())
    stamps = {(e["M"], e["variant"]): e["tuned"]["commit"] for e in data["entries"]}
    assert stamps == {(32, "wg_specialized"): "aaa1111", (64, "plain"): "bbb2222"}
    assert data["provenance"]["commit"] == "bbb2222"
    tables.validate_table(data, path)


def test_settle_runs_the_agreed_count_for_about_the_time_asked(monkeypatch):
    from tilefuse.tuning import tuner

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)  # no GPU here: the loop only
    clock = [0.0]  # a fake clock: each call takes 2 ms whatever the machine's load
    monkeypatch.setattr(tuner.time, "perf_counter", lambda: clock[0])
    calls = []

    def fn():
        calls.append(1)
        clock[0] += 0.002

    cuda = torch.device("cuda", 0)
    n = tuner.settle(fn, device=cuda, seconds=0.05, agree=lambda k: k + 1)
    assert n == 26 and len(calls) == n + 1, (n, len(calls))  # 25 calls of 2 ms, one more agreed
    assert tuner.settle(fn, device=cuda, seconds=10.0, max_calls=7) == 7
    assert tuner.settle(fn, device=torch.device("cpu"), seconds=1.0) == 0


def job_auto_resolution_follows_the_tables(ctx, table_dir):
    import os
    from pathlib import Path

    a = torch.randn(48, 32).to(torch.float16).to(ctx.device)
    b = torch.randn(32, 40).to(torch.float16).to(ctx.device)
    arch = hw.arch_name(ctx.device)
    os.environ["TILEFUSE_CONFIG_DIR"] = table_dir
    try:
        _write(Path(table_dir), _table([_entry(48, 40, 32, variant="plain")], arch=arch), arch=arch)
        tables.clear_cache()
        first = dispatch.resolve("gemm_all_scatter", a, b, None, None)[0]
        _write(Path(table_dir), _table([_entry(48, 40, 32, variant="bulk_sync")], arch=arch), arch=arch)
        remembered = dispatch.resolve("gemm_all_scatter", a, b, None, None)[0]
        tables.clear_cache()
        fresh = dispatch.resolve("gemm_all_scatter", a, b, None, None)[0]
        got = tilefuse.gemm_all_scatter(a, b)  # auto now runs bulk_sync with the table's config
        ref = tilefuse.gemm_all_scatter(a, b, variant="reference")
        torch.testing.assert_close(got.float(), ref.float(), rtol=1e-2, atol=5e-2)
    finally:
        del os.environ["TILEFUSE_CONFIG_DIR"]
        tables.clear_cache()
    elsewhere = dispatch.resolve("gemm_all_scatter", a, b, None, None)[0]  # no user directory: the default
    return first, remembered, fresh, elsewhere


def test_auto_remembers_its_resolution_until_the_tables_change(pools, tmp_path):
    [(first, remembered, fresh, elsewhere)] = pools.run(1, job_auto_resolution_follows_the_tables, str(tmp_path))
    assert (first, remembered, fresh) == ("plain", "plain", "bulk_sync")
    assert elsewhere == "plain", "untuned: the plain default"


def _run_module(args, env_extra, cwd, timeout=600):
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(repo), TRITON_INTERPRET="1", TILEFUSE_BACKEND="cpu", **env_extra)
    env.pop("TILEFUSE_CONFIG_DIR", None)
    return subprocess.run([sys.executable, "-m", *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


@needs_working_interpreter
@pytest.mark.slow
def test_tuner_cli_writes_the_user_cache_by_default_and_tables_with_out(tmp_path):
    from tilefuse.tuning import cache
    from tilefuse.tuning.tables import m_bucket

    cache_dir = tmp_path / "cache"
    args = ["--op", "gemm_all_scatter", "--shapes", "", "--shape", "48x40x32", "--dtype", "float16", "--quick",
            "--reps", "2", "--keep", "1"]
    got = _run_module(["tilefuse.tune", *args], {"TILEFUSE_CACHE_DIR": str(cache_dir)}, tmp_path)
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-3000:]
    entries = cache.load(cache_dir / "autotune.json")
    [(key, entry)] = entries.items()
    assert key == cache.entry_key("cpu", 1, "gemm_all_scatter", "float16", 40, 32, m_bucket(48))
    assert entry["M"] == 48 and entry["variant"] in registry.variants("gemm_all_scatter")
    assert not any(tables.SHIPPED_DIR.glob("gemm_all_scatter/cpu_*.json")), "nothing written into the package"

    out = tmp_path / "tables"
    got = _run_module(["tilefuse.tuning", *args, "--out", str(out)], {"TILEFUSE_CACHE_DIR": str(tmp_path / "c2")},
                      tmp_path)
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-3000:]
    path = tables.table_path(out, "gemm_all_scatter", "cpu", 1)
    [e] = tables.validate_table(json.loads(path.read_text()), path)
    assert (e["M"], e["N"], e["K"]) == (48, 40, 32)
    assert not (tmp_path / "c2").exists(), "--out writes the table only"


def test_model_shape_sets_cover_every_op_and_world():
    from tilefuse.tuning import shapes

    sets = shapes.shape_sets()
    models = [k for k in sets if k.startswith("tp-")]
    assert sorted(models) == ["tp-llama3-70b", "tp-llama3-8b", "tp-mixtral-8x7b", "tp-qwen2.5-72b", "tp-qwen2.5-7b"]
    assert len(sets["models"]) == sum(len(sets[m]) for m in models)
    for op in shapes.OPS:
        for world in (2, 4, 8):
            got = shapes.local_shapes(op, "models", world)
            assert len(got) == 60, (op, world, len(got))
    # Llama-3 8B's down projection at TP-4, 2048 tokens per rank:
    assert {"name": "llama3-8b-down-t2048", "M": 8192, "N": 4096, "K": 3584} in \
        shapes.local_shapes("gemm_reduce_scatter", "tp-llama3-8b", 4)
    assert {"name": "llama3-8b-down-t2048", "M": 2048, "N": 4096, "K": 3584} in \
        shapes.local_shapes("gemm_all_reduce", "tp-llama3-8b", 4)
    assert {"name": "llama3-70b-qkv-t512", "M": 512, "N": 1280, "K": 8192} in \
        shapes.local_shapes("all_gather_gemm", "tp-llama3-70b", 8)


def test_heldout_shapes_are_seeded_and_never_tuned():
    from benchmarks.tune import heldout_shapes
    from tilefuse.tuning import shapes

    for op in shapes.OPS:
        for world in (1, 2, 8):
            a = heldout_shapes(op, world, 12)
            assert a == heldout_shapes(op, world, 12), "seeded"
            assert a != heldout_shapes(op, world, 12, seed=1)
            tuned = {(e["M"], e["N"], e["K"]) for name in shapes.shape_sets()
                     for e in shapes.local_shapes(op, [name], world)}
            assert len({(e["M"], e["N"], e["K"]) for e in a}) == 12
            assert not tuned & {(e["M"], e["N"], e["K"]) for e in a}
    with pytest.raises(ValueError, match="unknown op"):
        heldout_shapes("gemm_everything", 2)
