"""The crash budget of a job's workers: only losses within a sliding window count, so transient
losses spread over a long job's life do not fail it, while a job that keeps crashing still does."""
from __future__ import annotations

#: seconds a lost worker counts against its job's budget (`--crash-window`)
DEFAULT_CRASH_WINDOW_S = 3600.0


def note_loss(times: list[float], now: float, window_s: float) -> int:
    """Record a loss at `now` in `times` (kept short: older ones are dropped) and return how many
    fall within the window."""
    times.append(now)
    times[:] = [t for t in times if now - t < window_s]
    return len(times)
