"""What every chart of the dashboard shares, so that they read at a glance: an empty state in
words instead of default axes, whole-number ticks for counts, axis titles with units, "—" for a
ratio with nothing to divide by, and legend labels that name a job by id and name."""
from __future__ import annotations

import math
from typing import Optional, Sequence

NO_DATA = "no data yet"
DASH = "—"
#: the x axis of every chart over time
TIME_AXIS = {"type": "date", "title": {"text": "simulated time (UTC)"}}
LIVE_TIME_AXIS = {"type": "date", "title": {"text": "time (UTC)"}}
MARGIN = {"l": 60, "r": 10, "t": 30, "b": 45}


def empty_figure(title: str, message: str = NO_DATA, height: int = 280) -> dict:
    """A chart with nothing to draw yet: its title and a line saying why, and no axes (Plotly's
    default axes run from -1 to 1, or over the year 2000 on a date axis)."""
    return {"data": [], "layout": {
        "title": {"text": title, "font": {"size": 13}}, "height": height, "margin": MARGIN,
        "xaxis": {"visible": False}, "yaxis": {"visible": False},
        "annotations": [{"text": message, "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5,
                         "showarrow": False, "font": {"size": 15, "color": "#6b7280"}}]}}


def ratio(part: float, whole: float, digits: int = 1) -> str:
    """`part / whole` as a percentage, or "—" when there is nothing to divide by (0 / 0 is not
    100 % nor 0 %: nothing was offered)."""
    if not whole or not math.isfinite(whole) or not math.isfinite(part):
        return DASH
    return f"{100.0 * part / whole:.{digits}f} %"


def count_step(top: float, ticks: int = 6) -> int:
    """A tick step for a count axis from 0 to `top`: a whole number of the 1-2-5 series giving at
    most about `ticks` ticks, so a small run never shows half a node."""
    top = max(1.0, float(top or 0))
    magnitude = 10 ** max(0, math.floor(math.log10(top / ticks))) if top > ticks else 1
    for m in (1, 2, 5, 10):
        step = m * magnitude
        if top / step <= ticks:
            return int(step)
    return int(10 * magnitude)


def count_axis(title: str, top: float) -> dict:
    """A y axis of whole things (nodes, runs) from 0, ticked at whole numbers."""
    return {"title": {"text": title}, "rangemode": "tozero", "tick0": 0, "dtick": count_step(top),
            "tickformat": ",d"}


def legend_label(job_id: str, name: Optional[str], nodes: int, probing: bool = False) -> str:
    """`j0060 resnet18 · 60 nodes`: two jobs of one name are told apart by their id."""
    who = f"{job_id} {name}" if name and name != job_id else job_id
    what = f"{nodes:,} node" + ("" if nodes == 1 else "s")
    return f"{who} · {what}" + (" (probing)" if probing else "")


def histogram(values: Sequence[float], bins: int = 30,
              top: Optional[float] = None) -> tuple[list[float], list[int], float]:
    """(bin centres, counts, bin width) on a linear scale: drawn as bars on a count axis, so the
    y axis reads in whole runs. With `top`, the bins run from 0 to `top` and a value above it
    counts in the last bin, so that a few slow outliers do not squash the rest into one bar."""
    if not values:
        return [], [], 0.0
    lo, hi = (0.0, float(top)) if top else (min(values), max(values))
    width = (hi - lo) / bins if hi > lo else max(abs(hi) * 0.1, 1e-3)
    counts = [0] * bins
    for v in values:
        counts[max(0, min(bins - 1, int((v - lo) / width)))] += 1
    return [lo + (k + 0.5) * width for k in range(bins)], counts, width


def nice_ceiling(x: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is at least `x` (x > 0)."""
    magnitude = 10 ** math.floor(math.log10(x))
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= x * (1 - 1e-12))


def fit_top(values: Sequence[float], quantile: float = 0.95, headroom: float = 1.5) -> float:
    """Where an axis over `values` should end: a round number above their `quantile` with some
    headroom (never past the largest), so nearly every value is spread over the axis."""
    ordered = sorted(values)
    q = ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]
    top = nice_ceiling(max(q * headroom, 1e-6))
    return min(top, nice_ceiling(max(ordered[-1], 1e-6)))
