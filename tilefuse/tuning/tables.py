"""Per-shape config tables ``<dir>/<op>/<arch>_ws<W>.json`` (schema and lookup: ``tilefuse/configs/README.md``).
A malformed table raises :class:`TableError` naming the file and the entry; it is never skipped."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..ops.common.config import Config

SCHEMA_VERSION = 1
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "configs"
PLAIN = "plain"  # torch.matmul + torch.distributed collective
# Float8 entries are keyed by a's dtype (b's float8 kind and the scales' layout do not change the choice).
_DTYPES = ("float16", "bfloat16", "float32", "float8_e4m3fn", "float8_e5m2")
VARIANTS = ("bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized", "copy_engine", PLAIN)
_CACHE: dict = {}  # path -> (mtime_ns, entries)
_CHOICES: dict = {}  # lookup's key -> Choice or None
_GENERATION = [0]  # bumped by clear_cache: callers that remember choices key them on it
FLAT_MAX = 16  # M <= FLAT_MAX: one M bucket
OCTAVE_MAX = 256  # FLAT_MAX < M <= OCTAVE_MAX: one bucket per power of two; above, two


class TableError(ValueError):
    """A config table that does not follow the schema."""


@dataclass(frozen=True)
class Choice:
    """What a table says to run for a shape."""

    variant: str
    config: Config | None
    source: str  # "exact <file>", "bucket <file> (M, N, K)"; auto's: "cache", "tuned", "model", "default ..."
    graph: tuple | None = None  # (variant, config) inside CUDA graphs, from an entry's ``graph``; None: the same

    def for_graphs(self) -> Choice:
        return self if self.graph is None else Choice(*self.graph, f"{self.source}, inside CUDA graphs")


def graph_of(entry: dict) -> tuple | None:
    """An entry's ``graph`` (``{"variant", "config"}``, optional) as ``Choice.graph``."""
    g = entry.get("graph")
    if not g:
        return None
    try:
        if g["variant"] not in VARIANTS:
            raise ValueError(f"variant {g['variant']!r} is not one of {VARIANTS}")
        return (g["variant"], None if g["variant"] == PLAIN or not g.get("config") else Config.from_dict(g["config"]))
    except (TypeError, KeyError, ValueError) as err:  # a ValueError: auto's decision reports it on every rank
        raise ValueError(f"malformed 'graph' {g!r}: {err}") from None


