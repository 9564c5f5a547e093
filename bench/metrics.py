"""What a `/metrics` scrape costs on a long history: `python -m bench.metrics [--quick]
[--changes N] [--baseline DIR]`.

1. The real app (`python -m app --dispatch simulated --local-nodes 64`) starts once on a fresh
   store and stops, leaving a live run's store. SYNTHETIC LOAD, not a measured run: N allocation
   changes (default 200,000; 50 per job, 20 owners, every job ended, over the 30 days before
   that start) are then appended through the real store API (core.store.Batch.change: the rows
   the controller writes, with their throughput points and job rows).
2. The app starts again on that store (it resumes the run), 4 live jobs are registered, and
   clients scrape `/metrics` back to back: 1 client, then 6 at once, each for a few seconds,
   with the text rebuilt on every scrape (`--metrics-interval 0`: each scrape pays a build, the
   "cold" cost) and as served by default (`--metrics-interval 5`: "warm").
3. `--baseline DIR` runs the same against another checkout's app (e.g. `git archive HEAD` of the
   code before issue 57, whose every scrape rebuilt the usage report over the whole history).
   Also timed in this process: one full usage report over the store (core/usage.py) against the
   incremental tally's first read and a later one (core/usage_tally.py).

Prints a table; the goal is a p50 at most 50 ms with 200,000 changes. `--quick`: 20,000 changes,
2 s per client mix (a smoke run for `make bench`'s list and tests)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Optional

from core.model import Curve, Job, JobState
from core.store import Batch, Store
from core.usage_tally import UsageFeed
from tests.support.ports import free_port
from tests.support.server import AppProcess, start_app, write_users

GOAL_P50_MS = 50.0
OWNERS = [f"user{k:02d}" for k in range(20)]
PER_JOB = 50
DAY_S = 86400.0


def synthetic_history(db: Path, nodes: list[str], changes: int, now: float) -> int:
    """SYNTHETIC LOAD: `changes` allocation changes of ended jobs through the store's own API."""
    store = Store(db)
    jobs = max(1, changes // PER_JOB)
    span = 30 * DAY_S
    step = span / (jobs * PER_JOB + 1)
    t, made = now - span - 3600, 0
    batch = Batch()
    for k in range(jobs):
        job = Job(id=f"syn-{k:06d}", min_nodes=1, max_nodes=8, total_samples=1e9, curve=Curve((1, 8), (10.0, 70.0)),
                  owner=OWNERS[k % len(OWNERS)], name=f"synthetic {k}", submit_time=t, start_time=t,
                  state=JobState.RUNNING)
        first = (k * 7) % len(nodes)
        held: list[str] = []
        for c in range(PER_JOB):
            size = 0 if c == PER_JOB - 1 else 1 + (c * 3 + k) % 8
            after = [nodes[(first + i) % len(nodes)] for i in range(size)]
            job.samples_done += 1000.0 * len(held)
            if c == PER_JOB - 1:
                job.state, job.end_time = JobState.DONE, t
            batch.change(t, job, held, after, "grow" if len(after) > len(held) else "shrink", 10.0 * size,
                         job.samples_done, "simulated")
            held, t, made = after, t + step, made + 1
        if batch.rows > 50_000:
            store.write(batch)
            batch = Batch()
    store.write(batch)
    store.close()
    return made


def launch(workdir: Path, db: Path, args: list[str], app_dir: Optional[Path]) -> AppProcess:
    """The app of this checkout (tests.support.server.start_app) or of `app_dir`."""
    if app_dir is None:
        return start_app(workdir, *args, db=db, timeout=180)
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = workdir / f"baseline-{port}.log"
    env = {**os.environ, "PYTHONPATH": str(app_dir), "PYTHONUNBUFFERED": "1"}
    env.pop("HARVEST_USERS", None)
    proc = subprocess.Popen([sys.executable, "-m", "app", "--host", "127.0.0.1", "--port", str(port), "--db", str(db),
                             "--users", str(write_users(workdir / "users.json")), *args, "--trust-user-commands"],
                            cwd=app_dir, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    app = AppProcess(proc, f"http://127.0.0.1:{port}", db, log)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the baseline app exited with {proc.returncode}:\n{app.output()}")
        try:
            if app.get("/api/health")[0] == 200:
                return app
        except OSError:
            pass
        time.sleep(0.3)
    app.stop()
    raise RuntimeError(f"the baseline app did not start:\n{app.output()}")


def scrape_ms(url: str) -> float:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as r:
        r.read()
    return (time.perf_counter() - t0) * 1000


def clients(url: str, n: int, seconds: float) -> list[float]:
    """`n` clients scraping back to back for `seconds`: every latency (ms)."""
    out: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def one() -> None:
        while time.monotonic() < stop:
            ms = scrape_ms(url)
            with lock:
                out.append(ms)
    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else xs[0]


def measure(label: str, workdir: Path, db: Path, extra: list[str], seconds: float,
            app_dir: Optional[Path]) -> list[tuple]:
    app = launch(workdir, db, ["--dispatch", "simulated", "--local-nodes", "64", *extra], app_dir)
    rows = []
    try:
        first = scrape_ms(app.url + "/metrics")
        token = app.token("alice")
        for k in range(4):
            app.request("POST", "/api/jobs", {"name": f"live {k}", "min_nodes": 1, "max_nodes": 8, "total_samples": 1e12,
                                              "curve": {"nodes": [1, 8], "samples_per_second": [10.0, 70.0]}},
                        token=token)
        for n in (1, 6):
            xs = clients(app.url + "/metrics", n, seconds)
            rows.append((label, n, len(xs), pct(xs, 50), pct(xs, 95), first))
    finally:
        app.stop()
    return rows


def in_process(db: Path) -> list[tuple[str, float]]:
    """One full report over the store (what each scrape did before) against the tally's reads."""
    from core.service.base import Harvester
    out = []
    h = Harvester(db, 1.0)
    t0 = time.perf_counter()
    rep = h.usage(None, None, "owner")
    out.append(("full usage report (core/usage.py)", (time.perf_counter() - t0) * 1000))
    feed = UsageFeed(db)
    t0 = time.perf_counter()
    tally = feed.totals()
    out.append(("tally, first read (the seed, once per start)", (time.perf_counter() - t0) * 1000))
    t0 = time.perf_counter()
    feed.totals()
    out.append(("tally, a later read (nothing new)", (time.perf_counter() - t0) * 1000))
    assert {r.key for r in rep.rows} == set(tally), "the tally and the report name the same owners"
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.metrics", description=__doc__.splitlines()[0])
    ap.add_argument("--changes", type=int, default=200_000, help="synthetic allocation changes (default 200000)")
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds each client mix scrapes (default 8)")
    ap.add_argument("--baseline", type=Path, metavar="DIR", help="also measure the app of this checkout")
    ap.add_argument("--quick", action="store_true", help="20,000 changes, 2 s per mix")
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON line, last")
    args = ap.parse_args(argv)
    if args.quick:
        args.changes, args.seconds = 20_000, 2.0
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
        work = Path(tmp)
        db = work / "harvest.db"
        app = start_app(work / "seed", "--fresh", "--dispatch", "simulated", "--local-nodes", "64", db=db)
        nodes = [n["name"] for n in app.get("/api/cluster")[1]["nodes"]]
        app.stop()
        t0 = time.perf_counter()
        made = synthetic_history(db, nodes, args.changes, time.time())
        print(f"SYNTHETIC LOAD: {made:,} allocation changes appended in {time.perf_counter() - t0:.1f} s "
              f"({made // PER_JOB:,} ended jobs of {len(OWNERS)} owners)", flush=True)
        timings = in_process(db)
        for what, ms in timings:
            print(f"{what:48} {ms:9.1f} ms", flush=True)
        rows = []
        if args.baseline:
            rows += measure("before (baseline checkout)", work / "base", db, [], args.seconds, args.baseline)
        rows += measure("after, cold (--metrics-interval 0)", work / "cold", db, ["--metrics-interval", "0"],
                        args.seconds, None)
        rows += measure("after, warm (default 5 s)", work / "warm", db, [], args.seconds, None)
    print(f"\n/metrics with {made:,} allocation changes in the store (goal: p50 <= {GOAL_P50_MS:g} ms)\n")
    print(f"| {'server':38} | clients | scrapes | p50 ms | p95 ms | first scrape ms |")
    print(f"|{'-' * 40}|---------|---------|--------|--------|-----------------|")
    for label, n, count, p50, p95, first in rows:
        print(f"| {label:38} | {n:7} | {count:7} | {p50:6.1f} | {p95:6.1f} | {first:15.1f} |")
    worst = max(r[3] for r in rows if not r[0].startswith("before"))
    print(f"\nafter: worst p50 {worst:.1f} ms: {'meets' if worst <= GOAL_P50_MS else 'MISSES'} the goal")
    if args.json:
        print(json.dumps({"changes": made, "goal_p50_ms": GOAL_P50_MS, "worst_p50_ms": worst,
                          "rows": [dict(zip(("server", "clients", "scrapes", "p50_ms", "p95_ms", "first_ms"), r))
                                   for r in rows], "in_process_ms": dict(timings)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
