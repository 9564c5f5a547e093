"""Replay a node-state trace against a job set, headless, as fast as the machine allows.

    python -m core.replay --trace data/summit-idle-nodes-2021-02.csv.gz \
        --jobs data/jobs-imagenet-1001.csv [--nodes N | --racks a01-a10] [--start ISO] [--hours H]
        [--policy milp|even|greedy] [--max-jobs 10] [--tfwd auto|S] [--db PATH [--resume]]
        [--out steps.csv] [--json]

Prints a summary (what an HPC centre would have harvested); with --json the last line is the
summary as JSON.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

from .clairvoyant import Clairvoyant
from .clock import SimClock
from .controller import Controller
from .controller_config import AUTO, QUEUE_ORDERS, ControllerConfig, parse_tfwd
from .restore import restore
from .counters import StepResult
from .dispatchers.simulated import Measurement, SimulatedDispatcher
from .errors import InputError, SettingsError
from .fairshare import DEFAULT_HALF_LIFE_S
from .jobsets import load_jobset
from .jpa import JPA, JPAConfig
from .model import Curve, Job, JobState
from .objective import OBJECTIVES
from .policies import POLICIES, SOLVERS
from .slots import MAX_SLOTS, Slots
from .sources.trace import TraceSource, machine_order, read_node_list, select_nodes
from .store import Store
from .timeutil import iso, parse_iso

DATA = Path(__file__).resolve().parent.parent / "data"
DEFAULT_TRACE = DATA / "summit-idle-nodes-2021-02.csv.gz"
DEFAULT_JOBS = DATA / "jobs-imagenet-1001.csv"
DEFAULT_NODE_LIST = DATA / "summit-nodes.txt"
#: what the allocator is told about each job's curve: the job set's measured curve (an oracle),
#: a straight line through its 1-node rate (the usual user guess), or nothing (JPA learns it)
CURVES = ("given", "linear", "learned")
#: references, not policies (core.clairvoyant): placement is told when the trace takes each node
#: back ("times"), and also groups the nodes it takes back together ("groups"); "" is off
CLAIRVOYANCE = ("", "times", "groups")
#: Summit: 6 NVIDIA V100 per node; the shipped trace's nodes are held with all six
SUMMIT_GPUS_PER_NODE = 6
TIMING_KEYS = ("wall_s", "solver_ms_p50", "solver_ms_p95", "solver_ms_max", "peak_rss_mb")


@dataclass
class ReplaySettings:
    trace: Path = DEFAULT_TRACE
    jobs: Path = DEFAULT_JOBS
    node_list: Optional[Path] = None
    nodes: Optional[int] = None
    racks: Optional[str] = None
    start: Optional[str] = None
    hours: Optional[float] = None
    coalesce: float = 0.0
    config: ControllerConfig = field(default_factory=ControllerConfig)
    curves: str = "given"
    noise: float = 0.03           # learned: sd of the measurement noise (log)
    sample_every: float = 30.0    # learned: simulated seconds per throughput sample
    seed: int = 0                 # learned: measurement noise seed
    groups: bool = True           # learned: jobs of one name inform each other's priors
    gpus_per_node: Optional[int] = None  # GPUs a held node brings; None: 6 for the Summit trace, else 1
    clairvoyant: str = ""         # a reference, not a policy: "times" or "groups" (CLAIRVOYANCE)

    def __post_init__(self) -> None:
        """Every replay setting is checked here, once, whoever builds the settings."""
        self.trace, self.jobs = Path(self.trace), Path(self.jobs)
        self.node_list = Path(self.node_list) if self.node_list else None
        if isinstance(self.clairvoyant, bool) or self.clairvoyant is None:
            self.clairvoyant = "times" if self.clairvoyant else ""   # runs stored when it was on/off
        if self.clairvoyant not in CLAIRVOYANCE:
            raise SettingsError("clairvoyant", f"unknown clairvoyance {self.clairvoyant!r}; choose "
                                               f"{' or '.join(repr(c) for c in CLAIRVOYANCE if c)}")
        if self.curves not in CURVES:
            raise SettingsError("curves", f"unknown curves {self.curves!r}; choose one of {', '.join(CURVES)}")
        if self.nodes is not None and (isinstance(self.nodes, bool) or not isinstance(self.nodes, int)
                                       or self.nodes < 1):
            raise SettingsError("nodes", f"the first N nodes: N must be a whole number of at least 1, not {self.nodes!r}")
        if self.hours is not None and not (_number(self.hours) and self.hours > 0):
            raise SettingsError("hours", f"must be positive, not {self.hours!r}")
        if not (_number(self.coalesce) and self.coalesce >= 0):
            raise SettingsError("coalesce", f"must be 0 or more seconds, not {self.coalesce!r}")
        self.start = (self.start or "").strip() or None
        if self.start is not None:
            try:
                parse_iso(self.start)
            except ValueError:
                raise SettingsError("start", f"give an ISO 8601 time such as 2021-02-10T20:00:00Z, "
                                             f"not {self.start!r}") from None
        self.racks = (self.racks or "").strip() or None
        g = self.gpus_per_node
        if g is not None and (isinstance(g, bool) or not isinstance(g, int) or not 1 <= g <= MAX_SLOTS):
            raise SettingsError("gpus_per_node", f"must be a whole number from 1 to {MAX_SLOTS}, not {g!r}")
        try:
            Measurement(self.noise, self.sample_every, self.seed)
        except ValueError as e:
            raise SettingsError("noise", str(e)) from None

    def key(self) -> dict:
        """What must match for a stored run to be resumed."""
        return {"trace": str(self.trace), "jobs": str(self.jobs),
                "node_list": str(self.node_list) if self.node_list else None, "nodes": self.nodes,
                "racks": self.racks, "start": self.start, "hours": self.hours,
                "coalesce": self.coalesce, "policy": self.config.policy,
                "solver": self.config.solver, "objective": self.config.objective,
                "fair_half_life": self.config.fair_half_life,
                "tfwd": self.config.tfwd, "max_jobs": self.config.max_jobs,
                "queue": self.config.queue, "visitor_slots": self.config.visitor_slots, "curves": self.curves, "noise": self.noise,
                "sample_every": self.sample_every, "seed": self.seed, "groups": self.groups,
                "gpus_per_node": self.gpus_per_node, "clairvoyant": self.clairvoyant}


    @classmethod
    def from_key(cls, key: dict) -> "ReplaySettings":
        """The settings a stored run was made with (the inverse of key())."""
        config = ControllerConfig(key["policy"], key["solver"], key["objective"], key["tfwd"],
                                  key["max_jobs"], key["queue"], visitor_slots=key.get("visitor_slots", 0),
                                  fair_half_life=key.get("fair_half_life", DEFAULT_HALF_LIFE_S))
        return cls(Path(key["trace"]), Path(key["jobs"]),
                   Path(key["node_list"]) if key.get("node_list") else None, key["nodes"],
                   key["racks"], key["start"], key["hours"], key["coalesce"], config,
                   key.get("curves", "given"), key.get("noise", 0.03), key.get("sample_every", 30.0),
                   key.get("seed", 0), key.get("groups", True), key.get("gpus_per_node"),
                   key.get("clairvoyant", ""))


def _number(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def linear_guess(job: Job) -> Curve:
    """The no-information baseline: the job's true rate at its smallest size, scaled linearly."""
    truth = job.true_curve or job.curve
    per_node = truth(job.min_nodes) / job.min_nodes
    if job.min_nodes == job.max_nodes:
        return Curve((job.min_nodes,), (per_node * job.min_nodes,))
    return Curve((job.min_nodes, job.max_nodes), (per_node * job.min_nodes, per_node * job.max_nodes))


