"""Numbers and times as the pages print them."""
from __future__ import annotations

import time
from typing import Optional


def sim_time(t: Optional[float]) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if t else "–"


def short_time(t: Optional[float]) -> str:
    return time.strftime("%m-%d %H:%M", time.gmtime(t)) if t else ""


def si(x: Optional[float]) -> str:
    if x is None:
        return "–"
    for unit, div in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}" if x else "0"


def duration(s: Optional[float]) -> str:
    if s is None or s < 0:
        return "–"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"
