"""Helpers shared by the op test files: inputs, poisoning, tolerances, comparison."""

from __future__ import annotations

import contextlib
import math
import os

import pytest
import torch

import tilefuse
from tilefuse.ops.common import arena

# `make test` keeps each op's matrices small enough for 2 cores: world 1 and 4, world 2 of the
# barrier-ordered variants (world 3 keeps them), and their late-rank and back-to-back checks (their
# flagged siblings keep those) are marked slow and run in `make test-all` and on GPUs.
FLAGGED = ("producer_consumer", "wg_specialized")


def interpreter_breaks_on_numpy() -> bool:
    """Whether Triton's interpreter here fails every collective call: Triton 3.6's interpreter hands a
    kernel's int argument over as a 1-element array and turns it into a loop bound with ``int()``,
    which NumPy 2.5 refuses (``range(0, world)`` in the begin of every call; seen on the GPU image,
    triton 3.6.0 with numpy 2.5.2). Triton 3.7 squeezes the array first."""
    import numpy
    import triton

    def version(mod):
        return tuple(int(x) for x in mod.__version__.split(".")[:2])

    return version(triton) < (3, 7) and version(numpy) >= (2, 5)


# For the tests that run CPU ranks in Triton's interpreter in a subprocess (on GPU machines too).
needs_working_interpreter = pytest.mark.skipif(
    interpreter_breaks_on_numpy(), reason="Triton < 3.7 interpreter with NumPy >= 2.5 (int() of a 1-element "
    "array in every call's begin): the CPU ranks need the Makefile's triton 3.7.1")


def variant_world_matrix(variants) -> list:
    """``(variant, world)`` pairs for a parametrize over every variant and W = 1..4, the pairs that
    `make test` leaves out marked slow."""
    out = []
    for world in (1, 2, 3, 4):
        for v in variants:
            slow = world in (1, 4) or (world == 2 and v not in FLAGGED)
            out.append(pytest.param(v, world, marks=pytest.mark.slow) if slow else (v, world))
    return out


def flagged_first(variants) -> list:
    """``variants`` for a parametrize: all but producer_consumer marked slow (the flag handover that
    wg_specialized shares with it runs in `make test` once; the barrier-ordered ones and
    wg_specialized in the slow set)."""
    return [v if v == FLAGGED[0] else pytest.param(v, marks=pytest.mark.slow) for v in variants]


def dtypes(on_gpu: bool) -> list:
    """fp16 and fp32 everywhere; bf16 only on GPUs (the interpreter's bf16 arithmetic is wrong)."""
    return [torch.float16, torch.float32] + ([torch.bfloat16] if on_gpu else [])


def randn(shape, dtype, device, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype=dtype, device=device)


def poison_workspaces(epoch_floor: bool = True) -> None:
    """Fill every op workspace with garbage before a call (collective: barrier around it).

    Floating-point buffers get NaN (an unwritten tile then fails the comparison). ``flags*``
    buffers get stale sequence numbers, at most the last call's (a consumer that does not wait for
    this call's value then reads garbage).
    """
    from tilefuse.runtime import control_block, primitives

    tilefuse.barrier()
    seq = int(control_block()[int(primitives.CTL_SEQ)].item())
    for i, ws in enumerate(arena.workspaces()):
        for name, buf in ws.buffers.items():
            if buf.dtype.is_floating_point:
                buf.fill_(float("nan"))
            elif name.startswith("flags") and epoch_floor:
                g = torch.Generator().manual_seed((seq % 2**31) * 1000 + i)
                # Any value but the next call's sequence number is stale (the comparison is equality).
                stale = torch.randint(0, 1000, buf.shape, generator=g, dtype=torch.int64)
                stale = seq - stale  # wraps like the device counter near 2**63
                buf.copy_(stale.to(buf.dtype))
    tilefuse.barrier()


def tolerance(dtype: torch.dtype, K: int, on_gpu: bool) -> tuple[float, float]:
    """(rtol, atol per unit of output magnitude) for an fp32-accumulated GEMM with inner size K."""
    if dtype == torch.float16:
        return 1e-2, 2e-3 * math.sqrt(K)
    if dtype == torch.bfloat16:
        return 2e-2, 1.6e-2 * math.sqrt(K)
    # fp32: tf32 tensor cores on a GPU, true fp32 in the interpreter.
    return (1e-2, 2e-3 * math.sqrt(K)) if on_gpu else (1e-4, 1e-5 * math.sqrt(K))


def assert_matches(got: torch.Tensor, ref: torch.Tensor, dtype, K: int, on_gpu: bool, what: str,
                   scale: float = 1.0) -> None:
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype} != {ref.dtype}"
    assert not torch.isnan(got).any(), f"{what}: NaN in the result (unwritten tile?)"
    rtol, atol = tolerance(dtype, K, on_gpu)
    torch.testing.assert_close(got.float(), ref.float(), rtol=rtol, atol=atol * scale,
                               msg=lambda m: f"{what}: {m}")


@contextlib.contextmanager
def environment(**values):
    """The environment variables ``values`` set inside the block (None: removed; a rank's job:
    tilefuse reads its switches at each call), then restored, or removed where they were unset."""
    old = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(value)
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
