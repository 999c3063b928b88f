"""Benchmark results: run facts, long-format CSV rows, text tables, progress, option parsing.

CSV: one row per measurement (long format): ``op, variant, M, N, K, dtype, world, metric, value,
device, torch, triton, commit, date`` and a free-text ``note`` (the error of a failed run). A
benchmark may append columns of its own (``write_csv(..., columns=COLUMNS + [...])``). ``commit`` is
``TILEFUSE_COMMIT`` where set (a device's copy of the checkout may lack ``.git``), else the git
commit (``-dirty`` with local changes), else a hash of the sources.

:class:`Progress`: a tqdm bar on a terminal where tqdm is importable, else a line now and then.
pandas (the ``bench`` extra) is imported only by the functions that read or write CSVs.
"""

from __future__ import annotations

import datetime
import hashlib
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
COLUMNS = ["op", "variant", "M", "N", "K", "dtype", "world", "metric", "value",
           "device", "torch", "triton", "commit", "date", "note"]
DTYPE_NAMES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
               "float16": torch.float16, "half": torch.float16, "fp32": torch.float32,
               "float32": torch.float32, "float": torch.float32}


def _source_hash() -> str:
    """Hash of the package and benchmark sources: identifies the code where git is not available."""
    h = hashlib.sha1()
    for sub in ("tilefuse", "benchmarks"):
        for path in sorted((REPO / sub).rglob("*.py")):
            h.update(str(path.relative_to(REPO)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:10]


def commit_id() -> str:
    """``TILEFUSE_COMMIT``, else the git commit (``-dirty`` with local changes), else a source hash."""
    env = os.environ.get("TILEFUSE_COMMIT", "").strip()
    if env:
        return env
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "src-" + _source_hash()


def run_info(device: torch.device | None = None) -> dict:
    """device, torch, triton, commit, date (UTC) for every CSV row of this run."""
    import triton

    if device is not None and device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = "cpu-interpreter"
    return {
        "device": name,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "commit": commit_id(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def row(op: str, variant: str, M, N, K, dtype, world: int, metric: str, value, note: str = "") -> dict:
    """One long-format measurement (run facts are added by :func:`write_csv`)."""
    return {"op": op, "variant": variant, "M": M, "N": N, "K": K,
            "dtype": str(dtype).replace("torch.", ""), "world": world, "metric": metric,
            "value": value, "note": note}


def read_csv(path):
    """A results CSV as a DataFrame, with text columns kept as text (a commit like ``3436e23`` is not a
    number)."""
    import pandas as pd

    return pd.read_csv(path, dtype={"commit": str, "note": str, "device": str, "torch": str, "triton": str})


def write_csv(rows: list, path: str | os.PathLike, info: dict, append: bool = False,
              columns: list | None = None) -> None:
    """Write ``rows`` (dicts from :func:`row`) with the run facts ``info`` to ``path``.

    ``columns`` (default :data:`COLUMNS`) names the CSV columns in order; keys of a row that are
    not among them are dropped, missing ones are left empty.
    """
    import pandas as pd

    frame = pd.DataFrame([{**info, **r} for r in rows], columns=columns or COLUMNS)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    exists = append and path.exists() and path.stat().st_size > 0
    frame.to_csv(path, mode="a" if exists else "w", header=not exists, index=False)


def write_rows(path: str | os.PathLike, rows: list, columns: list, **facts) -> None:
    """Write ``rows`` (dicts) to the CSV ``path`` with the columns ``columns``, each row completed
    by ``facts`` (the device, the commit...), with the standard library only (no pandas), and say so
    on stderr."""
    import csv
    import sys

    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        for r in rows:
            w.writerow({**r, **facts})
    print(f"wrote {len(rows)} rows to {path}", file=sys.stderr)


def _cell(value) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return f"{value:.0f}"
        if abs(value) >= 1e-2:
            return f"{value:.3g}" if abs(value) < 100 else f"{value:.1f}"
        return f"{value:.2e}"
    return str(value)


def format_table(records: list, columns: list, title: str | None = None) -> str:
    """A fixed-width text table of ``records`` (dicts) with ``columns`` in order."""
    cells = [[_cell(r.get(c, "")) for c in columns] for r in records]
    widths = [max([len(c)] + [len(row_[i]) for row_ in cells]) for i, c in enumerate(columns)]
    lines = [] if title is None else [title]
    lines.append("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    lines.append("  ".join("-" * w for w in widths))
    for row_ in cells:
        lines.append("  ".join(v.rjust(w) if _numeric(v) else v.ljust(w) for v, w in zip(row_, widths)))
    return "\n".join(lines)


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def print_table(records: list, columns: list, title: str | None = None) -> None:
    print(format_table(records, columns, title), flush=True)


def parse_bytes(text: str) -> int:
    """``4K``, ``1M``, ``1G`` or a plain byte count."""
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def parse_dtype(name: str) -> torch.dtype:
    """``bf16``/``bfloat16``, ``fp16``/``float16``, ``fp32``/``float32``."""
    try:
        return DTYPE_NAMES[name.strip().lower().removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use one of {sorted(DTYPE_NAMES)}") from None


class Progress:
    """Progress of a long run on stderr: a tqdm bar where tqdm is importable and stderr is a
    terminal, else a plain ``[done/total]`` line at most every ``every_s`` seconds (a log file
    then gets a few readable lines instead of a stream of carriage returns). ``enabled=False``
    prints nothing (pass it on every rank but the one that reports)."""

    def __init__(self, total: int, desc: str = "", enabled: bool = True, every_s: float = 30.0):
        self.total, self.desc, self.enabled, self.every_s = total, desc, enabled, every_s
        self.done = 0
        self._last = time.monotonic()
        self._file = sys.stderr
        self._bar = None
        if enabled and self._file.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total, desc=desc, file=self._file, dynamic_ncols=True, leave=True)

    def update(self, n: int = 1, what: str = "") -> None:
        self.done += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
            if what:
                self._bar.set_postfix_str(what, refresh=False)
            return
        now = time.monotonic()
        if now - self._last >= self.every_s or self.done >= self.total:
            self._last = now
            print(f"{self.desc} [{self.done}/{self.total}] {what}".strip(), file=self._file, flush=True)

    def write(self, text: str) -> None:
        """Print a line without breaking the bar (nothing when disabled)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text, file=sys.stdout)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
