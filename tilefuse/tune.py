"""``python -m tilefuse.tune``: the tuner's older name; the tuner is :mod:`tilefuse.tuning.tuner`
(``python -m tilefuse.tuning``), re-exported here."""

from tilefuse.tuning.tuner import *  # noqa: F403  (the tuner's functions under their old module name)
from tilefuse.tuning.tuner import main

if __name__ == "__main__":
    raise SystemExit(main())
