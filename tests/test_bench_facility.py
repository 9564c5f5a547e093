"""bench.facility (issues 48, 59): the slice it cuts from a trace and its idle periods, the
figures it reads from sdiag, /metrics and the harvester's store, the lag model that projects the
harvest to another compression, and a whole run on a small slice of the real Summit trace on a
real Slurm, whose invariants are checked: every main job ran on its own node in both passes, a
delay was measured for each, a lag for the idle periods, and no pilot was left. The figures
themselves are the bench's to report (README), not this test's: on a shared 2-core machine they
vary from run to run."""
from __future__ import annotations

import json
import math
from pathlib import Path

from bench.facility_lag import lag_report, measure, read_store_times, usable_share
from bench.facility_report import histogram_quantile
from bench.facility_slice import idle_periods, take_slice
from bench.facility_slurm import parse_sdiag
from core.model import Curve, Event, EventKind, Job
from core.store import Batch, Store
from core.timeutil import iso, parse_iso
from tests.support.files import write_trace
from tests.support.procs import last_json, run_module

T0 = parse_iso("2021-02-10T00:00:00Z")


def trace(tmp_path: Path, rows: list[tuple[float, str, str]]) -> Path:
    """A node trace of `rows` (seconds after T0, node, state)."""
    return write_trace(tmp_path / "t.csv", [(iso(T0 + t), node, state) for t, node, state in rows])


def test_the_slice_has_a_main_job_per_busy_period_cut_to_the_window_and_compressed(tmp_path):
    # a01n1 idle before the window, busy 600-1800, idle again; a01n2 busy throughout except
    # 1200-1500; a01n3 never idle (picked last, to fill up); a01n0 idle in no window
    t = trace(tmp_path, [(100, "a01n1", "idle"), (600, "a01n1", "busy"), (1200, "a01n2", "idle"),
                         (1500, "a01n2", "busy"), (1800, "a01n1", "idle")])
    nodes = tmp_path / "nodes.txt"
    nodes.write_text("a01n0\na01n1\na01n2\na01n3\n")
    sl = take_slice(t, nodes, 3, T0 + 300, 0.5, 10.0)       # window 300-2100 s, 180 s compressed
    assert sl.summit == ["a01n1", "a01n2", "a01n0"] and sl.names == ["node1", "node2", "node3"]
    got = [(j.node, round(j.at, 3), round(j.run_s, 3), j.initial) for j in sl.jobs]
    assert got == [("node2", 0.0, 90.0, True), ("node3", 0.0, 180.0, True), ("node1", 30.0, 120.0, False),
                   ("node2", 120.0, 60.0, False)], got
    assert [j.idx for j in sl.jobs] == [0, 1, 2, 3]
    # idle: a01n1 300-600 and 1800-2100, a01n2 1200-1500: 900 s, 90 s compressed
    assert math.isclose(sl.idle_node_s, 90.0) and math.isclose(sl.window_s, 180.0)
    assert sl.lines[0] == (T0 + 299, "node1", "idle")      # idle at the start: before it
    assert [(round(x - T0 - 300, 3), n, s) for x, n, s in sl.lines[1:]] == [
        (30.0, "node1", "busy"), (90.0, "node2", "idle"), (120.0, "node2", "busy"), (150.0, "node1", "idle")]


def small_slice(tmp_path: Path):
    t = trace(tmp_path, [(100, "a01n1", "idle"), (600, "a01n1", "busy"), (1200, "a01n2", "idle"),
                         (1500, "a01n2", "busy"), (1800, "a01n1", "idle")])
    nodes = tmp_path / "nodes.txt"
    nodes.write_text("a01n0\na01n1\na01n2\na01n3\n")
    return take_slice(t, nodes, 3, T0 + 300, 0.5, 10.0)


