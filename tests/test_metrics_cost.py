"""/metrics costs what is live, not the history (issue 57, item 5): its per-owner usage counters
are kept up to date from what is new in the store (core/usage_tally.py) and equal the full
report's recount (core/usage.py) however the history is read in pieces; its text is rebuilt at
most every --metrics-interval, one thread at a time, the others served the previous text; and
--metrics-token-file closes it to scrapers without the token (401). Real servers, real stores."""
from __future__ import annotations

import random
import re
import sqlite3
import threading
import urllib.error
import urllib.request

import pytest

from app.scrape import CachedText
from core.usage import Change, JobRecord, Progress, report
from core.usage_tally import JobRow, UsageTally
from tests.support.procs import last_json, run_module
from tests.support.server import start_app
from tests.support.waiting import wait

NODES = [f"n{k}" for k in range(12)]
OWNERS = ["alice", "bob", "carol", ""]


def slots(node: str) -> int:
    return 1 + int(node[1:]) % 4


def history(rng: random.Random, jobs: int = 40):
    """A random run: jobs start, grow, shrink and end on 12 nodes, a node sometimes taken by
    another job with no row removing it (a row lost to a crash), progress at each change."""
    changes, progress, records = [], [], {}
    held: dict[str, set] = {}
    owner_of = {f"j{k}": rng.choice(OWNERS) for k in range(jobs)}
    done = {j: rng.uniform(0, 1e6) for j in owner_of}
    t = 1000.0
    for _ in range(600):
        t += rng.uniform(0.5, 60)
        jid = rng.choice(list(owner_of))
        before = held.get(jid, set())
        after = set(rng.sample(NODES, rng.randint(0, 4)))
        added, removed = sorted(after - before), sorted(before - after)
        changes.append(Change(t, jid, tuple(added), tuple(removed)))
        done[jid] += rng.uniform(0, 5e4)
        progress.append(Progress(t, jid, done[jid], rng.uniform(0, 100)))
        held[jid] = after
        for other in held:
            if other != jid:
                held[other] -= set(added)
    until = t + 30
    for jid, owner in owner_of.items():
        ended = rng.random() < 0.7
        if ended:           # an ended job gives back its nodes
            nodes = held.pop(jid, set())
            if nodes:
                changes.append(Change(until - 10, jid, (), tuple(sorted(nodes))))
        records[jid] = JobRecord(jid, jid, owner, done[jid] + rng.uniform(0, 10), until - 10 if ended else None)
    return changes, progress, records, until


def rows(records, wanted, ended):
    return {j: JobRow(records[j].owner, j in ended, records[j].samples_done) for j in wanted if j in records}


@pytest.mark.parametrize("seed", range(8))
def test_the_tally_read_in_pieces_equals_the_full_reports_recount(seed):
    rng = random.Random(seed)
    changes, progress, records, until = history(rng)
    ended = {j for j, r in records.items() if r.end_time is not None}
    tally = UsageTally()
    cuts = sorted(rng.sample(range(1, len(changes)), 6)) + [len(changes)]
    k0 = p0 = 0
    for cut in cuts:      # a read after each save: what was new since the last; rows as they are now
        new_c = changes[k0:cut]
        t_end = new_c[-1].time
        new_p = [p for p in progress[p0:] if p.time <= t_end]
        names = tally.watched() | {c.job for c in new_c} | {p.job for p in new_p}
        last = cut == len(changes)
        tally.apply(rows(records, names, ended if last else set()),
                    [(c.time, c.job, list(c.added), list(c.removed)) for c in new_c],
                    [(p.job, p.samples_done) for p in new_p], until if last else t_end, slots)
        k0, p0 = cut, p0 + len(new_p)
    full = report(changes, progress, records.values(), [], None, None, until, "owner", slots=slots)
    got = tally.totals(slots)
    assert set(got) == {r.key for r in full.rows}
    for r in full.rows:
        t = got[r.key]
        assert t.node_seconds == pytest.approx(r.totals.node_seconds, rel=1e-9), r.key
        assert t.gpu_seconds == pytest.approx(r.totals.gpu_seconds, rel=1e-9), r.key
        assert t.samples == pytest.approx(r.totals.samples, rel=1e-9, abs=1e-6), r.key
    assert len(tally.watched()) == len(records) - len(ended), "ended jobs are folded in and forgotten"


def test_one_thread_rebuilds_while_the_others_get_the_previous_text():
    now = [0.0]
    release, started = threading.Event(), threading.Event()
    calls = []

    def build() -> bytes:
        calls.append(now[0])
        if len(calls) == 2:
            started.set()
            release.wait(10)
        return f"text {len(calls)}".encode()

    cache = CachedText(build, 5.0, clock=lambda: now[0])
    assert cache.get() == b"text 1" and cache.get() == b"text 1" and cache.rebuilds == 1
    now[0] = 4.9
    assert cache.get() == b"text 1" and cache.rebuilds == 1, "within the interval: the same text"
    now[0] = 5.0
    got = []
    t = threading.Thread(target=lambda: got.append(cache.get()))
    t.start()
    assert started.wait(10)
    assert [cache.get() for _ in range(20)] == [b"text 1"] * 20, "while one rebuilds, the others get the last"
    release.set()
    t.join(10)
    assert got == [b"text 2"] and cache.get() == b"text 2" and cache.rebuilds == 2
    zero = CachedText(lambda: b"x", 0.0)
    for _ in range(3):
        zero.get()
    assert zero.rebuilds == 3, "interval 0: a build per scrape"


