"""The user's decision cache ``<dir>/autotune.json``, keyed by all a measurement depends on (:func:`entry_key`).
Writers lock, merge and rename; a file or entry that breaks the schema is warned about and ignored."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import torch
import triton

from .._version import __version__
from ..ops.common.config import Config, check_config_fits, check_variant_config
from .rules import COMM_VARIANTS
from .tables import VARIANTS

log = logging.getLogger("tilefuse")

SCHEMA_VERSION = 1
FILE_NAME = "autotune.json"
LOCK_TIMEOUT_S = 10.0
_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_LOADED: dict = {}  # path -> ((mtime_ns, size, inode), entries)
_WARNED: set = set()


class CacheDirError(ValueError):
    """A cache directory that tilefuse refuses to write to (inside the installed package)."""


def cache_dir() -> Path:
    """``TILEFUSE_CACHE_DIR``, else ``$XDG_CACHE_HOME/tilefuse``, else ``~/.cache/tilefuse``; never
    inside the installed package (:class:`CacheDirError`)."""
    explicit = os.environ.get("TILEFUSE_CACHE_DIR", "")
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    path = Path(explicit).expanduser() if explicit else Path(base).expanduser() / "tilefuse"
    if _PACKAGE_DIR in (path.resolve(), *path.resolve().parents):
        raise CacheDirError(f"TILEFUSE_CACHE_DIR={path} is inside the tilefuse package ({_PACKAGE_DIR}): "
                            "choose a directory outside it")
    return path


def cache_path() -> Path:
    return cache_dir() / FILE_NAME


def entry_key(arch: str, world: int, op: str, dtype: str, N: int, K: int, bucket: tuple[int, int]) -> str:
    """E.g. ``nvidia-h200|ws2|gemm_all_scatter|bfloat16|N7168|K4096|M513-768|torch2.11.0|triton3.6.0|tilefuse0.1.0``."""
    return (f"{arch}|ws{world}|{op}|{dtype}|N{N}|K{K}|M{bucket[0]}-{bucket[1]}|"
            f"torch{torch.__version__}|triton{triton.__version__}|tilefuse{__version__}")


def _valid_entry(e) -> bool:
    if not isinstance(e, dict) or e.get("variant") not in VARIANTS:
        return False
    try:
        if e["variant"] != "plain" and e.get("config") is not None:  # no config: the variant's own default
            Config.from_dict(e["config"])
        return True
    except (TypeError, ValueError, AttributeError):
        return False


def _read(path: Path) -> dict:
    """Entries of the file at ``path`` ({} if there is none or it is unusable: warned, not raised)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:  # unreadable, or a JSONDecodeError
        log.warning("tilefuse: the autotune cache %s is unreadable or not valid JSON (%s): ignored", path, err)
        return {}
    if not isinstance(data, dict) or data.get("schema") != SCHEMA_VERSION or not isinstance(data.get("entries"), dict):
        log.warning("tilefuse: the autotune cache %s does not follow schema %d: ignored", path, SCHEMA_VERSION)
        return {}
    out = {key: e for key, e in data["entries"].items() if _valid_entry(e)}
    for key in [k for k in data["entries"] if k not in out]:
        log.warning("tilefuse: autotune cache %s: entry %r is malformed: ignored", path, key)
    return out


def load(path: Path | None = None) -> dict:
    """Every valid entry of the cache file, re-read when the file changes."""
    path = Path(path) if path is not None else cache_path()
    try:
        st = path.stat()
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
    except FileNotFoundError:
        return {}
    hit = _LOADED.get(path)
    if hit is None or hit[0] != stamp:
        hit = _LOADED[path] = (stamp, _read(path))
    return hit[1]


def decision(key: str, op: str, variants, num_sms: int | None = None) -> tuple[dict, Config | None] | None:
    """``(entry, config)`` of the cached decision ``key`` for ``op`` where it can be used, else None.

    The cache never breaks a call: an unusable directory or file, or an entry whose variant is not in
    ``variants`` or whose config that variant refuses (or needs more than ``num_sms`` programs), is
    warned about once, naming the cache path, and the decision goes on without it."""
    where = os.environ.get("TILEFUSE_CACHE_DIR", "") or "the default cache directory"
    try:
        where = str(path := cache_path())
        e = load(path).get(key)
    except (OSError, ValueError) as err:  # NotADirectoryError, PermissionError, CacheDirError, ...
        _warn_once("tilefuse: the autotune cache %s cannot be used (%s: %s): deciding without it", where,
                   type(err).__name__, err)
        return None
    if e is None:
        return None
    variant = e["variant"]
    try:
        if variant not in variants:
            raise ValueError(f"{op} has no variant {variant!r}")
        cfg = Config.from_dict(e["config"]) if variant != "plain" and e.get("config") else None
        if cfg is not None:
            check_variant_config(op, variant, cfg)
            if num_sms is not None:
                check_config_fits(cfg, num_sms)
            if variant in COMM_VARIANTS and cfg.COMM_SMS < 1:
                raise ValueError(f"{variant} needs COMM_SMS >= 1 communication programs, got {cfg.COMM_SMS}")
    except (TypeError, ValueError) as err:
        _warn_once("tilefuse: autotune cache %s: entry %r is refused (%s): deciding without it", where, key, err)
        return None
    return e, cfg


def _warn_once(text: str, *args) -> None:
    if (text, args) not in _WARNED:
        _WARNED.add((text, args))
        log.warning(text, *args)


@contextlib.contextmanager
def _locked(path: Path, timeout: float):
    """An exclusive ``flock`` on ``<path>.lock``, waited for at most ``timeout`` seconds (then none)."""
    lock_path = path.with_name(path.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            if time.monotonic() >= deadline:
                log.warning("tilefuse: the autotune cache lock %s stayed taken for %.0f s: writing without it",
                            lock_path, timeout)
                break
            time.sleep(0.01)
        yield
    finally:
        os.close(fd)  # releases the lock


def put(entries: dict, path: Path | None = None, *, timeout: float = LOCK_TIMEOUT_S) -> Path:
    """Merge ``{key: entry}`` into the cache file (atomically, under the lock); return its path."""
    path = Path(path) if path is not None else cache_path()
    for key, e in entries.items():
        if not _valid_entry(e):
            raise ValueError(f"autotune cache: entry {key!r} is malformed: {e!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path, timeout):
        merged = {**_read(path), **entries}
        data = {"schema": SCHEMA_VERSION, "entries": dict(sorted(merged.items()))}
        fd, tmp = tempfile.mkstemp(prefix=FILE_NAME + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(data, indent=1) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
    _LOADED.pop(path, None)
    return path
