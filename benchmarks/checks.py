"""Checks of a benchmarked method's result: relative error against an fp32 product, per-dtype
tolerances, NaN-poisoned workspaces, and recording a failure without stopping the run."""

from __future__ import annotations

import torch

from .launch import RankCtx


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """‖got − ref‖ / ‖ref‖ in float64 (NaN if the shapes differ or ``got`` has NaN/inf)."""
    g, r = got.double(), ref.double()
    if g.shape != r.shape or not torch.isfinite(g).all():
        return float("nan")
    denom = torch.linalg.vector_norm(r).item()
    return torch.linalg.vector_norm(g - r).item() / (denom if denom > 0 else 1.0)


def tolerance(dtype: torch.dtype, on_gpu: bool) -> float:
    """Largest accepted :func:`rel_error` against the fp32 product, per dtype."""
    if dtype == torch.float32:
        return 5e-3 if on_gpu else 1e-5  # tf32 tensor cores on a GPU
    return 1e-2


def error_text(err: BaseException) -> str:
    """One line for the CSV ``note``: the exception's type and the first line of its message."""
    return f"{type(err).__name__}: {err}".splitlines()[0][:300]


def cuda_alive(ctx: RankCtx) -> bool:
    """False when this rank's GPU context is broken (e.g. after an illegal memory access)."""
    try:
        ctx.sync()
        return True
    except Exception:
        return False


def poison(*tensors: torch.Tensor) -> None:
    """NaN into ``tensors`` (outputs a checked call must overwrite, e.g. an ``out=`` heap buffer peers
    write into), between two barriers (collective)."""
    import tilefuse

    tilefuse.barrier()
    for t in tensors:
        if t.dtype.is_floating_point:
            t.fill_(float("nan"))
    tilefuse.barrier()
