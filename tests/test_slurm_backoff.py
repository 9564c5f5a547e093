"""Pilots that fail count against their node (core/pilots/backoff.py): the policy on a clock of
its own, then the whole way on a real Slurm (both versions of tests/support/slurm.py) with a
pilot Python that exits 1 at start, as a broken interpreter or module path on the nodes would."""
from __future__ import annotations

import time
from collections import Counter

import pytest

from core.pilots.backoff import PilotBackoff
from core.pilots.book import PilotBook
from core.pilots.hub import PilotLink
from core.slurm.records import SlurmJob, SlurmNode
from core.pilots.settings import SettingError, PilotSettings
from tests.support.server import ROOT, start_app
from tests.support.slurm import slurm_cluster, submit_digits  # noqa: F401  (the fixture)
from tests.support.waiting import wait

BROKEN = "pilot python broken: No module named 'core'"


def failing_submissions(backoff: PilotBackoff, nodes: int, seconds: float, fails_after: float = 2.0) -> Counter:
    """Pilots sent per node over `seconds` when every one fails `fails_after` s after it is sent
    (a poll each second, as the source does)."""
    sent: Counter = Counter()
    pending: dict[str, float] = {}
    t = 0.0
    while t < seconds:
        for node, ends in list(pending.items()):
            if ends <= t:
                backoff.failed(node, "exit 1", t)
                del pending[node]
        for i in range(nodes):
            node = f"n{i}"
            if node not in pending and not backoff.waiting(node, t) and backoff.room(t):
                backoff.submitted(t)
                sent[node] += 1
                pending[node] = t + fails_after
        t += 1.0
    return sent


def test_a_node_whose_pilots_always_fail_gets_a_handful_in_ten_minutes():
    sent = failing_submissions(PilotBackoff(), nodes=3, seconds=600)
    assert set(sent.values()) == {5}, f"20 s doubling: at 0, ~22, ~64, ~146, ~310 s; {sent}"
    short = failing_submissions(PilotBackoff(base_s=1, cap_s=4), nodes=1, seconds=60)
    assert 10 <= short["n0"] <= 12, f"the cap bounds the wait: every ~6 s; {short}"


def test_the_overall_rate_is_capped_and_a_good_pilot_clears_its_node():
    b = PilotBackoff(per_minute=50)
    sent = failing_submissions(b, nodes=400, seconds=120, fails_after=1000)
    assert sum(sent.values()) == 100, "50 in each of two minutes, whatever the number of free nodes"
    b.failed("n1", "exit 1", 0.0)
    b.failed("n1", "exit 1", 1.0)
    f = b.failure("n1")
    assert f is not None and f.failures == 2 and f.until == 41.0 and b.waiting("n1", 40.0)
    b.succeeded("n1")
    assert not b.waiting("n1", 2.0) and b.failing() == {}
    b.failed("n2", "exit 1", 0.0)
    assert b.clear("n2") and not b.clear("n2") and not b.waiting("n2", 1.0)


def test_backoff_settings_are_checked_with_the_option_named():
    for bad, name in ((dict(backoff_s=-1), "backoff_s"), (dict(backoff_s=60, backoff_cap_s=30), "backoff_cap_s"),
                      (dict(submit_per_minute=0), "submit_per_minute")):
        with pytest.raises(SettingError) as e:
            PilotSettings(**bad)
        assert e.value.field == name


# once, on the current version: Slurm only runs sbatch here, the same on every version
@pytest.mark.parametrize("slurm_cluster", ["24.11"], indirect=True)
def test_pilots_that_exit_at_start_back_off_and_say_why(slurm_cluster, tmp_path):
    cluster = slurm_cluster
    cluster.wait_quiet()
    python = tmp_path / "broken-python"
    python.write_text(f"#!/bin/sh\necho \"{BROKEN}\" >&2\nexit 1\n")
    python.chmod(0o755)
    logs = tmp_path / "pilot-logs"
    logs.mkdir()
    nodes = cluster.nodes[:3]
    app = start_app(tmp_path / "app", "--source", "slurm", *cluster.app_args(), "--slurm-python", str(python),
                    "--slurm-pilot-logs", str(logs), "--slurm-watch", ",".join(nodes), "--workdir", str(ROOT),
                    "--no-profiler", "--slurm-slots", "1", "--slurm-backoff", "8")
    try:
        submit_digits(app, "a job for broken pilots", 3)
        clu = lambda: app.get("/api/cluster")[1]
        src = wait(lambda: (lambda s: s if "failing on 3 node(s)" in s["detail"] else None)(clu()["source"]),
                   60, "every node's first pilot failed, on the badge", clu)
        assert "ended before it connected" in src["detail"] and BROKEN in src["detail"], src
        by_name = {n["name"]: n for n in clu()["nodes"]}
        for n in nodes:
            assert "1 failed pilot(s) in a row" in by_name[n]["source"] and BROKEN in by_name[n]["source"], by_name[n]
        pilots = lambda: Counter(j["nodes"] or "pending" for j in cluster.jobs().values() if j["name"] == "harvest-pilot")
        wait(lambda: all(pilots()[n] == 2 for n in nodes), 30, "a second pilot per node after ~8 s", pilots)
        # the second failure doubles the wait to 16 s: nothing more for a while
        wait(lambda: "2 failed pilot(s) in a row" in str(clu()["nodes"]), 30, "the second failures seen", clu)
        before = pilots()
        status, body = app.request("POST", f"/api/nodes/{nodes[0]}/clear", {}, token=app.token("staff1"))
        assert status == 200 and body["cleared"] is True, body
        wait(lambda: pilots()[nodes[0]] == before[nodes[0]] + 1, 15, "a pilot at once on the cleared node", pilots)
        assert all(pilots()[n] == 2 for n in nodes[1:]), f"the others still wait: {pilots()}"
        status, body = app.request("POST", "/api/nodes/nodeX/clear", {}, token=app.token("staff1"))
        assert status == 404, body
        status, body = app.request("POST", f"/api/nodes/{nodes[1]}/clear", {}, token=app.token("alice"))
        assert status == 403, body
    finally:
        app.stop()
    out = app.output()
    assert "pilot" in out and "ended before it connected" in out and BROKEN in out, out[-3000:]


