"""``python -m tilefuse.tuning.loo``: :func:`tilefuse.tuning.costmodel.main` (``-m costmodel`` imports it twice)."""

from tilefuse.tuning.costmodel import main

if __name__ == "__main__":
    raise SystemExit(main())
