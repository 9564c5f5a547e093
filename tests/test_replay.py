"""The headless replay (core/replay.py) on small real files and the Summit trace: deterministic,
resumable, through every exact solver, in small increments; and its command line."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from core.controller_config import ControllerConfig
from core.replay import TIMING_KEYS, Replay, ReplaySettings
from tests.support.files import write_jobset
from tests.support.procs import run_module


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


@pytest.mark.parametrize("tfwd", ["auto", 10.0])
def test_a_quiet_replay_wakes_when_the_horizon_is_due(tmp_path, tfwd):
    """Nothing happens in this trace after the nodes go idle; B arrives 5 s after A took all 8.
    The replay steps the controller at `replan_at` as at an event, so under `auto` B gets nodes
    within minutes; a fixed T_fwd has nothing to wake for, and B waits the whole hour."""
    from tests.support.files import write_trace
    trace = write_trace(tmp_path / "quiet.csv",
                        [(f"2021-02-10T00:00:0{i}Z", f"r00n{i:02d}", "idle") for i in range(8)])
    jobs = write_jobset(tmp_path / "jobs.csv", [
        "A,alex,2021-02-10T00:01:00Z,1,8,1e12,18,12,1;2;4;8,100;195;370;680",
        "B,vgg,2021-02-10T00:01:05Z,1,8,1e12,18,12,1;2;4;8,100;195;370;680",
    ])
    rp = Replay(ReplaySettings(trace=trace, jobs=jobs, hours=1, config=ControllerConfig(tfwd=tfwd)))
    rp.advance(rp.start + 600)
    held = rp.controller.held
    assert bool(held.get("B")) == (tfwd == "auto") and (len(held["A"]) < 8) == (tfwd == "auto")
    s = rp.run()
    assert s["steps"] < 20
