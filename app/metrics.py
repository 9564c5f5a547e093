"""`GET /metrics` in Prometheus text format, built from the last snapshot (nothing is counted
twice and a scrape never waits on the allocator) at most every --metrics-interval seconds
(app/scrape.py), each build costing what is live, not the history (core/usage_tally.py)."""
from __future__ import annotations

from typing import Optional

import flask
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import CollectorRegistry

from core.snapshot import SOLVE_BUCKETS_S

from . import context
from .logs import skipped_ticks
from .scrape import CachedText, authorized

STATES = ("queued", "running", "done", "failed", "cancelled")
ENDED = STATES[2:]


class HarvesterCollector:
    def __init__(self) -> None:
        self.cache: Optional[CachedText] = None

    def own_counters(self):
        """What serving /metrics costs: builds made, and how long the last one took."""
        if self.cache is None:
            return
        c = CounterMetricFamily("harvest_metrics_builds", "Builds of this text (at most one per "
                                "--metrics-interval, however many clients scrape)")
        c.add_metric([], self.cache.rebuilds)
        yield c
        g = GaugeMetricFamily("harvest_metrics_build_seconds", "How long the last build of this text took")
        g.add_metric([], self.cache.last_build_s)
        yield g

    def collect(self):
        snap = context.harvester.snapshot
        k = snap.kpis
        g = GaugeMetricFamily("harvest_idle_nodes", "Nodes the main scheduler leaves idle now")
        g.add_metric([], k.get("idle", 0))
        yield g
        g = GaugeMetricFamily("harvest_harvested_nodes", "Idle nodes training jobs hold now")
        g.add_metric([], k.get("harvested", 0))
        yield g
        g = GaugeMetricFamily("harvest_idle_gpus", "GPUs (slots) of the nodes idle now")
        g.add_metric([], k.get("idle_gpus", 0))
        yield g
        g = GaugeMetricFamily("harvest_harvested_gpus", "GPUs (slots) of the nodes training jobs hold now: "
                                                        "their ranks, or with simulated workers the GPUs held")
        g.add_metric([], k.get("harvested_gpus", 0))
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
        for s in ENDED:       # the controller's counts: a snapshot may list only the newest ended jobs
            if isinstance(k.get(s), int):
                counts[s] = k[s]
        for s, n in counts.items():
            g.add_metric([s], n)
        yield g
        c = CounterMetricFamily("harvest_events", "Events handled by the controller, by kind", labels=["kind"])
        for kind, n in sorted(k.get("events_by_kind", {}).items()):
            c.add_metric([kind], n)
        yield c
        c = CounterMetricFamily("harvest_ticks_skipped", "Controller ticks skipped because the last one was "
                                "still running (a slow step; logged only at debug)")
        c.add_metric([], skipped_ticks.count)
        yield c
        yield from usage_counters()
        yield from self.own_counters()
        yield from quota_gauges(snap.quotas)
        yield from fair_share_gauges(snap.fair_shares)
        yield from pilot_counters()
        st = snap.solve_times
        buckets = [(repr(b), n) for b, n in zip(SOLVE_BUCKETS_S, st.le)] + [("+Inf", st.count)]
        hist = HistogramMetricFamily("harvest_solver_seconds", "Allocator solve time per decision")
        hist.add_metric([], buckets, st.sum_s)
        yield hist


def usage_counters():
    """Node-seconds, GPU-seconds and samples per owner since the run began, from the store's
    history as of its last save (GET /api/usage's figures, kept up to date from what is new):
    they survive a restart, and only grow."""
    families = (CounterMetricFamily("harvest_owner_node_seconds", "Node-seconds held by each owner's jobs",
                                    labels=["owner"]),
                CounterMetricFamily("harvest_owner_gpu_seconds", "GPU-seconds (node-seconds x the node's slots) held "
                                    "by each owner's jobs", labels=["owner"]),
                CounterMetricFamily("harvest_owner_samples", "Samples processed by each owner's jobs",
                                    labels=["owner"]))
    for owner, t in sorted(context.harvester.usage_totals().items()):
        for family, value in zip(families, (t.node_seconds, t.gpu_seconds, t.samples)):
            family.add_metric([owner], value)
    yield from families


