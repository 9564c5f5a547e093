"""Quotas (issue 49, item 3): an owner's (and an account's) node cap, and node-hours per UTC day
or week. The allocator side (the caps exact in every solver against exhaustive enumeration) is in
test_allocator.py; here the rules on plain records, the users file, and a real controller (the
simulated dispatcher, a SimClock, a real SQLite store) over many solves, a period quota used up,
a restart, and the roll-over."""
from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from core.clock import SimClock
from core.controller_config import ControllerConfig
from core.dispatchers.simulated import SimulatedDispatcher
from core.explain import why
from core.model import Event, EventKind, JobState
from core.objective import Cap
from core.quotas import Block, Limits, QuotaBook, Tally, block_of, caps_for, period_end, period_start
from core.restore import restore
from core.store import Store
from core.timeutil import parse_iso
from core.usage import Change, JobRecord, report
from tests.support.sim import T0, controller, job

NODES = [f"a01n{i:02d}" for i in range(1, 17)]
H = 3600.0
WED = T0                                    # 2021-02-10 00:00 UTC, a Wednesday
MON = parse_iso("2021-02-08T00:00:00Z")


def owned(jid: str, owner: str, **kw):
    j = job(jid, **kw)
    j.owner = owner
    return j


# ---------------------------------------------------------------- the rules on plain records

def test_periods_are_utc_days_and_weeks_from_monday():
    assert period_start("day", WED + 5 * H) == WED and period_end("day", WED + 5 * H) == WED + 24 * H
    assert period_start("day", WED) == WED and period_start("day", WED - 1) == WED - 24 * H
    assert period_start("week", WED + 5 * H) == MON and period_end("week", WED) == MON + 7 * 24 * H
    assert period_start("week", MON) == MON and period_start("week", MON - 1) == MON - 7 * 24 * H


def test_the_tally_counts_node_seconds_and_rolls_over():
    t = Tally()
    t.add("alice", 4, WED + 23 * H, WED + 25 * H)          # 4 nodes across midnight
    assert t.used("alice", "day", WED + 25 * H) == 4 * H     # only today's hour
    assert t.used("alice", "week", WED + 25 * H) == 8 * H    # the week holds both
    assert t.used("alice", "day", WED + 49 * H) == 0.0       # the next day: nothing yet
    t.add("alice", 1, WED + 10 * H, WED + 11 * H)            # yesterday, seen late: not today's
    assert t.used("alice", "day", WED + 25 * H) == 4 * H
    t.add("", 99, WED, WED + H)                              # no owner (the job set): no tally
    assert t.used("", "day", WED + H) == 0.0


def test_a_block_says_who_how_much_and_until_when():
    b = QuotaBook(users={"alice": Limits(node_hours_per_day=96)})
    t = Tally()
    t.add("alice", 8, WED, WED + 12 * H)
    blk = block_of(b, "alice", t, WED + 12 * H)
    assert blk == Block("alice", 96 * H, 96.0, "day", WED + 24 * H)
    assert blk.line() == "alice has used 96 of 96 node-hours today; nodes again at 2021-02-11 00:00 UTC"
    assert block_of(b, "alice", t, WED + 24 * H) is None       # the next day
    assert block_of(b, "bob", t, WED + 12 * H) is None


def test_an_account_quota_counts_every_owner_of_the_account_and_the_longest_block_wins():
    """bob is blocked by what alice used (her jobs may have ended), the week's block over the day's."""
    b = QuotaBook(users={"alice": Limits(node_hours_per_day=100), "bob": Limits(node_hours_per_day=4)},
                  account_of={"alice": "phys", "bob": "phys", "carol": "other"},
                  accounts={"phys": Limits(node_hours_per_week=10)})
    t = Tally()
    t.add("alice", 2, WED, WED + 2 * H)
    t.add("bob", 4, WED, WED + 1 * H)
    t.add("carol", 8, WED, WED + 1 * H)
    assert block_of(b, "bob", t, WED + 2 * H).who == "bob"         # his day (8 of the account's 10)
    t.add("alice", 2, WED + 2 * H, WED + 3 * H)                    # alice's last job, ended since
    blk = block_of(b, "bob", t, WED + 3 * H)
    assert blk is not None and blk.who == "account phys" and blk.until == MON + 7 * 24 * H
    assert blk.line().startswith("account phys has used 10 of 10 node-hours this week; nodes again at 2021-02-15")


