"""Hostile soak: can one user's input stall a live harvester, or cost the other users' jobs?

    python -m bench.soak --hostile [--minutes 30] [--quiet-minutes 3] [--quick] [--json]

It starts the real app live (`--dispatch local`, `--local-nodes 8`, `--trust-user-commands`) on
loopback with a fresh store in a temporary directory. bob's normal job (examples/digits_cnn.py on
one node, paced at `--step-seconds`) trains alone for `--quiet-minutes` (its quiet throughput),
then for `--minutes` alice, a user without staff rights, keeps every kind of hostile job alive
(each re-registered when the harvester ends it):

- `pattern`: progress pattern `(a+)+$`, prints `"a"*26 + "!"` every second (catastrophic
  backtracking for a backtracking engine);
- `line30`: writes one 30 MB line without a newline, then sleeps; its log is read through
  `GET /api/jobs/<id>/logs` every 5 s;
- `nan`: pattern `samples=(\\S+)`, prints `samples=nan` and `samples=inf`;
- `forks`: starts 2,000 processes;

and registers `--registrations` jobs in a register-then-cancel loop spread over the run, while six
clients scrape `/metrics` back to back and a probe reads `/api/health` every 0.25 s.

Every JSON answer is parsed strictly (NaN or Infinity is a violation). Measured: `/api/health`
p50/p99/max, 5xx answers, strict-JSON violations, `/metrics` p50/p99, the server's RSS growth over
the hostile phase, and bob's throughput hostile / quiet. A table goes to stdout, progress to
stderr; `--json` adds the figures as a JSON last line. The server is stopped by PID at the end.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Callable, Optional

from bench.procmem import memory_mib
from tests.support.files import ROOT
from tests.support.server import AppProcess, start_app

PY = sys.executable
METRICS_CLIENTS = 6
NORMAL = {"name": "normal", "min_nodes": 1, "max_nodes": 1, "total_samples": 1e12, "global_batch": 64,
          "curve": "1:640"}
TORCHRUN = {"min_nodes": 1, "max_nodes": 1, "total_samples": 1e12, "curve": "1:100", "launcher": "torchrun",
            "stop_grace_seconds": 2}
#: alice's hostile jobs: the program each runs (python -c) and the pattern it is registered with
HOSTILE = {
    "pattern": ("import time\nwhile True:\n    print('a' * 26 + '!', flush=True)\n    time.sleep(1)", "(a+)+$"),
    "line30": ("import sys, time\nsys.stdout.write('x' * 30_000_000)\nsys.stdout.flush()\ntime.sleep(3600)",
               r"samples=(\d+)"),
    "nan": ("import time\nwhile True:\n    print('samples=nan', flush=True)\n    print('samples=inf', flush=True)\n"
            "    time.sleep(1)", r"samples=(\S+)"),
    "forks": ("import subprocess, time\nps = [subprocess.Popen(['sleep', '3600']) for _ in range(2000)]\n"
              "time.sleep(3600)", r"samples=(\d+)"),
}


def log(msg: str) -> None:
    print(f"[bench.hostile] {msg}", file=sys.stderr, flush=True)


def _no_constant(name: str):
    raise ValueError(f"not JSON: {name}")


def strict(text: str):
    """JSON as a browser's JSON.parse reads it: NaN and Infinity are errors."""
    return json.loads(text, parse_constant=_no_constant)


def pct(xs: list[float], q: float) -> Optional[float]:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


