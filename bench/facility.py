"""A facility day on a real Slurm: the Summit trace as main jobs, played twice, without and with
the harvester, to show what harvesting costs the main workload and what it gains.

    python -m bench.facility [--json] [--nodes 128] [--start ISO] [--hours 1] [--compress 10]
                             [--slurm 22.05|24.11] [--jobs FILE] [--job-count 10] [--keep DIR] [--quick]

1. Brings up the test Slurm (tests/support/slurm.py: munged, slurmctld and N slurmd on loopback,
   the README's site set-up: partition `main` preempts partition `scavenger`, GraceTime=0).
2. Takes a slice of the Summit trace: N nodes (the first N, in machine order, that are idle at
   some moment of the window: a node busy throughout gives nothing to harvest) over
   [start, start + hours). Each busy period becomes a main job pinned to its node (`sbatch -p main
   -w nodeI`), submitted at its trace time divided by `--compress` K and running for its span
   divided by K (cut at the window's end); the job writes the time it began. Periods that are
   under way at the window's start are submitted, and running, before the clock starts.
3. Plays the slice without the harvester, then with it, as a site runs it (`python -m app
   --source slurm --dispatch simulated --no-profiler --slurm-max-pilots N`, every other setting
   its default) and `--job-count` jobs of the job set registered through the API. The whole world
   runs K times faster: each job's rescale costs are divided by K and its throughputs multiplied
   by K, so the harvest is the day's, seen in time-lapse.
4. Reports, side by side: main-job start delay (the trace's time -> the job running, from the
   time the job wrote), and per job the delay added by the harvester; the share of the slice's
   idle node-seconds held by pilots and used by jobs against what core.replay predicts for the
   same nodes, window, compression and jobs; vacate latency (Slurm's signal to a pilot -> the
   pilot gone, from the harvester's /metrics histogram); the harvester's CPU share of one core
   (its process and the Slurm commands it ran) and peak RSS; slurmctld RPCs per second caused by
   the harvester (root's RPCs with it minus without it, from `sdiag`, over the same played
   window), and the main scheduler's cycle times with and without it; pilots submitted,
   cancelled, preempted; hub connections at peak.

With --json the last stdout line is the whole result (`nodes`, `main_delay_ms`,
`added_delay_ms_p50`, `harvest_share`, `replay_share`, `harvest_vs_replay`, `vacate_ms_p50`,
`harvester_cpu_pct`, `harvester_rpc_per_s`, ...). `--quick` (16 nodes, a 3-minute slice at K=6,
about 90 s in all) checks that every step works (tests/test_bench_facility.py), not the
figures. Progress goes to stderr. What the figures mean for a machine of Summit's size is a
calculation in docs/evaluation/facility.md.
"""
from __future__ import annotations

import argparse
import bisect
import csv
import json
import os
import re
import sys
import tempfile
import threading
import time
import urllib.error
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from core.controller_config import ControllerConfig
from core.jobsets import load_jobset
from core.model import Job
from core.replay import DEFAULT_JOBS, DEFAULT_NODE_LIST, DEFAULT_TRACE, Replay, ReplaySettings, percentile
from core.sources.trace import read_node_list, read_transitions
from core.timeutil import iso, parse_iso

DEFAULT_START = "2021-02-18T12:00:00Z"
QUICK = {"nodes": 16, "start": "2021-02-17T12:00:00Z", "hours": 0.05, "compress": 6.0, "job_count": 3}
PILOT_NAME = "harvest-pilot"
#: goals from the issue: added main-job start delay, harvest against the replay, harvester load
GOALS = {"added_delay_ms_p50": 500.0, "added_delay_ms_p99": 1000.0, "harvest_vs_replay": 0.90,
         "harvester_cpu_pct": 10.0, "harvester_rpc_per_s": 5.0}
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[bench.facility] {msg}", file=sys.stderr, flush=True)


# ---- the slice ----------------------------------------------------------------------------------
@dataclass
class MainJob:
    idx: int
    node: str          # the Slurm node it is pinned to (nodeI)
    at: float          # seconds after the clock starts (compressed); 0 for the initial ones
    run_s: float       # compressed span
    initial: bool      # under way when the window opens: submitted before the clock starts


