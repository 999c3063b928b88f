"""``python -m tilefuse.tune``: the tuner (:mod:`tilefuse.tuning.tuner`, re-exported here)."""

from tilefuse.tuning.tuner import *  # noqa: F403  (the tuner's functions under this module's name too)

if __name__ == "__main__":
    raise SystemExit(main())  # noqa: F405
