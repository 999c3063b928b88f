"""What first-call tuning and the offline tuner both leave out of their search, and their limits:
all_gather_gemm's ``fused_sequential`` reads a peer's A rows once per column tile (no reuse): link-bound
above ``FUSED_AG_MAX_COLUMN_TILES`` tiles of 256 from W = 2. ``copy_engine`` has nothing to copy at W = 1.
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
