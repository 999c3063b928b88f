"""The tuners' shared rules: the copy-engine forms are candidates; its fused_sequential is
left out where it re-reads the peers' rows once per column tile; gemm_all_reduce's two-shot form is a
candidate across ranks; decode-size tiles in the tuner's search; both search spaces stay bounded."""

from types import SimpleNamespace

import pytest
import torch

import tilefuse
from tilefuse.ops import dispatch, registry
from tilefuse.ops.common.config import WARP_SPEC_VARIANTS, Config, default_config
from tilefuse.runtime import hw
from tilefuse.tuning import rules, tuner


def test_fused_all_gather_gemm_skipped_on_wide_n_at_world_2_only():
    assert rules.skip_reason("all_gather_gemm", "fused_sequential", 14336, 2) is not None
    assert rules.skip_reason("all_gather_gemm", "fused_sequential", 512, 2) is None  # two column tiles
    assert rules.skip_reason("all_gather_gemm", "fused_sequential", 14336, 1) is None  # nothing crosses a link
    assert rules.skip_reason("gemm_all_scatter", "fused_sequential", 14336, 2) is None


@pytest.mark.parametrize("op", ["all_gather_gemm", "gemm_all_scatter"])
def test_copy_engine_candidate_for_producer_consumer(op):
    base = default_config(4096, 14336, 4096, torch.bfloat16, num_sms=132, interpreter=False, comm=False)
    (cfg,) = rules.extra_configs(op, "producer_consumer", base, 132, 2)
    assert cfg.COMM_SMS == 0 and cfg.GEMM_SMS == 131 and cfg.BLOCK_N == base.BLOCK_N
    assert rules.extra_configs(op, "producer_consumer", base, 132, 1) == []
    assert rules.extra_configs(op, "wg_specialized", base, 132, 2) == []
    assert rules.extra_configs("gemm_reduce_scatter", "producer_consumer", base, 132, 2) == []


def test_scatter_copy_engine_candidate_needs_the_cuda_runtime(monkeypatch):
    """gemm_all_scatter's form issues 2-D copies through the CUDA runtime: without it no candidate."""
    from tilefuse.runtime import dma

    base = default_config(4096, 14336, 4096, torch.bfloat16, num_sms=132, interpreter=False, comm=False)
    monkeypatch.setattr(dma, "available", lambda: False)
    assert rules.extra_configs("gemm_all_scatter", "producer_consumer", base, 132, 2) == []
    assert len(rules.extra_configs("all_gather_gemm", "producer_consumer", base, 132, 2)) == 1


def test_two_shot_form_of_gemm_all_reduce_only_across_ranks():
    base = default_config(4096, 8192, 4096, torch.bfloat16, num_sms=132, interpreter=False, comm=False)
    for variant in ("bulk_sync", "fused_sequential"):
        cfg = rules.extra_configs("gemm_all_reduce", variant, base, 132, 2)[0]  # (fused_sequential: + its epilogue sum)
        assert cfg == base.replace(TWO_SHOT=1)
    for variant in rules.COMM_VARIANTS:  # summing and gathering programs, taken from the GEMM's
        (cfg,) = rules.extra_configs("gemm_all_reduce", variant, base, 132, 4)
        assert cfg.TWO_SHOT == 1 and cfg.COMM_SMS == 16 and cfg.GEMM_SMS == 116
    assert rules.extra_configs("gemm_all_reduce", "wg_specialized", base, 132, 1) == []
    assert rules.two_shot_form("gemm_reduce_scatter", "bulk_sync", base, 132, 2) is None
    assert rules.two_shot_form("gemm_all_reduce", "bulk_sync", base.replace(TWO_SHOT=1), 132, 2) is None
    tiny = base.replace(GEMM_SMS=2)
    assert rules.two_shot_form("gemm_all_reduce", "wg_specialized", tiny, 2, 2) is None, "no room for both"


