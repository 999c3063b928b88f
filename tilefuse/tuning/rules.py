"""What the tuners try for a shape beyond each variant's default config, and what they leave out.

Shared by first-call tuning (``tilefuse.ops.dispatch``) and the offline tuner (``tilefuse.tuning.tuner``)
so both search the same space.

- **all_gather_gemm's ``copy_engine`` form.** producer_consumer with the rows pulled by the copy
  engines and the GEMM on every SM but one (``ops/all_gather_gemm/copy_engine.py``): a variant of
  its own for the tuners, from W = 2 (at W = 1 there is nothing to copy).
- **all_gather_gemm's ``fused_sequential`` on wide N.** Each of its tiles loads its A rows straight
  from the source rank's heap inside the K loop, so rank s's shard crosses the link once per column
  tile, ``cdiv(N, BLOCK_N)`` times, with no reuse (peer reads are not kept in this GPU's L2): with
  many column tiles it is link-bound, far slower than the plain path. The tuners skip it above
  ``FUSED_AG_MAX_COLUMN_TILES`` column tiles of 256; at W = 1 nothing crosses a link and it stays.

Bounds. First-call tuning times every candidate inside a budget of about a second per M bucket
(``autotune.BUDGET_S``) and compiles each one first, outside it: its list is plain, each
variant's (and named form's) default and the cost model's pick, at most ``MAX_FIRST_CALL_CANDIDATES``
in all (``tests/test_rules.py`` counts them for every op and
W). The offline tuner's search (``tuner.candidate_configs``: tile sizes, small-M tiles for decode,
warps/stages, GEMM/communication splits) keeps at most ``MAX_TUNER_CONFIGS`` per
variant and shape, most promising first.
"""

from __future__ import annotations

FUSED_AG_MAX_COLUMN_TILES = 2
COMM_VARIANTS = ("producer_consumer", "wg_specialized")  # variants with communication programs
MAX_FIRST_CALL_CANDIDATES = 7  # plain + 4 variants + a named form + the cost model's pick
MAX_TUNER_CONFIGS = 24  # per variant and shape in the offline tuner


def skip_reason(op: str, variant: str, N: int, world: int) -> str | None:
    """Why the tuners leave ``variant`` out for this shape (None: try it)."""
    if variant == "copy_engine" and world == 1:
        return "nothing to copy at world 1"
    if op == "all_gather_gemm" and variant == "fused_sequential" and world > 1:
        tiles = -(-N // 256)
        if tiles > FUSED_AG_MAX_COLUMN_TILES:
            return (f"reads every peer's A rows once per column tile ({tiles} of 256): link-bound, "
                    "see tilefuse/tuning/rules.py")
    return None
