"""``python -m tilefuse.tuning.loo``: :func:`tilefuse.tuning.costmodel.main` (a module of its own: running
the cost model that ``import tilefuse`` already loaded with ``-m`` would import it twice)."""

from tilefuse.tuning.costmodel import main

if __name__ == "__main__":
    raise SystemExit(main())
