"""A leadership machine from one harvester: the REAL harvester against a SIMULATED Slurm and a
SIMULATED pilot fleet, at Summit's size (4,734 nodes) or Aurora's (10,624, the Summit trace tiled).

    python -m bench.scale [--json] [--nodes 4734] [--start ISO] [--hours 1] [--compress 10]
                          [--tile-shift-days 1] [--job-count 10] [--wide-jobs 2] [--keep DIR] [--quick]

What is real: the harvester process itself (`python -m app --source slurm --dispatch simulated`,
started as a site starts it): its pilot hub (TLS listener, lobby, one connection per pilot), the
wire protocol, the pilot book and source (its sinfo/squeue parser, sbatch/scancel calls), the
controller and allocator, the store and the web tier. What is simulated: Slurm (bench/scale_feed.py:
fake commands answering from the Summit trace) and the pilots (bench/scale_pilots.py: asyncio
tasks in this process, each with its own TLS connection speaking the real protocol, no workers),
and the workers (--dispatch simulated).

1. Takes the machine (bench/scale_feed.py: the first --nodes of the Summit node list, tiled past
   4,734 with each tile's trace shifted by a day per tile) and its state at --start.
2. Starts the feed server and the fleet on an event loop in this process, writes the fake
   commands, and starts the harvester on them with --slurm-max-pilots N, --slurm-batch N and
   --slurm-hub-max-connections 4N + 64 (the pilots it may hold are the machine). RLIMIT_NOFILE
   is raised to its hard limit here and so for the harvester, its child.
3. Registers --job-count jobs of the measured job set (costs / K and throughputs x K, as
   bench.facility) and --wide-jobs jobs that can use the whole machine, through the API.
4. The cold start, the trace clock stopped at --start: the harvester submits a pilot to every idle
   node, they connect, the jobs take them. The burst is every pilot connected then; its figure is
   the time from its last hello to the allocation change after which all its nodes are in jobs.
5. The replay: the trace's node changes over [start, start + hours) at --compress K (trace second
   t is real second t / K): a node going busy preempts its pilot, a node going idle gets one.
   The grid callback of the cluster page is timed every few seconds (a full figure at the start
   and the end).
6. Reads the harvester's /proc, /metrics and store (bench/scale_measure.py says how each latency
   is exact without loading the harvester) and prints a table; with --json the last stdout line
   is the whole result: pilots_peak, rss_mb, cpu_share, kb_per_pilot, hello_to_alloc_ms_p50/p99,
   leave_to_shrunk_ms_p50/p99, alloc_ms_p99, burst_nodes, burst_alloc_s, events_per_s,
   store_mb_per_hour, grid, ... Progress goes to stderr.

`--quick` (200 nodes, 6 minutes of trace at x20, about a minute) checks that every step works
(tests/test_bench_scale.py), not the figures. docs/evaluation/scale.md has the runs and figures.
"""
from __future__ import annotations

import argparse
import asyncio
import getpass
import resource
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from core.replay import DEFAULT_JOBS, DEFAULT_NODE_LIST, DEFAULT_TRACE
from core.timeutil import iso, parse_iso

from . import scale_measure as measure
from .facility_slice import compressed_jobs, curve_text
from .results import hand_over
from .scale_feed import Feed, Machine, fake_commands, take_machine
from .scale_pilots import Fleet
from .scale_report import print_table, report

#: 3,529 of Summit's nodes idle at once (a cold start of thousands), 1,204 of them taken by main
#: jobs within the hour
DEFAULT_START = "2021-02-17T03:00:00Z"
#: the first 200 nodes all idle, then all taken by main jobs and all idle again within 6 minutes
QUICK = {"nodes": 200, "start": "2021-02-12T20:40:00Z", "hours": 0.1, "compress": 20.0, "job_count": 3, "wide_jobs": 1, "cold_timeout": 40.0}
SIMULATED = ("SIMULATED: Slurm (fake sinfo/squeue/sbatch/scancel answering from the Summit trace) and the "
             "pilots (asyncio tasks, real TLS and protocol, no workers); REAL: the harvester (hub, TLS, wire "
             "protocol, pilot book, controller, store, web tier)")