@dataclass
class Slice:
    summit: list[str]                      # the trace's node names, in order
    names: list[str]                       # node1..nodeN, the same order
    start: float
    end: float
    compress: float
    jobs: list[MainJob]
    idle_node_s: float                     # idle node-seconds of the slice, compressed
    lines: list[tuple[float, str, str]]    # the compressed trace (time, node, state) for the replay

    @property
    def window_s(self) -> float:
        return (self.end - self.start) / self.compress


def take_slice(trace: Path, node_list: Path, nodes: int, start: float, hours: float, compress: float) -> Slice:
    """The slice's main jobs, its idle node-seconds and its compressed trace (see the module doc)."""
    end = start + hours * 3600.0
    order = {n: i for i, n in enumerate(read_node_list(node_list))}
    state: dict[str, bool] = {}                # idle? as of the window's start
    inside: list[tuple[float, str, bool]] = []
    for t, node, idle, _ in read_transitions(trace):
        if t < start:
            state[node] = idle
        elif t < end:
            inside.append((t, node, idle))
        else:
            break
    seen = {n for n, idle in state.items() if idle} | {n for _, n, _ in inside}
    pick = sorted(seen, key=lambda n: (order.get(n, len(order)), n))[:nodes]
    if len(pick) < nodes:                      # too few ever idle: the rest busy throughout
        rest = [n for n in sorted(order, key=order.get) if n not in set(pick)]
        pick += rest[:nodes - len(pick)]
    name = {s: f"node{i + 1}" for i, s in enumerate(pick)}
    k = compress
    idle = {s: state.get(s, False) for s in pick}
    since = {s: start for s in pick}
    jobs: list[MainJob] = []
    idle_s = 0.0
    lines = [(start - 1.0, name[s], "idle") for s in pick if idle[s]]

    def close(s: str, t: float) -> None:
        nonlocal idle_s
        if idle[s]:
            idle_s += t - since[s]
        else:
            b = since[s]
            jobs.append(MainJob(len(jobs), name[s], (b - start) / k, (t - b) / k, b == start))

    for t, s, now_idle in inside:
        if s not in name or idle[s] == now_idle:
            continue
        close(s, t)
        idle[s], since[s] = now_idle, t
        lines.append((start + (t - start) / k, name[s], "idle" if now_idle else "busy"))
    for s in pick:
        close(s, end)
    jobs.sort(key=lambda j: (j.at, j.idx))
    for i, j in enumerate(jobs):
        j.idx = i
    return Slice(pick, [name[s] for s in pick], start, end, k, jobs, idle_s / k, lines)


def compressed_jobs(path: Path, count: int, compress: float) -> list[Job]:
    """The first `count` jobs of the job set, K times faster: costs / K, throughputs x K."""
    jobs = load_jobset(path)[:count]
    if len(jobs) < count:
        raise SystemExit(f"{path} holds {len(jobs)} job(s), fewer than --job-count {count}")
    for j in jobs:
        j.scale_up_seconds /= compress
        j.scale_down_seconds /= compress
        for attr in ("curve", "true_curve", "given_curve"):
            c = getattr(j, attr)
            if c is not None:
                setattr(j, attr, type(c)(c.nodes, tuple(r * compress for r in c.samples_per_second)))
    return jobs


def curve_text(job: Job) -> str:
    return ", ".join(f"{n}:{r:g}" for n, r in zip(job.curve.nodes, job.curve.samples_per_second))


# ---- what core.replay predicts ------------------------------------------------------------------
def replay_prediction(sl: Slice, jobs: list[Job], folder: Path) -> dict:
    """core.replay on the compressed slice, with the same jobs all there at the start, curves given."""
    trace, node_list, jobset = folder / "slice.csv", folder / "slice-nodes.txt", folder / "jobs.csv"
    with trace.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["time", "node", "state"])
        for t, node, st in sl.lines:
            w.writerow([datetime_text(t), node, st])
    node_list.write_text("\n".join(sl.names) + "\n")
    with jobset.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["job", "model", "submit_time", "min_nodes", "max_nodes", "total_samples",
                    "scale_up_seconds", "scale_down_seconds", "nodes", "samples_per_second"])
        for j in jobs:
            w.writerow([j.id, j.name or j.id, iso(sl.start), j.min_nodes, j.max_nodes, j.total_samples,
                        j.scale_up_seconds, j.scale_down_seconds, ";".join(map(str, j.curve.nodes)),
                        ";".join(f"{r:g}" for r in j.curve.samples_per_second)])
    settings = ReplaySettings(trace=trace, jobs=jobset, node_list=node_list, start=iso(sl.start),
                              hours=sl.window_s / 3600.0, config=ControllerConfig(), curves="given",
                              gpus_per_node=1)
    return Replay(settings).run()