@pytest.mark.parametrize("world", [1, 2, 4])
def test_epilogue_sum_forms_of_fused_sequential_only(world):
    base = default_config(4096, 8192, 4096, torch.bfloat16, num_sms=132, interpreter=False, comm=False)
    (cfg,) = rules.extra_configs("gemm_reduce_scatter", "fused_sequential", base, 132, world)
    assert cfg == base.replace(EPILOGUE_SUM=1)
    extra = rules.extra_configs("gemm_all_reduce", "fused_sequential", base, 132, world)
    assert extra[-1] == base.replace(EPILOGUE_SUM=1) and len(extra) == (2 if world > 1 else 1)  # + two-shot
    assert rules.two_shot_form("gemm_all_reduce", "fused_sequential", base.replace(EPILOGUE_SUM=1), 132, world) is None
    for op, variant in [("gemm_reduce_scatter", "bulk_sync"), ("gemm_all_scatter", "fused_sequential"),
                        ("gemm_all_reduce", "wg_specialized"), ("all_gather_gemm", "fused_sequential")]:
        assert not any(c.EPILOGUE_SUM for c in rules.extra_configs(op, variant, base, 132, world)), (op, variant)
    for op in ("gemm_reduce_scatter", "gemm_all_reduce"):
        configs = tuner.candidate_configs("fused_sequential", 4096, 8192, 4096, torch.bfloat16, 132, False, False,
                                          op=op, world=world)
        assert sum(c.EPILOGUE_SUM for c in configs) == 1 and not any(c.EPILOGUE_SUM and c.TWO_SHOT for c in configs)


def test_config_two_shot_round_trips_and_old_entries_stay_valid():
    cfg = default_config(64, 64, 64, torch.float16, num_sms=8, interpreter=True, comm=True).replace(TWO_SHOT=1)
    assert Config.from_dict(cfg.to_dict()) == cfg
    old = cfg.to_dict()
    del old["TWO_SHOT"]  # a table written before the field existed
    assert Config.from_dict(old).TWO_SHOT == 0
    with pytest.raises(ValueError, match="TWO_SHOT must be 0 or 1"):
        cfg.replace(TWO_SHOT=2)
    with pytest.raises(TypeError, match="TWO_SHOT must be an int"):
        cfg.replace(TWO_SHOT=True)
    summed = cfg.replace(TWO_SHOT=0, EPILOGUE_SUM=1)  # the same for gemm_reduce_scatter's epilogue-sum form
    assert Config.from_dict(summed.to_dict()) == summed and Config.from_dict(old).EPILOGUE_SUM == 0
    with pytest.raises(ValueError, match="EPILOGUE_SUM must be 0 or 1"):
        cfg.replace(EPILOGUE_SUM=2)


def _first_call_candidates(monkeypatch, op, world, num_sms, M=4096, N=8192, K=4096):
    """dispatch's own candidate list for one call, as on a device of ``num_sms`` multiprocessors."""
    monkeypatch.setattr(dispatch, "get_heap",
                        lambda group=None: SimpleNamespace(world_size=world, device=torch.device("cpu")))
    monkeypatch.setattr(hw, "num_sms", lambda device=None: num_sms)
    monkeypatch.setattr(hw, "interpreting", lambda: False)
    a, b = torch.empty(M, K, dtype=torch.bfloat16), torch.empty(K, N, dtype=torch.bfloat16)
    return dispatch._candidates(op, a, b, None, {}, None)


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_first_call_candidates_stay_bounded(monkeypatch, world):
    for op in registry.OPS:
        for M in (1, 200, 4096):
            names = [c.name for c in _first_call_candidates(monkeypatch, op, world, 132, M=M)]
            assert names[0] == "plain" and len(names) == len(set(names))
            assert len(names) + 1 <= rules.MAX_FIRST_CALL_CANDIDATES, (op, world, names)  # + the model's pick
            per_variant = {}
            for n in names[1:]:
                per_variant[n.split("#")[0]] = per_variant.get(n.split("#")[0], 0) + 1
            assert max(per_variant.values()) <= 1 + rules.MAX_EXTRA_CONFIGS


