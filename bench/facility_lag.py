"""bench.facility's lag: from a node going idle (its main job's span ended) to a pilot holding
it and to a job using it, in real seconds, and the harvest that lag implies at another
compression (see bench/facility.py). The lag does not shrink with the compression K: at ×K each
idle period is K times shorter, so the same seconds cost K times their share of it.

The model: idle period i of the slice lasts D_i seconds of the trace; its lag L_i (node idle ->
a job using it) is measured in the ×K run, in real seconds. core.replay gives a node to a job the
instant it goes idle; at compression c the lag leaves S(c) = Σ max(0, D_i - c·L_i) / Σ D_i of
that, and S(c) is the projected harvest as a fraction of the replay's prediction (where the
replay uses every idle node-second, as on the slices measured). Nothing else is modelled: not
jobs that cannot use a node, not main jobs starting later (their node stays harvested longer),
not the bench's 1 s sampling; S(K) beside the measured share at ×K is the model's own error.
Periods idle when the window opens were held before the clock started: L = 0 at any c. A
period that ended before a job used its node gives only a lower bound, its played length: it
takes the run's median lag if that is longer. A period not played to its end (its main job
ended after the window) takes the median too.
"""
from __future__ import annotations

import csv
import json
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from bench.facility_slice import IdlePeriod
from core.replay import percentile
from core.store import read_only


def read_store_times(db: Path) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """From the harvester's store: {node: times a pilot connected and held it} (its node_join
    events, stamped when the hub took the pilot's hello) and {node: times a job's allocation
    took it} (the allocations table, stamped at the controller's decision: with
    `--dispatch simulated` the job runs on the node from then)."""
    joins: dict[str, list[float]] = {}
    uses: dict[str, list[float]] = {}
    with closing(read_only(db)) as con:
        for t, node in con.execute("SELECT time, node FROM events WHERE kind = 'node_join' AND node IS NOT NULL"):
            joins.setdefault(node, []).append(t)
        for t, added in con.execute("SELECT time, added FROM allocations"):
            for node in json.loads(added or "[]"):
                uses.setdefault(node, []).append(t)
    for d in (joins, uses):
        for times in d.values():
            times.sort()
    return joins, uses


@dataclass
class PeriodLag:
    period: IdlePeriod
    played_s: Optional[float]      # idle in the played run: its main job's end -> the next one's start
    held_s: Optional[float]        # its main job's end -> a pilot holding the node (None: not in it)
    used_s: Optional[float]        # its main job's end -> a job using the node (None: not in it)


def first_in(times: list[float], lo: float, hi: float) -> Optional[float]:
    return next((t for t in times if lo <= t < hi), None)


def measure(periods: list[IdlePeriod], started: dict[int, tuple[float, str]], ended: dict[int, float],
            joins: dict[str, list[float]], uses: dict[str, list[float]], clock_end: float) -> list[PeriodLag]:
    """The lags of every period opened by a main job's end while the clock ran."""
    out = []
    for p in periods:
        if p.after is None:
            continue
        end = ended.get(p.after)
        close = min(started[p.until][0] if p.until in started else clock_end, clock_end)
        if end is None or end >= close:
            out.append(PeriodLag(p, None, None, None))
            continue
        held, used = first_in(joins.get(p.node, []), end, close), first_in(uses.get(p.node, []), end, close)
        out.append(PeriodLag(p, close - end, held - end if held is not None else None,
                             used - end if used is not None else None))
    return out


def usable_share(periods: list[IdlePeriod], lags: list[PeriodLag], c: float) -> Optional[float]:
    """S(c) of the module's model: the share of the idle node-seconds the lag leaves at ×c."""
    measured = [x.used_s for x in lags if x.used_s is not None]
    fill = percentile(measured, 0.5)
    if fill is None:
        return None
    lag_of = {id(x.period): x for x in lags}
    total = usable = 0.0
    for p in periods:
        x = lag_of.get(id(p))
        if p.after is None:
            lag = 0.0
        elif x is None or x.played_s is None:
            lag = fill
        elif x.used_s is None:
            lag = max(x.played_s, fill)
        else:
            lag = x.used_s
        total += p.trace_s
        usable += max(0.0, p.trace_s - c * lag)
    return usable / total if total else None


def lag_report(periods: list[IdlePeriod], lags: list[PeriodLag], compress: float) -> dict:
    """The JSON keys of the lag and of the harvest it implies at ×1, ×2 and the run's ×K."""
    held = [x.held_s for x in lags if x.held_s is not None]
    used = [x.used_s for x in lags if x.used_s is not None]

    def q(values: list[float], p: float) -> Optional[float]:
        v = percentile(values, p)
        return round(v, 3) if v is not None else None

    share = {c: usable_share(periods, lags, c) for c in (1.0, 2.0, compress)}
    r4 = {c: round(s, 4) if s is not None else None for c, s in share.items()}
    return {
        "idle_to_held_s_p50": q(held, 0.5), "idle_to_held_s_p99": q(held, 0.99),
        "idle_to_used_s_p50": q(used, 0.5), "idle_to_used_s_p99": q(used, 0.99),
        "idle_periods": {"opened": len(lags), "played": sum(x.played_s is not None for x in lags),
                         "held": len(held), "used": len(used)},
        "harvest_projected_x1": r4[1.0], "harvest_projected_x2": r4[2.0],
        "harvest_modelled": r4[compress],
    }


def write_lags(path: Path, lags: list[PeriodLag]) -> None:
    """One row per period opened by a main job's end, for a look beyond the percentiles."""
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["node", "after_job", "trace_s", "played_s", "held_s", "used_s"])
        for x in lags:
            w.writerow([x.period.node, x.period.after, round(x.period.trace_s, 3),
                        *("" if v is None else round(v, 3) for v in (x.played_s, x.held_s, x.used_s))])