def datetime_text(t: float) -> str:
    whole = int(t)
    return f"{iso(whole)[:-1]}.{int(round((t - whole) * 1e6)):06d}Z"


# ---- one pass -----------------------------------------------------------------------------------
@dataclass
class PassResult:
    harvester: bool
    started: dict[int, tuple[float, str]] = field(default_factory=dict)   # idx -> (wall time, node)
    clock0: float = 0.0                    # wall time the clock started
    measured_s: float = 0.0
    sdiag_before: dict = field(default_factory=dict)
    sdiag_after: dict = field(default_factory=dict)
    held_node_s: float = 0.0
    used_node_s: float = 0.0
    cpu_s: float = 0.0
    rss_mb: float = 0.0
    metrics: dict = field(default_factory=dict)
    pilots_left: list[str] = field(default_factory=list)
    cold_start_s: Optional[float] = None
    submit_late_ms: list[float] = field(default_factory=list)
    sent_at: dict[int, float] = field(default_factory=dict)                # idx -> wall time sbatch returned
    samples: list[tuple[float, int, int]] = field(default_factory=list)    # (s after the clock, held, used)


def sbatch_main(cluster, job: MainJob, marks: Path) -> None:
    """The job writes when it began and on which node, then runs its span. One under way at the
    window's start runs its span from the clock's start (the `go` file), not from its own: the
    harvester's start, before the clock, must not shorten it."""
    wait = f"while [ ! -e {marks}/go ]; do sleep 0.1; done; " if job.initial else ""
    cluster.sbatch("-p", "main", "-w", job.node, "-N", "1", "-J", f"main-{job.idx}", "-o", "/dev/null",
                   "--wrap", f"echo $(date +%s.%N) $SLURMD_NODENAME > {marks}/{job.idx}.tmp && "
                             f"mv {marks}/{job.idx}.tmp {marks}/{job.idx}; {wait}exec sleep {job.run_s:.3f}")


def read_marks(marks: Path) -> dict[int, tuple[float, str]]:
    out = {}
    for p in marks.iterdir():
        if p.name.isdigit():
            t, node = p.read_text().split()
            out[int(p.name)] = (float(t), node)
    return out


def parse_sdiag(text: str) -> dict:
    """sdiag's main and backfill cycle statistics and RPC counts per user and per type."""
    out: dict = {"users": {}, "types": {}, "main": {}, "backfill": {}}
    section = ""
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("Main schedule statistics"):
            section = "main"
        elif s.startswith("Backfilling stats"):
            section = "backfill"
        elif s.startswith("Remote Procedure Call statistics by message type"):
            section = "types"
        elif s.startswith("Remote Procedure Call statistics by user"):
            section = "users"
        elif s.startswith("Pending RPC") or s.startswith("Remote Procedure Call statistics by"):
            section = ""
        elif section in ("main", "backfill"):
            m = re.match(r"(Mean cycle|Max cycle|Total cycles|Last cycle):\s+(\d+)", s)
            if m:
                out[section][m.group(1)] = int(m.group(2))
        elif section in ("users", "types"):
            m = re.match(r"(\S+)\s*\(\s*\d+\)\s+count:(\d+)", s)
            if m:
                out[section][m.group(1)] = int(m.group(2))
    return out