def test_first_call_tuning_tries_two_shot_at_world_2_and_up(monkeypatch):
    one = _first_call_candidates(monkeypatch, "gemm_all_reduce", 1, 132)
    assert not any(c.config is not None and c.config.TWO_SHOT for c in one)
    two = _first_call_candidates(monkeypatch, "gemm_all_reduce", 2, 132)
    two_shot = {c.variant: c.config for c in two if c.config is not None and c.config.TWO_SHOT}
    assert set(two_shot) == set(tilefuse.VARIANTS), [c.name for c in two]
    assert all(two_shot[v].COMM_SMS >= 2 for v in rules.COMM_VARIANTS)
    for op in ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter"):
        got = _first_call_candidates(monkeypatch, op, 2, 132)
        assert not any(c.config is not None and c.config.TWO_SHOT for c in got), op


@pytest.mark.parametrize("M", [1, 16, 24, 64, 100, 256])
def test_tuner_tries_decode_tiles_at_small_m(M):
    configs = tuner.candidate_configs("fused_sequential", M, 8192, 4096, torch.bfloat16, 132, False, False,
                                      op="gemm_all_scatter", world=2)
    tiles = {(c.BLOCK_M, c.BLOCK_N) for c in configs}
    top = max(16, 1 << (M - 1).bit_length())
    want = {(bm, bn) for bm in (16, 32, 64) if bm <= top for bn in (64, 128)}
    assert want <= tiles, (M, sorted(tiles))
    assert all(bm <= max(top, 128) for bm, _ in tiles), "no tile taller than M needs past 128"
    if M > 64:  # the swept small-M tiles, with their K steps and stages
        from tilefuse.ops.common.config import SMALL_M_TILES

        got = {(c.BLOCK_M, c.BLOCK_N, c.BLOCK_K, c.num_stages) for c in configs}
        assert set(SMALL_M_TILES) <= got, (M, sorted(got))
    big = tuner.candidate_configs("fused_sequential", 4096, 8192, 4096, torch.bfloat16, 132, False, False)
    assert min(c.BLOCK_M for c in big) == 64, "large M keeps the large-tile search"
    assert not any(c.WARP_SPEC for c in big), "no op named: no warp-specialized candidate"
    for op, variants in WARP_SPEC_VARIANTS.items():
        for variant in tilefuse.VARIANTS:
            got = tuner.candidate_configs(variant, 4096, 8192, 4096, torch.bfloat16, 132, False, False, op=op)
            ws = [c for c in got if c.WARP_SPEC]
            if variant in variants:
                assert ws and ws[0] == got[1] and (ws[0].BLOCK_N, ws[0].num_warps) == (256, 4), (op, variant)
            else:
                assert not ws, (op, variant)


def test_tuner_search_space_stays_bounded_and_has_two_shot_twins():
    for op in registry.OPS:
        for variant in tilefuse.VARIANTS:
            for M in (1, 16, 100, 256, 1000, 8192):
                for world in (1, 2, 4):
                    for quick in (False, True):
                        configs = tuner.candidate_configs(variant, M, 8192, 4096, torch.bfloat16, 132, False, quick,
                                                          op=op, world=world)
                        assert len(configs) == len(set(configs)) <= rules.MAX_TUNER_CONFIGS, (op, variant, M, world)
                        twins = [c for c in configs if c.TWO_SHOT]
                        if op == "gemm_all_reduce" and world > 1:
                            assert twins and configs[0].replace(TWO_SHOT=1) in twins
                            assert all(c.COMM_SMS >= 2 for c in twins if variant in rules.COMM_VARIANTS)
                        else:
                            assert not twins
