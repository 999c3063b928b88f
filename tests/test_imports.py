"""Import order: ``import triton`` before ``import tilefuse`` on a machine without a GPU still runs
every kernel in Triton's interpreter (tilefuse remakes Triton's own ``@triton.jit`` helpers)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from harness import TEST_DEVICE

pytestmark = pytest.mark.skipif(TEST_DEVICE != "cpu", reason="the interpreter's import order")

SCRIPT = textwrap.dedent("""
    import triton  # first, with TRITON_INTERPRET unset
    import torch
    import torch.distributed as dist
    import tilefuse
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
    tilefuse.init(heap_size=32 << 20)
    a, b = torch.randn(8, 64), torch.randn(64, 48)
    for variant in ("bulk_sync", "fused_sequential"):
        c = tilefuse.gemm_all_scatter(a, b, variant=variant)
        assert torch.allclose(c, a @ b, atol=1e-4), variant
    tilefuse.shutdown()
    print("ok")
""")


@pytest.mark.slow
def test_triton_imported_first_still_runs_the_kernels():
    from harness import _free_port

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TILEFUSE_BACKEND="cpu", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(port=_free_port())], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
