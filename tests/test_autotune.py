"""``variant="auto"`` beyond the tables: M buckets, the decision cache, first-call tuning, the plain default.

On CPU ranks the times mean nothing, so the tuning tests replace the clock (``autotune.set_timer``);
the candidates still run, are checked against the plain path, and the ranks still exchange their
views, times and decision as they do on GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from harness import TEST_DEVICE
from ophelpers import environment, needs_working_interpreter

import tilefuse
from tilefuse.ops import dispatch
from tilefuse.runtime import hw
from tilefuse.tuning import autotune, cache, costmodel, tables
from tilefuse.tuning.tables import m_bucket

REPO = Path(__file__).resolve().parents[1]
OP = "gemm_all_scatter"
SHAPE = (48, 40, 32)  # M, N_loc, K


# ---------------------------------------------------------------------------------------------
# Buckets
# ---------------------------------------------------------------------------------------------


def test_m_buckets():
    assert m_bucket(1) == m_bucket(16) == (1, 16)
    assert m_bucket(17) == (17, 32) and m_bucket(256) == (129, 256)
    assert m_bucket(257) == (257, 384) and m_bucket(384) == (257, 384) and m_bucket(385) == (385, 512)
    assert m_bucket(8192) == (6145, 8192) and m_bucket(8193) == (8193, 12288)
    for M in range(1, 70000):
        lo, hi = m_bucket(M)
        assert lo <= M <= hi
    assert len({m_bucket(M) for M in range(1, 65537)}) == 21
    assert len({m_bucket(M) for M in range(300, 16385)}) <= 13, "a server's token counts: about a dozen buckets"
    for bad in (0, -3, 2.0, True):
        with pytest.raises(ValueError, match="positive int"):
            m_bucket(bad)


# ---------------------------------------------------------------------------------------------
# The cache file
# ---------------------------------------------------------------------------------------------


def test_cache_round_trip_and_keys(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFUSE_CACHE_DIR", str(tmp_path))
    key = cache.entry_key("cpu", 2, OP, "float16", 40, 32, m_bucket(48))
    assert key.startswith("cpu|ws2|gemm_all_scatter|float16|N40|K32|M33-64|torch")
    assert "|triton" in key and "|tilefuse" in key
    assert cache.load().get(key) is None
    path = cache.put({key: {"variant": "bulk_sync", "config": None}})
    assert path == tmp_path / "autotune.json" and cache.load().get(key)["variant"] == "bulk_sync"
    cache.put({key + "x": {"variant": "plain", "config": None}})
    assert set(cache.load()) == {key, key + "x"}, "a write merges with what is on disk"
    with pytest.raises(ValueError, match="malformed"):
        cache.put({key: {"variant": "turbo"}})


def test_cache_refuses_the_package_directory(monkeypatch):
    monkeypatch.setenv("TILEFUSE_CACHE_DIR", str(Path(tilefuse.__file__).parent / "configs"))
    with pytest.raises(cache.CacheDirError, match="inside the tilefuse package"):
        cache.cache_dir()


def test_default_cache_dir_is_the_users(monkeypatch, tmp_path):
    monkeypatch.delenv("TILEFUSE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.cache_dir() == tmp_path / "tilefuse"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache.cache_dir() == Path.home() / ".cache" / "tilefuse"


def test_a_broken_cache_file_is_ignored_with_a_warning(tmp_path, caplog):
    path = tmp_path / "autotune.json"
    path.write_text("{half a file")
    with caplog.at_level("WARNING", logger="tilefuse"):
        assert cache.load(path) == {}
    assert "not valid JSON" in caplog.text
    key = "k"
    path.write_text(json.dumps({"schema": 1, "entries": {key: {"variant": "fused_sequential",
                                                                "config": {"BLOCK_M": 48}}}}))
    with caplog.at_level("WARNING", logger="tilefuse"):
        assert cache.load(path) == {}
    assert "malformed" in caplog.text
    cache.put({"k2": {"variant": "plain", "config": None}}, path)  # a writer replaces the broken file
    assert set(cache.load(path)) == {"k2"}


_WRITER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from tilefuse.tuning import cache
    path, tag, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    for i in range(n):
        cache.put({f"{tag}-{i}": {"variant": "plain", "config": None, "i": i}}, path)
        json.loads(path.read_text())  # every state a reader can see is a whole file
""")


@pytest.mark.slow  # two processes racing on the cache file for seconds (make test's 5-minute budget)
def test_two_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "autotune.json"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    n = 40
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), tag, str(n)], env=env, cwd=REPO,
                              stderr=subprocess.PIPE, text=True) for tag in ("a", "b")]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
    entries = json.loads(path.read_text())["entries"]
    assert set(entries) == {f"{t}-{i}" for t in "ab" for i in range(n)}
    assert not list(tmp_path.glob("*.tmp")), "no temporary file left behind"


# ---------------------------------------------------------------------------------------------
# The cost model
# ---------------------------------------------------------------------------------------------


def _sample(M, N, K, **speedups):
    cfg = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 4, "num_stages": 1,
           "GEMM_SMS": 2, "COMM_SMS": 2}
    return costmodel.Sample(M, N, K, 1.0, {v: (s, cfg) for v, s in speedups.items()})


def test_cost_model_needs_every_neighbour_to_agree():
    data = [_sample(4096, 4096, 4096, bulk_sync=1.3, wg_specialized=1.1),
            _sample(4096, 4096, 8192, bulk_sync=1.2, wg_specialized=1.4)]
    p = costmodel.predict_from(data, 4096, 4096, 5800)  # between the two, within the radius of both
    assert p.variant == "bulk_sync" and p.speedup == pytest.approx(1.2) and p.wins, p
    assert len(p.neighbours) == 2
    assert costmodel.predict_from(data, 512, 4096, 4096) is None, "nothing measured nearby"
    lonely = costmodel.predict_from([_sample(4096, 4096, 4096, bulk_sync=1.04)], 4096, 4096, 4096)
    assert lonely.variant == "bulk_sync" and not lonely.wins, "a 4 % win is below the model's 5 %"
    slow = costmodel.predict_from([_sample(4096, 4096, 4096, bulk_sync=0.8)], 4096, 4096, 4096)
    assert not slow.wins