GRID_EVERY_S = 5.0


def log(msg: str) -> None:
    print(f"[bench.scale] {msg}", file=sys.stderr, flush=True)


def raise_nofile() -> int:
    """RLIMIT_NOFILE's soft limit raised to the hard one (inherited by the harvester); the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class World:
    """The feed and the fleet, on an event loop in a thread of their own."""

    def __init__(self, machine: Machine, seed: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="scale-world", daemon=True)
        self.thread.start()
        self.fleet = Fleet(on_end=lambda job: self.feed.pilot_ended(job))
        self.feed = Feed(machine, getpass.getuser(), self.fleet.start, self.fleet.stop, seed)
        self.port = self.call(self.feed.serve())
        self.playing: Optional[Any] = None

    def call(self, coro, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def play(self, machine: Machine, compress: float) -> float:
        """Start the trace clock; its monotonic start."""
        clock0 = time.monotonic()
        self.playing = asyncio.run_coroutine_threadsafe(self.feed.play(machine, compress, clock0), self.loop)
        return clock0

    def close(self) -> None:
        async def stop() -> None:
            self.fleet.stop_all()
            await asyncio.sleep(0.2)
            if self.feed.server is not None:
                self.feed.server.close()
        try:
            self.call(stop(), 10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


@dataclass
class Run:
    """What the run saw, for the report (scale_report.py)."""
    args: argparse.Namespace
    machine: Machine
    nofile: int
    startup_s: float = 0.0
    rss_before_mb: float = 0.0                 # the harvester up, jobs registered, no pilot yet
    rss_burst_mb: float = 0.0                  # after the cold start
    connected_burst: int = 0
    cold: dict = field(default_factory=dict)
    burst_nodes: set = field(default_factory=set)
    burst_last_hello: Optional[float] = None
    wall0: float = 0.0                         # the replay, wall clock
    wall1: float = 0.0
    cpu0: Optional[measure.Cpu] = None
    cpu1: Optional[measure.Cpu] = None
    mem_end: dict = field(default_factory=dict)
    store0: int = 0
    store1: int = 0
    metrics: dict = field(default_factory=dict)
    grid_full: list = field(default_factory=list)
    grid_updates: list = field(default_factory=list)
    samples: list = field(default_factory=list)   # (s into the replay, fleet connected, trace idle)
    fleet_cpu_s: float = 0.0
    calls0: dict = field(default_factory=dict)     # the fake Slurm's calls by command, replay start
    calls1: dict = field(default_factory=dict)     # ... and end
    connected_end: int = 0


def harvester_args(bin_dir: Path, nodes: int, batch: int) -> list[str]:
    """As a site runs it for the whole machine: every other setting its default (the submission
    batch and parallelism, the hub's connection cap)."""
    return ["--source", "slurm", "--dispatch", "simulated", "--no-profiler", "--slurm-bin", str(bin_dir.resolve()),
            "--slurm-max-pilots", str(nodes), *(["--slurm-batch", str(batch)] if batch else []),
            "--metrics-interval", "0"]


def register_jobs(app, args: argparse.Namespace, nodes: int) -> int:
    """The job set's first --job-count jobs and --wide-jobs jobs as wide as the machine that
    rescale at no cost (independent single-node work, as a hyperparameter sweep): every node
    that joins repays a grow at once, so hello -> in the allocation times the harvester, not
    the policy's choice to leave a node idle until a grow pays (the job set's jobs do that)."""
    jobs = compressed_jobs(args.jobs, args.job_count, args.compress)
    token = app.token("alice")
    bodies = [{"name": j.name or j.id, "min_nodes": j.min_nodes, "max_nodes": j.max_nodes,
               "total_samples": j.total_samples, "curve": curve_text(j),
               "scale_up_seconds": j.scale_up_seconds, "scale_down_seconds": j.scale_down_seconds} for j in jobs]
    rate = 1000.0 * args.compress
    for i in range(args.wide_jobs):           # first: they run from the start, whatever the job slots
        bodies.insert(i, {"name": f"wide-{i}", "min_nodes": 1, "max_nodes": nodes, "total_samples": 1e15,
                          "curve": f"1:{rate:g}, {nodes}:{rate * nodes * 0.9:g}",
                          "scale_up_seconds": 0, "scale_down_seconds": 0})
    for body in bodies:
        status, answer = app.request("POST", "/api/jobs", body, token=token)
        if status != 201:
            raise RuntimeError(f"registering {body['name']}: {status} {answer}")
    return sum(b["max_nodes"] for b in bodies)


def cold_start(app, world: World, run: Run, target: int, timeout: float) -> None:
    """Wait until `target` pilots are connected and jobs use them (or nothing moved for a while)."""
    t0 = time.monotonic()
    last, moved = (-1, -1), t0
    fleet = world.fleet
    while True:
        kpis = app.get("/api/cluster?nodes=0")[1]["kpis"]
        now = time.monotonic()
        state = (fleet.connected, int(kpis.get("harvested", 0)))
        if state != last:
            last, moved = state, now
        if state[0] >= target and state[1] >= target:
            break
        if now - t0 > timeout or now - moved > min(60.0, timeout):
            log(f"cold start: stopped waiting with {state[0]} pilots connected, {state[1]} nodes used of {target}")
            break
        time.sleep(0.5)
    run.cold = {"target": target, "connected": state[0], "used": state[1], "s": round(time.monotonic() - t0, 1)}
    recs = [r for r in list(fleet.records) if r.welcome_at is not None and r.ended_at is None]
    run.burst_nodes = {r.node for r in recs}
    run.burst_last_hello = max((r.hello_at for r in recs if r.hello_at), default=None)
    log(f"cold start: {state[0]} pilots connected, {state[1]} nodes used in {run.cold['s']} s")


def replay(app, world: World, run: Run) -> None:
    """The trace at x K, the grid timed every GRID_EVERY_S."""
    window_s = run.args.hours * 3600.0 / run.args.compress
    grid = measure.Grid(app)
    run.grid_full.append(grid.full())
    run.cpu0 = measure.proc_cpu(app.proc.pid)
    run.store0 = measure.store_bytes(app.db)
    fleet_cpu0 = time.process_time()
    run.wall0 = time.time()
    run.calls0 = dict(world.feed.stats.calls)
    clock0 = world.play(run.machine, run.args.compress)
    next_grid, next_log = clock0 + GRID_EVERY_S, clock0 + 30.0
    while (now := time.monotonic()) < clock0 + window_s:
        time.sleep(min(1.0, clock0 + window_s - now))
        now = time.monotonic()
        run.samples.append((round(now - clock0, 1), world.fleet.connected, world.feed.idle_count()))
        if now >= next_grid:
            run.grid_updates.append(grid.update())
            next_grid += GRID_EVERY_S
        if now >= next_log:
            log(f"replay {now - clock0:.0f}/{window_s:.0f} s: {world.fleet.connected} pilots connected, "
                f"{world.feed.idle_count()} nodes idle in the trace")
            next_log += 30.0
    run.wall1 = time.time()
    run.calls1 = dict(world.feed.stats.calls)
    run.connected_end = world.fleet.connected
    run.cpu1 = measure.proc_cpu(app.proc.pid)
    run.fleet_cpu_s = time.process_time() - fleet_cpu0
    run.store1 = measure.store_bytes(app.db)
    run.grid_full.append(grid.full())
    run.mem_end = measure.proc_mem_mb(app.proc.pid)
    run.metrics = app.metrics()


def bench(args: argparse.Namespace, folder: Path) -> dict:
    from tests.support.server import start_app
    nofile = raise_nofile()
    machine = take_machine(args.trace, args.node_list, args.nodes, parse_iso(args.start), args.hours,
                           args.tile_shift_days)
    log(f"machine: {len(machine.names)} nodes, {machine.idle_at_start} idle at {args.start}, "
        f"{len(machine.changes)} trace changes in {args.hours:g} h (tiles shifted {machine.shifts_days} days); "
        f"RLIMIT_NOFILE {nofile}")
    log(SIMULATED)
    run = Run(args, machine, nofile)
    world = World(machine, args.seed)
    app = None
    try:
        bin_dir = fake_commands(folder / "bin", world.port)
        t0 = time.monotonic()
        app = start_app(folder / "app", *harvester_args(bin_dir, len(machine.names), args.batch), timeout=600)
        run.startup_s = round(time.monotonic() - t0, 1)
        want = register_jobs(app, args, len(machine.names))
        run.rss_before_mb = measure.proc_mem_mb(app.proc.pid)["VmRSS"]
        log(f"harvester up in {run.startup_s} s (RSS {run.rss_before_mb:.0f} MB); jobs want {want} nodes")
        cold_start(app, world, run, min(world.feed.idle_count(), want), args.cold_timeout)
        run.rss_burst_mb = measure.proc_mem_mb(app.proc.pid)["VmRSS"]
        run.connected_burst = world.fleet.connected
        replay(app, world, run)
        app.stop()
        r = report(run, world, app.db)
    finally:
        if app is not None:
            app.stop()
        world.close()
    return r


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the whole result as JSON on the last stdout line")
    ap.add_argument("--nodes", type=int, default=4734,
                    help="nodes of the machine: Summit's 4,734, or more (10624: Aurora) with the trace tiled")
    ap.add_argument("--start", default=DEFAULT_START, help=f"the trace moment the run begins at (default {DEFAULT_START})")
    ap.add_argument("--hours", type=float, default=1.0, help="hours of trace replayed after the cold start (default 1)")
    ap.add_argument("--compress", type=float, default=10.0,
                    help="time compression K: trace second t is real second t/K (default 10)")
    ap.add_argument("--tile-shift-days", type=float, default=1.0,
                    help="past 4,734 nodes, tile k replays the trace k times this many days later (default 1; "
                         "0: the tiles in lock step)")
    ap.add_argument("--job-count", type=int, default=10, help="jobs of the job set registered (default 10)")
    ap.add_argument("--wide-jobs", type=int, default=2, help="jobs registered that can use every node and rescale at no cost (default 2)")
    ap.add_argument("--batch", type=int, default=0,
                    help="the harvester's --slurm-batch, pilots submitted per poll (default 0: the harvester's own default)")
    ap.add_argument("--cold-timeout", type=float, default=300.0,
                    help="seconds the cold start may take before the replay starts anyway (default 300)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the pilots' start delays (default 0)")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="the node trace (default: the Summit trace)")
    ap.add_argument("--node-list", type=Path, default=DEFAULT_NODE_LIST, help="the trace's nodes in machine order")
    ap.add_argument("--jobs", type=Path, default=DEFAULT_JOBS, help="the job set (default: the measured ImageNet set)")
    ap.add_argument("--keep", type=Path, help="keep the harvester's store, log and the fake commands here")
    ap.add_argument("--save", type=Path, help="write the result JSON here as well")
    ap.add_argument("--quick", action="store_true",
                    help="200 nodes, 6 minutes of trace at x20: checks every step, not the figures")
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    if args.nodes < 1 or args.hours <= 0 or args.compress <= 0 or args.job_count < 1 or args.wide_jobs < 0:
        raise SystemExit("--nodes, --hours, --compress and --job-count must be positive, --wide-jobs not negative")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="bench-scale-", dir=args.keep))
    t0 = time.monotonic()
    r = bench(args, folder)
    r["bench_s"] = round(time.monotonic() - t0, 1)
    r["start"] = iso(parse_iso(args.start))
    print_table(r)
    hand_over(r, args.save, args.json, folder, bool(args.keep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
