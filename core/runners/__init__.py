"""The loop that moves a controller: one APScheduler interval job per run (see base.py), with a
replay variant (simulated time at a chosen speed) and a live one (wall time, a live node source)."""
from .base import Runner
from .live import LiveRunner
from .replay import ReplayRunner

__all__ = ["LiveRunner", "ReplayRunner", "Runner"]