def test_caps_are_per_owner_and_per_account_and_zero_while_blocked():
    b = QuotaBook(users={"alice": Limits(max_nodes=5), "bob": Limits(), "carol": Limits(max_nodes=3)},
                  account_of={"alice": "phys", "bob": "phys"}, accounts={"phys": Limits(max_nodes=7)})
    jobs = [("a1", "alice"), ("b1", "bob"), ("a2", "alice"), ("c1", "carol"), ("x", "")]
    assert caps_for(b, jobs) == [Cap(5, ("a1", "a2"), "alice"), Cap(3, ("c1",), "carol"),
                                 Cap(7, ("a1", "a2", "b1"), "account phys")]
    assert Cap(0, ("c1",), "carol") in caps_for(b, jobs, blocked={"carol"})


def test_the_controller_wakes_when_a_quota_runs_out_and_at_the_roll_over():
    from core.quotas import Quotas
    qb = QuotaBook(users={"alice": Limits(node_hours_per_day=2), "bob": Limits(), "carol": Limits(node_hours_per_day=1)},
                   account_of={"alice": "phys", "bob": "phys"}, accounts={"phys": Limits(node_hours_per_week=3)})
    q = Quotas(lambda: qb)
    q.count({"alice": 4, "carol": 4}, WED, WED + 900)        # alice 1 of 2, carol 1 of 1, phys 1 of 3
    assert q.review(["alice", "bob", "carol"], WED + 900) and set(q.blocked) == {"carol"}
    assert q.wake_at({"alice": 4}, WED + 900) == WED + 900 + 900         # alice's hour left on 4 nodes
    # with bob on 12 nodes too, phys's 2 hours left last 2 * 3600 / 16 s
    assert q.wake_at({"alice": 4, "bob": 12}, WED + 900) == WED + 900 + 450
    assert q.wake_at({}, WED + 900) == WED + 24 * H                      # carol's roll-over
    assert not q.review(["alice", "bob", "carol"], WED + 901)            # nothing changed
    assert q.review(["alice", "bob", "carol"], WED + 24 * H) and not q.blocked


# ---------------------------------------------------------------- the users file

def users_doc(**extra) -> dict:
    from werkzeug.security import generate_password_hash
    ph = generate_password_hash("x" * 10)
    return {"users": [{"name": "alice", "password_hash": ph, "account": "phys", "quota": {"max_nodes": 16}},
                      {"name": "bob", "password_hash": ph, "quota": {"node_hours_per_day": None}},
                      {"name": "carol", "password_hash": ph}], **extra}


def test_the_users_file_gives_quotas_with_site_defaults():
    from app.auth import Users
    doc = users_doc(quota_defaults={"user": {"max_nodes": 8, "node_hours_per_day": 96},
                                    "account": {"node_hours_per_week": 500}},
                    accounts={"phys": {"max_nodes": 40}})
    qb = Users.parse(json.dumps(doc), "users.json").book
    assert qb.owner("alice") == Limits(16, 96.0, None)        # own cap, the default day quota
    assert qb.owner("bob") == Limits(8, None, None)           # null: no day quota, over the default
    assert qb.owner("carol") == Limits(8, 96.0, None)         # all defaults
    assert qb.owner("gone") == Limits(8, 96.0, None)          # a user no longer listed: the defaults
    assert qb.owner("") == Limits()                           # the job set: no quota
    assert qb.account("phys") == Limits(40, None, 500.0) and qb.account_of["alice"] == "phys"
    assert Users.parse(json.dumps(users_doc()), "u").book.owner("carol") == Limits()


