"""Shape sets (``shapes.json``): global layer GEMMs turned into each op's per-rank operand shapes."""

from __future__ import annotations

import json
from pathlib import Path

_PATH = Path(__file__).with_name("shapes.json")
OPS = ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter")


def shape_sets() -> dict:
    data = json.loads(_PATH.read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def local_shape(op: str, M: int, N: int, K: int, world: int) -> tuple[int, int, int] | None:
    """The (M, N, K) of ``a [M, K] @ b [K, N]`` one rank passes to ``op`` for the global layer GEMM,
    or None when the world size does not divide the sharded dimension.

    gemm_all_scatter shards N (b is a column shard); all_gather_gemm shards M (tokens) and, as a
    column-parallel layer, N; gemm_reduce_scatter shards K (its output rows are split too).
    """
    if op == "gemm_all_scatter":
        return (M, N // world, K) if N % world == 0 else None
    if op == "all_gather_gemm":
        return (M // world, N // world, K) if M % world == 0 and N % world == 0 else None
    if op == "gemm_reduce_scatter":
        return (M, N, K // world) if M % world == 0 and K % world == 0 else None
    raise ValueError(f"unknown op {op!r}; ops are {OPS}")


def local_shapes(op: str, set_names, world: int) -> list[dict]:
    """Entries ``{name, M, N, K}`` (per-rank operand shapes) of the named sets that apply to ``op``."""
    sets = shape_sets()
    if isinstance(set_names, str):
        set_names = [s for s in set_names.split(",") if s]
    out = []
    for set_name in set_names:
        if set_name not in sets:
            raise ValueError(f"unknown shape set {set_name!r}; sets are {sorted(sets)}")
        for entry in sets[set_name]:
            if op not in entry.get("ops", OPS):
                continue
            shape = local_shape(op, entry["M"], entry["N"], entry["K"], world)
            if shape is not None:
                out.append({"name": entry["name"], "M": shape[0], "N": shape[1], "K": shape[2]})
    return out
