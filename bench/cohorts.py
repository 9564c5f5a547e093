"""Do nodes freed together get reclaimed together? The fact placement by cohort rests on.

    python -m bench.cohorts [--trace PATH] [--json]

Reads an idle/busy trace (default: the shipped Summit one), cuts it into idle fragments and
reports, over the pairs of nodes that became idle in the same second (a cohort: one batch job
ending), the share reclaimed in the same second and within a minute; where, in machine order, the
reclaims that take part of a cohort take it (core.reclaim_order's learner run over the whole
trace); how often a reclaim took exactly the first idle nodes of the whole machine in name order
(first fit: what a scheduler filling from its first free node does) and how many reclaims took
one run of consecutive idle nodes in name order; and, for comparison, how well a node's or its
rack's past fragment lengths predict its next one (correlation of the logs, using only fragments
that had ended before the new one began).
"""
from __future__ import annotations

import argparse
import bisect
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from core.model import node_order, rack_of
from core.reclaim_order import ReclaimOrder
from core.sources.trace import read_transitions

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "data" / "summit-idle-nodes-2021-02.csv.gz"


def fragments(path: Path) -> list[tuple[str, float, float]]:
    """(node, idle since, reclaimed at) for every idle fragment that ended."""
    start: dict[str, float] = {}
    out = []
    for t, node, idle, _ in read_transitions(path):
        if idle:
            start.setdefault(node, t)
        elif node in start:
            out.append((node, start.pop(node), t))
    return out


def together(frags: list[tuple[str, float, float]], within: float) -> float:
    """Share of pairs in a cohort whose reclaims are at most `within` seconds apart."""
    cohorts: dict[float, list[float]] = defaultdict(list)
    for _, began, ended in frags:
        cohorts[began].append(ended)
    same = pairs = 0
    for ends in cohorts.values():
        if len(ends) < 2:
            continue
        ends.sort()
        for e in ends:
            same += bisect.bisect_right(ends, e + within) - bisect.bisect_left(ends, e - within) - 1
        pairs += len(ends) * (len(ends) - 1)
    return same / pairs if pairs else float("nan")


def reclaim_order(path: Path) -> ReclaimOrder:
    """The learner placement uses, fed every moment of the trace: which end of a cohort its
    reclaims take first."""
    order = ReclaimOrder()
    idle: dict[str, float] = {}
    gone: dict[str, float] = {}
    at = None
    for t, node, is_idle, _ in read_transitions(path):
        if t != at:
            if gone:
                order.taken(gone, idle)
            gone, at = {}, t
        if is_idle:
            idle.setdefault(node, t)
        elif node in idle:
            gone[node] = idle.pop(node)
    if gone:
        order.taken(gone, idle)
    return order


def first_fit(path: Path) -> dict:
    """Of the reclaims that left something idle, those that took exactly the first k idle nodes
    of the machine in name order, and the nodes they took; `expected` is how many would if the
    scheduler picked its k nodes at random (the sum of 1 / C(idle, k)). Also, of the reclaims of
    two nodes or more, how many took one run of consecutive idle nodes in name order, and how
    many two: what placement would need jobs to hold for a reclaim to hit one job."""
    idle: list[tuple[tuple, str]] = []      # idle nodes, sorted by node_order
    is_idle_now: set[str] = set()
    gone: set[str] = set()
    at = None
    out = {"reclaims": 0, "nodes": 0, "first_fit": 0, "first_fit_nodes": 0, "first_fit_under_half": 0,
           "expected": 0.0, "multi": 0, "one_run": 0, "two_runs": 0}

    def close() -> None:
        k, n = len(gone), len(idle)
        if k >= 2:
            places = sorted(bisect.bisect_left(idle, (node_order(x), x)) for x in gone)
            runs = 1 + sum(1 for a, b in zip(places, places[1:]) if b != a + 1)
            out["multi"] += 1
            out["one_run"] += runs == 1
            out["two_runs"] += runs == 2
        if 0 < k < n:
            out["reclaims"] += 1
            out["nodes"] += k
            out["expected"] += math.exp(math.lgamma(k + 1) + math.lgamma(n - k + 1) - math.lgamma(n + 1))
            if {x for _, x in idle[:k]} == gone:
                out["first_fit"] += 1
                out["first_fit_nodes"] += k
                out["first_fit_under_half"] += 2 * k < n
        for x in gone:
            del idle[bisect.bisect_left(idle, (node_order(x), x))]
            is_idle_now.discard(x)
    for t, node, is_idle, _ in read_transitions(path):
        if t != at:
            close()
            gone, at = set(), t
        if is_idle:
            if node not in is_idle_now:
                is_idle_now.add(node)
                bisect.insort(idle, (node_order(node), node))
        elif node in is_idle_now:
            gone.add(node)
    close()
    out["expected"] = round(out["expected"], 1)
    return out