@pytest.mark.parametrize("change,words", [
    ({"quota_defaults": {"user": {"max_nodes": -1}}}, "quota_defaults.user: max_nodes must be a whole number"),
    ({"quota_defaults": {"users": {}}}, "quota_defaults: expected"),
    ({"accounts": {"phys": {"node_hours_per_day": "lots"}}}, "accounts.phys: node_hours_per_day must be a number"),
    ({"accounts": {"phys": {"max_gpus": 3}}}, "unknown field 'max_gpus'"),
])
def test_bad_quota_fields_are_refused_with_the_place(change, words):
    from app.auth import Users
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        Users.parse(json.dumps(users_doc(**change)), "users.json")


def test_users_cli_sets_a_quota_and_keeps_the_site_defaults(tmp_path):
    path = tmp_path / "users.json"
    path.write_text(json.dumps(users_doc(quota_defaults={"user": {"max_nodes": 8}})))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "app.users", *args, "--file", str(path), "--password-stdin"],
                              input="a-long-password\n", capture_output=True, text=True, timeout=60)
    r = cli("add", "dave", "--max-nodes", "4", "--node-hours-per-week", "200")
    assert r.returncode == 0, r.stderr
    doc = json.loads(path.read_text())
    assert doc["quota_defaults"] == {"user": {"max_nodes": 8}}
    assert [u["quota"] for u in doc["users"] if u["name"] == "dave"] == [{"max_nodes": 4, "node_hours_per_week": 200.0}]
    assert cli("passwd", "alice").returncode == 0
    assert json.loads(path.read_text())["quota_defaults"] == {"user": {"max_nodes": 8}}


# ---------------------------------------------------------------- a real controller: the node cap

@pytest.mark.parametrize("solver", ["dp", "highs", "cbc"])
def test_an_owner_at_the_node_cap_never_gets_more_in_any_solve(solver, tmp_path):
    """Alice (cap 5, account phys capped at 9 with bob) and carol (no cap) register jobs that
    would each take 8 nodes, while nodes leave and come back and jobs end and arrive; after every
    step alice holds at most 5, phys at most 9, and the caps are used (they bind: alice holds 5
    whenever her jobs could use more: her jobs are worth twice as much a node)."""
    qb = QuotaBook(users={"alice": Limits(max_nodes=5), "bob": Limits(), "carol": Limits()},
                   account_of={"alice": "phys", "bob": "phys"}, accounts={"phys": Limits(max_nodes=9)})
    store = Store(tmp_path / "run.db")
    ctl, clock = controller(NODES, ControllerConfig(max_jobs=6, tfwd=1000, solver=solver), store)
    ctl.quota.source = lambda: qb
    rng = random.Random(7)
    linear, fast = ((1, 8), (100.0, 800.0)), ((1, 8), (200.0, 1600.0))
    for k in range(3):
        ctl.submit(owned(f"alice{k}", "alice", hi=8, total=1e12, curve=fast))
    ctl.submit(owned("bob0", "bob", hi=8, total=1e12, curve=linear))
    ctl.submit(owned("carol0", "carol", hi=8, total=1e12, curve=linear))
    solves_at_cap = 0
    idle = set(NODES)
    for t in range(1, 80):
        clock.advance_to(T0 + 60 * t)
        events = []
        for n in rng.sample(NODES, 3):
            kind = EventKind.NODE_LEAVE if n in idle else EventKind.NODE_JOIN
            (idle.discard if kind is EventKind.NODE_LEAVE else idle.add)(n)
            events.append(Event(clock.now(), kind, node=n))
        if t % 20 == 0:
            ctl.submit(owned(f"alice-late{t}", "alice", hi=8, total=1e12, curve=fast, submit=clock.now()))
        ctl.step(events)
        held = ctl._held_by_owner()
        assert held.get("alice", 0) <= 5 and held.get("alice", 0) + held.get("bob", 0) <= 9, (t, held)
        if ctl.last_plan is not None:
            sizes = ctl.last_plan.sizes
            assert sum(n for j, n in sizes.items() if ctl.jobs[j].owner == "alice") <= 5
        solves_at_cap += held.get("alice", 0) == 5
    assert solves_at_cap >= 70, solves_at_cap
    ctl.flush()
    snap = ctl.snapshot("running", 1)
    info = next(j for j in snap.jobs if j["owner"] == "alice" and j["state"] == "running")
    assert info["node_cap"] == "alice's jobs may hold at most 5 nodes at once (the node cap)"
    line = why(ctl.jobs[info["id"]], info["nodes"], len(ctl.idle), len(ctl.owner), len(ctl.running), 6, 1000.0,
               node_cap=info["node_cap"])
    assert line.endswith("alice's jobs may hold at most 5 nodes at once (the node cap)")


