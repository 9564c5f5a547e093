"""Numbers and times as the pages print them."""
from __future__ import annotations

import html
import math
import time
from typing import Optional


#: 9999-12-31 23:59:59 UTC: a later time (an ETA at a rate near zero) is printed as "after 9999"
LAST_TIME = 253402300799.0


def plotly_text(text: str) -> str:
    """`text` as Plotly shows it literally: Plotly renders tags (<b>, <br>, <a href>) in every
    label, title and hover, so anything a user or a site wrote is escaped before it goes in."""
    return html.escape(text, quote=False)


def sim_time(t: Optional[float]) -> str:
    if not t:
        return "–"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if _printable(t) else "after 9999"


def short_time(t: Optional[float]) -> str:
    if not t:
        return ""
    return time.strftime("%m-%d %H:%M", time.gmtime(t)) if _printable(t) else "after 9999"


def _printable(t: float) -> bool:
    return isinstance(t, (int, float)) and math.isfinite(t) and 0 <= t <= LAST_TIME


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


def finite(value):
    """The value with every NaN or infinity as None, inside dicts and lists too: browsers'
    JSON.parse refuses the bare words Python's json writes for them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def gpus(n: int) -> str:
    return f"{n:,} GPU" + ("" if n == 1 else "s")


def extent(nodes: int, slots: Optional[int], ranks: int, runs_workers: bool) -> str:
    """A job's size as the machine sees it: "3 nodes × 4 GPUs = 12 ranks", or with nodes of
    different sizes "3 nodes, 10 GPUs = 10 ranks". Simulated workers run no ranks, so there the
    figure is the GPUs the job holds ("18 GPUs held"). On nodes of one slot each the node count
    says it all ("3 nodes")."""
    held = f"{nodes:,} node" + ("" if nodes == 1 else "s")
    if ranks == nodes:
        return held
    total = f"{ranks:,} ranks" if runs_workers else f"{gpus(ranks)} held"
    if slots is not None:
        return f"{held} × {gpus(slots)} = {total}"
    return f"{held}, {gpus(ranks)} = {total}" if runs_workers else f"{held}, {total}"


def _nodes(n: int) -> str:
    return f"{n:,} node" + ("" if n == 1 else "s")


def rescale_words(before: int, after: int, added: int, removed: int) -> str:
    """`8 → 32 nodes`, and where a step both took and gave back nodes, a word for it: "8 → 32
    nodes: 24 more, 8 swapped for others", so "+32 … −8" beside "8 → 32" reads as one change."""
    change = f"{before:,} → {_nodes(after)}"
    swapped = min(added, removed)
    if not swapped:
        return change
    net = after - before
    more = f"{net:,} more, " if net > 0 else f"{-net:,} fewer, " if net < 0 else ""
    return f"{change}: {more}{swapped:,} swapped for {'another' if swapped == 1 else 'others'}"
