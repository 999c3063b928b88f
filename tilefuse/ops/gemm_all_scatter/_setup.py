"""Host set-up shared by the gemm_all_scatter variants: checks, output buffer, workspace."""

from __future__ import annotations

import torch

from ..common.launch import GemmCall, after_launch, check_out, prepare_gemm, workspace

OP = "gemm_all_scatter"


def setup(variant: str, a, b, config, group, out, *, comm: bool):
    """Returns ``(call, c, c_block, ws)``.

    ``c`` [M, W*N_loc] is ``out`` or the op's heap buffer; ``c_block`` is this rank's column block
    (where its tiles go on every rank); ``ws`` holds the int32 tile flags and the done counter.
    """
    call: GemmCall = prepare_gemm(OP, a, b, group, config, comm=comm)
    heap = call.heap
    W, r = heap.world_size, heap.rank
    shape = (call.M, W * call.N)
    if out is not None:
        check_out(OP, heap, out, shape, a.dtype)
        c = out
    else:
        c = workspace(heap, (OP, "c", shape, a.dtype),
                      lambda h: {"c": h.empty(shape, dtype=a.dtype)}).c
    cfg = call.config
    # Everything the flag protocol depends on is in the key: tile counts and the number of
    # communication programs that report to the "done" counter.
    key = (OP, variant, call.M, call.N, cfg.BLOCK_M, cfg.BLOCK_N, cfg.GEMM_SMS, cfg.COMM_SMS)
    ws = workspace(heap, key, lambda h: {
        "flags": h.zeros(max(call.num_tiles, 1), dtype=torch.int32),  # per-tile "ready" epochs
        "done": h.zeros(1, dtype=torch.int64),  # finished communication programs, summed over calls
    })
    c_block = c[:, r * call.N:(r + 1) * call.N]
    return call, c, c_block, ws


def finish(call: GemmCall, c: torch.Tensor, out) -> torch.Tensor:
    """Report failed waits (cpu backend); return ``out`` or a copy of the heap buffer."""
    after_launch(call.heap)
    return out if out is not None else c.clone()