def test_cost_model_leave_one_out_on_the_shipped_tables():
    """The shipped tables' held-out shapes: the model's picks never lose to plain."""
    for op in ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter"):
        for world in (1, 2):
            data = costmodel.samples(op, "nvidia-h200", world, "bfloat16")
            if not data:
                continue
            rows = costmodel.leave_one_out(data)
            assert len(rows) == len(data)
            assert all(r["auto_speedup"] >= 1.0 for r in rows), (op, world, rows)


def test_sample_prefers_second_pass_times():
    entry = {"M": 64, "N": 64, "K": 64, "plain_ms": 2.0, "variant": "plain", "time_ms": 2.0, "candidates": [
        {"variant": "bulk_sync", "config": {"x": 1}, "time_ms": 0.5},
        {"variant": "bulk_sync", "config": {"x": 2}, "time_ms": 1.6, "final": True},
        {"variant": "fused_sequential", "config": {"x": 3}, "time_ms": 1.0},
        {"variant": "wg_specialized", "config": {"x": 4}, "error": "HeapFullError"}]}
    s = costmodel.sample_of(entry)
    assert s.speedups == {"bulk_sync": (1.25, {"x": 2}), "fused_sequential": (2.0, {"x": 3})}
    assert costmodel.sample_of({"M": 1, "N": 1, "K": 1, "plain_ms": None}) is None


# ---------------------------------------------------------------------------------------------
# Rank jobs
# ---------------------------------------------------------------------------------------------


@contextmanager
def _env(budget_s: float | None = None, **values):
    """Set (or, with None, remove) environment variables for the block, and first-call tuning's
    budget (``autotune.BUDGET_S``) where given; start from no decisions."""
    budget = autotune.BUDGET_S
    with environment(**values):
        dispatch.clear()
        tables.clear_cache()
        if budget_s is not None:
            autotune.BUDGET_S = budget_s
        try:
            yield
        finally:
            autotune.BUDGET_S = budget
            dispatch.clear()
            tables.clear_cache()
            autotune.set_timer(None)


@contextmanager
def _counting_tunes():
    calls = []
    real = autotune.tune

    def counted(candidates, **kw):
        calls.append([c.name for c in candidates])
        return real(candidates, **kw)

    autotune.tune = counted
    try:
        yield calls
    finally:
        autotune.tune = real


def _operands(ctx, M, N, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g).to(torch.float16).to(ctx.device)  # the same on every rank
    gb = torch.Generator().manual_seed(seed + 1 + ctx.rank)
    b = (torch.randn(K, N, generator=gb) / K ** 0.5).to(torch.float16).to(ctx.device)
    return a, b


def _checked_auto(ctx, a, b):
    got = tilefuse.gemm_all_scatter(a, b)
    ref = tilefuse.gemm_all_scatter(a, b, variant="reference")
    torch.testing.assert_close(got.float(), ref.float(), rtol=1e-2, atol=5e-2)


def job_tune_with_fake_times(ctx, cache_dirs, per_rank_ms, rank1_decides=None, shape=SHAPE):
    """Tune one shape with every rank's clock replaced by ``per_rank_ms[rank]`` (candidate -> ms);
    optionally rank 1's own decision rule is replaced (rank 0's decision must still win)."""
    times = per_rank_ms[ctx.rank]
    real_decide = autotune.decide
    with _env(TILEFUSE_AUTOTUNE="1", budget_s=0.0, TILEFUSE_CACHE_DIR=cache_dirs[ctx.rank],
              TILEFUSE_CONFIG_DIR=None), _counting_tunes() as tunes:
        autotune.set_timer(lambda name, _kind: times.get(name.split("#")[0], 5.0))
        if rank1_decides is not None and ctx.rank == 1:
            autotune.decide = lambda t, **kw: rank1_decides
        try:
            a, b = _operands(ctx, *shape)
            choice = dispatch._decide(OP, a, b, None, None)[0]
            _checked_auto(ctx, a, b)
            again = dispatch._decide(OP, a, b, None, None)[0]
        finally:
            autotune.decide = real_decide
        return choice.variant, choice.source, again.source == choice.source, len(tunes), tunes[:1]


def test_first_call_tuning_takes_the_cross_rank_max_and_rank_0_decides(pools, tmp_path):
    dirs = [str(tmp_path / f"r{r}") for r in range(2)]
    per_rank = [{"plain": 1.0, "bulk_sync": 0.5, "fused_sequential": 0.9},  # rank 0 alone: bulk_sync
                {"plain": 1.0, "bulk_sync": 0.95, "fused_sequential": 0.8}]  # rank 1 alone: fused_sequential
    res = pools.run(2, job_tune_with_fake_times, dirs, per_rank, "plain")
    for variant, source, remembered, n_tunes, tunes in res:
        # max over ranks: bulk_sync 0.95, fused_sequential 0.9 (10 % under plain); rank 1's own rule said plain
        assert variant == "fused_sequential" and source.startswith("tuned"), res
        assert remembered and n_tunes == 1
        assert tunes[0][0] == "plain" and "bulk_sync" in tunes[0], "the candidates always include plain"
    assert res[0][4] == res[1][4], "the same candidates in the same order on every rank"
    for d in dirs:
        entries = json.loads((Path(d) / "autotune.json").read_text())["entries"]
        [(key, entry)] = entries.items()
        assert "|ws2|gemm_all_scatter|float16|N40|K32|M33-64|" in key and entry["variant"] == "fused_sequential"


def test_a_fused_variant_needs_a_margin_over_plain(pools, tmp_path):
    dirs = [str(tmp_path)] * 2
    per_rank = [{"plain": 1.0, "bulk_sync": 0.99, "fused_sequential": 0.995}] * 2
    res = pools.run(2, job_tune_with_fake_times, dirs, per_rank)
    assert all(r[0] == "plain" and r[1].startswith("tuned") for r in res), res


def _write_table(ctx, directory: Path, table: dict) -> Path:
    """``table`` saved for this rank's device (its arch): each rank writes its own copy, no race."""
    arch = hw.arch_name(ctx.device)
    path = tables.table_path(directory, OP, arch, ctx.world)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(table, arch=arch)))
    return path