def prepare_jobs(jobs: list[Job], curves: str) -> None:
    """Set what the allocator is told: `given` leaves the job set's curves (the oracle),
    `linear` replaces them by `linear_guess`, `learned` hides them (the advisor's prior until
    measured). The simulated dispatcher always runs jobs at their true curve."""
    for job in jobs:
        job.true_curve = job.true_curve or job.curve
        if curves == "given":
            job.given_curve = job.curve
        elif curves == "linear":
            job.curve = linear_guess(job)
            job.given_curve = job.curve
        else:
            job.curve = Curve((job.min_nodes,), (0.0,))
            job.given_curve = None


def percentile(values: list[float], q: float) -> Optional[float]:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


@dataclass
class ReplayInputs:
    """What a replay's settings select from its files, checked before any run is touched: the
    Replay page calls `check` first so that a refused run leaves the running one as it was."""
    jobset: list[Job]
    nodes: list[str]
    is_summit: bool
    start: float
    end: float

    @classmethod
    def check(cls, settings: ReplaySettings) -> "ReplayInputs":
        """Read the job set, the trace and the node list; raises SettingsError or InputError."""
        jobset = load_jobset(settings.jobs)
        if settings.config.visitor_slots and any(j.owner for j in jobset):
            raise SettingsError("visitor_slots", "the demo lane takes jobs with an owner for registered ones, "
                                                 f"and {Path(settings.jobs).name} gives its jobs owners: set "
                                                 "{visitor_slots} to 0")
        is_summit = Path(settings.trace).resolve() == DEFAULT_TRACE.resolve()
        node_list = settings.node_list or (DEFAULT_NODE_LIST if is_summit else None)
        checked = TraceSource(settings.trace, [])
        _, first, last = checked.validate()
        if first is None:
            raise InputError(settings.trace, None, "the trace has no transitions")
        all_nodes = read_node_list(node_list) if node_list is not None else machine_order(checked.seen_nodes)
        nodes = select_nodes(all_nodes, settings.nodes, settings.racks)
        start = parse_iso(settings.start) if settings.start else first
        if start > last:
            raise SettingsError("start", f"the trace runs from {iso(first)} to {iso(last)}; "
                                         f"{settings.start} is after its end")
        end = start + settings.hours * 3600 if settings.hours else last + 1.0
        if end <= start:
            raise SettingsError("start", "the replay window is empty (check {start} and {hours})")
        return cls(jobset, nodes, is_summit, start, end)


