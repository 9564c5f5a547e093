"""Failed logins counted per key over a sliding window (core/windows.py is the mechanism, shared
with the registration limits): a key that has failed `Limit.events` times within
`Limit.window_s` seconds is refused until its oldest failure leaves the window; the caller
turns that wait into a 429 `Retry-After`."""
from __future__ import annotations

from core.windows import Limit, SlidingWindow

__all__ = ["FailureWindow", "Limit"]


class FailureWindow(SlidingWindow):
    """A sliding window whose events are failed attempts."""

    def fail(self, key: str) -> None:
        self.add(key)