def proc_cpu_s(pid: int) -> float:
    """CPU seconds of the process and its reaped children (the Slurm commands it ran)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLK_TCK


def proc_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def histogram_quantile(m: dict, name: str, q: float) -> Optional[float]:
    """Prometheus's histogram_quantile: linear within the bucket that holds the q-th sample."""
    buckets = sorted(((float(dict(labels)["le"]), v) for (n, labels), v in m.items()
                      if n == f"{name}_bucket"), key=lambda b: b[0])
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    lo_b, lo_n = 0.0, 0.0
    for b, n in buckets:
        if n >= rank:
            if b == float("inf"):
                return lo_b
            return lo_b + (b - lo_b) * ((rank - lo_n) / (n - lo_n) if n > lo_n else 0.0)
        lo_b, lo_n = b, n
    return lo_b


def play(sl: Slice, jobs: list[Job], harvester: bool, version: str, folder: Path) -> PassResult:
    from tests.support.server import start_app
    from tests.support.slurm import start_cluster
    res = PassResult(harvester)
    what = "with the harvester" if harvester else "without the harvester"
    log(f"{what}: starting Slurm with {len(sl.names)} nodes ({version})")
    cluster = start_cluster(folder / "slurm", nodes=len(sl.names), gpus=0, version=version)
    app = None
    try:
        cluster.wait_quiet(60)
        marks = folder / "slurm" / "marks"
        marks.mkdir()
        marks.chmod(0o777)
        initial = [j for j in sl.jobs if j.initial]
        later = [j for j in sl.jobs if not j.initial]
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda j: sbatch_main(cluster, j, marks), initial))
        deadline = time.monotonic() + 60
        while len(read_marks(marks)) < len(initial):
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(read_marks(marks))} of {len(initial)} initial main jobs ran")
            time.sleep(0.2)
        log(f"{what}: {len(initial)} main job(s) under way at the window's start are running")
        if harvester:
            app = start_app(folder / "app", "--source", "slurm", *cluster.app_args(), "--dispatch", "simulated",
                            "--no-profiler", "--slurm-max-pilots", str(len(sl.names)), "--metrics-interval", "0")
            token = app.token("alice")
            for j in jobs:
                status, body = app.request("POST", "/api/jobs", {
                    "name": j.name or j.id, "min_nodes": j.min_nodes, "max_nodes": j.max_nodes,
                    "total_samples": j.total_samples, "curve": curve_text(j),
                    "scale_up_seconds": j.scale_up_seconds, "scale_down_seconds": j.scale_down_seconds},
                    token=token)
                if status != 201:
                    raise RuntimeError(f"registering {j.id}: {status} {body}")
            free = len(sl.names) - len(initial)
            t0 = time.monotonic()
            while True:
                k = app.get("/api/cluster?nodes=0")[1]["kpis"]
                if k["idle"] >= free and k["harvested"] >= min(free, sum(j.max_nodes for j in jobs)):
                    res.cold_start_s = time.monotonic() - t0
                    break
                if time.monotonic() - t0 > 180:
                    raise RuntimeError(f"the harvester held {k['idle']} of {free} idle nodes after 180 s")
                time.sleep(0.5)
            log(f"{what}: pilots hold all {free} idle node(s), jobs use them ({res.cold_start_s:.1f} s)")
        (marks / "go").touch()
        cluster.run("sdiag", "--reset")
        res.sdiag_before = parse_sdiag(cluster.run("sdiag").stdout)
        cpu0 = proc_cpu_s(app.proc.pid) if app else 0.0
        res.clock0 = time.time()
        mono0 = time.monotonic()
        stop = threading.Event()

        def sample() -> None:
            last = time.monotonic()
            while not stop.wait(1.0):
                try:
                    k = app.get("/api/cluster?nodes=0")[1]["kpis"]
                except (urllib.error.URLError, OSError, KeyError):
                    continue
                now = time.monotonic()
                res.held_node_s += k["idle"] * (now - last)
                res.used_node_s += k["harvested"] * (now - last)
                res.samples.append((now - mono0, k["idle"], k["harvested"]))
                last = now

        sampler = threading.Thread(target=sample, daemon=True) if app else None
        if sampler:
            sampler.start()

        def submit(j: MainJob) -> None:
            wait = mono0 + j.at - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            res.submit_late_ms.append(max(0.0, (time.monotonic() - mono0 - j.at) * 1000))
            sbatch_main(cluster, j, marks)
            res.sent_at[j.idx] = time.time()

        next_note = 30.0
        with ThreadPoolExecutor(4) as pool:
            futures = []
            for j in later:
                while mono0 + j.at - time.monotonic() > 2.0:     # feed the pool just in time
                    time.sleep(0.5)
                    el = time.monotonic() - mono0
                    if el >= next_note:
                        next_note += 30.0
                        log(f"{what}: {el:.0f}/{sl.window_s:.0f} s, {len(futures)}/{len(later)} main jobs sent")
                futures.append(pool.submit(submit, j))
            for f in futures:
                f.result()
        rest = mono0 + sl.window_s - time.monotonic()
        if rest > 0:
            time.sleep(rest)
        res.measured_s = time.monotonic() - mono0
        stop.set()
        if sampler:
            sampler.join(5)
        res.sdiag_after = parse_sdiag(cluster.run("sdiag").stdout)
        if app:
            res.cpu_s = proc_cpu_s(app.proc.pid) - cpu0
            res.rss_mb = proc_hwm_mb(app.proc.pid)
            res.metrics = app.metrics()
            app.stop()
            app = None
        deadline = time.monotonic() + 60
        while True:
            live = [j for j in cluster.jobs().values() if j["job_state"] in ("PENDING", "RUNNING", "COMPLETING",
                                                                            "CONFIGURING")]
            res.pilots_left = [j["job_id"] for j in live if j["name"] == PILOT_NAME]
            if not live or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        res.started = read_marks(marks)
        log(f"{what}: {len(res.started)}/{len(sl.jobs)} main jobs ran; {len(res.pilots_left)} pilot(s) left")
    finally:
        if app is not None:
            app.stop()
        left = cluster.stop()
        if left:
            log(f"left running in the Slurm namespace after stop: {left}")
    return res