def job_auto_without_tuning(ctx, cache_dir, config_dir, autotune_mode, shape=SHAPE, table=None):
    """Auto with ``TILEFUSE_AUTOTUNE=autotune_mode`` and the plain path's timed call (made by the
    default mode on a GPU only) faked at 0.01 ms, under the default threshold: the default mode
    measures but does not tune, on either device. ``table`` (optional): a config table written
    under ``config_dir/r<rank>`` for this rank's arch."""
    if table is not None:
        config_dir = str(Path(config_dir) / f"r{ctx.rank}")
        _write_table(ctx, Path(config_dir), table)
    with _env(TILEFUSE_AUTOTUNE=autotune_mode, TILEFUSE_CACHE_DIR=cache_dir,
              TILEFUSE_CONFIG_DIR=config_dir), _counting_tunes() as tunes:
        autotune.set_timer(lambda name, _kind: 0.01)
        a, b = _operands(ctx, *shape)
        _checked_auto(ctx, a, b)
        choice = dispatch.choose(OP, a, b)
        return choice.variant, choice.source, len(tunes)


@pytest.mark.parametrize("mode", ["0", None])
def test_plain_is_the_default_and_the_env_turns_tuning_off(pools, tmp_path, mode):
    """Nothing measured, tuning off (=0), or the default mode (the interpreter: no timing; a GPU: plain
    timed under the threshold): plain at W = 2."""
    res = pools.run(2, job_auto_without_tuning, str(tmp_path / "cache"), str(tmp_path / "tables"), mode)
    assert all(r == ("plain", "default (nothing measured)", 0) for r in res), res
    assert not (tmp_path / "cache" / "autotune.json").exists()


def test_the_cost_model_may_leave_plain_when_measurements_agree(pools, tmp_path):
    M, N, K = SHAPE
    cfg = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "num_warps": 4, "num_stages": 1,
           "GEMM_SMS": 2, "COMM_SMS": 0}
    near = [(M * 2, N, K), (M, N, K * 2)]  # not the call's (N, K, M bucket); within the model's radius
    entries = [{"M": m, "N": n, "K": k, "dtype": "float16", "variant": "fused_sequential", "config": cfg,
                "time_ms": 0.5, "plain_ms": 1.0, "candidates": [
                    {"variant": "fused_sequential", "config": cfg, "time_ms": 0.5, "final": True},
                    {"variant": "bulk_sync", "config": cfg, "time_ms": 2.0, "final": True}]} for m, n, k in near]
    table = {"schema": 1, "op": OP, "arch": None, "world_size": 2, "provenance": {"device": "test"},
             "entries": entries}  # the arch: each rank's own (cpu, or its GPU's)
    res = pools.run(2, job_auto_without_tuning, str(tmp_path / "cache"), str(tmp_path / "tables"), "0",
                    table=table)
    for variant, source, _ in res:
        assert variant == "fused_sequential" and source.startswith("model (predicted 2.00x"), res
    # One neighbour measured fused_sequential slower than plain: the model stays on plain.
    entries[1]["candidates"][0]["time_ms"] = 1.2
    res = pools.run(2, job_auto_without_tuning, str(tmp_path / "cache"), str(tmp_path / "tables2"), "0",
                    table=table)
    assert all(r[0] == "plain" for r in res), res


def job_cache_on_one_rank_only(ctx, cache_dirs, mode, seeded_rank, seeded_variant):
    """Rank ``seeded_rank`` alone has a cache entry (``seeded_variant``, under its device's arch)."""
    if ctx.rank == seeded_rank:
        _seed_cache(Path(cache_dirs[ctx.rank]), seeded_variant, hw.arch_name(ctx.device), ctx.world)
    with _env(TILEFUSE_AUTOTUNE=mode, budget_s=0.0, TILEFUSE_CACHE_DIR=cache_dirs[ctx.rank],
              TILEFUSE_CONFIG_DIR=None), _counting_tunes() as tunes:
        autotune.set_timer(lambda name, _kind: {"plain": 1.0, "wg_specialized": 0.5}.get(name.split("#")[0], 3.0))
        a, b = _operands(ctx, *SHAPE)
        _checked_auto(ctx, a, b)
        choice = dispatch.choose(OP, a, b)
        return choice.variant, choice.source.split(" ")[0], len(tunes)


def _seed_cache(directory: Path, variant: str, arch: str, world: int):
    M, N, K = SHAPE
    key = cache.entry_key(arch, world, OP, "float16", N, K, m_bucket(M))
    cache.put({key: {"variant": variant, "config": None}}, directory / "autotune.json")


def test_a_cache_on_rank_0_only_decides_for_every_rank(pools, tmp_path):
    dirs = [tmp_path / "r0", tmp_path / "r1"]
    res = pools.run(2, job_cache_on_one_rank_only, [str(d) for d in dirs], "1", 0, "bulk_sync")
    assert res == [("bulk_sync", "cache", 0)] * 2, res


@pytest.mark.parametrize("mode,expect", [("0", ("plain", "default", 0)), ("1", ("wg_specialized", "tuned", 1))])
def test_a_cache_on_rank_1_only_still_gives_one_decision(pools, tmp_path, mode, expect):
    """Rank 0 saw nothing: every rank follows it (tunes together, or takes the default)."""
    dirs = [tmp_path / "r0", tmp_path / "r1"]
    res = pools.run(2, job_cache_on_one_rank_only, [str(d) for d in dirs], mode, 1, "bulk_sync")
    assert res == [expect] * 2, res


def job_serving_token_counts(ctx, cache_dir, Ms):
    """Many token counts, one (N, K): tuning runs once per M bucket (stubbed: each bucket -> plain)."""
    real = autotune.tune
    calls = []

    def stub(candidates, **kw):
        calls.append(kw["what"])
        return autotune.Result("plain", None, {"plain": 1.0}, {}, 3)

    with _env(TILEFUSE_AUTOTUNE="1", TILEFUSE_CACHE_DIR=cache_dir, TILEFUSE_CONFIG_DIR=None):
        autotune.tune = stub
        try:
            for M in Ms:
                a, b = _operands(ctx, M, 40, 32)
                out = tilefuse.gemm_all_scatter(a, b)
                assert out.shape == (M, 40 * ctx.world), "the kernels run the exact M"
        finally:
            autotune.tune = real
    return calls


def test_serving_tunes_once_per_m_bucket(pools, tmp_path):
    Ms = [1, 3, 16, 17, 20, 32, 33, 40, 64, 5, 18, 50]
    [calls] = pools.run(1, job_serving_token_counts, str(tmp_path), Ms)
    assert len(calls) == 3 and [c.split()[-1] for c in calls] == ["M1-16", "M17-32", "M33-64"], calls


