"""The README's example runs as written: its python block, run under torchrun on 2 ranks (CPU ranks in
Triton's interpreter here; one rank per GPU with TILEFUSE_TEST_DEVICE=cuda and two GPUs), prints
what it says and computes what its comments say. The scripts in examples/ show their torchrun line,
import nothing from the repository's benchmarks, and run with only the tilefuse package importable."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness import TEST_DEVICE

REPO = Path(__file__).resolve().parents[1]
WORLD = 2

# Appended to the example: its results against torch's own collectives and matmul in fp32.
CHECK = """
rank, world = dist.get_rank(), dist.get_world_size()
parts = [torch.empty_like(x) for _ in range(world)]
dist.all_gather(parts, x)
want_y = torch.cat(parts).float() @ w.float()
want_z = torch.cat([p.float() @ w.float() for p in parts], dim=1)
torch.testing.assert_close(y.float(), want_y, rtol=1e-2, atol=1e-1)
torch.testing.assert_close(z.float(), want_z, rtol=1e-2, atol=1e-1)
print("checked", rank)
"""


def readme_example(readme: Path = REPO / "README.md") -> str:
    """The first python block under the README's "## Example" heading."""
    text = readme.read_text()
    section = text.split("\n## Example", 1)
    assert len(section) == 2, "README.md has no '## Example' section"
    block = re.search(r"^```python\n(.*?)^```", section[1], re.M | re.S)
    assert block, "README.md's Example section has no python block"
    return block.group(1)


def run_under_torchrun(script: Path, logs: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """torchrun on ``script``; each rank's stdout and stderr also in ``logs/*/attempt_0/<rank>/``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    if TEST_DEVICE == "cpu":
        env.update(TILEFUSE_BACKEND="cpu", TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
           "--tee", "3", "--log-dir", str(logs), str(script)]
    return subprocess.run(cmd, env=env, cwd=script.parent, capture_output=True, text=True, timeout=timeout)


def test_readme_example_runs_as_written(tmp_path):
    if TEST_DEVICE == "cuda":
        import torch

        if torch.cuda.device_count() < WORLD:
            pytest.skip("the example runs one rank per GPU")
    code = readme_example()
    assert "tilefuse.Config(" not in code, "the example names a variant, not a hand-made config"
    script = tmp_path / "example.py"
    script.write_text(code + CHECK)
    proc = run_under_torchrun(script, tmp_path / "logs")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    for rank in range(WORLD):
        printed = [p.read_text() for p in (tmp_path / "logs").glob(f"*/attempt_0/{rank}/stdout.log")]
        assert printed, f"rank {rank} left no stdout log:\n{out[-6000:]}"
        lines = printed[0].splitlines()
        assert lines == [f"{rank} ({WORLD * 64}, 128) (64, {WORLD * 128})", f"checked {rank}"], (lines, out[-6000:])


def test_the_extractor_takes_the_example_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# x\n```python\nbefore = 1\n```\n## Example\ntext\n```bash\nls\n```\n"
                      "```python\nafter = 2\n```\n```python\nlater = 3\n```\n")
    assert readme_example(readme) == "after = 2\n"


EXAMPLES = REPO / "examples"


def imported_modules(path: Path) -> set:
    tree = ast.parse(path.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return names | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def test_examples_show_their_torchrun_line_and_import_no_benchmarks():
    scripts = sorted(EXAMPLES.glob("*.py"))
    assert {"demo.py", "tp_mlp.py", "tp_llama.py"} <= {p.name for p in scripts}
    for path in scripts:
        assert not {m for m in imported_modules(path) if m.split(".")[0] == "benchmarks"}, path.name
        assert "sys.path" not in path.read_text(), f"{path.name} reaches into the checkout"
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert re.search(rf"^\s*torchrun --nproc-per-node \d+ examples/{path.name}", doc, re.M), path.name
    assert imported_modules(EXAMPLES / "demo.py") >= {"tilefuse", "tilefuse.runtime"}


def installed_like(tmp_path: Path) -> dict:
    """An environment in which only the tilefuse package is importable from this checkout."""
    site = tmp_path / "site"
    shutil.copytree(REPO / "tilefuse", site / "tilefuse", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    if TEST_DEVICE == "cpu":
        env.update(TILEFUSE_BACKEND="cpu", TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    return env


@pytest.mark.slow  # every op x variant in Triton's interpreter, under torchrun
@pytest.mark.parametrize("script", ["demo.py", "tp_mlp.py"])
def test_examples_run_with_only_tilefuse_installed(tmp_path, script):
    env = installed_like(tmp_path)
    (tmp_path / "examples").mkdir()
    shutil.copy(EXAMPLES / script, tmp_path / "examples" / script)
    probe = subprocess.run([sys.executable, "-c", "import benchmarks"], env=env, cwd=tmp_path, capture_output=True)
    assert probe.returncode != 0, "benchmarks is importable: the run would not show a dependency on it"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
           f"examples/{script}"]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert ("ALL OK" if script == "demo.py" else "OK") in proc.stdout, out[-6000:]