# ---- the report ---------------------------------------------------------------------------------
def delays_ms(sl: Slice, r: PassResult) -> dict[int, float]:
    return {j.idx: (r.started[j.idx][0] - (r.clock0 + j.at)) * 1000.0
            for j in sl.jobs if not j.initial and j.idx in r.started}


def slurm_delays_ms(sl: Slice, r: PassResult) -> dict[int, float]:
    """From sbatch's return to the job running: Slurm's part alone, without the submission's own
    lateness (sbatch answers slower while slurmctld and this host are busier)."""
    return {j.idx: (r.started[j.idx][0] - r.sent_at[j.idx]) * 1000.0
            for j in sl.jobs if j.idx in r.started and j.idx in r.sent_at}


def dist(values: list[float]) -> dict:
    return {k: round(percentile(values, q), 1) if values else None
            for k, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99), ("max", 1.0))}


def rpc_rate(r: PassResult, user: str = "root") -> float:
    return (r.sdiag_after["users"].get(user, 0) - r.sdiag_before["users"].get(user, 0)) / r.measured_s


def report(sl: Slice, version: str, without: PassResult, with_: PassResult, replay: dict) -> dict:
    d0, d1 = delays_ms(sl, without), delays_ms(sl, with_)
    both = sorted(set(d0) & set(d1))
    added = [d1[i] - d0[i] for i in both]
    s0, s1 = slurm_delays_ms(sl, without), slurm_delays_ms(sl, with_)
    added_slurm = [s1[i] - s0[i] for i in sorted(set(s0) & set(s1))]
    wrong = {w: [j.idx for j in sl.jobs if j.idx not in r.started or r.started[j.idx][1] != j.node]
             for w, r in (("without", without), ("with", with_))}
    m = with_.metrics

    def count(outcome: str) -> int:
        return int(m.get(("harvest_slurm_pilots_total", (("outcome", outcome),)), 0))

    harvest = with_.used_node_s / sl.idle_node_s if sl.idle_node_s else 0.0
    held = with_.held_node_s / sl.idle_node_s if sl.idle_node_s else 0.0
    replay_share = replay["harvest_pct"] / 100.0
    vac = {q: histogram_quantile(m, "harvest_slurm_vacate_seconds", q) for q in (0.5, 0.99)}
    rpc_with, rpc_without = rpc_rate(with_), rpc_rate(without)
    types = {t: round((with_.sdiag_after["types"].get(t, 0) - without.sdiag_after["types"].get(t, 0))
                      / with_.measured_s, 2) for t in with_.sdiag_after["types"]}
    return {
        "nodes": len(sl.names), "slurm": version, "start": iso(sl.start), "hours": round((sl.end - sl.start) / 3600, 3),
        "compress": sl.compress, "window_s": round(sl.window_s, 1), "main_jobs": len(sl.jobs),
        "main_jobs_clocked": sum(not j.initial for j in sl.jobs), "main_jobs_played": len(both), "main_jobs_wrong": wrong,
        "main_delay_ms": {"without": dist(list(d0.values())), "with": dist(list(d1.values()))},
        "added_delay_ms_p50": round(percentile(added, 0.5), 1) if added else None,
        "added_delay_ms_p95": round(percentile(added, 0.95), 1) if added else None,
        "added_delay_ms_p99": round(percentile(added, 0.99), 1) if added else None,
        "added_delay_ms_max": round(max(added), 1) if added else None,
        "slurm_delay_ms": {"without": dist(list(s0.values())), "with": dist(list(s1.values()))},
        "added_slurm_delay_ms_p50": round(percentile(added_slurm, 0.5), 1) if added_slurm else None,
        "added_slurm_delay_ms_p99": round(percentile(added_slurm, 0.99), 1) if added_slurm else None,
        "submit_late_ms_p99": {"without": round(percentile(without.submit_late_ms, 0.99) or 0, 1),
                               "with": round(percentile(with_.submit_late_ms, 0.99) or 0, 1)},
        "idle_node_s": round(sl.idle_node_s, 1),
        "held_share": round(held, 4), "harvest_share": round(harvest, 4), "replay_share": round(replay_share, 4),
        "harvest_vs_replay": round(harvest / replay_share, 4) if replay_share else None,
        "cold_start_s": round(with_.cold_start_s, 1) if with_.cold_start_s is not None else None,
        "vacate_ms_p50": round(vac[0.5] * 1000, 1) if vac[0.5] is not None else None,
        "vacate_ms_p99": round(vac[0.99] * 1000, 1) if vac[0.99] is not None else None,
        "vacates": int(m.get(("harvest_slurm_vacate_seconds_count", ()), 0)),
        "harvester_cpu_pct": round(100.0 * with_.cpu_s / with_.measured_s, 2),
        "harvester_rss_mb": round(with_.rss_mb, 1),
        "harvester_rpc_per_s": round(rpc_with - rpc_without, 2),
        "root_rpc_per_s": {"without": round(rpc_without, 2), "with": round(rpc_with, 2)},
        "rpc_per_s_by_type_added": {t: v for t, v in sorted(types.items(), key=lambda kv: -kv[1]) if v > 0.01},
        "sched_mean_cycle_us": {"without": without.sdiag_after["main"].get("Mean cycle"),
                                "with": with_.sdiag_after["main"].get("Mean cycle")},
        "sched_max_cycle_us": {"without": without.sdiag_after["main"].get("Max cycle"),
                               "with": with_.sdiag_after["main"].get("Max cycle")},
        "backfill_mean_cycle_us": {"without": without.sdiag_after["backfill"].get("Mean cycle"),
                                   "with": with_.sdiag_after["backfill"].get("Mean cycle")},
        "pilots": {o: count(o) for o in ("submitted", "cancelled", "preempted", "lost")},
        "hub_connections_peak": int(m.get(("harvest_slurm_hub_connections_peak", ()), 0)),
        "pilots_left": with_.pilots_left + without.pilots_left,
        "replay": {k: replay[k] for k in ("idle_node_hours", "used_node_hours", "harvest_pct", "rescales")},
    }