def job_capture_makes_no_decision(ctx, cache_dir):
    real = torch.compiler.is_compiling
    with _env(TILEFUSE_AUTOTUNE="1", TILEFUSE_CACHE_DIR=cache_dir, TILEFUSE_CONFIG_DIR=None), \
            _counting_tunes() as tunes:
        a, b = _operands(ctx, *SHAPE)
        torch.compiler.is_compiling = lambda: True
        try:
            variant = dispatch.resolve(OP, a, b, None, None)[0]
            while_tracing = (variant, len(tunes), len(dispatch._RESOLVED))
        finally:
            torch.compiler.is_compiling = real
        autotune.set_timer(lambda name, _kind: 1.0)
        dispatch.resolve(OP, a, b, None, None)  # eager again: now the bucket is tuned
        return while_tracing, len(tunes)


def test_no_tuning_while_compiling_or_capturing(pools, tmp_path):
    [(while_tracing, tunes_after)] = pools.run(1, job_capture_makes_no_decision, str(tmp_path))
    assert while_tracing == ("plain", 0, 0), "plain, nothing tuned, nothing remembered"
    assert tunes_after == 1


def job_tune_and_report(ctx, cache_dir):
    with _env(TILEFUSE_AUTOTUNE="1", budget_s=0.0, TILEFUSE_CACHE_DIR=cache_dir,
              TILEFUSE_CONFIG_DIR=None):
        autotune.set_timer(lambda name, _kind: {"plain": 1.0, "fused_sequential": 0.6}.get(name.split("#")[0], 3.0))
        a, b = _operands(ctx, *SHAPE)
        _checked_auto(ctx, a, b)
        return dispatch.choose(OP, a, b).variant


_SECOND_PROCESS = textwrap.dedent("""
    import json, os, socket
    import torch, torch.distributed as dist
    device = torch.device(os.environ["TILEFUSE_BACKEND"] + (":0" if os.environ["TILEFUSE_BACKEND"] == "cuda" else ""))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    import tilefuse
    from tilefuse.ops import dispatch
    from tilefuse.tuning import autotune

    def no_tuning(*a, **k):
        raise AssertionError("the second process tuned")

    autotune.tune = no_tuning
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    tilefuse.init(heap_size=16 << 20)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(50, 32, generator=g).half().to(device)  # another M in the same bucket (33-64)
    b = torch.randn(32, 40, generator=g).half().to(device)
    assert tilefuse.get_heap().device.type == device.type
    c = tilefuse.gemm_all_scatter(a, b)
    torch.testing.assert_close(c.float(), (a.float() @ b.float()), rtol=1e-2, atol=5e-2)
    choice = dispatch.choose("gemm_all_scatter", a, b)
    print(json.dumps([choice.variant, choice.source]))
    tilefuse.shutdown()
    dist.destroy_process_group()
""")


@pytest.mark.slow
def test_cache_round_trip_across_processes(pools, tmp_path):
    [variant] = pools.run(1, job_tune_and_report, str(tmp_path))
    assert variant == "fused_sequential"
    # The second process runs where the first tuned (rank 0: cpu, or GPU 0): the cache key holds the arch.
    env = dict(os.environ, PYTHONPATH=str(REPO), TILEFUSE_CACHE_DIR=str(tmp_path), TILEFUSE_AUTOTUNE="1",
               TILEFUSE_BACKEND=TEST_DEVICE)
    if TEST_DEVICE == "cpu":
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    env.pop("TILEFUSE_CONFIG_DIR", None)
    out = subprocess.run([sys.executable, "-c", _SECOND_PROCESS], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    variant, source = json.loads(out.stdout.strip().splitlines()[-1])
    assert variant == "fused_sequential" and source.startswith("cache"), source


def test_tuning_logs_at_info_and_decisions_at_debug(pools, tmp_path):
    [logged] = pools.run(1, job_logged, str(tmp_path))
    assert any(r[0] == "INFO" and "tuned gemm_all_scatter 48x40x32" in r[1] and "-> " in r[1] for r in logged), logged
    assert any(r[0] == "DEBUG" and "(tuned" in r[1] for r in logged), logged


def job_logged(ctx, cache_dir):
    import logging

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append((record.levelname, record.getMessage()))

    logger = logging.getLogger("tilefuse")
    handler, level = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        job_tune_and_report(ctx, cache_dir)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return records


def test_bad_env_values_are_clear_errors(monkeypatch):
    monkeypatch.setenv("TILEFUSE_AUTOTUNE", "sometimes")
    from tilefuse.runtime._env import autotune_mode

    with pytest.raises(ValueError, match="TILEFUSE_AUTOTUNE"):
        autotune_mode()


def test_decide_keeps_plain_within_the_margin():
    assert autotune.decide({"plain": 1.0, "a": 0.985}) == "plain"
    assert autotune.decide({"plain": 1.0, "a": 0.97, "b": 0.95}) == "b"
    assert autotune.decide({"plain": 1.0}) == "plain"


def test_decide_needs_a_win_on_calls_alone_and_back_to_back():
    # faster back to back (device-bound) but slower per call alone (its host work shows): rejected
    assert autotune.decide({"plain": 1.0, "a": 1.01}, block={"plain": 1.0, "a": 0.7}) == "plain"
    # faster alone but not back to back: rejected
    assert autotune.decide({"plain": 1.0, "a": 0.8}, block={"plain": 1.0, "a": 0.99}) == "plain"
    assert autotune.decide({"plain": 1.0, "a": 0.8}, block={"plain": 1.0, "a": 0.9}) == "a"
    # the pick is the candidate whose worse ratio is best: b (0.9, 0.9) over a (0.7, 0.95)
    both = autotune.decide({"plain": 1.0, "a": 0.7, "b": 0.9}, block={"plain": 1.0, "a": 0.95, "b": 0.9})
    assert both == "b"
    # a candidate timed one way only is not a candidate
    assert autotune.decide({"plain": 1.0, "a": 0.5}, block={"plain": 1.0}) == "plain"


def test_decide_margin_grows_with_the_medians_uncertainty():
    times = {"plain": 1.0, "a": 0.95}
    assert autotune.decide(times) == "a"
    assert autotune.decide(times, spread={"plain": 0.01, "a": 0.01}) == "a"  # margin 2.8 %
    assert autotune.decide(times, spread={"plain": 0.02, "a": 0.02}) == "plain"  # margin 5.7 %
    assert autotune.decide(times, spread={"plain": 0.0, "a": 0.03}) == "plain"  # margin 6 %
    assert autotune.decide({"plain": 1.0, "a": 0.9}, spread={"plain": 0.0, "a": 0.03}) == "a"


def test_the_medians_uncertainty_follows_the_spread_and_the_sample_count():
    u = autotune._rel_uncertainty
    assert u([1.0] * 9) == 0.0 and u([1.0]) == 0.0
    narrow, wide = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 1.01, 0.99], [1.0, 1.1, 0.9, 1.0, 1.2, 0.8, 1.0, 1.1, 0.9]
    assert 0 < u(narrow) < u(wide)
    assert u(wide * 4) < u(wide) / 1.5  # four times the samples: about half the error