def test_the_idle_periods_are_the_slices_idle_node_seconds_each_opened_and_closed_by_its_main_jobs(tmp_path):
    sl = small_slice(tmp_path)      # jobs: 0 node2 0-90, 1 node3 0-180, 2 node1 30-150, 3 node2 120-180
    got = [(p.node, p.after, p.until, round(p.trace_s, 3)) for p in idle_periods(sl)]
    assert got == [("node1", None, 2, 300.0), ("node1", 2, None, 300.0), ("node2", 0, 3, 300.0)], got
    assert math.isclose(sum(p.trace_s for p in idle_periods(sl)), sl.idle_node_s * sl.compress)


def test_the_lag_runs_from_the_main_jobs_end_to_the_first_hold_and_use_before_the_next_one(tmp_path):
    periods = idle_periods(small_slice(tmp_path))
    started = {0: (1000.0, "node2"), 1: (1000.0, "node3"), 2: (1031.0, "node1"), 3: (1121.0, "node2")}
    ended = {0: 1090.5, 2: 1151.0}
    joins = {"node1": [990.0, 1153.0], "node2": [1092.5, 1125.0]}
    uses = {"node1": [1000.0, 1154.0], "node2": [1093.0]}
    lags = measure(periods, started, ended, joins, uses, clock_end=1180.0)
    assert [(x.period.node, x.played_s, x.held_s, x.used_s) for x in lags] == [
        ("node1", 29.0, 2.0, 3.0), ("node2", 30.5, 2.0, 2.5)]
    # the model: usable at xc = sum(max(0, D - c * lag)) / sum(D); the window's first period lag 0
    assert math.isclose(usable_share(periods, lags, 10.0), (300 + 270 + 275) / 900)
    assert math.isclose(usable_share(periods, lags, 1.0), (300 + 297 + 297.5) / 900)
    r = lag_report(periods, lags, 10.0)
    assert r["harvest_projected_x1"] == round(894.5 / 900, 4)
    assert r["harvest_projected_x2"] == round((300 + 294 + 295) / 900, 4)
    assert r["harvest_modelled"] == round(845 / 900, 4)
    assert (r["idle_to_held_s_p50"], r["idle_to_used_s_p50"]) == (2.0, 2.75)
    assert r["idle_periods"] == {"opened": 2, "played": 2, "held": 2, "used": 2}
    assert lag_report(periods, [], 10.0)["harvest_projected_x1"] is None, "no lag measured: no projection"


def test_a_period_no_job_used_costs_at_least_its_played_length(tmp_path):
    periods = idle_periods(small_slice(tmp_path))
    started = {0: (1000.0, "node2"), 1: (1000.0, "node3"), 2: (1031.0, "node1"), 3: (1121.0, "node2")}
    lags = measure(periods, started, {0: 1090.5, 2: 1151.0}, {}, {"node1": [1154.0], "node2": [1125.0]}, 1180.0)
    assert [(x.played_s, x.used_s) for x in lags] == [(29.0, 3.0), (30.5, None)], "a use after the next job is not"
    assert math.isclose(usable_share(periods, lags, 10.0), (300 + 270 + 0) / 900)
    assert math.isclose(usable_share(periods, lags, 1.0), (300 + 297 + 269.5) / 900)


def test_the_store_gives_when_a_pilot_held_a_node_and_when_a_job_got_it(tmp_path):
    store = Store(tmp_path / "h.db")
    job = Job("j1", 1, 4, 1e6, Curve((1, 4), (10.0, 40.0)))
    b = Batch()
    b.event(Event(5.0, EventKind.NODE_JOIN, node="node1", detail="pilot 7 holds it"))
    b.event(Event(5.5, EventKind.NODE_LEAVE, node="node2"))
    b.event(Event(5.7, EventKind.JOB_SUBMIT, job="j1"))
    b.change(6.0, job, [], ["node1", "node2"], "grow", 20.0, 0.0, "model")
    b.change(7.0, job, ["node1", "node2"], ["node2", "node3"], "regroup", 20.0, 10.0, "model")
    store.write(b)
    store.close()
    joins, uses = read_store_times(tmp_path / "h.db")
    assert joins == {"node1": [5.0]}
    assert uses == {"node1": [6.0], "node2": [6.0], "node3": [7.0]}