def print_table(r: dict) -> None:
    dw, d1 = r["main_delay_ms"]["without"], r["main_delay_ms"]["with"]
    print(f"# facility slice: {r['nodes']} nodes of Summit from {r['start']} for {r['hours']} h at x{r['compress']:g} "
          f"({r['window_s']:.0f} s), Slurm {r['slurm']}; {r['main_jobs']} main jobs, {r['main_jobs_played']} "
          f"submitted while the clock ran")
    print(f"{'main-job start delay (ms)':<46} {'p50':>8} {'p95':>8} {'p99':>8} {'max':>8}")
    for label, d in (("  without the harvester", dw), ("  with the harvester", d1)):
        print(f"{label:<46} " + " ".join(f"{d[k] if d[k] is not None else '-':>8}" for k in ("p50", "p95", "p99", "max")))
    print(f"{'  added per job':<46} {r['added_delay_ms_p50']:>8} {r['added_delay_ms_p95']:>8} "
          f"{r['added_delay_ms_p99']:>8} {r['added_delay_ms_max']:>8}   goal p50 <= 500, p99 <= 1000")
    sw, s1 = r["slurm_delay_ms"]["without"], r["slurm_delay_ms"]["with"]
    print(f"{'sbatch returned -> running (ms): without':<46} " + " ".join(f"{sw[k]:>8}" for k in ("p50", "p95", "p99", "max")))
    print(f"{'  with':<46} " + " ".join(f"{s1[k]:>8}" for k in ("p50", "p95", "p99", "max")))
    print(f"{'  added per job (p50, p99)':<46} {r['added_slurm_delay_ms_p50']:>8} {'':>8} {r['added_slurm_delay_ms_p99']:>8}")
    print(f"{'submission late, p99 (ms): without, with':<46} {r['submit_late_ms_p99']['without']:>8} "
          f"{r['submit_late_ms_p99']['with']:>8}")
    print(f"{'idle node-seconds held by pilots':<46} {100 * r['held_share']:>7.1f}%")
    print(f"{'idle node-seconds used by jobs':<46} {100 * r['harvest_share']:>7.1f}%   replay predicts "
          f"{100 * r['replay_share']:.1f}% -> {100 * (r['harvest_vs_replay'] or 0):.0f}% of it (goal >= 90%)")
    print(f"{'vacate: signal -> pilot gone (ms)':<46} p50 {r['vacate_ms_p50']}, p99 {r['vacate_ms_p99']} "
          f"({r['vacates']} vacates)")
    print(f"{'harvester CPU (% of one core), peak RSS':<46} {r['harvester_cpu_pct']:>7}%  {r['harvester_rss_mb']} MB"
          f"   goal <= 10%")
    print(f"{'slurmctld RPCs/s caused by the harvester':<46} {r['harvester_rpc_per_s']:>8}   goal <= 5 "
          f"(root: {r['root_rpc_per_s']['without']} without, {r['root_rpc_per_s']['with']} with)")
    print(f"{'  by type':<46} {r['rpc_per_s_by_type_added']}")
    print(f"{'scheduler mean / max cycle (us)':<46} without {r['sched_mean_cycle_us']['without']} / "
          f"{r['sched_max_cycle_us']['without']}, with {r['sched_mean_cycle_us']['with']} / "
          f"{r['sched_max_cycle_us']['with']}")
    print(f"{'pilots':<46} {r['pilots']}, hub connections at peak {r['hub_connections_peak']}")
    print(f"{'cold start (pilots on every idle node, used)':<46} {r['cold_start_s']} s")