def scrape(app, token=None) -> tuple[int, object, str]:
    req = urllib.request.Request(app.url + "/metrics")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def value(text: str, series: str) -> float:
    m = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    assert m, (series, text[-1500:])
    return float(m.group(1))


TOKEN = "s3cret-token-for-prometheus-0123456789"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    d = tmp_path_factory.mktemp("metrics-token")
    (d / "metrics.token").write_text(TOKEN + "\n")
    a = start_app(d, "--dispatch", "simulated", "--local-nodes", "4", "--tick", "0.1",
                  "--metrics-interval", "3600", "--metrics-token-file", str(d / "metrics.token"))
    yield a
    a.stop()


def test_the_token_is_required_when_set(guarded):
    status, headers, _ = scrape(guarded)
    assert status == 401 and headers.get("WWW-Authenticate", "").startswith("Bearer"), (status, dict(headers))
    assert scrape(guarded, "wrong-token-of-the-same-kind-0123")[0] == 401
    status, _, text = scrape(guarded, TOKEN)
    assert status == 200 and "harvest_idle_nodes" in text


def test_within_the_interval_the_same_text_is_served_and_built_once(guarded):
    texts = [scrape(guarded, TOKEN)[2] for _ in range(5)]
    assert len(set(texts)) == 1
    assert value(texts[0], "harvest_metrics_builds_total") == 1.0


def test_a_token_file_that_holds_no_token_stops_the_start(tmp_path):
    (tmp_path / "empty").write_text("\n")
    for path in (tmp_path / "empty", tmp_path / "missing"):
        r = run_module("app", "--metrics-token-file", str(path), "--print-config")
        assert r.returncode == 2 and str(path) in r.stderr and "token" in r.stderr, r.stderr


def test_the_counters_equal_the_usage_report_after_allocation_history(tmp_path):
    """Jobs of two owners rescale one another on 4 nodes and end, /metrics read (and so the
    tally brought up to date) all along; once all have ended the counters are the report's, and
    again after a restart (the tally seeded from the store)."""
    args = ("--dispatch", "simulated", "--local-nodes", "4", "--tick", "0.1", "--metrics-interval", "0")
    app = start_app(tmp_path / "a", *args)
    spec = {"min_nodes": 1, "max_nodes": 4, "total_samples": 1e12, "scale_up_seconds": 1, "scale_down_seconds": 1,
            "curve": {"nodes": [1, 2, 4], "samples_per_second": [10.0, 12.0, 13.0]}}     # shared, not hoarded
    try:
        tokens = {u: app.token(u) for u in ("alice", "bob", "staff1")}
        live: list[str] = []
        for k in range(6):
            owner = ("alice", "bob")[k % 2]
            status, body = app.request("POST", "/api/jobs", {**spec, "name": f"j{k}", "priority": 1 + k},
                                       token=tokens[owner])
            assert status == 201, body
            live.append(body["id"])
            wait(lambda: app.get(f"/api/jobs/{body['id']}")[1]["nodes"], 20, "the new job gets nodes")
            scrape(app)
            if len(live) == 3:      # the oldest ends: the others grow into its nodes
                app.request("DELETE", f"/api/jobs/{live.pop(0)}", token=tokens["staff1"])
        for j in app.get("/api/jobs?state=running")[1]["jobs"]:
            app.request("DELETE", f"/api/jobs/{j['id']}", token=tokens["staff1"])
            scrape(app)
        wait(lambda: app.get("/api/jobs?state=running")[1]["count"] == 0, 20, "every job ended")
        changes = sqlite3.connect(f"file:{app.db}?mode=ro", uri=True).execute(
            "select count(*) from allocations").fetchone()[0]
        assert changes >= 12, changes

        def agree(a) -> bool:
            rows = a.get("/api/usage", token=a.token("staff1"))[1]["rows"]
            text = scrape(a)[2]
            assert {r["owner"] for r in rows} == {"alice", "bob"}, rows
            for r in rows:
                for metric in ("node_seconds", "gpu_seconds", "samples"):
                    got = value(text, f'harvest_owner_{metric}_total{{owner="{r["owner"]}"}}')
                    assert got == pytest.approx(r[metric], rel=1e-9), (metric, r, got)
            return True
        wait(lambda: agree(app), 10, "the counters equal the report")
    finally:
        app.stop()
    app = start_app(tmp_path / "a", *args, db=app.db)
    try:
        assert agree(app)
    finally:
        app.stop()


def test_the_bench_runs_in_its_quick_mode():
    """bench.metrics end to end on a small synthetic history (figures: docs/operators/metrics.md)."""
    out = last_json(run_module("bench.metrics", "--quick", "--json", timeout=600))
    assert out["changes"] == 20_000
    assert {(r["server"].split(",")[0], r["clients"]) for r in out["rows"]} == {("after", 1), ("after", 6)}
    assert all(r["scrapes"] > 0 and 0 < r["p50_ms"] <= r["p95_ms"] for r in out["rows"])
