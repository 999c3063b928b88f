"""The benchmarks' one entry point: ``python -m benchmarks <mode> [options]``.

    python -m benchmarks                       # lists the modes
    python -m benchmarks suite --world 2       # every op and variant against torch at world 2
    python -m benchmarks <mode> --help         # the mode's options
    python -m benchmarks plot CSV ... --out DIR   # the plots of results CSVs

Each mode runs ``main(argv)`` of its module in this package (``benchmarks/<module>.py``); modules run
directly too (``python -m benchmarks.suite ...``, ``torchrun ... -m benchmarks.suite ...``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    module: str  # benchmarks/<module>.py
    what: str


MODES = {
    "suite": Mode("suite", "every op x variant at world W against torch.matmul + the collective, the collective "
                           "alone, torch's fused ops and the ideal overlap (default W: the GPU count if more "
                           "than one, else 2; W = 1: each variant's fusion tax)"),
    "gemm": Mode("gemm", "tilefuse's GEMM core (tilefuse.matmul) against torch.matmul on a grid of shapes"),
    "host": Mode("host", "host µs per eager call and device µs per call timed alone: torch's own calls, plain, "
                         "auto and each variant (W = 1 on random shapes, W = 2 host time; --parts)"),
    "decode": Mode("decode", "row-parallel GEMM + all-reduce + residual add + RMSNorm at decode sizes, fused against "
                             "cuBLAS + NCCL / symmetric-memory chains, eager and in CUDA graphs"),
    "tune": Mode("tune", "variant='auto' on held-out shapes no table was tuned on, against plain and torch's "
                         "fused ops"),
    "tp": Mode("tp", "tensor-parallel Llama MLP forward + backward: tilefuse layers, the plain module, plain "
                     "tensor parallelism"),
}
# Not a measurement: draws the PNGs of the modes' CSVs.
TOOLS = {"plot": Mode("plot", "PNG plots of suite, host and decode CSVs and of tuner tables, each stamped "
                              "with its commit, torch and triton versions")}


def _usage() -> str:
    width = max(map(len, {**MODES, **TOOLS}))
    lines = ["usage: python -m benchmarks <mode> [options]   (python -m benchmarks <mode> --help)", "", "modes:"]
    for title, table in (("modes:", MODES), ("tools:", TOOLS)):
        if title != "modes:":
            lines += ["", title]
        for name, mode in table.items():
            present = importlib.util.find_spec(f"benchmarks.{mode.module}") is not None
            missing = "" if present else f" [benchmarks/{mode.module}.py missing]"
            lines.append(f"  {name:<{width}}  {mode.what}{missing}")
    return "\n".join(lines)


def resolve(name: str) -> Mode:
    """The mode (or tool) called ``name``; its module's own name is accepted too."""
    table = {**MODES, **TOOLS}
    if name in table:
        return table[name]
    for mode in table.values():
        if name == mode.module:
            return mode
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
    entry = importlib.import_module(f"benchmarks.{mode.module}").main
    given = {a.split("=", 1)[0] for a in rest}
    defaults = []
    if mode.module == "suite" and "--world" not in given and "WORLD_SIZE" not in os.environ:
        defaults = ["--world", str(_default_world())]
    sys.argv = [f"python -m benchmarks {name}"] + defaults + rest  # argparse's prog in usage lines
    rc = entry(defaults + rest)
    return 0 if rc is None else int(rc)


if __name__ == "__main__":
    sys.exit(main())