def job_tune_stand_ins(ctx, first: dict, later: dict | None = None):
    """:func:`autotune.tune` on stand-in candidates (no kernels: every one returns the same tensor)
    with a clock that gives ``first[kind][name]`` (scaled by rank: the last rank is slowest) for a
    candidate's first ``MIN_REPS`` samples (the first round at budget 0) and ``later`` after them
    (the confirmation round). Returns the pick, the rounds' times and each candidate's sample count."""
    counts: dict = {}

    def clock(name, kind):
        n = counts[(name, kind)] = counts.get((name, kind), 0) + 1
        table = first if later is None or n <= autotune.MIN_REPS else later
        return table[kind][name] * (1.0 + 0.01 * ctx.rank)

    out = torch.ones(4, 4)
    cands = [autotune.Candidate(n, n, None, lambda: out) for n in ("plain", "bulk_sync", "fused_sequential")]
    with _env():
        autotune.set_timer(clock)
        res = autotune.tune(cands, device=torch.device("cpu"), group=ctx.heap.group, what="stand-ins", budget=0.0)
    return res.variant, res.times, res.block, res.confirmed, sorted(counts.items())


@pytest.mark.parametrize("world", [2, 3])
def test_a_pick_that_loses_per_call_is_rejected_on_every_rank(pools, world):
    # bulk_sync: much faster back to back, but its calls alone are slower than plain's on the last
    # rank (its host work): the cross-rank max rejects it; fused_sequential wins both ways
    first = {"call": {"plain": 1.0, "bulk_sync": 0.8, "fused_sequential": 0.9},
             "block": {"plain": 1.0, "bulk_sync": 0.6, "fused_sequential": 0.92}}
    res = pools.run(world, job_tune_stand_ins_host_bound, first)
    assert len({(v, tuple(c)) for v, *_, c in res}) == 1, f"the ranks disagree or sampled differently: {res}"
    variant, times, block, confirmed, counts = res[0]
    assert variant == "fused_sequential", res[0]
    assert times["bulk_sync"] > times["plain"] and block["bulk_sync"] < block["plain"]
    assert confirmed is not None and set(confirmed["times"]) == {"plain", "fused_sequential"}
    assert dict(counts)[("fused_sequential", "call")] == 2 * autotune.MIN_REPS  # two rounds


def job_tune_stand_ins_host_bound(ctx, first: dict):
    """bulk_sync's call alone is slow on the last rank only."""
    if ctx.rank == ctx.world - 1:
        first = {kind: dict(t) for kind, t in first.items()}
        first["call"]["bulk_sync"] = 1.1
    return job_tune_stand_ins(ctx, first)


@pytest.mark.parametrize("world", [2, 3])
def test_a_pick_must_win_again_in_the_confirmation_round(pools, world):
    first = {"call": {"plain": 1.0, "bulk_sync": 1.5, "fused_sequential": 0.9},
             "block": {"plain": 1.0, "bulk_sync": 1.5, "fused_sequential": 0.9}}
    later = {"call": {"plain": 1.0, "fused_sequential": 0.99}, "block": {"plain": 1.0, "fused_sequential": 0.9}}
    res = pools.run(world, job_tune_stand_ins, first, later)
    assert len({(v, tuple(c)) for v, *_, c in res}) == 1, f"the ranks disagree or sampled differently: {res}"
    variant, times, _, confirmed, counts = res[0]
    assert times["fused_sequential"] < times["plain"], "it won the first round"
    assert confirmed is not None and confirmed["times"]["fused_sequential"] > 0.98
    assert variant == "plain", res[0]
    assert ("bulk_sync", "call") in dict(counts) and dict(counts)[("bulk_sync", "call")] == autotune.MIN_REPS
    # and one that holds its win is kept
    res = pools.run(world, job_tune_stand_ins, first, first)
    assert {r[0] for r in res} == {"fused_sequential"}, res


def job_graph_stand_ins(ctx, first: dict, later: dict):
    """:func:`autotune.tune` on stand-in candidates with device timing: every kind of time from
    ``first`` for a candidate's first ``MIN_REPS`` samples of that kind, then from ``later``."""
    counts: dict = {}

    def clock(name, kind):
        n = counts[(name, kind)] = counts.get((name, kind), 0) + 1
        return (first if n <= autotune.MIN_REPS else later)[kind][name] * (1.0 + 0.01 * ctx.rank)

    out = torch.ones(4, 4)
    cands = [autotune.Candidate(n, n, None, lambda: out) for n in ("plain", "bulk_sync", "fused_sequential")]
    with _env():
        autotune.set_timer(clock, device_timing=True)
        res = autotune.tune(cands, device=torch.device("cpu"), group=ctx.heap.group, what="graph stand-ins",
                            budget=0.0)
    return res.variant, res.graph_variant, res.device, res.graph_confirmed, dict(counts)


@pytest.mark.parametrize("world", [2, 3])
def test_a_graph_pick_must_win_again_in_its_confirmation_round(pools, world):
    """A fused variant that wins on device time in the first round but not in fresh samples runs plain
    inside CUDA graphs on every rank; one that wins again is kept. The eager pick is decided apart."""
    eager = {"plain": 1.0, "bulk_sync": 1.5, "fused_sequential": 1.2}  # plain wins eagerly
    first = {"call": eager, "block": eager, "device": {"plain": 1.0, "bulk_sync": 1.5, "fused_sequential": 0.8}}
    later = {"call": eager, "block": eager, "device": {"plain": 1.0, "fused_sequential": 0.99}}
    res = pools.run(world, job_graph_stand_ins, first, later)
    assert len({(v, g) for v, g, *_ in res}) == 1, f"the ranks disagree: {res}"
    variant, graph, device, confirmed, counts = res[0]
    assert variant == "plain" and device["fused_sequential"] < device["plain"], "it won the first round"
    assert confirmed is not None and set(confirmed["device"]) == {"plain", "fused_sequential"}
    assert confirmed["device"]["fused_sequential"] > 0.98, confirmed
    assert counts[("fused_sequential", "device")] == 2 * autotune.MIN_REPS  # two rounds of device samples
    assert counts[("bulk_sync", "device")] == autotune.MIN_REPS, "only the pick is confirmed"
    assert graph == "plain", res[0]
    # one that holds its win is kept (and plain stays the eager pick)
    res = pools.run(world, job_graph_stand_ins, first, first)
    assert {(v, g) for v, g, *_ in res} == {("plain", "fused_sequential")}, res
    # a plain graph pick needs no confirmation round
    plain_first = {"call": eager, "block": eager, "device": eager}
    res = pools.run(world, job_graph_stand_ins, plain_first, plain_first)
    assert {(v, g, c) for v, g, _, c, _ in res} == {("plain", "plain", None)}, res