class Recorder:
    """Every answer the bench got: status counts, latencies by endpoint, strict-JSON violations."""

    def __init__(self, app: AppProcess) -> None:
        self.app, self.lock = app, threading.Lock()
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.status: Counter = Counter()
        self.violations: list[str] = []
        self.errors: Counter = Counter()

    def call(self, label: str, method: str, path: str, body=None, token: Optional[str] = None,
             parse: bool = True) -> tuple[int, object]:
        import urllib.error
        import urllib.request
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.app.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                status, text = r.status, r.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode("utf-8", "replace")
        except OSError as e:
            with self.lock:
                self.errors[f"{label}: {type(e).__name__}"] += 1
            return 0, None
        took = time.monotonic() - t0
        value: object = text
        if parse and text:
            try:
                value = strict(text)
            except ValueError as e:
                with self.lock:
                    self.violations.append(f"{label} {status}: {e}: {text[:120]!r}")
        with self.lock:
            self.latency[label].append(took)
            self.status[(label, status // 100)] += 1
        return status, value

    def fives(self) -> int:
        return sum(n for (_, cls), n in self.status.items() if cls == 5)


def loop(stop: threading.Event, every: float, body: Callable[[], None]) -> threading.Thread:
    def run():
        while not stop.is_set():
            try:
                body()
            except Exception as e:          # a bench thread reports and goes on: the run measures
                log(f"thread error: {type(e).__name__}: {e}")
            stop.wait(every)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def samples_done(rec: Recorder, job: str, token: str, tries: int = 5) -> Optional[float]:
    """bob's progress as the API reports it (asked again while the server does not answer)."""
    for _ in range(tries):
        status, body = rec.call("job", "GET", f"/api/jobs/{job}", token=token)
        if status == 200 and isinstance(body, dict):
            return body.get("samples_done")
        time.sleep(1)
    return None


def rate_over(rec: Recorder, job: str, token: str, seconds: float) -> float:
    """bob's samples per second over `seconds` of wall time (progress as the API reports it)."""
    t0, s0 = time.monotonic(), samples_done(rec, job, token) or 0.0
    time.sleep(seconds)
    t1, s1 = time.monotonic(), samples_done(rec, job, token) or 0.0
    return (s1 - s0) / (t1 - t0)


class Hostile:
    """alice: keeps one job of each hostile kind registered, floods registrations, reads logs."""

    def __init__(self, rec: Recorder, token: str, registrations: int, seconds: float) -> None:
        self.rec, self.token = rec, token
        self.jobs: dict[str, Optional[str]] = dict.fromkeys(HOSTILE)
        self.started = Counter()
        self.flood = Counter()
        self.said: dict[int, str] = {}     # the first answer of each unexpected status, for the table
        self.flood_left, self.flood_every = registrations, seconds * 0.9 / max(1, registrations)

    def keep_alive(self) -> None:
        for kind, (program, pattern) in HOSTILE.items():
            job = self.jobs[kind]
            if job is not None:
                status, body = self.rec.call("job", "GET", f"/api/jobs/{job}", token=self.token)
                if status == 200 and isinstance(body, dict) and body.get("state") in ("queued", "running"):
                    continue
            spec = {**TORCHRUN, "name": f"hostile-{kind}", "command": [PY, "-c", program],
                    "progress_pattern": pattern}
            status, body = self.rec.call("register", "POST", "/api/jobs", spec, token=self.token)
            if status == 201 and isinstance(body, dict):
                self.jobs[kind] = body["id"]
                self.started[kind] += 1
            else:
                self.started[f"{kind} refused {status}"] += 1

    def read_logs(self) -> None:
        job = self.jobs.get("line30")
        if job:
            self.rec.call("logs", "GET", f"/api/jobs/{job}/logs", token=self.token)
        self.rec.call("jobs", "GET", "/api/jobs", token=self.token)

    def register_cancel(self) -> None:
        if self.flood_left <= 0:
            return
        self.flood_left -= 1
        spec = {"name": "flood", "min_nodes": 1, "max_nodes": 1, "total_samples": 1e6, "curve": "1:100",
                "global_batch": 64, "command": [PY, "-c", "pass"]}
        status, body = self.rec.call("register", "POST", "/api/jobs", spec, token=self.token)
        self.flood[status] += 1
        if status not in (201, 429) and status not in self.said:
            self.said[status] = str(body)[:200]
        if status == 201 and isinstance(body, dict):
            self.rec.call("cancel", "DELETE", f"/api/jobs/{body['id']}", token=self.token)


def start(workdir: Path, extra: list[str]) -> AppProcess:
    return start_app(workdir, "--fresh", "--dispatch", "local", "--local-nodes", "8", "--no-profiler", *extra)


def register_normal(rec: Recorder, token: str, step_seconds: float) -> str:
    command = [PY, str(ROOT / "examples" / "digits_cnn.py"), "--log-every", "1000000",
               "--step-seconds", f"{step_seconds:g}"]
    status, body = rec.call("register", "POST", "/api/jobs", {**NORMAL, "command": command}, token=token)
    if status != 201:
        raise RuntimeError(f"bob's job was refused: {status} {body}")
    return body["id"]


def wait_training(rec: Recorder, job: str, token: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = samples_done(rec, job, token)
        if done and done > 0:
            return
        time.sleep(2)
    raise RuntimeError(f"bob's job {job} did not train within {timeout:.0f} s")


def run(workdir: Path, minutes: float, quiet_minutes: float, registrations: int, step_seconds: float,
        extra: list[str]) -> dict:
    app = start(workdir, extra)
    log(f"app on {app.url} (pid {app.proc.pid}); workdir {workdir}")
    rec, stop = Recorder(app), threading.Event()
    try:
        bob, alice = app.token("bob"), app.token("alice")
        normal = register_normal(rec, bob, step_seconds)
        wait_training(rec, normal, bob)
        time.sleep(20)                                       # past the first steps' warm-up
        log(f"quiet phase: {quiet_minutes:g} min of bob's job alone")
        quiet = rate_over(rec, normal, bob, quiet_minutes * 60)
        log(f"quiet throughput {quiet:.1f} samples/s; hostile phase: {minutes:g} min")
        rss0, _ = memory_mib(app.proc.pid)
        rec.latency.clear()
        seconds = minutes * 60
        evil = Hostile(rec, alice, registrations, seconds)
        rss = [rss0]
        threads = [loop(stop, 0.25, lambda: rec.call("health", "GET", "/api/health")),
                   loop(stop, 5.0, evil.keep_alive), loop(stop, 5.0, evil.read_logs),
                   loop(stop, evil.flood_every, evil.register_cancel),
                   loop(stop, 5.0, lambda: rss.append(memory_mib(app.proc.pid)[0]))]
        threads += [loop(stop, 0.0, lambda: rec.call("metrics", "GET", "/metrics", parse=False))
                    for _ in range(METRICS_CLIENTS)]
        t0, s0 = time.monotonic(), samples_done(rec, normal, bob) or 0.0
        while time.monotonic() - t0 < seconds:
            time.sleep(min(60.0, seconds - (time.monotonic() - t0)))
            h = rec.latency["health"]
            log(f"{(time.monotonic() - t0) / 60:.1f} min: health p99 {1000 * (pct(h, 0.99) or 0):.0f} ms, "
                f"RSS {rss[-1]:.0f} MiB, 5xx {rec.fives()}, violations {len(rec.violations)}, "
                f"hostile jobs started {dict(evil.started)}, flood {dict(evil.flood)}")
        s1 = samples_done(rec, normal, bob)
        hostile_rate = (s1 - s0) / (time.monotonic() - t0) if s1 is not None else 0.0
        stop.set()
        for t in threads:
            t.join(70)
        return figures(rec, evil, quiet, hostile_rate, rss, minutes, step_seconds)
    finally:
        stop.set()
        rc = app.stop()
        log(f"app stopped (pid {app.proc.pid}, exit {rc})")


def figures(rec: Recorder, evil: Hostile, quiet: float, hostile: float, rss: list[float],
            minutes: float, step_seconds: float) -> dict:
    ms = lambda xs, q: round(1000 * pct(xs, q), 1) if xs else None
    h, m = rec.latency["health"], rec.latency["metrics"]
    return {"minutes": minutes, "step_seconds": step_seconds,
            "health": {"n": len(h), "p50_ms": ms(h, 0.5), "p99_ms": ms(h, 0.99), "max_ms": ms(h, 1.0)},
            "metrics": {"n": len(m), "p50_ms": ms(m, 0.5), "p99_ms": ms(m, 0.99)},
            "logs": {"n": len(rec.latency["logs"]), "p99_ms": ms(rec.latency["logs"], 0.99)},
            "fives": rec.fives(), "status": {f"{k[0]} {k[1]}xx": n for k, n in sorted(rec.status.items())},
            "violations": rec.violations[:20], "violation_count": len(rec.violations),
            "transport_errors": dict(rec.errors),
            "rss_start_mib": round(rss[0], 1), "rss_max_mib": round(max(rss), 1),
            "rss_growth_mib": round(max(rss) - rss[0], 1),
            "quiet_samples_per_s": round(quiet, 2), "hostile_samples_per_s": round(hostile, 2),
            "throughput_ratio": round(hostile / quiet, 3) if quiet else None,
            "hostile_started": dict(evil.started), "flood": {str(k): v for k, v in evil.flood.items()},
            "flood_said": {str(k): v for k, v in evil.said.items()}}


def table(r: dict) -> str:
    ok = lambda good: "yes" if good else "**no**"
    h, m = r["health"], r["metrics"]
    rows = [("/api/health p99 (ms)", f"{h['p99_ms']} (p50 {h['p50_ms']}, max {h['max_ms']}, n {h['n']})", "≤ 100",
             ok(h["p99_ms"] is not None and h["p99_ms"] <= 100)),
            ("5xx answers", str(r["fives"]), "0", ok(r["fives"] == 0)),
            ("strict-JSON violations", str(r["violation_count"]), "0", ok(r["violation_count"] == 0)),
            ("harvester RSS growth (MiB)", f"{r['rss_growth_mib']} ({r['rss_start_mib']} → {r['rss_max_mib']})",
             "≤ 50", ok(r["rss_growth_mib"] <= 50)),
            ("normal job throughput, hostile / quiet",
             f"{r['throughput_ratio']} ({r['hostile_samples_per_s']} / {r['quiet_samples_per_s']} samples/s)",
             "≥ 0.90", ok((r["throughput_ratio"] or 0) >= 0.9)),
            ("/metrics p50 / p99 (ms), 6 clients", f"{m['p50_ms']} / {m['p99_ms']} (n {m['n']})", "", ""),
            ("logs of the 30 MB job p99 (ms)", f"{r['logs']['p99_ms']} (n {r['logs']['n']})", "", "")]
    lines = [f"Hostile soak: {r['minutes']:g} min, hostile jobs started {r['hostile_started']}, "
             f"register-then-cancel answers {r['flood']}", "",
             "| figure | measured | goal | met |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    if r["violations"]:
        lines += ["", "violations (first 20):"] + [f"- {v}" for v in r["violations"]]
    if r["flood_said"]:
        lines += ["", f"unexpected registration answers: {r['flood_said']}"]
    if r["transport_errors"]:
        lines += ["", f"connection errors: {r['transport_errors']}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.soak --hostile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="length of the hostile phase (default 30)")
    ap.add_argument("--quiet-minutes", type=float, default=3.0,
                    help="bob's job alone first, for its quiet throughput (default 3)")
    ap.add_argument("--registrations", type=int, default=1000,
                    help="register-then-cancel attempts spread over the hostile phase (default 1000)")
    ap.add_argument("--step-seconds", type=float, default=0.1,
                    help="the normal job's least step time (examples/digits_cnn.py --step-seconds; default 0.1)")
    ap.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                    help="one more argument for python -m app (repeat for each)")
    ap.add_argument("--keep", type=Path, metavar="DIR", help="run in DIR and keep it (the app's log and store)")
    ap.add_argument("--quick", action="store_true",
                    help="a short check that the bench works: 40 s hostile, 15 s quiet, 60 registrations")
    ap.add_argument("--json", action="store_true", help="print the results as JSON as the last line")
    args = ap.parse_args(argv)
    if args.quick:
        args.minutes, args.quiet_minutes, args.registrations = 40 / 60, 0.25, 60
    if args.minutes <= 0 or args.quiet_minutes <= 0 or args.registrations < 0:
        ap.error("--minutes and --quiet-minutes must be positive, --registrations 0 or more")
    if args.keep:
        res = run(args.keep, args.minutes, args.quiet_minutes, args.registrations, args.step_seconds, args.server_arg)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-hostile-") as tmp:
            res = run(Path(tmp), args.minutes, args.quiet_minutes, args.registrations, args.step_seconds,
                      args.server_arg)
    print(table(res))
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
