"""``variant="auto"``: pick the variant for a call (per-shape tables come later; heuristic now)."""

from __future__ import annotations


def choose_variant(op: str, a, b, group) -> str:
    """The heuristic until tuned tables exist: the fused sequential kernel."""
    return "fused_sequential"
