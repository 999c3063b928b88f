"""Everything the benchmark modules share, under one name for existing imports.

New code imports from the module of the concern: :mod:`benchmarks.launch` (ranks),
:mod:`benchmarks.timing` (medians, interleaving, settling), :mod:`benchmarks.checks` (errors against
a reference, poisoned workspaces), :mod:`benchmarks.results` (CSV, tables, progress, options) and
:mod:`benchmarks.plots`.
"""

from .checks import cuda_alive, error_text, poison_workspaces, rel_error, tolerance
from .launch import LaunchError, RankCtx, is_main_process, launch, under_torchrun
from .results import (
    COLUMNS,
    DTYPE_NAMES,
    REPO,
    Progress,
    commit_id,
    format_table,
    human_bytes,
    parse_bytes,
    parse_dtype,
    print_table,
    read_csv,
    row,
    run_info,
    write_csv,
)
from .timing import Cycle, bench, bench_interleaved, bench_max, l2_bytes, rotating, round_order, settle

__all__ = [
    "COLUMNS", "DTYPE_NAMES", "REPO", "Cycle", "LaunchError", "Progress", "RankCtx", "bench", "bench_interleaved",
    "bench_max", "commit_id", "cuda_alive", "error_text", "format_table", "human_bytes", "is_main_process",
    "l2_bytes", "launch", "parse_bytes", "parse_dtype", "poison_workspaces", "print_table", "read_csv",
    "rel_error", "rotating", "round_order", "row", "run_info", "settle", "tolerance", "under_torchrun",
    "write_csv",
]