# ---------------------------------------------------------------- a real controller: period quotas

def quota_run(tmp_path, max_jobs=4):
    """Alice may use 2 node-hours a day; at 22:00 UTC she and bob each register a job that would
    take 8 of the 16 nodes."""
    qb = QuotaBook(users={"alice": Limits(node_hours_per_day=2.0)})
    store = Store(tmp_path / "run.db")
    ctl, clock = controller(NODES, ControllerConfig(max_jobs=max_jobs, tfwd=1000), store, t=WED + 22 * H)
    ctl.quota.source = lambda: qb
    linear = ((1, 8), (100.0, 800.0))
    ctl.submit(owned("A", "alice", hi=8, total=1e12, curve=linear, submit=clock.now()))
    ctl.submit(owned("B", "bob", hi=8, total=1e12, curve=linear, submit=clock.now()))
    ctl.step()
    return ctl, clock, store, qb


def line_of(ctl, jid):
    snap = ctl.snapshot("running", 1)
    info = snap.job(jid)
    return why(ctl.jobs[jid], info["nodes"], len(ctl.idle), len(ctl.owner), len(ctl.running),
               ctl.config.max_jobs, 1000.0, quota=info.get("quota"))


def test_at_the_period_quota_the_jobs_wait_with_the_reason_and_resume_at_the_roll_over(tmp_path):
    ctl, clock, store, qb = quota_run(tmp_path)
    assert len(ctl.held["A"]) == 8 and len(ctl.held["B"]) == 8
    # 2 node-hours on 8 nodes last 15 minutes: the controller wakes itself then, with no event
    assert ctl.replan_at == pytest.approx(WED + 22 * H + 900)
    clock.advance_to(ctl.replan_at)
    assert ctl.replan_due(clock.now()) and ctl.step() is not None
    assert ctl.held.get("A", []) == [] and len(ctl.held["B"]) == 8
    line = line_of(ctl, "A")
    assert line.startswith("waiting: alice has used 2 of 2 node-hours today; nodes again at 2021-02-11 00:00 UTC"), line
    # alice registers another job: it stays queued, and says why
    ctl.submit(owned("A2", "alice", hi=8, total=1e12, submit=clock.now()))
    clock.advance_to(WED + 23 * H)
    ctl.step([Event(clock.now(), EventKind.NODE_LEAVE, node=NODES[0]),
              Event(clock.now(), EventKind.NODE_JOIN, node=NODES[0])])
    assert ctl.jobs["A2"].state is JobState.QUEUED and ctl.held.get("A", []) == []
    assert line_of(ctl, "A2") == "queued: alice has used 2 of 2 node-hours today; nodes again at 2021-02-11 00:00 UTC"
    assert ctl.node_demand()[0] == 8                      # a source holding nodes at a cost holds none for alice
    assert ctl.replan_at == WED + 24 * H                  # the roll-over wakes it
    clock.advance_to(ctl.replan_at)
    ctl.step()
    assert len(ctl.held["A"]) > 0 and ctl.jobs["A2"].state is JobState.RUNNING, ctl.held
    assert ctl.snapshot("running", 2).job("A").get("quota") is None
    # what the store says happened agrees: alice used exactly her 2 node-hours on the 10th
    ctl.flush()
    rows = store.db.execute("select time, job, added, removed from allocations order by id").fetchall()
    rep = report([Change(t, j, tuple(json.loads(a or "[]")), tuple(json.loads(r or "[]"))) for t, j, a, r in rows],
                 [], [JobRecord("A", "", "alice", 0.0), JobRecord("A2", "", "alice", 0.0),
                      JobRecord("B", "", "bob", 0.0)], [], WED, WED + 24 * H, WED + 24 * H)
    assert {r.key: r.totals.node_seconds for r in rep.rows}["alice"] == pytest.approx(2 * H)