def quota_gauges(rows):
    """Each owner with a limit in the users file: what they hold and used against it (core.quotas);
    nothing without quotas."""
    if not rows:
        return
    held = GaugeMetricFamily("harvest_owner_nodes", "Nodes each owner's jobs hold now", labels=["owner"])
    cap = GaugeMetricFamily("harvest_owner_quota_max_nodes", "Each owner's node cap (owners with one)",
                            labels=["owner"])
    used = GaugeMetricFamily("harvest_owner_quota_used_node_hours", "Node-hours each owner used this UTC day "
                             "or week (from Monday)", labels=["owner", "period"])
    limit = GaugeMetricFamily("harvest_owner_quota_node_hours", "Each owner's node-hours per day or week "
                              "(owners with one)", labels=["owner", "period"])
    blocked = GaugeMetricFamily("harvest_owner_quota_blocked", "1 while a period quota keeps the owner's jobs "
                                "waiting", labels=["owner"])
    for r in rows:
        held.add_metric([r["owner"]], r["held"])
        blocked.add_metric([r["owner"]], 1 if r["blocked"] else 0)
        if r["max_nodes"] is not None:
            cap.add_metric([r["owner"]], r["max_nodes"])
        for period in ("day", "week"):
            used.add_metric([r["owner"], period], r[period]["used_h"])
            if r[period]["limit_h"] is not None:
                limit.add_metric([r["owner"], period], r[period]["limit_h"])
    yield from (held, cap, used, limit, blocked)


def fair_share_gauges(factors):
    """With a fair-share objective: each running owner's factor (core.fairshare), the weight of
    their jobs in the solve. Jobs without an owner show as owner=""."""
    if not factors:
        return
    g = GaugeMetricFamily("harvest_owner_fair_share_factor", "Each running owner's fair-share factor, "
                          "2^(-use/share): 1 used nothing, 0.5 at their share", labels=["owner"])
    for owner, f in sorted(factors.items()):
        g.add_metric([owner], f)
    yield g


def pilot_counters():
    """A Slurm source's pilots (core/pilots/stats.py): what it sent slurmctld, what main jobs took
    back, how fast it got off their nodes. Nothing for other sources."""
    stats = getattr(getattr(context.harvester, "source", None), "stats", None)
    if stats is None:
        return
    s = stats.snapshot()
    c = CounterMetricFamily("harvest_slurm_pilots", "Pilot jobs (Slurm or PBS) by what happened to them: "
                            "submitted, cancelled by the harvester, preempted by the scheduler, lost without a word",
                            labels=["outcome"])
    for outcome, n in s["counts"].items():
        c.add_metric([outcome], n)
    yield c
    g = GaugeMetricFamily("harvest_slurm_hub_connections", "Pilots connected to the hub now")
    g.add_metric([], s["connections"])
    yield g
    g = GaugeMetricFamily("harvest_slurm_hub_connections_peak", "Most pilots connected at once since the start")
    g.add_metric([], s["peak_connections"])
    yield g
    hist = HistogramMetricFamily("harvest_slurm_vacate_seconds", "From the scheduler's signal to a pilot "
                                 "until it is gone from the hub, its workers stopped")
    hist.add_metric([], [("+Inf" if b == float("inf") else repr(b), n) for b, n in s["vacate_buckets"]],
                    s["vacate_sum_s"])
    yield hist


def register(server: flask.Flask, interval_s: float = 0.0, token: Optional[str] = None) -> CachedText:
    """/metrics, rebuilt at most every `interval_s`; with a `token`, only for requests that
    bring it (Authorization: Bearer), others a 401."""
    registry = CollectorRegistry(auto_describe=False)
    collector = HarvesterCollector()
    registry.register(collector)
    collector.cache = cache = CachedText(lambda: generate_latest(registry), interval_s)

    @server.get("/metrics")
    def metrics():
        if not authorized(flask.request.headers.get("Authorization"), token):
            return flask.Response("send Authorization: Bearer <the token of --metrics-token-file>\n", 401,
                                  {"WWW-Authenticate": 'Bearer realm="metrics"'}, mimetype="text/plain")
        return flask.Response(cache.get(), mimetype=CONTENT_TYPE_LATEST)
    return cache
