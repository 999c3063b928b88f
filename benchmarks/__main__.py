"""The benchmarks' one entry point: ``python -m benchmarks <mode> [options]``.

    python -m benchmarks                       # lists the modes
    python -m benchmarks world1 --ops all      # every op and variant at world 1
    python -m benchmarks suite --world 2       # the same at world 2, against NCCL and torch's fused ops
    python -m benchmarks <mode> --help         # the mode's options

Each mode runs ``main(argv)`` of the module of that name in this package (``benchmarks/<module>.py``);
a mode whose module is not in this checkout says so and exits with status 2. Any other module of the
package with a ``main(argv)`` runs by its own name (``python -m benchmarks gemm_sweep``). Modules can
also be run directly (``python -m benchmarks.suite ...``, ``torchrun ... -m benchmarks.suite ...``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Mode:
    module: str  # benchmarks/<module>.py
    what: str
    defaults: list = field(default_factory=list)  # options put before the user's own


MODES = {
    "world1": Mode("suite", "every op and variant at world 1 against torch.matmul: each variant's fusion tax",
                   ["--world", "1"]),
    "suite": Mode("suite", "every op and variant at world N against torch.matmul + the collective, the "
                           "collective alone, torch's fused ops and the ideal overlap (default N: the GPU "
                           "count if more than one, else 2)"),
    "host": Mode("host", "host µs per eager call and device µs per call timed alone: torch's own calls, plain, "
                         "auto and each variant (W = 1 on random shapes, W = 2 host time; --parts, --profile)"),
    "tp": Mode("tp_mlp", "tensor-parallel Llama MLP forward + backward: tilefuse layers, the plain module, "
                         "torch's tensor parallelism"),
    "bandwidth": Mode("bandwidth", "the device API's store / load / put / get against plain copies"),
    "breakdown": Mode("breakdown", "gemm_reduce_scatter / gemm_all_reduce taken apart: GEMM core, partial staging, "
                                   "peer pushes, reduction, host path, each timed alone next to the whole variants"),
    "soak": Mode("soak", "many calls of every op, the shape changing every call: results checked, memory "
                         "watched, nothing hangs"),
    "heldout": Mode("heldout", "auto on held-out shapes the tables were not tuned on, against the plain path "
                               "and torch's fused ops"),
    "allreduce-decode": Mode("allreduce_decode", "all-reduce at decode sizes"),
    "auto-ab": Mode("auto_ab", "auto against the function it runs, in alternating rounds"),
    "sync-cost": Mode("sync_cost", "tilefuse.synchronize's bounded wait against torch.cuda.synchronize"),
    "plots": Mode("plots", "PNG plots of a suite CSV or of tuned tables"),
    "summary": Mode("summary", "compact tables of an output folder (tests, bandwidth, suite CSVs)"),
    "table-from-csv": Mode("table_from_csv", "config tables from a suite CSV (heuristic configs, margin rule)"),
}


# Modules of the package that are plumbing, not benchmarks.
NOT_MODES = {"__init__", "__main__", "common", "launch", "timing", "checks", "results"}


def _other_modules() -> list:
    """Modules of this package that no mode names (they run by their own name)."""
    named = {mode.module for mode in MODES.values()}
    here = Path(__file__).resolve().parent
    return sorted(p.stem for p in here.glob("*.py") if p.stem not in NOT_MODES and p.stem not in named)


def _usage() -> str:
    width = max(map(len, MODES))
    lines = ["usage: python -m benchmarks <mode> [options]   (python -m benchmarks <mode> --help)", "", "modes:"]
    for name, mode in MODES.items():
        present = importlib.util.find_spec(f"benchmarks.{mode.module}") is not None
        lines.append(f"  {name:<{width}}  {mode.what}" + ("" if present else f" [benchmarks/{mode.module}.py missing]"))
    others = _other_modules()
    if others:
        lines += ["", "other modules, run by their own name: " + ", ".join(others)]
    return "\n".join(lines)


def resolve(name: str) -> Mode:
    """The mode called ``name``; a module's own name (``tp_mlp``, ``gemm_sweep``) is accepted too."""
    if name in MODES:
        return MODES[name]
    for mode in MODES.values():
        if name == mode.module:
            return mode
    module = name.replace("-", "_")
    if module.isidentifier() and module not in NOT_MODES and module in _other_modules():
        return Mode(module, f"benchmarks/{module}.py")
    raise KeyError(name)


def _default_world() -> int:
    from .launch import gpu_count

    gpus = gpu_count()
    return gpus if gpus > 1 else 2


def main(argv: list | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help", "list"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    try:
        mode = resolve(name)
    except KeyError:
        print(f"unknown mode {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if importlib.util.find_spec(f"benchmarks.{mode.module}") is None:
        print(f"mode {name!r}: benchmarks/{mode.module}.py is not in this checkout", file=sys.stderr)
        return 2
    module = importlib.import_module(f"benchmarks.{mode.module}")
    entry = getattr(module, "main", None)
    if not callable(entry):
        print(f"mode {name!r}: benchmarks/{mode.module}.py has no main(argv)", file=sys.stderr)
        return 2
    given = {a.split("=", 1)[0] for a in rest}
    if name == "world1" and "--world" in given:
        print("mode 'world1' runs at world 1: drop --world, or use the mode 'suite'", file=sys.stderr)
        return 2
    defaults = list(mode.defaults)
    if name == "suite" and "--world" not in given and "WORLD_SIZE" not in os.environ:
        defaults += ["--world", str(_default_world())]
    sys.argv = [f"python -m benchmarks {name}"] + defaults + rest  # argparse's prog in usage lines
    rc = entry(defaults + rest)
    return 0 if rc is None else int(rc)


if __name__ == "__main__":
    sys.exit(main())