def test_a_blocked_owners_running_job_gives_its_slot_to_one_that_can_start(tmp_path):
    ctl, clock, store, qb = quota_run(tmp_path, max_jobs=2)
    ctl.submit(owned("C", "carol", hi=8, total=1e12, submit=clock.now()))
    ctl.step()
    assert ctl.jobs["C"].state is JobState.QUEUED                  # two slots, both taken
    clock.advance_to(ctl.replan_at)
    ctl.step()
    assert ctl.jobs["A"].state is JobState.QUEUED and ctl.jobs["C"].state is JobState.RUNNING
    assert len(ctl.held["C"]) == 4          # its curve gains nothing past 4
    ctl.flush()
    detail = store.db.execute("select detail from events where kind = 'job_requeue' and job = 'A'").fetchone()[0]
    assert detail.startswith("back to the queue: alice has used 2 of 2 node-hours today")


def test_a_restart_keeps_what_the_owner_used(tmp_path):
    """The tally is rebuilt from the store's allocation history: restarted while blocked, alice
    stays blocked until the roll-over."""
    ctl, clock, store, qb = quota_run(tmp_path)
    clock.advance_to(WED + 22 * H + 600)                     # 10 minutes on 8 nodes: 1.33 node-hours
    ctl.flush()
    store.close()
    store = Store(tmp_path / "run.db")
    clock2 = SimClock(WED + 22 * H + 900)
    ctl2 = restore(store, SimulatedDispatcher(), clock2, ControllerConfig(max_jobs=4, tfwd=1000), NODES)
    ctl2.quota.source = lambda: qb
    assert ctl2.quota.tally.used("alice", "day", clock2.now()) == pytest.approx(8 * 600)
    ctl2.step(force=True)
    # the down time is not counted: alice still has 0.67 node-hours, 5 minutes on 8 nodes
    assert len(ctl2.held["A"]) == 8 and ctl2.replan_at == pytest.approx(clock2.now() + 300)
    clock2.advance_to(ctl2.replan_at)
    ctl2.step()
    assert ctl2.held.get("A", []) == [] and "alice has used 2 of 2" in ctl2.quota.reason("alice")
    ctl2.flush()
    store.close()
    clock3 = SimClock(WED + 23 * H)
    ctl3 = restore(Store(tmp_path / "run.db"), SimulatedDispatcher(), clock3, ControllerConfig(max_jobs=4, tfwd=1000),
                   NODES)
    ctl3.quota.source = lambda: qb
    ctl3.step(force=True)
    assert ctl3.held.get("A", []) == [] and ctl3.quota.reason("alice") is not None
    clock3.advance_to(WED + 24 * H)
    ctl3.step(force=True)
    assert len(ctl3.held["A"]) > 0