class Replay:
    """One replay run: validated inputs, a controller on a simulated clock, and its loop."""

    def __init__(self, settings: ReplaySettings, db: Optional[Path] = None,
                 resume: bool = False) -> None:
        """Validate every input before the store is opened, so a bad file stores nothing."""
        self.settings = settings
        if resume and db is None:
            raise SettingsError("resume", "continuing a run needs a store: set {db}")
        inputs = ReplayInputs.check(settings)
        self.jobset: list[Job] = inputs.jobset
        prepare_jobs(self.jobset, settings.curves)
        self.all_nodes = inputs.nodes
        # GPUs per node: the simulated dispatcher runs no ranks, so these count the GPUs jobs hold
        self.slots = Slots(default=settings.gpus_per_node or (SUMMIT_GPUS_PER_NODE if inputs.is_summit else 1))
        self.start, self.end = inputs.start, inputs.end
        store = self.store = Store(db) if db is not None else None
        if store is not None and not resume and not store.is_empty():
            store.close()
            raise SettingsError("db", f"{db} already holds a run; set {{resume}} to continue it or choose another store")
        learned = settings.curves == "learned"
        self.dispatcher = SimulatedDispatcher(
            Measurement(settings.noise, settings.sample_every, settings.seed) if learned else None)
        self.advisor = JPA(JPAConfig(trust_given_costs=False, sample_s=settings.sample_every,
                                     groups=settings.groups)) if learned else None
        resumed_at = store.meta("replay_cursor") if (store is not None and resume) else None
        if resumed_at is not None:
            saved = store.meta("replay")
            if saved is not None:        # a store from before a setting existed ran at its default
                saved = {**ReplaySettings().key(), **saved}
            if saved != settings.key():
                store.close()
                raise ValueError(f"{db} holds a replay with other settings: {saved}")
            self.clock = SimClock(resumed_at)
            self.controller = restore(store, self.dispatcher, self.clock, settings.config, self.all_nodes,
                                      advisor=self.advisor, slots=self.slots)
            self.source = TraceSource(settings.trace, self.all_nodes, self.start, self.end,
                                      settings.coalesce, resume_after=resumed_at,
                                      resume_idle=list(self.controller.idle))
            known = set(self.controller.jobs)
            self.arrivals = [j for j in self.jobset if j.id not in known and j.submit_time < self.end]
        else:
            self.clock = SimClock(self.start)
            self.controller = Controller(self.dispatcher, self.clock, settings.config, store, self.all_nodes,
                                         advisor=self.advisor, slots=self.slots)
            self.source = TraceSource(settings.trace, self.all_nodes, self.start, self.end, settings.coalesce)
            self.controller.start(self.source.initial_idle())
            self.arrivals = [j for j in self.jobset if j.submit_time < self.end]
        if settings.clairvoyant:
            seer = Clairvoyant.from_trace(settings.trace, self.all_nodes, self.start, self.end)
            self.controller.clairvoyant = seer.remaining
            if settings.clairvoyant == "groups":
                self.controller.clairvoyant_groups = seer.taken_at
        self.arrivals.sort(key=lambda j: j.submit_time)
        self.wall_s = 0.0
        self._batches: Optional[Iterator] = None
        self._nxt = None
        self._i = 0
        self._last_flush = time.perf_counter()

    def _next_time(self) -> float:
        if self.controller.pending:
            return self.clock.now()
        t_trace = self._nxt[0] if self._nxt else math.inf
        t_arr = (max(self.arrivals[self._i].submit_time, self.start)
                 if self._i < len(self.arrivals) else math.inf)
        t_done = self.dispatcher.next_event_time(self.clock.now())
        t_replan = self.controller.replan_at
        return min(t_trace, t_arr, t_done if t_done is not None else math.inf,
                   t_replan if t_replan is not None else math.inf)

    def advance(self, until: float, on_step: Optional[Callable[[StepResult], None]] = None,
                progress: Optional[Callable[[float], None]] = None, flush_every_s: float = 1.0) -> bool:
        """Handle every event up to simulated time `until` and move the clock there.

        Returns False once the window is over (call finish() then). Live replay calls this from
        its scheduler tick; the headless run calls it once with the end of the window.
        """
        t_wall = time.perf_counter()
        ctl, clock = self.controller, self.clock
        if self._batches is None:
            self._batches = iter(self.source.batches())
            self._nxt = next(self._batches, None)
        limit = min(until, self.end)
        more = True
        while True:
            t = self._next_time()
            if t == math.inf or t >= self.end:
                more = False
                break
            if t > limit:
                break
            clock.advance_to(max(t, clock.now()))
            now = clock.now()
            events = []
            if self._nxt and self._nxt[0] <= now:
                events.extend(self._nxt[1])
                self._nxt = next(self._batches, None)
            while self._i < len(self.arrivals) and max(self.arrivals[self._i].submit_time, self.start) <= now:
                ctl.submit(self.arrivals[self._i])
                self._i += 1
            events.extend(self.dispatcher.poll(now))
            result = ctl.step(events)
            if result is not None and on_step is not None:
                on_step(result)
            if progress is not None:
                progress(now)
            if time.perf_counter() - self._last_flush >= flush_every_s:
                self.checkpoint()
        if clock.now() < limit:
            clock.advance_to(limit)
        self.wall_s += time.perf_counter() - t_wall
        return more and clock.now() < self.end

    def checkpoint(self, done: bool = False) -> None:
        """Flush the controller with where the replay stands, so --resume continues from here."""
        meta = {"replay": self.settings.key(), "replay_cursor": self.clock.now()}
        if done:
            meta["replay_done"] = True
        self.controller.flush(meta)
        self._last_flush = time.perf_counter()

    def finish(self) -> dict:
        """Close the window: account up to its end, record the last completions, flush."""
        t_wall = time.perf_counter()
        ctl, clock = self.controller, self.clock
        clock.advance_to(max(self.end, clock.now()))
        for ev in self.dispatcher.poll(clock.now()):
            ctl.post(ev)
        ctl.step()
        self.wall_s += time.perf_counter() - t_wall
        self.checkpoint(done=True)
        return self.summary()

    def run(self, on_step: Optional[Callable[[StepResult], None]] = None,
            progress: Optional[Callable[[float], None]] = None, flush_every_s: float = 1.0) -> dict:
        """The whole window as fast as the machine allows; returns the summary."""
        self.advance(self.end, on_step, progress, flush_every_s)
        summary = self.finish()
        if progress is not None:
            progress(self.clock.now())
        return summary

    def summary(self) -> dict:
        ctl = self.controller
        c = ctl.counters
        done = [j for j in ctl.jobs.values() if j.state is JobState.DONE]
        jct = [j.end_time - j.submit_time for j in done]
        ends = [j.end_time for j in done]
        all_done = bool(done) and len(done) == len(ctl.jobs) == len(self.jobset)
        offered_h = c.offered_node_s / 3600.0
        now = self.clock.now()
        job_s = sum((j.end_time if j.end_time is not None else now) - j.start_time
                    for j in ctl.jobs.values() if j.start_time is not None)
        used_h = c.used_node_s / 3600.0
        return {
            "policy": self.settings.config.policy,
            "solver": self.settings.config.solver,
            "tfwd": self.settings.config.tfwd,
            "max_jobs": self.settings.config.max_jobs,
            "nodes": len(self.all_nodes),
            "start": iso(self.start),
            "end": iso(self.end),
            "simulated_hours": round((self.end - self.start) / 3600.0, 3),
            "events": c.events,
            "steps": c.steps,
            "solves": c.solves,
            "wall_s": round(self.wall_s, 3),
            "idle_node_hours": round(offered_h, 3),
            "used_node_hours": round(used_h, 3),
            "harvest_pct": round(100.0 * used_h / offered_h, 3) if offered_h else 0.0,
            "samples": round(ctl.samples_processed(), 1),
            "jobs_submitted": c.jobs_submitted,
            "jobs_finished": c.jobs_finished,
            "mean_jct_hours": round(statistics.fmean(jct) / 3600.0, 4) if jct else None,
            "makespan_hours": round((max(ends) - self.start) / 3600.0, 4) if all_done else None,
            "job_hours": round(job_s / 3600.0, 3),
            "rescales": c.rescales,
            "preemptions": c.preemptions,
            "horizon": ctl.horizon.to_dict() if ctl.horizon_learner is not None else None,
            "curves": self.settings.curves,
            "probes": c.probes,
            "solver_ms_p50": round(percentile(ctl.solve_ms, 0.5) or 0.0, 3),
            "solver_ms_p95": round(percentile(ctl.solve_ms, 0.95) or 0.0, 3),
            "solver_ms_max": round(ctl.solve_times.max_ms, 3),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
            "objective": self.settings.config.objective,
            "owners": self.owners(),
        }

    def owners(self) -> Optional[dict]:
        """Per owner (a job set with an `owner` column): jobs submitted in the window, node-hours
        held, samples processed, jobs finished and their mean completion time (hours)."""
        ctl = self.controller
        if not any(j.owner for j in self.jobset):
            return None
        now = self.clock.now()
        out: dict[str, dict] = {}
        for j in ctl.jobs.values():
            row = out.setdefault(j.owner, {"jobs": 0, "node_hours": 0.0, "samples": 0.0, "done": 0, "jct": []})
            row["jobs"] += 1
            row["samples"] += ctl.dispatcher.progress(j, now) if j.id in ctl.running else j.samples_done
            if j.state is JobState.DONE:
                row["done"] += 1
                row["jct"].append(j.end_time - j.submit_time)
        for owner, row in out.items():
            row["node_hours"] = round(ctl.counters.owner_node_s.get(owner, 0.0) / 3600.0, 3)
            row["samples"] = round(row["samples"], 1)
            jct = row.pop("jct")
            row["mean_jct_hours"] = round(statistics.fmean(jct) / 3600.0, 3) if jct else None
        return out