def idle_over_time(sl: Slice) -> tuple[list[float], list[int]]:
    """The slice's idle node count as a step function of seconds after the clock started."""
    state = {n: st == "idle" for t, n, st in sl.lines if t < sl.start}
    xs, ys = [0.0], [sum(state.values())]
    for t, n, st in sl.lines:
        if t >= sl.start:
            state[n] = st == "idle"
            xs.append(t - sl.start)
            ys.append(sum(state.values()))
    xs.append(sl.window_s)
    ys.append(ys[-1])
    return xs, ys


def plot(sl: Slice, without: PassResult, with_: PassResult, r: dict, path: Path) -> Path:
    """Two panels: the main jobs' start delay CDF without and with the harvester, and the idle
    nodes of the slice against those pilots held and jobs used. An HTML file (plotly), and a PNG
    of it where Playwright and Chromium are installed (make test installs both)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "main-job start delay (trace time -> running)",
        f"idle nodes and what the harvester held ({r['nodes']} nodes, Slurm {r['slurm']})"))
    for name, res, colour in (("without the harvester", without, "#7f7f7f"), ("with the harvester", with_, "#d62728")):
        d = sorted(delays_ms(sl, res).values())
        fig.add_trace(go.Scatter(x=[v / 1000 for v in d], y=[(i + 1) / len(d) for i in range(len(d))],
                                 mode="lines", line_shape="hv", name=name, line_color=colour), 1, 1)
    xs, ys = idle_over_time(sl)
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line_shape="hv", name="idle in the trace",
                             line_color="#000000", line_width=1), 1, 2)
    t = [x for x, _, _ in with_.samples]
    fig.add_trace(go.Scatter(x=t, y=[h for _, h, _ in with_.samples], mode="lines", name="held by pilots",
                             line_color="#1f77b4"), 1, 2)
    fig.add_trace(go.Scatter(x=t, y=[u for _, _, u in with_.samples], mode="lines", name="used by jobs",
                             line_color="#2ca02c", line_dash="dot"), 1, 2)
    fig.update_xaxes(title_text="seconds", row=1, col=1)
    fig.update_yaxes(title_text="share of main jobs", row=1, col=1)
    fig.update_xaxes(title_text=f"seconds of the played window (x{sl.compress:g})", row=1, col=2)
    fig.update_yaxes(title_text="nodes", row=1, col=2)
    fig.update_layout(width=1300, height=480, template="plotly_white", margin=dict(l=60, r=20, t=50, b=50))
    html = path.with_suffix(".html")
    fig.write_html(html, include_plotlyjs=True)
    try:
        from playwright.sync_api import sync_playwright
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--headless", "--no-sandbox"])
            page = b.new_page(viewport={"width": 1300, "height": 480})
            page.goto(html.resolve().as_uri())
            page.wait_for_selector(".main-svg")
            page.screenshot(path=str(path.with_suffix(".png")))
            b.close()
        return path.with_suffix(".png")
    except Exception as e:                 # no Playwright or Chromium here: the HTML stands
        log(f"no PNG ({e}); the plot is {html}")
        return html


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.facility", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--start", default=DEFAULT_START)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--compress", type=float, default=10.0)
    ap.add_argument("--slurm", default=None, help="Slurm version (default: the host's)")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--node-list", type=Path, default=DEFAULT_NODE_LIST)
    ap.add_argument("--jobs", type=Path, default=DEFAULT_JOBS)
    ap.add_argument("--job-count", type=int, default=10)
    ap.add_argument("--keep", type=Path, help="keep Slurm's, the harvester's and the pilots' files here")
    ap.add_argument("--plot", type=Path, help="write the delay CDF and harvest-over-time plot here (.png/.html)")
    ap.add_argument("--save", type=Path, help="write the result JSON here as well")
    ap.add_argument("--quick", action="store_true", help="16 nodes, a short slice: checks every step, not the figures")
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    if args.nodes < 1 or args.hours <= 0 or args.compress <= 0 or args.job_count < 1:
        raise SystemExit("--nodes, --hours, --compress and --job-count must be positive")
    from tests.support.slurm import HOST_VERSION
    version = args.slurm or HOST_VERSION
    start = parse_iso(args.start)
    t0 = time.monotonic()
    sl = take_slice(args.trace, args.node_list, args.nodes, start, args.hours, args.compress)
    jobs = compressed_jobs(args.jobs, args.job_count, args.compress)
    log(f"slice: {len(sl.names)} nodes, {len(sl.jobs)} main jobs ({sum(j.initial for j in sl.jobs)} under way at "
        f"the start), {sl.idle_node_s:.0f} idle node-s over {sl.window_s:.0f} s")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="bench-facility-", dir=args.keep))
    replay = replay_prediction(sl, jobs, folder)
    log(f"replay predicts {replay['harvest_pct']:.1f}% of the idle node-seconds used")
    (folder / "without").mkdir()
    (folder / "with").mkdir()
    without = play(sl, jobs, False, version, folder / "without")
    with_ = play(sl, jobs, True, version, folder / "with")
    r = report(sl, version, without, with_, replay)
    r["bench_s"] = round(time.monotonic() - t0, 1)
    print_table(r)
    if args.plot:
        log(f"plot: {plot(sl, without, with_, r, args.plot)}")
    if args.save:
        args.save.write_text(json.dumps(r, indent=1) + "\n")
    if args.json:
        print(json.dumps(r))
    if not args.keep:
        import shutil
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