def test_no_quota_source_changes_nothing():
    """Without a users file (a replay) the controller plans as before and never wakes for quotas."""
    ctl, clock = controller(NODES, ControllerConfig(max_jobs=4, tfwd=1000))
    ctl.submit(owned("A", "alice", hi=8, total=1e12))
    ctl.step()
    assert len(ctl.held["A"]) == 4 and not ctl.quota.on and ctl.replan_at is None
    assert "quota" not in ctl.snapshot("running", 1).job("A")


# ---------------------------------------------------------------- the real server, from the users file

def test_the_server_takes_the_quotas_from_the_users_file_and_rereads_them(tmp_path):
    """alice capped at 2 nodes, bob with 0 node-hours a day: alice's job holds 2 of the 8 nodes
    and says why, bob's waits in the queue with the reason; the file changed (bob given 100), bob's
    job runs within a few ticks, without a restart."""
    from tests.support.server import start_app, write_users
    from tests.support.waiting import wait
    users = write_users(tmp_path / "users.json")
    doc = json.loads(users.read_text())
    doc["quota_defaults"] = {"user": {"node_hours_per_day": 1000}}
    for row in doc["users"]:
        row["quota"] = {"alice": {"max_nodes": 2}, "bob": {"node_hours_per_day": 0}}.get(row["name"], {})
    users.write_text(json.dumps(doc))
    app = start_app(tmp_path / "app", "--dispatch", "simulated", "--local-nodes", "8", "--tick", "0.1",
                    "--metrics-interval", "0", users=users)       # /metrics read twice within seconds
    try:
        body = {"min_nodes": 1, "max_nodes": 8, "total_samples": 1e12,
                "curve": {"nodes": [1, 8], "samples_per_second": [10.0, 80.0]}}
        status, a = app.request("POST", "/api/jobs", {**body, "name": "a"}, token=app.token("alice"))
        assert status == 201, a
        status, b = app.request("POST", "/api/jobs", {**body, "name": "b"}, token=app.token("bob"))
        assert status == 201, b
        wait(lambda: app.get(f"/api/jobs/{a['id']}")[1]["nodes"] == 2, 20, "alice's job on 2 nodes")
        got = app.get(f"/api/jobs/{a['id']}")[1]
        assert got["why"] == "holds 2 nodes: alice's jobs may hold at most 2 nodes at once (the node cap)", got["why"]
        # bob's job may be read before the step that weighs it against his quota (it came second)
        got = wait(lambda: (lambda j: j if j["why"].startswith("queued: bob has used") else None)(
            app.get(f"/api/jobs/{b['id']}")[1]), 10, "bob's job queued for his quota")
        assert got["state"] == "queued" and got["why"].startswith("queued: bob has used 0 of 0 node-hours today"), got
        text = app.get("/metrics")[1]
        for line in ('harvest_owner_nodes{owner="alice"} 2.0', 'harvest_owner_quota_max_nodes{owner="alice"} 2.0',
                     'harvest_owner_quota_blocked{owner="alice"} 0.0', 'harvest_owner_quota_blocked{owner="bob"} 1.0',
                     'harvest_owner_quota_node_hours{owner="bob",period="day"} 0.0',
                     'harvest_owner_quota_node_hours{owner="alice",period="day"} 1000.0',
                     'harvest_owner_quota_used_node_hours{owner="bob",period="week"} 0.0'):
            assert line in text.splitlines(), (line, [t for t in text.splitlines() if "quota" in t])
        assert 'harvest_owner_quota_max_nodes{owner="bob"}' not in text
        for row in doc["users"]:
            if row["name"] == "bob":
                row["quota"] = {"node_hours_per_day": 100}
        users.write_text(json.dumps(doc))
        wait(lambda: (app.get(f"/api/jobs/{b['id']}")[1]["nodes"] or 0) > 0, 30, "bob's job runs once allowed")
        assert 'harvest_owner_quota_blocked{owner="bob"} 0.0' in app.get("/metrics")[1].splitlines()
        assert app.get(f"/api/jobs/{a['id']}")[1]["nodes"] == 2
    finally:
        app.stop()
