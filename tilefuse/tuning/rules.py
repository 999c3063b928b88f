"""What the tuners try for a shape beyond each variant's default config, and what they leave out.

Shared by first-call tuning (``tilefuse.ops.dispatch``) and the offline tuner (``tilefuse.tuning.tuner``)
so both search the same space. all_gather_gemm's ``copy_engine`` form (rows pulled by the copy
engines, ``ops/all_gather_gemm/copy_engine.py``) is a candidate of its own from W = 2. Its
``fused_sequential`` loads each tile's A rows from the source rank's heap inside the K loop, so a
peer's shard crosses the link once per column tile with no reuse: link-bound above
``FUSED_AG_MAX_COLUMN_TILES`` column tiles of 256, where the tuners skip it (at W = 1 it stays).
"""

from __future__ import annotations

FUSED_AG_MAX_COLUMN_TILES = 2
COMM_VARIANTS = ("producer_consumer", "wg_specialized")  # variants with communication programs
MAX_FIRST_CALL_CANDIDATES = 7  # plain + 4 variants + a named form + the cost model's pick
MAX_TUNER_CONFIGS = 24  # per variant and shape in the offline tuner


def skip_reason(op: str, variant: str, N: int, world: int) -> str | None:
    """Why the tuners leave ``variant`` out for this shape (None: try it)."""
    if variant == "copy_engine" and world == 1:
        return "nothing to copy at world 1"
    tiles = -(-N // 256)
    if op == "all_gather_gemm" and variant == "fused_sequential" and world > 1 and tiles > FUSED_AG_MAX_COLUMN_TILES:
        return f"reads every peer's A rows once per column tile ({tiles} of 256): link-bound (tuning/rules.py)"
    return None