def history_correlation(frags: list[tuple[str, float, float]], key) -> float:
    """Correlation of log(next fragment length) with log(median of the last 20 that ended for the
    same key before it began)."""
    by_end = sorted(frags, key=lambda f: f[2])
    past: dict[str, list[float]] = defaultdict(list)
    xs, ys = [], []
    i = 0
    for node, began, ended in sorted(frags, key=lambda f: f[1]):
        while i < len(by_end) and by_end[i][2] <= began:
            n, b, e = by_end[i]
            past[key(n)].append(e - b)
            i += 1
        seen = past[key(node)]
        if len(seen) >= 3 and ended > began:
            xs.append(np.log(max(1.0, float(np.median(seen[-20:])))))
            ys.append(np.log(ended - began))
    return float(np.corrcoef(xs, ys)[0, 1]) if len(xs) > 2 else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cohorts", description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    frags = fragments(args.trace)
    order = reclaim_order(args.trace)
    fit = first_fit(args.trace)
    out = {"fragments": len(frags),
           "cohort_pairs_same_second": round(together(frags, 0.0), 4),
           "cohort_pairs_within_60s": round(together(frags, 60.0), 4),
           "partial_reclaims": order.count,
           "partial_reclaim_position": None if not order.count else round(order.mean, 4),
           "order_direction": order.direction,
           "first_fit": fit,
           "corr_node_history": round(history_correlation(frags, lambda n: n), 4),
           "corr_rack_history": round(history_correlation(frags, rack_of), 4)}
    print(f"{args.trace.name}: {out['fragments']:,} idle fragments that ended")
    rows = [("pairs of nodes freed in the same second, reclaimed in the same second",
             f"{out['cohort_pairs_same_second']:.1%}"),
            ("pairs of nodes freed in the same second, reclaimed within 60 s", f"{out['cohort_pairs_within_60s']:.1%}"),
            (f"where {order.count:,} reclaims that took part of a cohort took it (0 first node, 1 last)",
             "–" if not order.count else f"{order.mean:.3f}"),
            (f"reclaims that took exactly the first idle nodes in name order, of {fit['reclaims']:,}",
             f"{fit['first_fit']:,}"),
            ("  the same if the scheduler picked at random", f"{fit['expected']:,.1f}"),
            ("  of them, ones that left over half of what was idle", f"{fit['first_fit_under_half']:,}"),
            ("  share of the reclaimed nodes they took",
             "–" if not fit["nodes"] else f"{fit['first_fit_nodes'] / fit['nodes']:.1%}"),
            (f"reclaims of 2+ nodes that took one run of consecutive idle nodes, of {fit['multi']:,}",
             f"{fit['one_run']:,}"),
            ("  that took two runs", f"{fit['two_runs']:,}"),
            ("correlation of a fragment's log length with its node's past ones", f"{out['corr_node_history']:.3f}"),
            ("correlation of a fragment's log length with its rack's past ones", f"{out['corr_rack_history']:.3f}")]
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{w}}  {v:>6}")
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
