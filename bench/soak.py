"""Soak: does the served harvester's memory stay flat over the whole two-week Summit trace?

    python -m bench.soak [--json] [--days N] [--speed S] [--jobs 20] [--every 2]
    python -m bench.soak --hostile ...     (bench/hostile.py: one user's hostile jobs, a live harvester)

It starts the real app (`python -m app --fresh --start <trace start> --speed S`, by default the
top speed the app accepts, core.settings.SPEED_MAX) on loopback with a fresh store in a temporary
directory, and while the replay runs:

- registers `--jobs` jobs through the REST API (`POST /api/jobs` with a staff token from
  `POST /api/token`), spread evenly over the first 90 % of the simulated run, as users would;
- every `--every` wall seconds reads the server process's resident memory (VmRSS) and its peak
  (VmHWM) from /proc/<pid>/status, the simulated time from `/api/health` and the running and
  queued jobs from `/api/cluster?nodes=0`.

A row is printed at each simulated day (the sample that first reaches it): wall time, RSS, peak
RSS and jobs. It stops when the replay finishes, or after `--days` simulated days. A table goes to
stdout, progress to stderr; with --json the last stdout line is a JSON object with the rows,
`peak_rss_mib`, and `growth_after_day1_mib` (the largest RSS after day 1 minus RSS at day 1: the
"flat after warm-up" figure). The server is stopped by PID at the end, also on error.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from bench.hostile import main as hostile_main
from bench.procmem import memory_mib
from core.settings import SPEED_MAX
from tests.support.server import AppProcess, start_app

#: the trace's first event is 2021-02-10T00:48:48Z; start at midnight to replay all of it
TRACE_START = "2021-02-10T00:00:00Z"
TRACE_HOURS = 358.4            # to the last event (2021-02-24T22:19:29Z) from TRACE_START
DAY_S = 86400.0
STAFF = "staff1"
#: what each registered job asks for: up to 64 nodes, about 10 simulated hours at full size
JOB = {"min_nodes": 1, "max_nodes": 64, "total_samples": 1.0e9, "curve": "1:1200, 8:9000, 32:30000, 64:52000",
       "scale_up_seconds": 18, "scale_down_seconds": 12}


def log(msg: str) -> None:
    print(f"[bench.soak] {msg}", file=sys.stderr, flush=True)


def sample(app: AppProcess) -> Optional[dict]:
    """Simulated time, replay status, jobs running and queued, and the server's memory now."""
    status, health = app.get("/api/health")
    _, cluster = app.get("/api/cluster?nodes=0")
    if not isinstance(health, dict) or not isinstance(cluster, dict):
        return None
    rss, peak = memory_mib(app.proc.pid)
    kpis = cluster.get("kpis", {})
    return {"time": health.get("time"), "replay": health.get("replay"), "health": status,
            "rss_mib": rss, "peak_rss_mib": peak, "running": kpis.get("running"), "queued": kpis.get("queued")}


def soak(workdir: Path, speed: float, days: Optional[float], jobs: int, every: float) -> dict:
    hours = TRACE_HOURS if days is None else min(TRACE_HOURS, days * 24.0)
    log(f"starting the app (--fresh --start {TRACE_START} --hours {hours:g} --speed {speed:g}) ...")
    app = start_app(workdir, "--fresh", "--start", TRACE_START, "--hours", f"{hours:g}", "--speed", f"{speed:g}")
    log(f"app on {app.url} (pid {app.proc.pid})")
    rows: list[dict] = []
    registered, refused = 0, []
    try:
        token = app.token(STAFF)
        first = sample(app)
        t_sim0, wall0 = first["time"], time.monotonic()
        span = hours * 3600.0
        due = [t_sim0 + span * 0.9 * k / jobs for k in range(jobs)]
        next_day = 0
        while True:
            s = sample(app)
            if s is None or s["time"] is None:
                time.sleep(every)
                continue
            elapsed = s["time"] - t_sim0
            while registered < jobs and s["time"] >= due[registered] and s["replay"] == "running":
                status, body = app.request("POST", "/api/jobs", {"name": f"soak-{registered:02d}", **JOB},
                                           token=token)
                if status != 201:
                    refused.append(f"{status}: {str(body)[:120]}")
                registered += 1
            done = s["replay"] != "running"
            if elapsed >= next_day * DAY_S or done:
                row = {"day": round(elapsed / DAY_S, 2), "wall_s": round(time.monotonic() - wall0, 1),
                       "rss_mib": round(s["rss_mib"], 1), "peak_rss_mib": round(s["peak_rss_mib"], 1),
                       "running": s["running"], "queued": s["queued"], "registered": registered}
                rows.append(row)
                log(json.dumps(row))
                next_day = int(elapsed // DAY_S) + 1
            if done:
                break
            time.sleep(every)
    finally:
        rc = app.stop()
        log(f"app stopped (pid {app.proc.pid}, exit {rc})")
    wall = rows[-1]["wall_s"] if rows else 0.0
    after = [r["rss_mib"] for r in rows if r["day"] >= 1.0]
    day1 = after[0] if after else None
    return {"speed": speed, "hours": hours, "jobs": jobs, "registered": registered, "refused": refused,
            "cores": os.cpu_count(), "wall_s": wall, "days": rows,
            "peak_rss_mib": max((r["peak_rss_mib"] for r in rows), default=None),
            "growth_after_day1_mib": round(max(after) - day1, 1) if after else None,
            "speed_ratio": round(rows[-1]["day"] * DAY_S / (wall * speed), 3) if rows and wall else None}


def table(res: dict) -> str:
    lines = [f"Soak: {res['hours']:g} simulated hours at {res['speed']:g}x, {res['registered']} jobs registered "
             f"through the API ({len(res['refused'])} refused), {res['cores']} cores", "",
             "| simulated day | wall s | RSS MiB | peak RSS MiB | jobs running / queued | registered so far |",
             "|---:|---:|---:|---:|---:|---:|"]
    for r in res["days"]:
        lines.append(f"| {r['day']:.2f} | {r['wall_s']:.0f} | {r['rss_mib']:.1f} | {r['peak_rss_mib']:.1f} | "
                     f"{r['running']} / {r['queued']} | {r['registered']} |")
    lines += ["", f"RSS growth after day 1: {res['growth_after_day1_mib']} MiB; achieved speed "
                  f"{res['speed_ratio']} of the asked"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--hostile" in argv:
        return hostile_main([a for a in argv if a != "--hostile"])
    ap = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=float, help="stop after this many simulated days (default: the whole trace)")
    ap.add_argument("--speed", type=float, default=SPEED_MAX, help=f"replay speed (default {SPEED_MAX:g}, the top)")
    ap.add_argument("--jobs", type=int, default=20, help="jobs registered through the API (default 20)")
    ap.add_argument("--every", type=float, default=2.0, help="wall seconds between samples (default 2)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON as the last line")
    args = ap.parse_args(argv)
    if args.days is not None and args.days <= 0:
        ap.error("--days: a positive number of simulated days")
    if args.jobs < 0 or args.every <= 0:
        ap.error("--jobs must be 0 or more and --every positive")
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        res = soak(Path(tmp), args.speed, args.days, args.jobs, args.every)
    print(table(res))
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
