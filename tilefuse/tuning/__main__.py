"""``python -m tilefuse.tuning``: the tuner (:mod:`tilefuse.tuning.tuner`)."""

from tilefuse.tuning.tuner import main

if __name__ == "__main__":
    raise SystemExit(main())
