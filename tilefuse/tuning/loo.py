"""``python -m tilefuse.tuning.loo``: the cost model's leave-one-out error on the config tables
(:func:`tilefuse.tuning.costmodel.main`; a module of its own so that running it does not re-import
the cost model that ``import tilefuse`` already loaded)."""

from tilefuse.tuning.costmodel import main

if __name__ == "__main__":
    raise SystemExit(main())