def format_summary(s: dict) -> str:
    rows = [
        ("policy", f"{s['policy']} (solver {s['solver']}, T_fwd {s['tfwd']}{'' if s['tfwd'] == AUTO else ' s'}, "
                   f"max jobs {s['max_jobs']}, curves {s.get('curves', 'given')})"),
        ("window", f"{s['start']} .. {s['end']} ({s['simulated_hours']} h simulated), {s['nodes']} nodes"),
        ("events", f"{s['events']} in {s['steps']} steps, {s['solves']} solves"),
        ("wall time", f"{s['wall_s']} s"),
        ("idle node-hours offered", f"{s['idle_node_hours']:.1f}"),
        ("node-hours used by jobs", f"{s['used_node_hours']:.1f}"),
        ("harvest", f"{s['harvest_pct']:.2f} %"),
        ("samples processed", f"{s['samples']:.4g}"),
        ("jobs", f"{s['jobs_finished']} finished of {s['jobs_submitted']} submitted"
                 + (f", mean JCT {s['mean_jct_hours']:.2f} h" if s['mean_jct_hours'] else "")
                 + (f", all done after {s['makespan_hours']:.1f} h" if s['makespan_hours'] else "")),
        ("rescales / preemptions", f"{s['rescales']} / {s['preemptions']}"
                                   + (f" / {s['probes']} probes" if s.get("curves") == "learned" else "")),
        ("solver ms p50 / p95 / max", f"{s['solver_ms_p50']} / {s['solver_ms_p95']} / {s['solver_ms_max']}"),
        ("peak RSS", f"{s['peak_rss_mb']} MB"),
    ]
    h = s.get("horizon")
    if h:
        rows.insert(1, ("learned horizon", f"{h['tfwd']:.0f} s at the end, the median stand of "
                                           f"{h.get('stands', 0)} allocations that changed; placement from "
                                           f"{h['fragments']} ended fragments (median "
                                           f"{h['median_s']} s, an idle node expected to stay {h['node_life_s']} s)"))
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m core.replay", description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="time,node,state CSV (.gz ok)")
    ap.add_argument("--jobs", type=Path, default=DEFAULT_JOBS, help="job set CSV")
    ap.add_argument("--node-list", type=Path, help="node names in machine order (default: Summit's list for the Summit trace)")
    ap.add_argument("--nodes", type=int, help="use the first N nodes only")
    ap.add_argument("--racks", help="use these racks only, e.g. a01-a10,b03")
    ap.add_argument("--start", help="window start, ISO 8601 (default: start of the trace)")
    ap.add_argument("--hours", type=float, help="window length (default: to the end of the trace)")
    ap.add_argument("--coalesce", type=float, default=0.0, help="merge events this many seconds apart into one step")
    ap.add_argument("--policy", choices=POLICIES, default="milp")
    ap.add_argument("--solver", choices=SOLVERS, default="dp")
    ap.add_argument("--objective", choices=OBJECTIVES, default="throughput",
                    help="fairshare weighs each job by its owner's fair-share factor (a job set with an owner column)")
    ap.add_argument("--fair-half-life", type=float, default=DEFAULT_HALF_LIFE_S,
                    help="--objective fairshare: seconds after which an owner's use counts half (default a week)")
    ap.add_argument("--max-jobs", type=int, default=10)
    ap.add_argument("--queue", choices=QUEUE_ORDERS, default="fcfs")
    ap.add_argument("--tfwd", type=tfwd_arg, default=AUTO,
                    help="T_fwd, seconds the allocator looks ahead, or auto (default): learned from the idle fragments")
    ap.add_argument("--curves", choices=CURVES, default="given",
                    help="what the allocator is told: the job set's curves, a linear guess, or nothing (JPA learns)")
    ap.add_argument("--noise", type=float, default=0.03, help="--curves learned: measurement noise (sd of log)")
    ap.add_argument("--sample-every", type=float, default=30.0, help="--curves learned: seconds per throughput sample")
    ap.add_argument("--seed", type=int, default=0, help="--curves learned: measurement noise seed")
    ap.add_argument("--jpa-no-groups", action="store_true",
                    help="--curves learned: learn each job alone (no priors from jobs of the same name)")
    ap.add_argument("--gpus-per-node", type=int,
                    help="GPUs each node brings (default: 6 for the Summit trace, else 1); counted, never allocated")
    ap.add_argument("--clairvoyant", nargs="?", const="times", default="", choices=[c for c in CLAIRVOYANCE if c],
                    help="a reference, not a policy: placement is told when the trace takes each node "
                         "back (times, the default), and with groups also keeps together the nodes it "
                         "takes back together (bench.policy sets learned placement against both)")
    ap.add_argument("--time-limit", type=float, default=5.0, help="MILP solver time limit, seconds")
    ap.add_argument("--db", type=Path, help="SQLite store to record the run in")
    ap.add_argument("--resume", action="store_true", help="continue the run recorded in --db")
    ap.add_argument("--out", type=Path, help="write one CSV row per step here")
    ap.add_argument("--json", action="store_true", help="end with the summary as one JSON line")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def tfwd_arg(text: str) -> float | str:
    """--tfwd: seconds, or `auto` (ControllerConfig checks the value)."""
    try:
        return parse_tfwd(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"give seconds or {AUTO}, not {text!r}") from None


