"""The engine end to end on small real files: trace reader, simulated dispatcher, controller,
SQLite store (a real file in WAL mode), replay CLI and its resume."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.support.files import write_jobset, write_trace
from tests.support.procs import run_module
from core.clock import SimClock
from core.controller import Controller, ControllerConfig
from core.dispatchers.simulated import SimulatedDispatcher
from core.errors import InputError
from core.jobsets import load_jobset
from core.model import Curve, Event, EventKind, Job, JobState
from core.replay import TIMING_KEYS, Replay, ReplaySettings
from core.sources.trace import TraceSource, select_nodes
from core.store import Store
from core.timeutil import parse_iso

T0 = parse_iso("2021-02-10T00:00:00Z")


def job(jid: str, lo=1, hi=4, total=1e6, curve=((1, 2, 4), (100.0, 190.0, 350.0)), submit=T0, prio=1.0) -> Job:
    c = Curve(*curve)
    return Job(jid, lo, hi, total, c, 18.0, 12.0, prio, submit, true_curve=c)


def controller(nodes, config=None, store=None, t=T0):
    clock = SimClock(t)
    ctl = Controller(SimulatedDispatcher(), clock, config or ControllerConfig(), store, nodes)
    ctl.start(nodes)
    return ctl, clock


# ---- trace source ------------------------------------------------------------------------

def test_trace_batches_coalesce_and_report_net_changes(tmp_path):
    trace = write_trace(tmp_path / "t.csv", [
        ("2021-02-10T00:00:00Z", "a01n01", "idle"),
        ("2021-02-10T00:00:00Z", "a01n02", "idle"),
        ("2021-02-10T00:10:00Z", "a01n01", "busy"),   # idle -> busy -> idle in one second:
        ("2021-02-10T00:10:00Z", "a01n01", "idle"),   # the job there was preempted, node back
        ("2021-02-10T00:10:00Z", "a01n03", "idle"),
        ("2021-02-10T00:10:00Z", "a01n03", "busy"),   # busy -> idle -> busy: nothing to report
        ("2021-02-10T00:10:01Z", "a01n02", "busy"),
        ("2021-02-10T00:10:02Z", "zzz", "idle"),      # not in the subset
    ])
    src = TraceSource(trace, ["a01n01", "a01n02", "a01n03"], start=parse_iso("2021-02-10T00:05:00Z"))
    assert src.initial_idle() == ["a01n01", "a01n02"]
    batches = list(src.batches())
    assert [(t - T0, [(e.kind.value, e.node) for e in evs]) for t, evs in batches] == [
        (600.0, [("node_leave", "a01n01"), ("node_join", "a01n01")]),
        (601.0, [("node_leave", "a01n02")]),
    ]
    merged = list(TraceSource(trace, ["a01n01", "a01n02", "a01n03"], coalesce=5.0).batches())
    assert len(merged) == 2  # 00:00 batch, then 00:10:00..00:10:01 merged into one


def test_select_nodes_first_n_and_racks():
    names = [f"a{r:02d}n{i:02d}" for r in range(1, 4) for i in range(1, 19)]
    assert select_nodes(names, first=5) == names[:5]
    assert select_nodes(names, racks="a02") == names[18:36]
    assert select_nodes(names, racks="a01-a02,a03", first=40) == names[:40]
    with pytest.raises(ValueError):
        select_nodes(names, racks="b01")


@pytest.mark.parametrize("line, words", [
    ("2021-02-10T00:00:00Z,a01n01", "expected 3 fields"),
    ("2021-02-10T00:00:00Z,a01n01,down", "unknown state 'down'"),
    ("yesterday,a01n01,idle", "bad time"),
    ("2021-02-09T00:00:00Z,a01n01,idle", "goes back in time"),
])
def test_trace_errors_name_file_and_line(tmp_path, line, words):
    p = tmp_path / "bad.csv"
    p.write_text("time,node,state\n2021-02-10T00:00:00Z,a01n02,idle\n" + line + "\n")
    with pytest.raises(InputError) as e:
        TraceSource(p, []).validate()
    assert e.value.line == 3 and words in str(e.value) and "bad.csv:3" in str(e.value)


# ---- job sets ----------------------------------------------------------------------------

@pytest.mark.parametrize("row, words", [
    ("A,m,2021-02-10T00:00:00Z,4,2,100,18,12,1;2,1;2", "min_nodes (4) > max_nodes (2)"),
    ("A,m,2021-02-10T00:00:00Z,1,2,100,18,12,0;2,1;2", "node counts must be positive"),
    ("A,m,2021-02-10T00:00:00Z,1,2,100,18,12,1;2,1;2;3", "2 node counts but 3 throughputs"),
    ("A,m,2021-02-10T00:00:00Z,1,2,abc,18,12,1;2,1;2", "total_samples"),
    ("A,m,not-a-time,1,2,100,18,12,1;2,1;2", "submit_time"),
])
def test_jobset_errors_name_file_and_line(tmp_path, row, words):
    p = write_jobset(tmp_path / "jobs.csv", ["OK,m,2021-02-10T00:00:00Z,1,2,100,18,12,1;2,1;2", row])
    with pytest.raises(InputError) as e:
        load_jobset(p)
    assert e.value.line == 3 and words in str(e.value), str(e.value)


def test_jobset_unknown_column(tmp_path):
    p = tmp_path / "jobs.csv"
    p.write_text("job,submit_time,min_nodes,max_nodes,total_samples,nodes,samples_per_second,colour\n")
    with pytest.raises(InputError) as e:
        load_jobset(p)
    assert e.value.line == 1 and "unknown column(s) colour" in str(e.value)


def test_shipped_jobsets_load():
    for name in ("jobs-imagenet-1001.csv", "jobs-hps-shufflenet-1000.csv"):
        jobs = load_jobset(Path("data") / name)
        assert len(jobs) >= 1000 and all(j.true_curve is not None for j in jobs)


# ---- simulated dispatcher ----------------------------------------------------------------

def test_simulated_progress_rescale_and_preemption_costs():
    d = SimulatedDispatcher()
    j = job("J", total=1e9)
    d.resize(j, ["a", "b"], T0)                      # start: no cost
    assert d.progress(j, T0 + 100) == pytest.approx(190 * 100)
    d.resize(j, ["a", "b", "c", "d"], T0 + 100)      # grow: loses 18 s at the old rate
    assert d.progress(j, T0 + 100) == pytest.approx(190 * 100 - 18 * 190)
    d.vacate(j, ["d"], T0 + 200)                     # preempted: loses 12 s at the rate before
    expect = 190 * 100 - 18 * 190 + 350 * 100 - 12 * 350
    assert d.progress(j, T0 + 200) == pytest.approx(expect)
    assert d.rate(j) == pytest.approx(270)           # 3 nodes, interpolated between 2 and 4
    assert d.rescales == 1 and d.preemptions == 1


def test_simulated_completion_time_is_exact():
    d = SimulatedDispatcher()
    j = job("J", total=35_000)
    d.resize(j, ["a", "b", "c", "d"], T0)
    assert d.next_event_time(T0) == pytest.approx(T0 + 100)
    assert d.poll(T0 + 99.9) == []
    assert [e.job for e in d.poll(T0 + 100)] == ["J"]


def test_below_min_runs_at_zero():
    d = SimulatedDispatcher()
    j = job("J", lo=2)
    d.resize(j, ["a"], T0)
    assert d.rate(j) == 0 and d.next_event_time(T0) is None


# ---- controller --------------------------------------------------------------------------

class Recording(SimulatedDispatcher):
    def __init__(self):
        super().__init__()
        self.calls = []

    def vacate(self, job, lost, now):
        self.calls.append(("vacate", job.id, tuple(lost)))
        super().vacate(job, lost, now)

    def resize(self, job, nodes, now):
        self.calls.append(("resize", job.id, len(nodes)))
        super().resize(job, nodes, now)


def test_leave_is_handled_before_anything_else():
    nodes = [f"a01n{i:02d}" for i in range(1, 5)]
    clock = SimClock(T0)
    d = Recording()
    ctl = Controller(d, clock, ControllerConfig(tfwd=1000), None, nodes)
    ctl.start(nodes)
    ctl.submit(job("J", hi=8))
    ctl.step()
    assert len(ctl.held["J"]) == 4
    victim = ctl.held["J"][0]
    d.calls.clear()
    clock.advance_to(T0 + 60)
    # a join listed first in the batch must not be planned before the leave is vacated
    r = ctl.step([Event(T0 + 60, EventKind.NODE_JOIN, node="a02n01"),
                  Event(T0 + 60, EventKind.NODE_LEAVE, node=victim)])
    assert d.calls[0] == ("vacate", "J", (victim,))
    assert victim not in ctl.held["J"] and victim not in ctl.owner
    assert "a02n01" in ctl.held["J"] and r.events == 2
    view = {n.name: n for n in ctl.nodes()}
    assert view[victim].state.value == "busy" and view[victim].job is None
    assert view[victim].since == T0 + 60 and view[ctl.held["J"][0]].job == "J"
    alloc = ctl.last_allocation
    assert alloc.time == T0 + 60 and alloc.assignment["J"] == ctl.held["J"]
    assert ctl.counters.solves == 2 and ctl.counters.preemptions == 1


def test_max_jobs_fcfs_and_priority_queue():
    nodes = [f"a01n{i:02d}" for i in range(1, 9)]
    for queue, expect in (("fcfs", ["A", "B"]), ("priority", ["C", "B"])):
        ctl, clock = controller(nodes, ControllerConfig(max_jobs=2, queue=queue, tfwd=1000))
        ctl.submit(job("A", submit=T0, prio=1))
        ctl.submit(job("B", submit=T0 + 1, prio=5))
        ctl.submit(job("C", submit=T0 + 2, prio=9))
        r = ctl.step()
        assert sorted(ctl.running) == sorted(expect) and r.running == 2 and r.queued == 1
        assert sum(len(v) for v in ctl.held.values()) == 8


def test_job_finishes_and_frees_its_slot():
    nodes = [f"a01n{i:02d}" for i in range(1, 5)]
    ctl, clock = controller(nodes, ControllerConfig(max_jobs=1, tfwd=1000))
    ctl.submit(job("A", total=35_000))
    ctl.submit(job("B", submit=T0 + 1))
    ctl.step()
    assert list(ctl.running) == ["A"] and len(ctl.held["A"]) == 4
    t = ctl.dispatcher.next_event_time(clock.now())
    clock.advance_to(t)
    ctl.step(ctl.dispatcher.poll(t))
    a = ctl.jobs["A"]
    assert a.state is JobState.DONE and a.samples_done == 35_000 and a.end_time == pytest.approx(T0 + 100)
    assert list(ctl.running) == ["B"] and len(ctl.held["B"]) == 4
    assert ctl.counters.jobs_finished == 1


def test_events_of_one_batch_cost_one_solve():
    nodes = [f"a01n{i:02d}" for i in range(1, 5)]
    ctl, clock = controller(nodes[:1], ControllerConfig(tfwd=1000))
    ctl.submit(job("A", hi=8))
    ctl.step()
    clock.advance_to(T0 + 10)
    ctl.step([Event(T0 + 10, EventKind.NODE_JOIN, node=n) for n in nodes[1:]])
    assert ctl.counters.solves == 2 and len(ctl.held["A"]) == 4


def test_cancel_releases_nodes():
    nodes = [f"a01n{i:02d}" for i in range(1, 5)]
    ctl, clock = controller(nodes, ControllerConfig(tfwd=1000))
    ctl.submit(job("A"))
    ctl.step()
    ctl.cancel("A")
    ctl.step()
    assert ctl.jobs["A"].state is JobState.CANCELLED and not ctl.owner and not ctl.running
    with pytest.raises(ValueError):
        ctl.submit(job("A"))


# ---- store -------------------------------------------------------------------------------

def test_store_is_wal_and_restores_the_controller(tmp_path):
    db = tmp_path / "run.db"
    store = Store(db)
    assert store.journal_mode == "wal"
    nodes = [f"a01n{i:02d}" for i in range(1, 7)]
    ctl, clock = controller(nodes, ControllerConfig(max_jobs=2, tfwd=1000), store)
    for k, jid in enumerate("ABC"):
        ctl.submit(job(jid, submit=T0 + k, total=1e7))
    ctl.step()
    clock.advance_to(T0 + 500)
    ctl.step([Event(T0 + 500, EventKind.NODE_LEAVE, node=ctl.held["A"][0])])
    ctl.flush()
    store.close()

    store2 = Store(db)
    clock2 = SimClock(T0 + 500)
    ctl2 = Controller.restore(store2, SimulatedDispatcher(), clock2, node_names=nodes)
    assert ctl2.config == ctl.config
    assert list(ctl2.running) == list(ctl.running)
    assert ctl2.held == ctl.held and ctl2.owner == ctl.owner and set(ctl2.idle) == set(ctl.idle)
    for jid in "ABC":
        assert ctl2.jobs[jid].state == ctl.jobs[jid].state
        assert ctl2.jobs[jid].samples_done == pytest.approx(ctl.jobs[jid].samples_done)
    assert ctl2.n_queued == 1 and ctl2.counters == ctl.counters
    assert ctl2.nodes() == ctl.nodes()
    tables = {r[0] for r in sqlite3.connect(db).execute("select name from sqlite_master where type='table'")}
    assert {"jobs", "nodes", "events", "allocations", "throughput", "solver_runs", "meta"} <= tables


# ---- replay ------------------------------------------------------------------------------

def settings(trace, jobs, **kw):
    return ReplaySettings(trace=trace, jobs=jobs, hours=10, config=ControllerConfig(**kw))


def strip(summary):
    return {k: v for k, v in summary.items() if k not in TIMING_KEYS}


def test_replay_small_is_deterministic_and_finishes_jobs(small_trace, small_jobs):
    a = Replay(settings(small_trace, small_jobs, tfwd=600)).run()
    b = Replay(settings(small_trace, small_jobs, tfwd=600)).run()
    assert strip(a) == strip(b)
    assert a["jobs_finished"] == 3 and a["samples"] == pytest.approx(5.1e6)
    assert 0 < a["harvest_pct"] <= 100 and a["preemptions"] >= 1


def test_replay_resume_matches_uninterrupted_run(tmp_path, small_trace, small_jobs):
    full = Replay(settings(small_trace, small_jobs, tfwd=600)).run()

    class Stop(Exception):
        pass
    steps = []

    def stop_after_some(r):
        steps.append(r)
        if len(steps) == 12:
            raise Stop
    db = tmp_path / "r.db"
    first = Replay(settings(small_trace, small_jobs, tfwd=600), db)
    with pytest.raises(Stop):
        first.run(on_step=stop_after_some)
    first.checkpoint()
    first.store.close()
    resumed = Replay(settings(small_trace, small_jobs, tfwd=600), db, resume=True)
    assert resumed.clock.now() > resumed.start
    out = resumed.run()
    assert strip(out) == strip(full)


def test_replay_cli_json_and_steps(tmp_path, small_trace, small_jobs):
    out = tmp_path / "steps.csv"
    db = tmp_path / "r.db"
    p = run_module("core.replay", "--trace", str(small_trace), "--jobs", str(small_jobs),
                   "--hours", "10", "--policy", "even", "--db", str(db), "--out", str(out), "--json")
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    for key in ("events", "wall_s", "samples", "jobs_finished", "harvest_pct", "solver_ms_p50",
                "solver_ms_p95", "peak_rss_mb"):
        assert key in summary
    assert "harvest" in p.stdout
    assert out.read_text().splitlines()[0].startswith("time,events,idle,used")
    c = sqlite3.connect(db)
    assert c.execute("select count(*) from jobs where state='done'").fetchone()[0] == 3
    again = run_module("core.replay", "--trace", str(small_trace), "--jobs", str(small_jobs), "--db", str(db))
    assert again.returncode == 2 and "already holds a run" in again.stderr


@pytest.mark.parametrize("kind", ["trace", "jobs"])
def test_replay_cli_bad_input_stores_nothing(tmp_path, small_trace, small_jobs, kind):
    if kind == "trace":
        bad = tmp_path / "bad.csv"
        bad.write_text(small_trace.read_text() + "2021-02-10T03:00:00Z,r00n00,gone\n")
        args = ["--trace", str(bad), "--jobs", str(small_jobs)]
        where = "bad.csv:16"
    else:
        bad = write_jobset(tmp_path / "badjobs.csv", ["A,m,2021-02-10T00:00:00Z,4,2,100,18,12,1;2,1;2"])
        args = ["--trace", str(small_trace), "--jobs", str(bad)]
        where = "badjobs.csv:2"
    db = tmp_path / "never.db"
    p = run_module("core.replay", *args, "--db", str(db))
    assert p.returncode == 2 and where in p.stderr, p.stderr
    assert not db.exists()


def test_summit_trace_uses_the_full_node_list_however_it_is_named():
    """4,680 nodes appear in the log; the machine has 4,734 (some never go idle)."""
    for trace in (Path("data/summit-idle-nodes-2021-02.csv.gz"), None):
        st = ReplaySettings(hours=0.01) if trace is None else ReplaySettings(trace=trace, hours=0.01)
        r = Replay(st)
        assert len(r.all_nodes) == 4734 and r.all_nodes[0] == "a01n01"


@pytest.mark.parametrize("solver", ["highs", "cbc"])
def test_replay_through_pulp_solvers_matches_dp(small_trace, small_jobs, solver):
    """The controller reaches the same optimum at every step whichever exact solver it uses."""
    runs = {}
    for s in ("dp", solver):
        steps = []
        out = Replay(settings(small_trace, small_jobs, tfwd=600, solver=s)).run(on_step=steps.append)
        runs[s] = (out, [r.objective for r in steps if r.objective is not None],
                   {r.status for r in steps if r.status})
    (dp, dp_obj, _), (other, obj, statuses) = runs["dp"], runs[solver]
    assert statuses == {"optimal"} and other["solver"] == solver
    assert obj == pytest.approx(dp_obj, rel=1e-6)
    assert other["jobs_finished"] == dp["jobs_finished"] == 3


def test_replay_in_small_increments_equals_one_run(small_trace, small_jobs):
    """Live replay advances a few simulated seconds per tick; the outcome must not depend on it."""
    whole = Replay(settings(small_trace, small_jobs, tfwd=600)).run()
    r = Replay(settings(small_trace, small_jobs, tfwd=600))
    t = r.start
    while r.advance(t):
        assert r.clock.now() == pytest.approx(min(t, r.end))
        t += 97.0
    assert strip(r.finish()) == strip(whole)
