"""The host steps of every gemm_all_scatter variant: :func:`prepare` once per call signature (checks,
config, heap buffer, flags); :func:`begin` and :func:`finish` every call (outputs, begin, copy-out)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..common.config import WARP_SPEC_VARIANTS, Config, check_variant_config
from ..common.launch import check_out, new_output, op_heap, prepare_gemm
from ..common.prepare import CallSteps, hold, once
from ._tiles import launch_copy_peer_blocks

OP = "gemm_all_scatter"


@dataclass(eq=False)
class Prepared(CallSteps):
    """One call signature of a variant, checked and resolved: what each of its calls launches with."""

    heap: object
    sig: tuple  # the call's signature: its begin checks that every rank made the same call
    M: int
    N: int  # N_loc: the columns of this rank's block
    K: int
    config: Config
    meta: dict  # the tile loop's constexprs and launch options (BLOCK_*, GROUP_M, USE_TMA, B_KMAJOR, warps, stages)
    pad: bool  # a or b is copied onto the tensor-descriptor path on every call (the variants' own GEMM)
    begins: bool  # the call's first kernel may begin it (P.enter); else the begin kernel does
    inplace: bool  # `out` is a heap tensor at the same offset on every rank: the kernels write it
    c: torch.Tensor | None  # [M, W*N] heap buffer where the peers' blocks land; None: the result itself
    flags: torch.Tensor | None  # int64 per-tile "ready" flags (flagged variants)
    done: torch.Tensor | None  # int64 [W, COMM_SMS] completion flags (wg_specialized)
    workspaces: list  # common.prepare.hold's entries
    empty: bool  # nothing to compute or move (M, N_loc or K is 0)

    @property
    def use_tma(self) -> bool:
        return self.meta["USE_TMA"]


def prepare(variant: str, a, b, config, group, out, *, comm: bool, flags: bool = False) -> Prepared:
    """The variant's :class:`Prepared` for this call signature (made on first use, by every rank alike).
    ``comm``: the variant needs COMM_SMS >= 1 communication programs; ``flags``: it uses flags."""
    heap = op_heap(OP, group)
    make = functools.partial(_make, heap, variant, a, b, config, group, out, comm=comm, flags=flags)
    on_heap = isinstance(out, torch.Tensor) and heap.is_on_heap(out)
    p = once(heap, (OP, variant, on_heap), make, config, a, b, out)
    if out is not None:  # its address: no overlap with a or b, a heap offset checked across ranks
        check_out(OP, heap, out, (p.M, heap.world_size * p.N), a.dtype, a=a, b=b)
    return p


def _make(heap, variant: str, a, b, config, group, out, *, comm: bool, flags: bool) -> Prepared:
    g = prepare_gemm(OP, a, b, group, config, comm=comm, specialize=variant in WARP_SPEC_VARIANTS[OP])
    cfg = g.config
    check_variant_config(OP, variant, cfg)  # only bulk_sync splits K
    W, M, N = heap.world_size, g.M, g.N
    shape = (M, W * N)
    empty = M == 0 or N == 0 or g.K == 0
    inplace = out is not None and check_out(OP, heap, out, shape, a.dtype, a=a, b=b)
    held, c = [], None
    if not (inplace or empty or W == 1):
        # This rank's tiles go straight into the result; the peers' land here and are copied out.
        c = hold(heap, held, (OP, "c", shape, a.dtype), lambda h: {"c": h.empty(shape, dtype=a.dtype)},
                 M * W * N * a.element_size()).c
    flag_buf = done = None
    if flags and not empty:
        # The key: all the flag protocol depends on (tile counts, the programs that report done).
        key = (OP, variant, M, N, cfg.BLOCK_M, cfg.BLOCK_N, cfg.COMM_SMS)
        ws = hold(heap, held, key, lambda h: {
            "flags": h.zeros(max(g.num_tiles, 1), dtype=torch.int64),  # per-tile "ready" sequence numbers
            "flags_done": h.zeros((W, max(cfg.COMM_SMS, 1)), dtype=torch.int64),  # (source, program) done
        }, 8 * (g.num_tiles + W * cfg.COMM_SMS))
        flag_buf, done = ws.flags, ws.flags_done
    pad = variant != "bulk_sync" and (g.a is not a or g.b is not b)  # bulk_sync's GEMM core pads itself
    return Prepared(heap=heap, sig=g.key(variant, inplace), M=M, N=N, K=g.K, config=cfg, pad=pad,
                    meta=g.gemm_meta_ws if g.specialize else g.gemm_meta, begins=g.kernel_may_begin,
                    inplace=inplace, c=c, flags=flag_buf, done=done, workspaces=held, empty=empty)


def begin(p: Prepared, a, b, out) -> tuple:
    """``(a, b, dest, c, entry)`` of this call: the operands (copied where :attr:`Prepared.pad`), the
    result [M, W*N_loc] (``out`` unless strided) and where the peers' blocks land, strided alike (the
    result itself with a heap ``out`` or where none land), both NaN if the call aborts; the begin
    arguments of a first kernel that begins the call (None: the begin kernel began it)."""
    a, b = p.operands(a, b)
    if p.inplace:
        dest = c = out
    else:
        contiguous = out is not None and out.is_contiguous()
        dest = out if contiguous else new_output((p.M, p.heap.world_size * p.N), a.dtype, a.device)
        c = dest if p.c is None else p.c
    entry = p.begin(dest, c if c is not dest else None)
    if p.K == 0 and p.M and p.N:
        dest.zero_()  # an empty sum (every rank's block is zero: nothing needs to move)
    return a, b, dest, c, entry


def finish(p: Prepared, dest: torch.Tensor, c: torch.Tensor, out) -> torch.Tensor:
    """The result, once the call's kernels are queued: ``dest`` after the peers' blocks are copied into
    it from ``c`` (one more kernel; this rank's block is there), then ``out`` where it is strided."""
    if c is not dest and not p.empty:
        launch_copy_peer_blocks(dest, c, p.M, p.N, p.heap.rank, p.heap.world_size)
    if out is None or out is dest:
        return dest
    return out.copy_(dest)