def progress_bar(replay: Replay):
    """A tqdm bar over the simulated hours left, and the callback that moves it."""
    from tqdm import tqdm
    span_h = (replay.end - replay.clock.now()) / 3600.0
    bar = tqdm(total=round(span_h, 2), unit="sim h", file=sys.stderr, disable=None,
               bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} sim h [{elapsed}<{remaining}]")
    origin = replay.clock.now()

    def show(now: float) -> None:
        done = min(span_h, (now - origin) / 3600.0)
        if done - bar.n >= 0.1 or done >= span_h:
            bar.update(done - bar.n)
    return bar, show


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = ControllerConfig(args.policy, args.solver, args.objective, args.tfwd, args.max_jobs,
                                  args.queue, args.time_limit, fair_half_life=args.fair_half_life)
        settings = ReplaySettings(args.trace, args.jobs, args.node_list, args.nodes, args.racks,
                                  args.start, args.hours, args.coalesce, config, args.curves, args.noise,
                                  args.sample_every, args.seed, not args.jpa_no_groups, args.gpus_per_node,
                                  args.clairvoyant)
        replay = Replay(settings, args.db, resume=args.resume)
    except SettingsError as e:
        print(f"error: {e.render(lambda path: '--' + path.rsplit('.', 1)[-1].replace('_', '-'))}", file=sys.stderr)
        return 2
    except (InputError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out_fh = writer = None
    if args.out:
        out_fh = args.out.open("a" if args.resume else "w", newline="")
        writer = csv.writer(out_fh)
        if not args.resume or out_fh.tell() == 0:
            writer.writerow(["time", "events", "idle", "used", "running", "queued",
                             "samples_per_second", "objective", "solve_ms", "status", "changes"])

    def on_step(r: StepResult) -> None:
        if writer is not None:
            writer.writerow([iso(r.time), r.events, r.idle, r.used, r.running, r.queued,
                             round(r.samples_per_second, 3),
                             "" if r.objective is None else round(r.objective, 3),
                             "" if r.solve_ms is None else round(r.solve_ms, 3), r.status,
                             ";".join(f"{j}:{a}->{b}" for j, (a, b) in r.changes.items())])

    bar, progress = (None, None) if args.no_progress else progress_bar(replay)
    try:
        summary = replay.run(on_step, progress)
    except KeyboardInterrupt:
        replay.checkpoint()
        print("interrupted; state saved" + (f" in {args.db} (continue with --resume)" if args.db else ""),
              file=sys.stderr)
        return 130
    finally:
        if bar is not None:
            bar.close()
        if out_fh is not None:
            out_fh.close()
    print(format_summary(summary))
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
