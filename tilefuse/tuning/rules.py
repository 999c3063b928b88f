"""What the tuners try for a shape beyond each variant's default config, and what they leave out.

Shared by first-call tuning (``tilefuse.ops.dispatch``) and the offline tuner (``tilefuse.tuning.tuner``)
so both search the same space.

- **all_gather_gemm's copy-engine form.** ``producer_consumer`` with ``COMM_SMS = 0`` moves the peers'
  rows with DMA copies and leaves every SM but one to the GEMM (``ops/all_gather_gemm``): a candidate
  of its own next to the SM-driven push.
- **all_gather_gemm's ``fused_sequential`` on wide N.** Each of its tiles loads its A rows straight
  from the source rank's heap inside the K loop, so rank s's shard crosses the link once per column
  tile, ``cdiv(N, BLOCK_N)`` times, with no reuse (peer reads are not kept in this GPU's L2). On two
  H200s it ran at 0.23-0.32x of the plain path on the Llama-3-8B shapes (56 and 12 column tiles;
  ``docs/perf/2026-11-30_h200x2_ws2_suite_llama3-8b.csv``). The tuners skip it above
  ``FUSED_AG_MAX_COLUMN_TILES`` column tiles of 256; at W = 1 nothing crosses a link and it stays.
"""

from __future__ import annotations

from ..ops.common.config import Config

FUSED_AG_MAX_COLUMN_TILES = 2


def skip_reason(op: str, variant: str, N: int, world: int) -> str | None:
    """Why the tuners leave ``variant`` out for this shape (None: try it)."""
    if op == "all_gather_gemm" and variant == "fused_sequential" and world > 1:
        tiles = -(-N // 256)
        if tiles > FUSED_AG_MAX_COLUMN_TILES:
            return (f"reads every peer's A rows once per column tile ({tiles} of 256): link-bound, "
                    "see tilefuse/tuning/rules.py")
    return None


def extra_configs(op: str, variant: str, base: Config, num_sms: int, world: int) -> list[Config]:
    """Configs tried besides ``base`` (a variant's default) that the search space has no axis for."""
    if op == "all_gather_gemm" and variant == "producer_consumer" and world > 1 and num_sms > 1:
        return [base.replace(COMM_SMS=0, GEMM_SMS=num_sms - 1)]  # the copy-engine form
    return []
