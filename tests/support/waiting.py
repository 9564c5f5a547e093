"""Waiting in tests for something a real process does in its own time, with a deadline and a
message that says what was awaited (and, via `diag`, what the state was when it gave up).

The one way to wait in these tests: a test module defines no wait/wait_for/poll of its own
(tests/test_layout.py checks it)."""
from __future__ import annotations

import time
from typing import Callable, Optional


def wait(cond: Callable, timeout: float, what: str = "", diag: Optional[Callable] = None, period: float = 0.05,
         *, fail: bool = True):
    """`cond()`'s first truthy value, calling it every `period` s for `timeout` s.

    When the time is up: with `fail` (the default), AssertionError saying what was awaited
    (`what`, and `diag()` where given); with `fail=False`, `cond()`'s last value, for a caller
    whose own assert then says what was wrong."""
    t0 = time.monotonic()
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() - t0 > timeout:
            if not fail:
                return v
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or 'the condition'}"
                                 + (f"; {diag()}" if diag else ""))
        time.sleep(period)