# ---- which ends count: PilotBook's verdicts, on a real clock without Slurm ---------------------
def link(job: str, node: str, leaving: bool = False) -> PilotLink:
    return PilotLink(job, node, 1, None, time.time(), leaving=leaving)


def book_with(tmp_path, jobs: dict[str, str]) -> PilotBook:
    """A book watching node1..node3 with these pilots (job -> node) submitted."""
    b = PilotBook(PilotSettings(log_dir=str(tmp_path)), ["node1", "node2", "node3"])
    b.want(3, ())
    for job, node in jobs.items():
        b.submitted(job, node)
    return b


def test_only_a_pilots_own_failures_count_against_its_node(tmp_path):
    (tmp_path / "pilot-11.log").write_text("Traceback (most recent call last):\nImportError: no torch here\n")
    b = book_with(tmp_path, {"11": "node1", "12": "node2", "13": "node3"})
    squeue = {"11": SlurmJob("11", "harvest-pilot", "FAILED", "node1", "scavenger", "u", "NonZeroExitCode"),
              "12": SlurmJob("12", "harvest-pilot", "PREEMPTED", "node2", "scavenger", "u")}
    cancel, dropped, left = b.check(squeue, {"11", "12", "13"}, {})
    assert sorted(dropped) == ["11", "12", "13"] and not cancel and not left
    failing = b.backoff.failing()
    assert set(failing) == {"node1", "node3"}, "a preempted pilot is no failure; a vanished one is"
    assert failing["node1"].reason == ("pilot 11 on node1 ended before it connected: FAILED (NonZeroExitCode); "
                                       "its log: ImportError: no torch here")
    assert "gone from squeue" in failing["node3"].reason
    assert b.free_nodes({n: SlurmNode(n, "idle", (), ("scavenger",)) for n in ("node1", "node2", "node3")}) == ["node2"]

    b = book_with(tmp_path, {"21": "node1", "22": "node2", "23": "node3"})
    for job, node in (("21", "node1"), ("22", "node2"), ("23", "node3")):
        assert b.hello(link(job, node)) == "join"
    b.leave(link("21", "node1"), "lost")                       # dropped seconds after its hello
    b.leave(link("22", "node2", leaving=True), "preempted")    # said it was leaving: asked to
    assert set(b.backoff.failing()) == {"node1"}
    assert "ended" not in b.backoff.failing()["node1"].reason and "lost its connection" in b.backoff.failing()["node1"].reason
    assert b.closing() == ["23"]
    b.leave(link("23", "node3"), "cancelled")
    assert set(b.backoff.failing()) == {"node1"}, "pilots cancelled at close are no failures"


def test_a_node_slurm_took_back_gets_no_pilot_until_the_main_job_is_seen_on_it(tmp_path, monkeypatch):
    """Between a preempted pilot's end and the main job's start sinfo shows the node idle: a pilot
    sent then waits behind the main job only to be cancelled (bench.facility saw 11-25 such on
    128 nodes). Our own cancels and nodes Slurm never gives away are not held for long."""
    from core.pilots import book as book_module
    b = book_with(tmp_path, {"31": "node1", "32": "node2"})
    for job, node in (("31", "node1"), ("32", "node2")):
        assert b.hello(link(job, node)) == "join"
    b.cancelling(["32"])
    before_leave = time.monotonic()
    b.leave(link("31", "node1", leaving=True), "preempted")      # Slurm's SIGTERM
    b.leave(link("32", "node2", leaving=True), "cancelled")      # ours
    idle = {n: SlurmNode(n, "idle", (), ("scavenger",)) for n in ("node1", "node2", "node3")}
    after = time.monotonic()
    assert b.free_nodes(idle, after) == ["node2", "node3"], "the main job's node is not ours to ask for"
    stale = {**idle, "node1": SlurmNode("node1", "allocated", (), ("scavenger",))}
    assert b.free_nodes(stale, before_leave) == ["node2", "node3"], "a read from before the leave shows the pilot"
    ending = {**idle, "node1": SlurmNode("node1", "allocated", ("completing",), ("scavenger",))}
    assert b.free_nodes(ending, after) == ["node2", "node3"], "the pilot's end is not the main job"
    main = {**idle, "node1": SlurmNode("node1", "allocated", (), ("main",))}
    assert b.free_nodes(main, time.monotonic()) == ["node2", "node3"]
    assert b.free_nodes(idle, time.monotonic()) == ["node1", "node2", "node3"], "once the main job was seen, idle is idle"

    b.hello(link("33", "node3"))
    b.leave(link("33", "node3", leaving=True), "preempted")
    assert "node3" not in b.free_nodes(idle, time.monotonic())
    monkeypatch.setattr(book_module, "RECLAIM_HOLD_S", 0.0)
    assert "node3" in b.free_nodes(idle, time.monotonic()), "a main job that never came holds it no longer than the cap"
