"""The wheel works outside the checkout: build it, install it into a temporary folder, and from a
temporary working directory (no checkout on ``sys.path``) run the tuner's ``--help`` and load the
shipped config tables and shape sets.

Needs no network (``--no-deps --no-build-isolation``: the build uses this environment's setuptools,
and the installed package uses this environment's torch and triton). Deselect with
``-m "not packaging"``; it is skipped where setuptools or pip is missing.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Not copied into the build tree: the environment, VCS data, build and benchmark outputs.
SKIP_DIRS = {".venv", "venv", ".git", "build", "dist", "bench_out", "__pycache__", ".pytest_cache", ".ruff_cache"}

pytestmark = [
    pytest.mark.packaging,
    pytest.mark.skipif(importlib.util.find_spec("setuptools") is None or importlib.util.find_spec("pip") is None,
                       reason="building the wheel needs setuptools and pip in this environment"),
]


def _copy_tree(dst: Path) -> None:
    """The checkout without its environment and outputs: an in-tree build would reuse a stale
    ``build/lib`` (files deleted from the source would still ship)."""
    def ignore(folder, names):
        return [n for n in names if n in SKIP_DIRS or n.endswith(".egg-info")]

    shutil.copytree(REPO, dst, ignore=ignore)


def _shipped_data() -> set:
    """Data files the package must carry, relative to the repository root."""
    files = {p for p in (REPO / "tilefuse" / "configs").rglob("*.json")}
    files |= set((REPO / "tilefuse" / "tuning").glob("*.json"))
    return {p.relative_to(REPO).as_posix() for p in files}


def _version_in_source() -> str:
    text = (REPO / "tilefuse" / "_version.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"$', text, flags=re.M)
    assert match, "tilefuse/_version.py must assign __version__ a string literal"
    return match.group(1)


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TILEFUSE_"))}
    env.update(TILEFUSE_BACKEND="cpu", TRITON_INTERPRET="1")
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel path, install folder) of a wheel built from a copy of the checkout."""
    root = tmp_path_factory.mktemp("wheel")
    src, wheels, target = root / "src", root / "wheels", root / "site"
    _copy_tree(src)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheels), str(src)], capture_output=True, text=True, timeout=120,
                           env=_clean_env(), cwd=root)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (wheel,) = wheels.glob("tilefuse-*.whl")
    inst = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                           "--target", str(target), str(wheel)], capture_output=True, text=True, timeout=120,
                          env=_clean_env(), cwd=root)
    assert inst.returncode == 0, inst.stdout[-3000:] + inst.stderr[-3000:]
    return wheel, target


def _run(target: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = _clean_env()
    env["PYTHONPATH"] = str(target)  # the installed wheel only; cwd is a fresh folder
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


def test_wheel_carries_data_license_and_honest_metadata(installed):
    wheel, _ = installed
    version = _version_in_source()
    assert wheel.name.startswith(f"tilefuse-{version}-"), wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = z.read(meta_name).decode()
    missing = _shipped_data() - names
    assert not missing, f"data files not in the wheel: {sorted(missing)}"
    assert any(n.endswith("configs/README.md") for n in names)
    assert any(re.search(r"\.dist-info/(licenses/)?LICENSE$", n) for n in names), "LICENSE not in the wheel"
    assert not [n for n in names if n.startswith(("benchmarks/", "tests/", "examples/"))]
    assert f"Version: {version}" in meta
    required = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    hard = [r for r in required if "extra ==" not in r]
    assert sorted(re.split(r"[<>=;\s\[]", r)[0] for r in hard) == ["numpy", "torch", "triton"], hard
    assert any(r.startswith("pandas") and "extra ==" in r for r in required), required


@pytest.mark.slow  # installs the wheel into a fresh environment and tunes there: the longest end-to-end run
def test_installed_wheel_runs_the_tuner_and_loads_its_tables(installed, tmp_path):
    _, target = installed
    # `python -m tilefuse.tune` must keep working; `python -m tilefuse.tuning` too where the wheel has it.
    # One interpreter runs both as `-m` would (runpy) and then loads the tables: each fresh Python
    # that imports torch costs seconds.
    has_tuning_main = (target / "tilefuse" / "tuning" / "__main__.py").exists()
    modules = ["tilefuse.tune"] + (["tilefuse.tuning"] if has_tuning_main else [])

    script = f"""
import contextlib, io, json, pathlib, runpy, sys
helps = {{}}
for module in {modules!r}:
    sys.argv = [module, "--help"]
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exit:
            code = exit.code or 0
    helps[module] = [code, text.getvalue()]
import tilefuse
from tilefuse.tuning import shapes, tables
from tilefuse.ops import registry
target = pathlib.Path({str(target)!r}).resolve()
here = pathlib.Path(tilefuse.__file__).resolve()
assert target in here.parents, f"tilefuse imported from {{here}}, not from the installed wheel"
assert tables.SHIPPED_DIR.resolve().is_relative_to(target), tables.SHIPPED_DIR
version = getattr(tilefuse, "__version__", None)
if version is None:  # tilefuse/__init__.py does not re-export it yet
    from tilefuse._version import __version__ as version
loaded = {{}}
for path in sorted(tables.SHIPPED_DIR.glob("*/*.json")):
    entries = tables.load_table(path)
    assert entries, f"{{path}}: no entries"
    loaded[path.relative_to(tables.SHIPPED_DIR).as_posix()] = len(entries)
# A lookup through the search path finds a shipped entry exactly.
path = sorted(tables.SHIPPED_DIR.glob("*/*.json"))[0]
data = json.loads(path.read_text())
e = data["entries"][0]
choice = tables.lookup(data["op"], data["arch"], data["world_size"], e["M"], e["N"], e["K"], e["dtype"])
assert choice is not None and choice.source.startswith("exact"), choice
sets = shapes.shape_sets()
assert sets and all(sets.values()), "no shape sets"
print(json.dumps({{"version": version, "tables": loaded, "sets": sorted(sets), "ops": list(registry.OPS),
                  "helps": helps}}))
"""
    got = _run(target, "-c", script, cwd=tmp_path)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    import json

    report = json.loads(got.stdout.strip().splitlines()[-1])
    assert sorted(report["helps"]) == sorted(modules)
    for module, (code, text) in report["helps"].items():
        assert code == 0, f"{module} --help exited with {code}: {text[-2000:]}"
        assert "--op" in text and "--shapes" in text, f"{module} --help: {text[-2000:]}"
    assert report["version"] == _version_in_source()
    shipped = {p.relative_to(REPO / "tilefuse" / "configs").as_posix()
               for p in (REPO / "tilefuse" / "configs").glob("*/*.json")}
    assert set(report["tables"]) == shipped
    assert "tiny" in report["sets"]
