"""The shared code of the modes under one name: :mod:`benchmarks.launch` (ranks),
:mod:`benchmarks.timing` (medians, interleaved calls, settling), :mod:`benchmarks.checks` (errors
against a reference) and :mod:`benchmarks.results` (CSV rows, run facts, tables)."""

from .checks import cuda_alive, error_text, poison, rel_error, tolerance
from .launch import LaunchError, RankCtx, is_main_process, launch, under_torchrun
from .results import (
    COLUMNS,
    Progress,
    commit_id,
    format_table,
    parse_bytes,
    parse_dtype,
    print_table,
    read_csv,
    row,
    run_info,
    write_csv,
    write_rows,
)
from .timing import Cycle, bench, bench_interleaved, bench_max, capture_graph, rotating, settle, sync

__all__ = [
    "COLUMNS", "Cycle", "LaunchError", "Progress", "RankCtx", "bench", "bench_interleaved", "bench_max",
    "capture_graph", "commit_id", "cuda_alive", "error_text", "format_table", "is_main_process", "launch",
    "parse_bytes", "parse_dtype", "poison", "print_table", "read_csv", "rel_error", "rotating", "row", "run_info",
    "settle", "sync", "tolerance", "under_torchrun", "write_csv", "write_rows",
]
