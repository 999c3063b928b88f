"""The tuners' shared rules: all_gather_gemm's copy-engine form is a candidate; its fused_sequential is
left out where it re-reads the peers' rows once per column tile."""

import torch

from tilefuse.ops.common.config import default_config
from tilefuse.tuning import rules


def test_fused_all_gather_gemm_skipped_on_wide_n_at_world_2_only():
    assert rules.skip_reason("all_gather_gemm", "fused_sequential", 14336, 2) is not None
    assert rules.skip_reason("all_gather_gemm", "fused_sequential", 512, 2) is None  # two column tiles
    assert rules.skip_reason("all_gather_gemm", "fused_sequential", 14336, 1) is None  # nothing crosses a link
    assert rules.skip_reason("gemm_all_scatter", "fused_sequential", 14336, 2) is None


def test_copy_engine_candidate_for_all_gather_gemm_producer_consumer():
    base = default_config(4096, 14336, 4096, torch.bfloat16, num_sms=132, interpreter=False, comm=False)
    (cfg,) = rules.extra_configs("all_gather_gemm", "producer_consumer", base, 132, 2)
    assert cfg.COMM_SMS == 0 and cfg.GEMM_SMS == 131 and cfg.BLOCK_N == base.BLOCK_N
    assert rules.extra_configs("all_gather_gemm", "producer_consumer", base, 132, 1) == []
    assert rules.extra_configs("gemm_all_scatter", "producer_consumer", base, 132, 2) == []