@needs_working_interpreter
@pytest.mark.slow
def test_heldout_benchmark_smoke(tmp_path):
    """benchmarks/tune.py on CPU ranks: auto's result is checked, every method timed, the CSV written."""
    import pandas as pd

    out = tmp_path / "heldout.csv"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("TILEFUSE_CONFIG_DIR", None)
    got = subprocess.run([sys.executable, "-m", "benchmarks.tune", "--smoke", "--world", "2", "--n", "2",
                          "--ops", "gemm_all_scatter,gemm_reduce_scatter", "--out", str(out),
                          "--cache-dir", str(tmp_path / "cache")],
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-3000:]
    df = pd.read_csv(out)
    per_shape = df[df["variant"] != "summary"]
    for op in ("gemm_all_scatter", "gemm_reduce_scatter"):
        mine = per_shape[per_shape["op"] == op]
        assert len(mine[mine["metric"] == "ms"]) == 4, "plain and auto on two shapes"
        assert set(mine["metric"]) == {"ms", "speedup_vs_plain", "first_call_ms"}
        assert mine[mine["variant"] == "auto"]["note"].str.startswith("plain (default").all()
    summary = df[df["variant"] == "summary"]
    assert {"worst_speedup_vs_plain", "median_speedup_vs_plain"} <= set(summary["metric"])
    assert "no torch fused column" in got.stderr


def job_default_mode_threshold(ctx, cache_dir, plain_ms):
    """The default mode as on a GPU: one plain call timed (max over ranks) decides whether to tune."""
    real = dispatch._times_mean_something
    with _env(TILEFUSE_AUTOTUNE=None, budget_s=0.0,
              TILEFUSE_CACHE_DIR=cache_dir, TILEFUSE_CONFIG_DIR=None), _counting_tunes() as tunes:
        dispatch._times_mean_something = lambda device: True
        # rank 1 is the slow one: the maximum over ranks decides
        autotune.set_timer(lambda name, _kind: plain_ms * (1.0 if ctx.rank == 1 else 0.1) if name == "plain" else 3.0)
        try:
            a, b = _operands(ctx, *SHAPE)
            _checked_auto(ctx, a, b)
            choice = dispatch.choose(OP, a, b)
        finally:
            dispatch._times_mean_something = real
        return choice.variant, choice.source.split(" ")[0], len(tunes)


@pytest.mark.parametrize("plain_ms,tuned", [(0.1, False), (0.5, True)])
def test_default_mode_tunes_only_calls_above_the_threshold(pools, tmp_path, plain_ms, tuned):
    res = pools.run(2, job_default_mode_threshold, str(tmp_path), plain_ms)
    expect = ("plain", "tuned", 1) if tuned else ("plain", "default", 0)  # every variant is slower (3 ms)
    assert res == [expect] * 2, res


def job_bad_setting_on_one_rank(ctx, cache_dir):
    with _env(TILEFUSE_AUTOTUNE="sometimes" if ctx.rank == 1 else "0", TILEFUSE_CACHE_DIR=cache_dir,
              TILEFUSE_CONFIG_DIR=None):
        a, b = _operands(ctx, *SHAPE)
        try:
            tilefuse.gemm_all_scatter(a, b)
        except RuntimeError as err:
            return str(err)
        return "no error"


def test_a_bad_setting_on_one_rank_is_an_error_on_every_rank(pools, tmp_path):
    res = pools.run(2, job_bad_setting_on_one_rank, str(tmp_path))
    assert all("cannot decide: rank 1: ValueError: TILEFUSE_AUTOTUNE='sometimes'" in r for r in res), res


# ---------------------------------------------------------------------------------------------
# all_gather_gemm's copy_engine form as a tuned choice
# ---------------------------------------------------------------------------------------------


def test_a_named_form_round_trips_through_the_cache(tmp_path):
    from tilefuse.ops.common.config import Config

    cfg = Config(BLOCK_M=32, BLOCK_N=64, BLOCK_K=32, GROUP_M=4, num_warps=4, num_stages=1, GEMM_SMS=4, COMM_SMS=0)
    key = cache.entry_key("cpu", 2, "all_gather_gemm", "float16", 48, 24, m_bucket(40))
    path = cache.put({key: {"variant": "copy_engine", "config": cfg.to_dict()}}, tmp_path / "autotune.json")
    entry = cache.load(path)[key]
    assert entry["variant"] == "copy_engine" and Config.from_dict(entry["config"]) == cfg
    with pytest.raises(ValueError, match="malformed"):
        cache.put({key: {"variant": "pc_copy_engines", "config": cfg.to_dict()}}, path)


def job_tune_copy_engine(ctx, cache_dir):
    """First-call tuning of all_gather_gemm where the copy_engine form is the fastest: auto runs it,
    the cache keeps it, and a later process (decisions forgotten, tuning off) reads it."""
    M, N, K = 40, 48, 24
    g = torch.Generator().manual_seed(ctx.rank)
    a = torch.randn(M, K, generator=g).to(torch.float16).to(ctx.device)
    b = (torch.randn(K, N, generator=g) / K ** 0.5).to(torch.float16).to(ctx.device)
    with _env(TILEFUSE_AUTOTUNE="1", budget_s=0.0, TILEFUSE_CACHE_DIR=cache_dir,
              TILEFUSE_CONFIG_DIR=None), _counting_tunes() as tunes:
        autotune.set_timer(lambda name, _kind: {"plain": 1.0, "copy_engine": 0.5}.get(name, 3.0))
        tilefuse.all_gather_gemm(a, b)  # tunes: every candidate runs
        got = tilefuse.all_gather_gemm(a, b)
        ref = tilefuse.all_gather_gemm(a, b, variant="reference")
        torch.testing.assert_close(got.float(), ref.float(), rtol=1e-2, atol=5e-2)
        tuned = dispatch.choose("all_gather_gemm", a, b)
    with _env(TILEFUSE_AUTOTUNE="0", TILEFUSE_CACHE_DIR=cache_dir, TILEFUSE_CONFIG_DIR=None):
        cached = dispatch._decide("all_gather_gemm", a, b, None, None)[0]
    return tunes, tuned.variant, tuned.source.split(" ")[0], cached.variant, cached.source.split(" ")[0]