def test_sdiag_and_histogram_readers():
    text = """Main schedule statistics (microseconds):
\tLast cycle:   120
\tMax cycle:    2705
\tTotal cycles: 10
\tMean cycle:   683
Backfilling stats
\tMean cycle: 44
Remote Procedure Call statistics by message type
\tREQUEST_PARTITION_INFO                  ( 2009) count:7      ave_time:175    total_time:1230
\tREQUEST_JOB_INFO                        ( 2003) count:3      ave_time:175    total_time:1230
Remote Procedure Call statistics by user
\troot            (       0) count:160    ave_time:225    total_time:36130
\talice           (    1000) count:2      ave_time:25     total_time:50
Pending RPC statistics
\tNo pending RPCs
"""
    s = parse_sdiag(text)
    assert s["main"] == {"Last cycle": 120, "Max cycle": 2705, "Total cycles": 10, "Mean cycle": 683}
    assert s["backfill"] == {"Mean cycle": 44}
    assert s["types"] == {"REQUEST_PARTITION_INFO": 7, "REQUEST_JOB_INFO": 3}
    assert s["users"] == {"root": 160, "alice": 2}
    h = {("v_bucket", (("le", "0.1"),)): 2.0, ("v_bucket", (("le", "0.2"),)): 4.0,
         ("v_bucket", (("le", "+Inf"),)): 4.0}
    assert math.isclose(histogram_quantile(h, "v", 0.5), 0.1)
    assert math.isclose(histogram_quantile(h, "v", 0.75), 0.15)
    assert histogram_quantile({}, "v", 0.5) is None


def test_a_small_slice_on_a_real_slurm_every_main_job_ran_on_its_node(tmp_path):
    out = last_json(run_module("bench.facility", "--quick", "--json", "--plot", str(tmp_path / "f.png"),
                               "--save", str(tmp_path / "f.json"), timeout=600))
    assert (tmp_path / "f.png").stat().st_size > 20_000 and (tmp_path / "f.html").exists(), "the plot"
    assert json.loads((tmp_path / "f.json").read_text()) == out
    assert out["nodes"] == 16 and out["main_jobs"] > out["main_jobs_clocked"] > 0
    assert out["main_jobs_wrong"] == {"without": [], "with": []}, "every main job ran, on its own node"
    assert out["main_jobs_played"] == out["main_jobs_clocked"], "a delay measured for each, in both passes"
    for d in out["main_delay_ms"].values():
        assert 0 < d["p50"] <= d["p99"] <= d["max"]
    assert out["pilots_left"] == [], "no pilot left"
    p = out["pilots"]
    assert p["submitted"] >= out["hub_connections_peak"] > 0 and p["lost"] == 0
    assert out["vacates"] >= p["preempted"] > 0, "main jobs took nodes back from pilots"
    assert 0 < out["harvest_share"] <= out["held_share"] <= 1.1 and out["replay_share"] > 0
    assert out["harvester_cpu_pct"] > 0 and out["harvester_rss_mb"] > 0 and out["cold_start_s"] is not None
    assert out["root_rpc_per_s"]["with"] > out["root_rpc_per_s"]["without"]
    lag = out["idle_periods"]
    assert lag["opened"] >= lag["played"] >= lag["held"] >= lag["used"] > 0, "a lag measured for idle periods"
    for what in ("held", "used"):
        assert 0 < out[f"idle_to_{what}_s_p50"] <= out[f"idle_to_{what}_s_p99"] < out["window_s"]
    assert 0 < out["harvest_modelled"] <= out["harvest_projected_x2"] <= out["harvest_projected_x1"] <= 1, \
        "a lag costs more, the faster the play"
