"""The package version, in one place: ``pyproject.toml`` reads it (setuptools ``dynamic``), and
``tilefuse.__version__`` re-exports it."""

__version__ = "0.2.0"
