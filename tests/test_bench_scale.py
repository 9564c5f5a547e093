"""bench.scale (issue 59): the tiled machine it cuts from the trace, the simulated Slurm's answers as
the real parser reads them, the latencies it reads from a store, and a whole `--quick` run of the
real harvester against the simulated Slurm and pilots, whose result must have every key with
sane values. How fast is the bench's to report (docs/evaluation/scale.md), not this test's."""
from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

from bench.scale_feed import Feed, Machine, take_machine, tile_name
from bench.scale_measure import burst_alloc_s, hello_to_alloc_ms, leave_to_shrunk_ms, read_changes
from bench.scale_pilots import PilotRecord, reply
from core.slurm.parse import parse_jobs, parse_nodes
from core.timeutil import iso, parse_iso
from tests.support.files import write_trace
from tests.support.procs import last_json, run_module

T0 = parse_iso("2021-02-10T00:00:00Z")


def trace(tmp_path: Path, rows: list[tuple[float, str, str]]) -> Path:
    """A node trace of `rows` (seconds after T0, node, state)."""
    return write_trace(tmp_path / "t.csv", [(iso(T0 + t), node, state) for t, node, state in rows])


def test_tiles_rename_the_nodes_and_shift_the_trace_by_a_day_each(tmp_path):
    rows = [(0, "a01n01", "idle"), (100, "a01n01", "busy"), (86400 + 50, "a01n02", "idle"),
            (86400 + 200, "a01n01", "idle"), (3 * 86400, "a01n01", "busy")]
    nodes = tmp_path / "nodes.txt"
    nodes.write_text("a01n01\na01n02\n")
    m = take_machine(trace(tmp_path, rows), nodes, 3, T0 + 60, 1.0)
    assert m.names == ["a01n01", "a01n02", tile_name(1, "a01n01")] == ["a01n01", "a01n02", "ta01n01"]
    assert m.shifts_days == [0.0, 1.0]
    # tile 0 from 60 s: a01n01 idle, busy at +40; tile 1 from a day later: ta01n01 busy, idle at +140
    assert m.idle0 == {"a01n01": True, "a01n02": False, "ta01n01": False}
    assert m.changes == [(40.0, "a01n01", False), (140.0, "ta01n01", True)]


def test_the_feed_answers_as_slurm_prints_and_preempts_a_pilot_when_its_node_is_taken():
    started, stopped = [], []
    m = Machine(["n1", "n2"], {"n1": True, "n2": False}, [], [0.0])

    async def go():
        feed = Feed(m, "alice", started.append, lambda j, why: stopped.append((j, why)), seed=1)
        rc, out = feed.sbatch(["--parsable", "--job-name", "harvest-pilot", "--nodelist", "n1", "--nodes", "1"],
                              {"HARVEST_PILOT_HUB": "127.0.0.1:1"})
        assert rc == 0 and out.strip().isdigit()
        jid = out.strip()
        assert [j.state for j in parse_jobs(feed.squeue(["--name=harvest-pilot"])[1])] == ["PENDING"]
        await asyncio.sleep(0.35)                    # the start delay is at most 0.3 s
        assert [p.id for p in started] == [jid]
        nodes = {n.name: n for n in parse_nodes(feed.sinfo([])[1])}
        assert nodes["n1"].state == "allocated" and nodes["n2"].state == "allocated"
        assert set(nodes["n1"].partitions) == {"main", "scavenger"}
        assert feed.sinfo(["--version"])[1].startswith("slurm 24.11")
        feed.set_idle("n1", False)                   # a main job takes n1
        assert stopped == [(jid, "preempted")] and feed.squeue([])[1] == ""
        feed.set_idle("n1", True)
        assert parse_nodes(feed.sinfo([])[1])[0].free
    asyncio.run(go())


def test_latencies_come_from_the_stores_allocation_rows(tmp_path):
    db = tmp_path / "s.db"
    with sqlite3.connect(db) as con:
        con.execute("create table allocations (id integer primary key, time float, job text, added text, removed text)")
        for t, job, added, removed in [(10.2, "A", ["n1"], []), (10.5, "B", ["n2"], []), (20.05, "A", [], ["n1"])]:
            con.execute("insert into allocations (time, job, added, removed) values (?, ?, ?, ?)",
                        (t, job, json.dumps(added), json.dumps(removed)))
    ch = read_changes(db)
    recs = [PilotRecord("1", "n1", 9.0, hello_at=10.0, welcome_at=10.01, leave_at=20.0),
            PilotRecord("2", "n2", 9.0, hello_at=10.1, welcome_at=10.11),
            PilotRecord("3", "n3", 9.0, hello_at=10.1, welcome_at=10.11)]
    ms, never = hello_to_alloc_ms(recs, ch)
    assert [round(x) for x in ms] == [200, 400] and never == 1
    assert [round(x) for x in leave_to_shrunk_ms(recs, ch)] == [50]
    assert round(burst_alloc_s({"n1", "n2"}, 10.1, ch), 3) == 0.4


def test_a_simulated_pilot_answers_each_request_as_the_real_one():
    assert reply({"op": "alive", "id": 3, "handles": [{"pid": 1}, {"pid": 2}]}) == {"re": 3, "ok": True,
                                                                                  "alive": [True, True]}
    assert reply({"op": "stop", "id": 4, "handles": [{"pid": 1}]})["results"] == ["stopped"]
    assert reply({"op": "nonsense", "id": 5})["ok"] is False


def test_quick_run_of_the_real_harvester_against_simulated_slurm_and_pilots():
    r = last_json(run_module("bench.scale", "--quick", "--json", timeout=240))
    assert "SIMULATED" in r["simulated"] and "REAL" in r["simulated"]
    assert r["nodes"] == 200 and r["trace_changes"] > 0
    # every pilot the trace left room for connected, the hub counted the same, all were used
    assert r["pilots_peak"]["fleet"] == r["pilots_peak"]["hub"] == r["idle_at_start"] > 0
    assert r["burst_nodes"] == r["idle_at_start"] and r["burst_alloc_s"] is not None and r["burst_alloc_s"] >= 0
    assert 50 < r["rss_mb"]["peak"] < 4096 and r["rss_mb"]["end"] <= r["rss_mb"]["peak"]
    assert r["kb_per_pilot"] is not None
    assert 0 < r["cpu_share"]["harvester"] <= r["cpu_share"]["with_commands"] < 2
    for key in ("hello_to_alloc_ms", "leave_to_shrunk_ms"):
        assert r[f"{key}_p50"] is not None and 0 <= r[f"{key}_p50"] <= r[f"{key}_p99"], key
        assert r[key]["n"] > 0
    assert 0 <= r["hellos_never_allocated"] < r["hello_to_alloc_ms"]["n"]
    assert r["hello_to_alloc_ms_cold"]["n"] == r["burst_nodes"]      # every pilot of the burst was used
    assert r["alloc_ms_p99"] is not None and r["alloc_ms_p99"] > 0
    assert r["pilots"]["preempted"] > 0 and r["pilots"]["submitted"] >= r["pilots"]["started"]
    assert r["events_per_s"] > 0 and r["store_mb_end"] > 0 and "store_mb_per_hour" in r
    assert r["grid"]["full"]["kb_p50"] > 0 and r["grid"]["update"]["n"] > 0
    assert r["slurm_calls_per_s"]["sinfo"] > 0