def m_bucket(M: int) -> tuple[int, int]:
    """The bucket ``(lo, hi)`` of ``M`` (both inclusive): the token counts that share one ``variant="auto"``
    decision (the kernels run the exact M). M <= 16 is one (decode reads the weights once whatever M is);
    to 256, one per power of two; above, two per power of two split at 1.5x: ``(256, 384], (384, 512], ...``."""
    if not isinstance(M, int) or isinstance(M, bool) or M < 1:
        raise ValueError(f"m_bucket: M must be a positive int, got {M!r}")
    if M <= FLAT_MAX:
        return (1, FLAT_MAX)
    top = 1 << (M - 1).bit_length()  # the smallest power of two >= M
    if M <= OCTAVE_MAX:
        return (top // 2 + 1, top)
    mid = top // 2 + top // 4  # 1.5x the power of two below
    return (top // 2 + 1, mid) if M <= mid else (mid + 1, top)


def bucket_name(bucket: tuple[int, int]) -> str:
    return f"M{bucket[0]}-{bucket[1]}"


def table_path(directory: Path, op: str, arch: str, world: int) -> Path:
    return Path(directory) / op / f"{arch}_ws{world}.json"


def search_dirs() -> list[Path]:
    return [Path(p) for p in os.environ.get("TILEFUSE_CONFIG_DIR", "").split(os.pathsep) if p] + [SHIPPED_DIR]


def _require(ok, path, where: str, msg: str) -> None:
    if not ok:
        raise TableError(f"config table {path}: {where}: {msg}")


def validate_table(data, path="<table>") -> list[dict]:
    """Check ``data`` against the schema; return its entries (raises TableError)."""
    _require(isinstance(data, dict), path, "top level", "must be a JSON object")
    for key in ("schema", "op", "arch", "world_size", "provenance", "entries"):
        _require(key in data, path, "top level", f"missing key {key!r}")
    _require(data["schema"] == SCHEMA_VERSION, path, "schema", f"version {data['schema']!r} is not {SCHEMA_VERSION}")
    _require(isinstance(data["entries"], list), path, "entries", "must be a list")
    seen = set()
    for i, e in enumerate(data["entries"]):
        _require(isinstance(e, dict), path, f"entry {i}", "must be an object")
        for key in ("M", "N", "K", "dtype", "variant", "config", "time_ms", "plain_ms"):
            _require(key in e, path, f"entry {i}", f"missing key {key!r}")
        for key in ("M", "N", "K"):
            _require(isinstance(e[key], int) and e[key] >= 1, path, f"entry {i}",
                     f"{key} must be a positive int, got {e[key]!r}")
        where = f"entry {i} ({e['M']}x{e['N']}x{e['K']} {e['dtype']})"
        _require(e["dtype"] in _DTYPES, path, where, f"dtype {e['dtype']!r} is not one of {_DTYPES}")
        _require(e["variant"] in VARIANTS, path, where, f"variant {e['variant']!r} is not one of {VARIANTS}")
        if e["variant"] != PLAIN:
            _require(isinstance(e["config"], dict), path, where, "config must be an object for a tilefuse variant")
            try:
                Config.from_dict(e["config"])
            except (TypeError, ValueError) as err:
                _require(False, path, where, f"bad config: {err}")
        try:
            if e.get("graph") is not None and graph_of(e) is None:
                raise ValueError(f"graph must name a variant of {VARIANTS}, got {e['graph']!r}")
        except ValueError as err:
            _require(False, path, where, str(err))
        key = (e["M"], e["N"], e["K"], e["dtype"])
        _require(key not in seen, path, where, "duplicate shape")
        seen.add(key)
    return data["entries"]


def load_table(path: Path) -> list[dict] | None:
    """Entries of the table at ``path`` (None if there is none); cached by modification time."""
    path = Path(path)
    try:
        mtime = path.stat().st_mtime_ns
    except FileNotFoundError:
        return None
    hit = _CACHE.get(path)
    if hit is None or hit[0] != mtime:
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise TableError(f"config table {path}: not valid JSON: {err}") from None
        hit = _CACHE[path] = (mtime, validate_table(data, path))
    return hit[1]


def _choice(e: dict, source: str) -> Choice:
    return Choice(e["variant"], None if e["variant"] == PLAIN else Config.from_dict(e["config"]), source, graph_of(e))


def clear_cache() -> None:
    """Forget what was read; ``variant="auto"`` then decides again, collectively: call it on every rank."""
    _CACHE.clear()
    _CHOICES.clear()
    _GENERATION[0] += 1


def generation() -> int:
    """How many times :func:`clear_cache` has run (choices remembered under an older one are stale)."""
    return _GENERATION[0]


def lookup(op: str, arch: str, world: int, M: int, N: int, K: int, dtype: str) -> Choice | None:
    """The table's choice for this call, or None. Remembered per call signature (an op call makes no
    file-system request): a table rewritten by hand is seen after :func:`clear_cache`."""
    key = (op, arch, world, M, N, K, dtype, os.environ.get("TILEFUSE_CONFIG_DIR", ""), str(SHIPPED_DIR))
    if key in _CHOICES:
        return _CHOICES[key]
    lo, hi = m_bucket(M)
    choice = None  # an exact entry in any directory beats a bucket entry in an earlier one
    for directory in search_dirs():
        path = table_path(directory, op, arch, world)
        entries = load_table(path) or []
        if exact := [e for e in entries if (e["M"], e["N"], e["K"], e["dtype"]) == (M, N, K, dtype)]:
            choice = _choice(exact[0], f"exact {path}")
            break
        same = [e for e in entries if (e["N"], e["K"], e["dtype"]) == (N, K, dtype) and lo <= e["M"] <= hi]
        if choice is None and same:
            best = min(same, key=lambda e: (abs(e["M"] - M), e["M"]))
            choice = _choice(best, f"bucket {path} ({best['M']}, {best['N']}, {best['K']})")
    _CHOICES[key] = choice
    return choice


def write_table(directory, op: str, arch: str, world: int, entries: list[dict], provenance: dict) -> Path:
    """Merge ``entries`` into the table (same shape: replaced), validate, write it and return its path.
    ``provenance`` describes this run; each entry keeps the ``commit`` and ``date`` that tuned it (``tuned``)."""
    path = table_path(directory, op, arch, world)
    old_data = json.loads(path.read_text()) if path.exists() else {}
    old_stamp = {k: old_data.get("provenance", {}).get(k) for k in ("commit", "date")}
    old = [dict(e, tuned=e.get("tuned", old_stamp)) for e in old_data.get("entries", [])]
    stamp = {k: provenance.get(k) for k in ("commit", "date")}
    keys = {(e["M"], e["N"], e["K"], e["dtype"]) for e in entries}
    merged = [e for e in old if (e["M"], e["N"], e["K"], e["dtype"]) not in keys]
    merged += [dict(e, tuned=e.get("tuned", stamp)) for e in entries]
    merged.sort(key=lambda e: (e["dtype"], e["M"], e["N"], e["K"]))
    data = {"schema": SCHEMA_VERSION, "op": op, "arch": arch, "world_size": world,
            "provenance": provenance, "entries": merged}
    validate_table(data, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # then renamed: a reader never sees half a table
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
    clear_cache()
    return path
