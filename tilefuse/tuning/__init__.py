"""Tuning: shape sets, per-shape config tables and their lookup, the tuner (``python -m tilefuse.tune``)."""