@pytest.mark.slow  # six candidates at W = 2 in the interpreter
def test_first_call_tuning_can_choose_a_named_form(pools, tmp_path):
    res = pools.run(2, job_tune_copy_engine, str(tmp_path))
    for tunes, variant, source, c_variant, c_source in res:
        assert len(tunes) == 1 and "copy_engine" in tunes[0], tunes
        assert (variant, source, c_variant, c_source) == ("copy_engine", "tuned", "copy_engine", "cache"), res
    [entry] = json.loads((tmp_path / "autotune.json").read_text())["entries"].values()
    assert entry["variant"] == "copy_engine"


# ---------------------------------------------------------------------------------------------
# benchmarks.suite: auto's note is the decision its timed calls ran
# ---------------------------------------------------------------------------------------------


def job_suite_auto_note(ctx, cache_dir):
    """One suite shape with auto on an untuned bucket: its first call (the check) tunes, so a note
    taken before it would say plain; the rows must name what the timed calls ran."""
    from argparse import Namespace

    from benchmarks import launch as blaunch
    from benchmarks import results, suite

    bctx = blaunch.RankCtx(rank=ctx.rank, world=ctx.world, device=ctx.device, heap=ctx.heap, pg_backend="gloo",
                           host_group=None)
    args = Namespace(reps=1, warmup_ms=1.0, rep_ms=1.0, sync_each=False, no_heap_out=True, graphs=False, fp8=None)
    M, N, K = SHAPE
    entry = {"M": M, "N": N, "K": K, "set": "test", "name": "note"}
    with _env(TILEFUSE_AUTOTUNE="1", budget_s=0.0, TILEFUSE_CACHE_DIR=cache_dir,
              TILEFUSE_CONFIG_DIR=None):
        autotune.set_timer(lambda name, _kind: {"plain": 1.0, "fused_sequential": 0.5}.get(name.split("#")[0], 3.0))
        before = suite.auto_note(OP, *_operands(ctx, M, N, K))
        rows = suite.run_shape(bctx, OP, entry, torch.float16, ["auto"], args, results.Progress(1, enabled=False))
    return before, sorted({(r["metric"], r["note"]) for r in rows if r["variant"] == "auto"})


def test_suite_notes_what_auto_ran_after_its_first_call(pools, tmp_path):
    [(before, notes)] = pools.run(1, job_suite_auto_note, str(tmp_path))
    assert before.startswith("auto -> plain (default"), before
    assert {m for m, _ in notes} >= {"ok", "rel_err", "ms"}, notes
    for metric, note in notes:
        assert note.startswith("auto -> fused_sequential (tuned"), (metric, note)


# ---------------------------------------------------------------------------------------------
# benchmarks.tune: shapes round-robin over the ops, a time budget that stops cleanly
# ---------------------------------------------------------------------------------------------


def job_heldout(ctx, n, budget_s, out):
    from benchmarks import launch as blaunch
    from benchmarks import tune as heldout

    bctx = blaunch.RankCtx(rank=ctx.rank, world=ctx.world, device=ctx.device, heap=ctx.heap, pg_backend="gloo",
                           host_group=None)
    with _env(TILEFUSE_AUTOTUNE="0", TILEFUSE_CONFIG_DIR=None):
        return heldout._job(bctx, ["gemm_all_scatter", "gemm_reduce_scatter"], n, "float16", True,
                            heldout.HELDOUT_SEED, None, budget_s=budget_s, out=out)


def test_heldout_goes_round_robin_and_stops_at_its_budget(pools, tmp_path):
    import pandas as pd

    from benchmarks import tune as heldout

    [(rows, notes)] = pools.run(1, job_heldout, 2, None, None)
    timed = [r["op"] for r in rows if r["metric"] == "ms" and r["variant"] == "plain"]
    assert timed == ["gemm_all_scatter", "gemm_reduce_scatter"] * 2, "shape i of every op before shape i + 1"
    assert {(r["op"], r["value"]) for r in rows if r["metric"] == "shapes_run"} == {
        ("gemm_all_scatter", 2.0), ("gemm_reduce_scatter", 2.0)}
    summary = heldout.summarize(rows, min_ms=0.0)
    assert {"worst_speedup_vs_plain", "median_speedup_vs_plain_plain_ge_0ms"} <= {r["metric"] for r in summary}
    out = tmp_path / "cut.csv"
    [(rows, notes)] = pools.run(1, job_heldout, 3, 1e-3, str(out))  # the first shape always runs
    assert {(r["op"], r["value"]) for r in rows if r["metric"] == "shapes_run"} == {
        ("gemm_all_scatter", 1.0), ("gemm_reduce_scatter", 0.0)}, rows
    assert any("--budget-s 0.001: stopped after" in line for line in notes), notes
    written = pd.read_csv(out)  # rewritten after every shape: what ran is on disk before the end
    assert set(written["op"]) == {"gemm_all_scatter"} and "speedup_vs_plain" in set(written["metric"])


def job_graph_choice(ctx, cache_dir, device_fused_ms):
    """First-call tuning with device timing: fused_sequential wins eagerly (less host work) at 0.5 ms
    against plain's 1.0; on device time it takes ``device_fused_ms`` against plain's 1.0."""
    def clock(name, kind):
        base = name.split("#")[0]
        if kind == "device":
            return {"plain": 1.0, "fused_sequential": device_fused_ms}.get(base, 3.0)
        return {"plain": 1.0, "fused_sequential": 0.5}.get(base, 3.0)

    with _env(TILEFUSE_AUTOTUNE="1", budget_s=0.0, TILEFUSE_CACHE_DIR=cache_dir,
              TILEFUSE_CONFIG_DIR=None), _counting_tunes() as tunes:
        autotune.set_timer(clock, device_timing=True)
        a, b = _operands(ctx, *SHAPE)
        _checked_auto(ctx, a, b)
        choice = dispatch.choose(OP, a, b)
        eager = dispatch.resolve(OP, a, b, None, {}, graphs=False)[0]
        in_graphs = dispatch.resolve(OP, a, b, None, {}, graphs=True)[0]
        return choice.variant, choice.graph and choice.graph[0], eager, in_graphs, len(tunes)


