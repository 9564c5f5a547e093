"""`GET /metrics` in Prometheus text format, computed at scrape time from the last snapshot
(nothing is counted twice and a scrape never waits on the allocator)."""
from __future__ import annotations

import flask
import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import CollectorRegistry

from . import context

SOLVE_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
STATES = ("queued", "running", "done", "failed", "cancelled")


class HarvesterCollector:
    def collect(self):
        h = context.harvester
        snap = h.snapshot
        k = snap.kpis
        g = GaugeMetricFamily("harvest_idle_nodes", "Nodes the main scheduler leaves idle now")
        g.add_metric([], k.get("idle", 0))
        yield g
        g = GaugeMetricFamily("harvest_harvested_nodes", "Idle nodes training jobs hold now")
        g.add_metric([], k.get("harvested", 0))
        yield g
        g = GaugeMetricFamily("harvest_samples_per_second", "Aggregate training throughput")
        g.add_metric([], k.get("samples_per_second", 0.0))
        yield g
        g = GaugeMetricFamily("harvest_job_samples_per_second", "Throughput per running job", labels=["job"])
        for j in snap.jobs:
            if j["state"] == "running":
                g.add_metric([j["id"]], j["samples_per_second"])
        yield g
        g = GaugeMetricFamily("harvest_jobs", "Jobs by state", labels=["state"])
        counts = dict.fromkeys(STATES, 0)
        for j in snap.jobs:
            counts[j["state"]] = counts.get(j["state"], 0) + 1
        for s, n in counts.items():
            g.add_metric([s], n)
        yield g
        c = CounterMetricFamily("harvest_events", "Events handled by the controller, by kind", labels=["kind"])
        for kind, n in sorted(k.get("events_by_kind", {}).items()):
            c.add_metric([kind], n)
        yield c
        ctl = h.controller
        solve_ms = np.asarray(ctl.solve_ms if ctl else [], dtype=float) / 1000.0
        counts_le = [int(np.count_nonzero(solve_ms <= b)) for b in SOLVE_BUCKETS_S]
        buckets = [(repr(b), n) for b, n in zip(SOLVE_BUCKETS_S, counts_le)] + [("+Inf", len(solve_ms))]
        hist = HistogramMetricFamily("harvest_solver_seconds", "Allocator solve time per decision")
        hist.add_metric([], buckets, float(solve_ms.sum()))
        yield hist


def register(server: flask.Flask) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HarvesterCollector())

    @server.get("/metrics")
    def metrics():
        return flask.Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)
