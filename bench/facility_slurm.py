"""bench.facility's passes: the slice's main jobs played on a real Slurm as the clock runs,
without or with the harvester, and what each pass measured (see bench/facility.py)."""
from __future__ import annotations

import os
import re
import sys
import threading
import time
import urllib.error
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from bench.facility_lag import read_store_times
from bench.facility_slice import MainJob, Slice, curve_text
from core.model import Job

PILOT_NAME = "harvest-pilot"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[bench.facility] {msg}", file=sys.stderr, flush=True)


@dataclass
class PassResult:
    harvester: bool
    started: dict[int, tuple[float, str]] = field(default_factory=dict)   # idx -> (wall time, node)
    ended: dict[int, float] = field(default_factory=dict)                  # idx -> wall time its span ended
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
    joins: dict[str, list[float]] = field(default_factory=dict)            # node -> wall times a pilot held it
    uses: dict[str, list[float]] = field(default_factory=dict)             # node -> wall times a job got it


def sbatch_main(cluster, job: MainJob, marks: Path) -> None:
    """The job writes when it began and on which node, runs its span, and writes when the span
    ended (the moment its node goes idle in the trace). One under way at the window's start runs
    its span from the clock's start (the `go` file), not from its own: the harvester's start,
    before the clock, must not shorten it."""
    wait = f"while [ ! -e {marks}/go ]; do sleep 0.1; done; " if job.initial else ""
    cluster.sbatch("-p", "main", "-w", job.node, "-N", "1", "-J", f"main-{job.idx}", "-o", "/dev/null",
                   "--wrap", f"echo $(date +%s.%N) $SLURMD_NODENAME > {marks}/{job.idx}.tmp && "
                             f"mv {marks}/{job.idx}.tmp {marks}/{job.idx}; {wait}sleep {job.run_s:.3f}; "
                             f"date +%s.%N > {marks}/end-{job.idx}")


def read_marks(marks: Path) -> tuple[dict[int, tuple[float, str]], dict[int, float]]:
    """What the main jobs wrote: {idx: (began, node)} and {idx: span ended}."""
    began, ended = {}, {}
    for p in marks.iterdir():
        if p.name.isdigit():
            t, node = p.read_text().split()
            began[int(p.name)] = (float(t), node)
        elif p.name.startswith("end-") and p.read_text().strip():
            ended[int(p.name[4:])] = float(p.read_text())
    return began, ended


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


def play(sl: Slice, jobs: list[Job], harvester: bool, version: str, folder: Path) -> PassResult:
    """One pass of the slice on a fresh Slurm, with or without the harvester."""
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
        start_initial(cluster, sl, marks, what)
        if harvester:
            app = start_harvester(cluster, sl, jobs, folder / "app", res, what)
        (marks / "go").touch()
        play_clock(cluster, app, sl, marks, res, what)
        if app:
            res.rss_mb = proc_hwm_mb(app.proc.pid)
            res.metrics = app.metrics()
            app.stop()
            res.joins, res.uses = read_store_times(app.db)
            app = None
        drain(cluster, res)
        res.started, res.ended = read_marks(marks)
        log(f"{what}: {len(res.started)}/{len(sl.jobs)} main jobs ran; {len(res.pilots_left)} pilot(s) left")
    finally:
        if app is not None:
            app.stop()
        left = cluster.stop()
        if left:
            log(f"left running in the Slurm namespace after stop: {left}")
    return res


def start_initial(cluster, sl: Slice, marks: Path, what: str) -> None:
    """The main jobs under way at the window's start, running (each waits for `go`)."""
    initial = [j for j in sl.jobs if j.initial]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda j: sbatch_main(cluster, j, marks), initial))
    deadline = time.monotonic() + 60
    while len(read_marks(marks)[0]) < len(initial):
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(read_marks(marks)[0])} of {len(initial)} initial main jobs ran")
        time.sleep(0.2)
    log(f"{what}: {len(initial)} main job(s) under way at the window's start are running")


def start_harvester(cluster, sl: Slice, jobs: list[Job], folder: Path, res: PassResult, what: str):
    """The harvester as a site runs it, the job set registered, and every idle node held and used
    (the cold start, before the clock)."""
    from tests.support.server import start_app
    app = start_app(folder, "--source", "slurm", *cluster.app_args(), "--dispatch", "simulated",
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
    free = len(sl.names) - sum(j.initial for j in sl.jobs)
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
    return app


def sample_harvest(app, res: PassResult, mono0: float, stop: threading.Event) -> None:
    """Once a second: the nodes pilots hold and jobs use, integrated over the played window."""
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


def play_clock(cluster, app, sl: Slice, marks: Path, res: PassResult, what: str) -> None:
    """The window as the clock runs: each later main job submitted at its time, sdiag and the
    harvester's CPU read around it."""
    later = [j for j in sl.jobs if not j.initial]
    cluster.run("sdiag", "--reset")
    res.sdiag_before = parse_sdiag(cluster.run("sdiag").stdout)
    cpu0 = proc_cpu_s(app.proc.pid) if app else 0.0
    res.clock0 = time.time()
    mono0 = time.monotonic()
    stop = threading.Event()
    sampler = threading.Thread(target=sample_harvest, args=(app, res, mono0, stop), daemon=True) if app else None
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


def drain(cluster, res: PassResult) -> None:
    """Wait up to a minute for every job to end; the pilots still there are counted as left."""
    deadline = time.monotonic() + 60
    while True:
        live = [j for j in cluster.jobs().values() if j["job_state"] in ("PENDING", "RUNNING", "COMPLETING",
                                                                        "CONFIGURING")]
        res.pilots_left = [j["job_id"] for j in live if j["name"] == PILOT_NAME]
        if not live or time.monotonic() > deadline:
            break
        time.sleep(0.5)
