"""What the tuners try for a shape beyond each variant's default config, and what they leave out.

Shared by first-call tuning (``tilefuse.ops.dispatch``) and the offline tuner (``tilefuse.tuning.tuner``)
so both search the same space.

- **The copy-engine forms.** ``producer_consumer`` with ``COMM_SMS = 0`` moves rows with DMA copies
  and leaves every SM but one to the GEMM: all_gather_gemm pulls the peers' rows, gemm_all_scatter
  pushes its finished row chunks (``ops/all_gather_gemm``, ``ops/gemm_all_scatter``). A candidate of
  its own next to the SM-driven form, from W = 2.
- **gemm_all_reduce's two-shot algorithm.** ``Config.TWO_SHOT = 1`` (the op's ``two_shot=True``):
  partials go to the owner of their rows, the owner sums, every rank copies the sums. From W = 3 it
  sends less than one-shot (2(W-1)/W instead of W-1 times M x N per rank); at W = 2 it sends the same
  bytes in one more step but each rank sums only its own rows. Nothing measured says where it wins,
  so both tuners time it next to one-shot at every W >= 2 (:func:`two_shot_form`); the tuners' margin
  over plain keeps a tie from switching.
- **The epilogue-sum forms.** ``fused_sequential`` with ``Config.EPILOGUE_SUM = 1`` sums each tile
  in the epilogue that made it, its own partial never staged: gemm_reduce_scatter computes a rank's
  own tiles last and adds the peers' partials there (no reduction pass, no barrier);
  gemm_all_reduce's one-shot form sums each tile right after its push, once the peers' same tile
  has landed (a wait per tile where the staged form sums after all of a program's tiles). Their
  tile loops set flags and are not warp-specialized. Where that trade wins is measured per shape,
  so both tuners time them next to the staged forms at every W (at world 1 each is the GEMM and the
  store of c).
- **all_gather_gemm's ``fused_sequential`` on wide N.** Each of its tiles loads its A rows straight
  from the source rank's heap inside the K loop, so rank s's shard crosses the link once per column
  tile, ``cdiv(N, BLOCK_N)`` times, with no reuse (peer reads are not kept in this GPU's L2): with
  many column tiles it is link-bound, far slower than the plain path. The tuners skip it above
  ``FUSED_AG_MAX_COLUMN_TILES`` column tiles of 256; at W = 1 nothing crosses a link and it stays.

Bounds. First-call tuning times every candidate inside a budget of about a second per M bucket
(``autotune.BUDGET_S``) and compiles each one first, outside it: its list is plain, each
variant's default, at most ``MAX_EXTRA_CONFIGS`` extra configs per variant and the cost model's pick,
at most ``MAX_FIRST_CALL_CANDIDATES`` in all (``tests/test_rules.py`` counts them for every op and
W). The offline tuner's search (``tuner.candidate_configs``: tile sizes, small-M tiles for decode,
warps/stages, GEMM/communication splits, two-shot twins) keeps at most ``MAX_TUNER_CONFIGS`` per
variant and shape, most promising first.
"""

from __future__ import annotations

from ..ops.common.config import EPILOGUE_SUM_FORMS, Config
from ..runtime import dma

FUSED_AG_MAX_COLUMN_TILES = 2
TWO_SHOT_OPS = ("gemm_all_reduce",)
TWO_SHOT_MIN_WORLD = 2
COMM_VARIANTS = ("producer_consumer", "wg_specialized")  # variants with communication programs
MAX_EXTRA_CONFIGS = 2  # per variant, on top of its default, in first-call tuning
MAX_FIRST_CALL_CANDIDATES = 14  # plain + 4 variants x (1 + MAX_EXTRA_CONFIGS) + the cost model's pick
MAX_TUNER_CONFIGS = 24  # per variant and shape in the offline tuner
# The offline tuner times the two-shot twin of this many of a variant's configs (most promising first).
TUNER_TWO_SHOT_TWINS = 4


def skip_reason(op: str, variant: str, N: int, world: int) -> str | None:
    """Why the tuners leave ``variant`` out for this shape (None: try it)."""
    if op == "all_gather_gemm" and variant == "fused_sequential" and world > 1:
        tiles = -(-N // 256)
        if tiles > FUSED_AG_MAX_COLUMN_TILES:
            return (f"reads every peer's A rows once per column tile ({tiles} of 256): link-bound, "
                    "see tilefuse/tuning/rules.py")
    return None


def two_shot_form(op: str, variant: str, cfg: Config, num_sms: int, world: int) -> Config | None:
    """``cfg`` with gemm_all_reduce's two-shot algorithm (None where there is none to try).

    The communication variants' two-shot form needs ``COMM_SMS >= 2`` (summing and gathering
    programs): a config with fewer gets ``max(2, num_sms // 8)`` of them, as a variant's default does,
    taken from its GEMM programs. None if the device has too few programs for both.
    """
    if op not in TWO_SHOT_OPS or world < TWO_SHOT_MIN_WORLD or cfg.TWO_SHOT or cfg.EPILOGUE_SUM:
        return None  # (the epilogue sum is one-shot only)
    if variant in COMM_VARIANTS and cfg.COMM_SMS < 2:
        comm = max(2, num_sms // 8)
        gemm = min(cfg.GEMM_SMS, num_sms - comm)
        if gemm < 1:
            return None
        return cfg.replace(TWO_SHOT=1, COMM_SMS=comm, GEMM_SMS=gemm)
    return cfg.replace(TWO_SHOT=1)


COPY_ENGINE_OPS = ("all_gather_gemm", "gemm_all_scatter")  # producer_consumer's COMM_SMS = 0 form


def extra_configs(op: str, variant: str, base: Config, num_sms: int, world: int) -> list[Config]:
    """Configs tried besides ``base`` (a variant's default) that the search space has no axis for;
    at most ``MAX_EXTRA_CONFIGS``."""
    out = []
    if op in COPY_ENGINE_OPS and variant == "producer_consumer" and world > 1 and num_sms > 1 and \
            (op == "all_gather_gemm" or dma.available()):  # gemm_all_scatter's 2-D copies need the CUDA runtime
        out.append(base.replace(COMM_SMS=0, GEMM_SMS=num_sms - 1))  # the copy-engine form
    two_shot = two_shot_form(op, variant, base, num_sms, world)
    if two_shot is not None:
        out.append(two_shot)
    if (op, variant) in EPILOGUE_SUM_FORMS:
        out.append(base.replace(EPILOGUE_SUM=1))  # a warp-specialized tile runs unspecialized there
    return out[:MAX_EXTRA_CONFIGS]
