"""A program that never calls ``tilefuse.shutdown()`` exits cleanly: exit code 0 on every rank, no
"terminate called" (an abort in a C++ destructor), and the heaps closed by tilefuse's exit hook
while torch still works. Real processes: a multiprocessing child skips the interpreter's exit."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from harness import TEST_DEVICE

REPO = Path(__file__).resolve().parents[1]

_SCRIPT = r"""
import atexit, sys
import torch
import torch.distributed as dist
import tilefuse

rank, world, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if torch.cuda.is_available():
    torch.cuda.set_device(rank % torch.cuda.device_count())
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
# Registered before tilefuse's exit hook, so it runs after it: the heaps must be closed by then.
atexit.register(lambda: print("closed at exit:", not tilefuse.is_initialized(), flush=True))
heap = tilefuse.init(heap_size=16 << 20)
a = torch.randn(8, 16, device=heap.device)
b = torch.randn(16, 16, device=heap.device)
c = tilefuse.all_gather_gemm(a, b, variant="fused_sequential")
kept = tilefuse.zeros(4)  # a heap tensor still held at exit
tilefuse.synchronize()
print("result", tuple(c.shape), flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_once(world: int = 2) -> list:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if TEST_DEVICE == "cpu":
        env.update(TILEFUSE_BACKEND="cpu", TRITON_INTERPRET="1")
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, "-c", _SCRIPT, str(r), str(world), port], env=env, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        out.append((p.returncode, stdout, stderr))
    return out


def _check(runs: list) -> None:
    for i, ranks in enumerate(runs):
        for rank, (code, stdout, stderr) in enumerate(ranks):
            where = f"run {i}, rank {rank}: exit code {code}\n{stdout}\n{stderr[-3000:]}"
            assert code == 0, where
            assert "terminate called" not in stderr, where
            assert "result (16, 16)" in stdout and "closed at exit: True" in stdout, where


@pytest.mark.slow
def test_a_program_without_shutdown_exits_cleanly():
    _check([_run_once()])


@pytest.mark.slow
def test_twenty_programs_without_shutdown_exit_cleanly():
    _check([_run_once() for _ in range(20)])
