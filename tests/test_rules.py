"""The tuners' shared rules: all_gather_gemm's copy_engine form is a candidate across ranks; its
fused_sequential is left out where it re-reads the peers' rows once per column tile; decode-size
tiles in the tuner's search; both search spaces stay bounded."""

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


def test_copy_engine_form_only_across_ranks():
    assert rules.skip_reason("all_gather_gemm", "copy_engine", 4096, 1) is not None  # nothing to copy
    assert rules.skip_reason("all_gather_gemm", "copy_engine", 14336, 2) is None
    assert registry.tunable("all_gather_gemm") == tilefuse.VARIANTS + ("copy_engine",)
    assert registry.tunable("gemm_all_scatter") == tilefuse.VARIANTS


def test_config_refuses_unknown_fields():
    cfg = default_config(64, 64, 64, torch.float16, num_sms=8, interpreter=True, comm=True)
    for field in ("TWO_SHOT", "EPILOGUE_SUM", "STREAM_K"):
        with pytest.raises(ValueError, match="unknown key"):
            Config.from_dict(dict(cfg.to_dict(), **{field: 0}))


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
            assert set(names[1:]) <= set(registry.tunable(op)), (op, names)
            assert ("copy_engine" in names) == (op == "all_gather_gemm" and world > 1), (op, world, names)


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


def test_tuner_search_space_stays_bounded():
    for op in registry.OPS:
        for variant in tilefuse.VARIANTS:
            for M in (1, 16, 100, 256, 1000, 8192):
                for world in (1, 2, 4):
                    for quick in (False, True):
                        configs = tuner.candidate_configs(variant, M, 8192, 4096, torch.bfloat16, 132, False, quick,
                                                          op=op, world=world)
                        assert len(configs) == len(set(configs)) <= rules.MAX_TUNER_CONFIGS, (op, variant, M, world)


def test_config_for_shape_is_the_default_to_change_one_field_of():
    """A user starts from the default config of a shape and changes one field."""
    cfg = Config.for_shape(256, 512, 128, torch.float16)
    assert cfg == default_config(256, 512, 128, torch.float16, num_sms=hw.num_sms(), interpreter=hw.interpreting(),
                                 comm=True)
    assert cfg.replace(COMM_SMS=cfg.COMM_SMS + 1).COMM_SMS == cfg.COMM_SMS + 1
