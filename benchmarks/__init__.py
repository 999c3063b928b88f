"""tilefuse benchmarks, outside the package: ``python -m benchmarks <mode>`` from the repository root
(``python -m benchmarks`` lists the modes; ``docs/BENCHMARKS.md``).

Importing this package picks the interpreter before any Triton kernel module is imported: with
no usable GPU (or ``TILEFUSE_BACKEND=cpu``) it sets ``TILEFUSE_BACKEND=cpu`` and
``TRITON_INTERPRET=1``, so the benchmarks' own kernels and every rank process they spawn agree on
the mode whatever is imported first.
"""

import os as _os


def _configure() -> None:
    forced = _os.environ.get("TILEFUSE_BACKEND", "").strip().lower()
    if forced == "cuda":
        return
    if forced != "cpu":
        import torch

        if torch.cuda.is_available():
            return
    _os.environ["TILEFUSE_BACKEND"] = "cpu"
    _os.environ["TRITON_INTERPRET"] = "1"


_configure()
