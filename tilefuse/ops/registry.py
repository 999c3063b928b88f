"""One table from (op, variant) to the entry point, each with the signature of the op's public
function minus ``variant``; tests, benchmarks and the README read it.
"""

from __future__ import annotations

OPS = ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce")
VARIANTS = ("bulk_sync", "producer_consumer", "fused_sequential", "wg_specialized")
# Named forms with an algorithm (and file) of their own: tables, tuning and ``variant=`` take them too.
FORMS = {"all_gather_gemm": ("copy_engine",)}
_TABLE: dict[str, dict[str, object]] = {}  # op -> variant -> entry point


def tunable(op: str) -> tuple:
    """The variants and named forms of ``op`` that tables and tuning may choose."""
    return VARIANTS + FORMS.get(op, ())


def register(op: str, variant: str, fn) -> None:
    if op not in OPS or variant not in tunable(op) + ("reference", "plain"):
        raise ValueError(f"unknown op/variant {op}/{variant}")
    _TABLE.setdefault(op, {})[variant] = fn


def get(op: str, variant: str):
    """The entry point of ``variant`` of ``op`` (one lookup every eager call); errors name both."""
    try:
        return _TABLE[op][variant]
    except (KeyError, TypeError):  # TypeError: an unhashable variant
        pass
    if op not in _TABLE:
        raise ValueError(f"unknown op {op!r}; ops are {sorted(_TABLE)}")
    if not isinstance(variant, str):
        raise TypeError(f"{op}: variant must be a string, got {type(variant).__name__}")
    raise ValueError(f"{op}: unknown variant {variant!r}; choose one of {sorted(_TABLE[op])} or 'auto'")


def variants(op: str) -> dict:
    """Every registered variant of ``op``, reference first."""
    return dict(_TABLE.get(op, {}))
