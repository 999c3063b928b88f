"""``variant="auto"``: pick the variant for a call (per-shape tables come later; heuristic now)."""

from __future__ import annotations

from . import registry


def choose_variant(op: str, a, b, group) -> str:
    """The heuristic until tuned tables exist: fused sequential where the op has it."""
    available = registry.variants(op)
    for name in ("fused_sequential", "bulk_sync", "reference"):
        if name in available:
            return name
    raise ValueError(f"{op}: no variant registered")