@pytest.mark.parametrize("device_fused_ms,graph",
                         [(2.0, "plain"), pytest.param(0.5, "fused_sequential", marks=pytest.mark.slow)])
def test_first_call_tuning_decides_apart_for_cuda_graphs(pools, tmp_path, device_fused_ms, graph):
    """A variant that wins eagerly but loses on device time runs plain inside CUDA graphs; one that
    wins both ways runs in both. The graph choice is saved in the cache entry and read back."""
    res = pools.run(2, job_graph_choice, str(tmp_path / "cache"), device_fused_ms)
    assert res == [("fused_sequential", graph, "fused_sequential", graph, 1)] * 2, res
    entries = json.loads((tmp_path / "cache" / "autotune.json").read_text())["entries"]
    [entry] = entries.values()
    assert entry["graph"]["variant"] == graph, entry
    # decided again from the cache entry (buckets cleared): no tuning, the same two picks
    res = pools.run(2, job_graph_choice, str(tmp_path / "cache"), device_fused_ms)
    assert res == [("fused_sequential", graph, "fused_sequential", graph, 0)] * 2, res


def job_unmeasured_choice_in_graphs(ctx, cache_dir):
    """A cache entry with no graph pick (made before graph picks existed): eager runs it; inside CUDA
    graphs, at this M (< GRAPH_MIN_M), plain."""
    _seed_cache(Path(cache_dir), "bulk_sync", hw.arch_name(ctx.device), ctx.world)
    with _env(TILEFUSE_AUTOTUNE="0", TILEFUSE_CACHE_DIR=cache_dir, TILEFUSE_CONFIG_DIR=None):
        a, b = _operands(ctx, *SHAPE)
        eager = dispatch.resolve(OP, a, b, None, {}, graphs=False)[0]
        in_graphs = dispatch.resolve(OP, a, b, None, {}, graphs=True)[0]
        big = dispatch._for_graphs(dispatch.choose(OP, a, b), dispatch.GRAPH_MIN_M).variant
        return eager, in_graphs, big


def job_auto_graph_pick(ctx, cache_dir):
    """A cache entry whose graph pick differs from its eager one: auto's remembered call holds both;
    on a GPU the public call runs the eager pick eagerly and the graph pick while a CUDA graph
    captures, and the replay is right."""
    M, N, K = SHAPE
    key = cache.entry_key(hw.arch_name(ctx.device), ctx.world, OP, "float16", N, K, m_bucket(M))
    cache.put({key: {"variant": "bulk_sync", "config": None,
                     "graph": {"variant": "fused_sequential", "config": None}}}, Path(cache_dir) / "autotune.json")
    with _env(TILEFUSE_AUTOTUNE="0", TILEFUSE_CACHE_DIR=cache_dir, TILEFUSE_CONFIG_DIR=None):
        a, b = _operands(ctx, *SHAPE)
        picks = (dispatch.resolve(OP, a, b, None, {})[0], dispatch.resolve(OP, a, b, None, {}, graphs=True)[0])
        [hit] = dispatch._RESOLVED.values()
        assert hit[4] is not None and hit[4][0] == "fused_sequential", hit
        ran = []
        named = lambda name, fn: lambda *args, **kw: ran.append(name) or fn(*args, **kw)
        key = next(iter(dispatch._RESOLVED))
        dispatch._RESOLVED[key] = (hit[0], named(hit[0], hit[1]), *hit[2:4],
                                   (hit[4][0], named(hit[4][0], hit[4][1]), *hit[4][2:]))
        ref = tilefuse.gemm_all_scatter(a, b, variant="reference")
        got = tilefuse.gemm_all_scatter(a, b)
        torch.testing.assert_close(got.float(), ref.float(), rtol=1e-2, atol=5e-2)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = tilefuse.gemm_all_scatter(a, b)
            graph.replay()
            torch.cuda.synchronize()
            torch.testing.assert_close(out.float(), ref.float(), rtol=1e-2, atol=5e-2)
        tilefuse.barrier()
        return picks, ran


def test_auto_keeps_the_graph_pick_beside_the_eager_one(pools, tmp_path, on_gpu):
    res = pools.run(2, job_auto_graph_pick, str(tmp_path / "cache"))
    ran = ["bulk_sync", "fused_sequential"] if on_gpu else ["bulk_sync"]
    assert res == [(("bulk_sync", "fused_sequential"), ran)] * 2, res


def test_an_unmeasured_fused_choice_runs_plain_in_graphs_at_small_m(pools, tmp_path):
    assert SHAPE[0] < dispatch.GRAPH_MIN_M
    res = pools.run(2, job_unmeasured_choice_in_graphs, str(tmp_path / "cache"))
    assert res == [("bulk_sync", "plain", "bulk_sync")] * 2, res


def job_malformed_graph_entry(ctx, cache_dirs):
    """Rank 1's cache entry carries a malformed ``graph``: auto's decision raises on every rank."""
    M, N, K = SHAPE
    if ctx.rank == 1:
        key = cache.entry_key(hw.arch_name(ctx.device), ctx.world, OP, "float16", N, K, m_bucket(M))
        cache.put({key: {"variant": "bulk_sync", "config": None, "graph": {"variant": "nope"}}},
                  Path(cache_dirs[1]) / "autotune.json")
    with _env(TILEFUSE_AUTOTUNE="0", TILEFUSE_CACHE_DIR=cache_dirs[ctx.rank], TILEFUSE_CONFIG_DIR=None):
        a, b = _operands(ctx, *SHAPE)
        with pytest.raises(RuntimeError, match="rank 1: ValueError: malformed 'graph'"):
            dispatch._decide(OP, a, b, None, None)[0]
        return True


def test_a_malformed_graph_pick_on_one_rank_raises_on_every_rank(pools, tmp_path):
    dirs = [tmp_path / "r0", tmp_path / "r1"]
    assert all(pools.run(2, job_malformed_graph_entry, [str(d) for d in dirs]))
