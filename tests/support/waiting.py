"""Waiting in tests for something a real process does in its own time, with a deadline and a
message that says what was awaited (and, via `diag`, what the state was when it gave up)."""
from __future__ import annotations

import time
from typing import Callable, Optional


def wait(cond: Callable, timeout: float, what: str, diag: Optional[Callable] = None, period: float = 0.05):
    """`cond()`'s first truthy value, polling every `period` s; AssertionError after `timeout` s."""
    t0 = time.monotonic()
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}" + (f"; {diag()}" if diag else ""))
        time.sleep(period)


def poll(pred: Callable, timeout: float, every: float = 0.1):
    """`pred()`'s first truthy value, or its last value once `timeout` s have passed (the
    caller's assert then says what was wrong)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)
