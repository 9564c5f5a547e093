"""Load benchmark: how many dashboard viewers one harvester process holds while it replays.

    python -m bench.load [--json] [--viewers 10,50,200] [--seconds 30] [--speed 600] [--threads N]
                         [--connection-limit N]

It starts the real app (`python -m app --fresh --speed S`, tests.support.server.start_app) on
loopback, loads the cluster page once in Chromium to capture the grid callback request a real
page sends (bench/dashboard.py), and then, for each viewer count N in turn against the same
server, runs for `--seconds`:

- N viewers, each a thread with its own keep-alive connection, polling the grid update once a
  second as a browser's interval does: the first request with no key (a new visitor gets the
  whole figure), then each with the key the previous answer returned, through what a browser's
  JSON does to it (an answer with no grid output means the snapshot has not changed since: the
  viewer keeps its key, as a page does). Viewers start spread over the first second.
- N/10 (at least one) API pollers: `GET /api/cluster?nodes=0` once a second each.

It reports the grid update's round trip p50/p95 (the first `--warmup` seconds dropped), the
replay's achieved speed as a fraction of the asked speed (simulated seconds from /api/health
over wall seconds), errors (HTTP errors, timeouts, refused connections, of viewers and pollers)
and the server's CPU use. A table goes to stdout, progress to stderr; with --json the last stdout
line is a JSON object with one entry per viewer count and, for the largest count,
`update_ms_p50`, `update_ms_p95`, `speed_ratio`, `errors` at the top level.
The server is stopped by PID at the end, also on error.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

from bench.dashboard import CALLBACK, Client, capture_request, js_roundtrip, pct, request_for
from tests.support.server import CHROMIUM, CHROMIUM_ARGS, start_app

TICKS = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[bench.load] {msg}", file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of `pid` so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


class Viewer(threading.Thread):
    """One browser tab on the cluster page: a grid update a second over its own connection."""

    def __init__(self, url: str, template: dict, stop: threading.Event, t0: float, offset: float) -> None:
        super().__init__(daemon=True)
        self.url, self.template, self.stop, self.t0, self.offset = url, template, stop, t0, offset
        self.samples: list[tuple[float, float]] = []      # (seconds since t0, ms)
        self.errors: list[str] = []

    def run(self) -> None:
        client: Optional[Client] = None
        key: Any = None
        i = 0
        while not self.stop.is_set():
            due = self.t0 + self.offset + i
            self.stop.wait(max(0.0, due - time.monotonic()))
            if self.stop.is_set():
                break
            try:
                client = client or Client(self.url)
                r = client.post(CALLBACK, request_for(self.template, 1 + i, key))
                self.samples.append((time.monotonic() - self.t0, r["ms"]))
                answer = (r["json"] or {}).get("response", {})
                if answer:               # empty (or a 204): the snapshot has not changed, keep the key
                    if "grid-key" not in answer:
                        raise KeyError(f"grid-key: {json.dumps(r['json'])[:300]}")
                    key = js_roundtrip(answer["grid-key"]["data"])
            except Exception as e:  # noqa: BLE001 - every failure is counted, the viewer goes on
                self.errors.append(f"{type(e).__name__}: {str(e)[:120]}")
                if client is not None:
                    client.close()
                client = None
            i += 1
        if client is not None:
            client.close()


class Poller(threading.Thread):
    """An API client (a script or a CLI watching the cluster): GET /api/cluster once a second."""

    def __init__(self, host: str, port: int, stop: threading.Event, offset: float) -> None:
        super().__init__(daemon=True)
        self.host, self.port, self.stop, self.offset = host, port, stop, offset
        self.samples: list[float] = []
        self.errors: list[str] = []

    def run(self) -> None:
        t0 = time.monotonic() + self.offset
        conn: Optional[http.client.HTTPConnection] = None
        i = 0
        while not self.stop.is_set():
            self.stop.wait(max(0.0, t0 + i - time.monotonic()))
            if self.stop.is_set():
                break
            try:
                conn = conn or http.client.HTTPConnection(self.host, self.port, timeout=30)
                s = time.perf_counter()
                conn.request("GET", "/api/cluster?nodes=0")
                r = conn.getresponse()
                r.read()
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}")
                self.samples.append((time.perf_counter() - s) * 1000.0)
            except Exception as e:  # noqa: BLE001
                self.errors.append(f"{type(e).__name__}: {str(e)[:120]}")
                if conn is not None:
                    conn.close()
                conn = None
            i += 1
        if conn is not None:
            conn.close()


def health(host: str, port: int) -> tuple[dict, float]:
    """/api/health and when it answered (an overloaded server may take long, or not answer)."""
    conn = http.client.HTTPConnection(host, port, timeout=120)
    try:
        conn.request("GET", "/api/health")
        r = conn.getresponse()
        return json.loads(r.read()), time.monotonic()
    except (OSError, http.client.HTTPException, ValueError) as e:
        log(f"/api/health did not answer: {e}")
        return {}, time.monotonic()
    finally:
        conn.close()


def one_load(url: str, host: str, port: int, pid: int, template: dict, viewers: int, seconds: float,
             warmup: float, speed: float) -> dict:
    stop = threading.Event()
    t0 = time.monotonic() + 0.5
    views = [Viewer(url, template, stop, t0, random.random()) for _ in range(viewers)]
    polls = [Poller(host, port, stop, random.random()) for _ in range(max(1, viewers // 10))]
    (h0, w0), c0 = health(host, port), cpu_seconds(pid)
    for t in views + polls:
        t.start()
    next_log = time.monotonic() + 10
    while time.monotonic() < t0 + seconds:
        time.sleep(0.5)
        if time.monotonic() >= next_log:
            done = sum(len(v.samples) for v in views)
            log(f"{viewers} viewers: {done} grid updates, {sum(len(v.errors) for v in views)} errors so far")
            next_log += 10
    (h1, w1), c1 = health(host, port), cpu_seconds(pid)
    stop.set()
    t_stop = time.monotonic()
    for t in views + polls:
        t.join(65)
    ms = [m for v in views for at, m in v.samples if at >= warmup]
    errors = [e for t in views + polls for e in t.errors]
    sim = h1["time"] - h0["time"] if h0.get("time") and h1.get("time") else None
    wall = w1 - w0
    asked = sum(int(t_stop - (t0 + v.offset)) + 1 for v in views)     # updates due by the stop
    return {"viewers": viewers, "pollers": len(polls), "updates": len(ms),
            "updates_per_s": round(sum(len(v.samples) for v in views) / max(wall, 1e-9), 1),
            "answered": round(sum(len(v.samples) for v in views) / max(asked, 1.0), 3),
            "update_ms_p50": round(pct(ms, 50), 1), "update_ms_p95": round(pct(ms, 95), 1),
            "update_ms_max": round(max(ms), 1) if ms else None,
            "api_ms_p95": round(pct([m for p in polls for m in p.samples], 95), 1),
            "speed_ratio": round(sim / (wall * speed), 3) if sim is not None and wall > 0 else None,
            "errors": len(errors), "error_kinds": sorted({e.split(":")[0] for e in errors}),
            "error_examples": sorted(set(errors))[:3],
            "server_cpu_pct": round(100.0 * (c1 - c0) / wall, 1), "replay": h1.get("replay")}


def run(workdir: Path, counts: list[int], seconds: float, warmup: float, speed: float,
        threads: Optional[int], connection_limit: Optional[int] = None) -> dict:
    from playwright.sync_api import sync_playwright

    extra = (["--threads", str(threads)] if threads else []) + \
        (["--connection-limit", str(connection_limit)] if connection_limit else [])
    log(f"starting the app (--fresh --speed {speed:g} {' '.join(extra)}) ...")
    app = start_app(workdir / "server", "--fresh", "--speed", str(speed), *extra)
    host, port = app.url.split("//")[1].split(":")
    log(f"app on {app.url} (pid {app.proc.pid})")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                template, _ = capture_request(browser, app.url, watch_s=1.0)
            finally:
                browser.close()
        results = []
        for n in counts:
            log(f"{n} viewers for {seconds:g} s ...")
            r = one_load(app.url, host, int(port), app.proc.pid, template, n, seconds, warmup, speed)
            log(json.dumps(r))
            results.append(r)
            time.sleep(2.0)          # let the last requests drain before the next count
    finally:
        rc = app.stop()
        log(f"app stopped (pid {app.proc.pid}, exit {rc})")
    return {"speed": speed, "seconds": seconds, "threads": threads, "connection_limit": connection_limit,
            "cores": os.cpu_count(), "runs": results}


def speed_text(ratio: Optional[float]) -> str:
    return "no answer" if ratio is None else f"{100 * ratio:.0f} %"


def table(res: dict) -> str:
    lines = [f"Dashboard load: replay at {res['speed']:g}x, {res['seconds']:g} s per row, "
             f"{res['cores']} cores, viewers poll the grid once a second, N/10 API pollers",
             "", "| viewers | grid update p50 | p95 | answered | replay speed | errors | server CPU |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["runs"]:
        lines.append(f"| {r['viewers']} | {r['update_ms_p50']:.1f} ms | {r['update_ms_p95']:.1f} ms | "
                     f"{100 * r['answered']:.0f} % | {speed_text(r['speed_ratio'])} | {r['errors']} | "
                     f"{r['server_cpu_pct']:.0f} % |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.split("\n\n")[0])
    ap.add_argument("--viewers", default="10,50,200", help="viewer counts, comma-separated (default 10,50,200)")
    ap.add_argument("--seconds", type=float, default=30.0, help="seconds per viewer count (default 30)")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds dropped from each count's figures")
    ap.add_argument("--speed", type=float, default=600.0, help="replay speed (default 600)")
    ap.add_argument("--threads", type=int, default=None, help="the server's --threads (default: the app's)")
    ap.add_argument("--connection-limit", type=int, default=None,
                    help="the server's --connection-limit (default: the app's; the viewers and pollers each "
                         "keep one connection open, so N + N/10 above it wait to be accepted)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON as the last line")
    args = ap.parse_args(argv)
    try:
        counts = [int(v) for v in args.viewers.split(",") if v.strip()]
    except ValueError:
        ap.error(f"--viewers: give whole numbers separated by commas, not {args.viewers!r}")
    if not counts or min(counts) < 1:
        ap.error("--viewers: at least one viewer")
    if args.seconds <= args.warmup:
        ap.error("--seconds must be longer than --warmup")
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        res = run(Path(tmp), counts, args.seconds, args.warmup, args.speed, args.threads, args.connection_limit)
    print(table(res))
    if args.json:
        top = max(res["runs"], key=lambda r: r["viewers"])
        print(json.dumps({**res, **{k: top[k] for k in ("update_ms_p50", "update_ms_p95", "speed_ratio", "errors")}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
