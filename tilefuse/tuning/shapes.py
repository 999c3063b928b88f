"""Shape sets (``shapes.json``; ``models``: every model set). A list set holds global GEMMs ``{name, M,
N, K[, ops]}``; a model set ``{layers, tokens_per_rank}`` holds ``[K] -> [N]`` column or row linears at
T tokens per rank, which :func:`local_shape_per_rank` gives each op at world size W:

  =====================  =========  ============================  ==========================
  op                     layer      this rank's ``a``             this rank's ``b``
  =====================  =========  ============================  ==========================
  all_gather_gemm        column     ``[T, K]`` (its SP shard)     ``[K, N/W]``
  gemm_all_scatter       column     ``[T, K]`` (replicated)       ``[K, N/W]``
  gemm_reduce_scatter    row        ``[W*T, K/W]`` (out: T rows)  ``[K/W, N]``
  gemm_all_reduce        row        ``[T, K/W]`` (out: T rows)    ``[K/W, N]``
  =====================  =========  ============================  ==========================
"""

from __future__ import annotations

import json
from pathlib import Path

_PATH = Path(__file__).with_name("shapes.json")
OPS = ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce")
COLUMN_OPS = ("all_gather_gemm", "gemm_all_scatter")
ROW_OPS = ("gemm_reduce_scatter", "gemm_all_reduce")


def _expand_model(name: str, spec: dict) -> list[dict]:
    out = []
    for layer in spec["layers"]:
        kind = layer["kind"]
        if kind not in ("column", "row"):
            raise ValueError(f"shape set {name!r}: layer {layer['name']!r} has kind {kind!r}, not column or row")
        ops = list(COLUMN_OPS if kind == "column" else ROW_OPS)
        out += [{"name": f"{layer['name']}-t{T}", "T": T, "N": layer["N"], "K": layer["K"], "ops": ops}
                for T in layer.get("tokens_per_rank", spec["tokens_per_rank"])]
    return out


def shape_sets() -> dict:
    """Every set as a list of entries (model sets expanded), plus ``models``: all model sets' entries."""
    data = {k: v for k, v in json.loads(_PATH.read_text()).items() if not k.startswith("_")}  # "_doc"
    sets = {k: _expand_model(k, v) if isinstance(v, dict) else v for k, v in data.items()}
    sets["models"] = [e for k, v in data.items() if isinstance(v, dict) for e in sets[k]]
    return sets


def local_shape(op: str, M: int, N: int, K: int, world: int) -> tuple[int, int, int] | None:
    """The (M, N, K) one rank passes to ``op`` for the global GEMM ``a [M, K] @ b [K, N]``, or None
    when W does not divide a sharded dimension."""
    if op == "gemm_all_scatter":
        return (M, N // world, K) if N % world == 0 else None
    if op == "all_gather_gemm":
        return (M // world, N // world, K) if M % world == 0 and N % world == 0 else None
    if op == "gemm_reduce_scatter":
        return (M, N, K // world) if M % world == 0 and K % world == 0 else None
    if op == "gemm_all_reduce":
        return (M, N, K // world) if K % world == 0 else None
    raise ValueError(f"unknown op {op!r}; ops are {OPS}")


def local_shape_per_rank(op: str, T: int, N: int, K: int, world: int) -> tuple[int, int, int] | None:
    """The per-rank (M, N, K) of ``op`` for a layer ``[K] -> [N]`` at T tokens per rank (the table
    above): the global GEMM has W*T rows where the op shards the tokens, else T."""
    return local_shape(op, world * T if op in ("all_gather_gemm", "gemm_reduce_scatter") else T, N, K, world)


def local_shapes(op: str, set_names, world: int) -> list[dict]:
    """Entries ``{name, M, N, K}`` (per-rank operand shapes) of the named sets that apply to ``op``."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; ops are {OPS}")
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
            shape = (local_shape_per_rank(op, entry["T"], entry["N"], entry["K"], world) if "T" in entry
                     else local_shape(op, entry["M"], entry["N"], entry["K"], world))
            if shape is not None:
                out.append({"name": entry["name"], "M": shape[0], "N": shape[1], "K": shape[2]})
    return out
