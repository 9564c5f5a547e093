"""Fair shares (issue 49, item 4): decayed use per owner, the factor 2^(-use/share) that weighs an
owner's jobs in the exact solve, the fair-share queue, and the plumbing from the users file, the
job set and the command line. The exact solve itself is checked against enumeration in
tests/test_allocator.py (objective fairshare)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import pytest

from core.clock import SimClock
from core.controller_config import ControllerConfig
from core.dispatchers.simulated import SimulatedDispatcher
from core.fairshare import MIN_FACTOR, DecayedUsage, factors
from core.job_queue import JobQueue
from core.jobsets import load_jobset
from core.errors import InputError
from core.restore import restore
from core.store import Store
from core.workloads import with_owners, write_jobset
from tests.support.procs import ROOT
from tests.support.sim import T0, controller, job

NODES = [f"a01n{i:02d}" for i in range(1, 17)]
H = 3600.0


def owned(jid: str, owner: str, **kw):
    j = job(jid, **kw)
    j.owner = owner
    return j


# ---------------------------------------------------------------- the rules on plain records

def test_use_decays_by_half_each_half_life_whatever_the_order_it_is_told():
    u = DecayedUsage(half_life_s=H)
    u.add("alice", 2, T0, T0 + H)
    full = 2 * H / math.log(2) * 0.5                         # the integral of 2 * 2^-(t/H) over one H
    assert u.value("alice", T0 + H) == pytest.approx(full)
    assert u.value("alice", T0 + 3 * H) == pytest.approx(full / 4)
    assert u.value("bob", T0 + H) == 0.0
    a, b = DecayedUsage(H), DecayedUsage(H)
    a.add("x", 1, T0, T0 + 600)
    a.add("x", 3, T0 + 5000, T0 + 9000)
    b.add("x", 3, T0 + 5000, T0 + 9000)
    b.add("x", 1, T0, T0 + 600)                               # a restart's history comes in any order
    assert a.value("x", T0 + 10_000) == pytest.approx(b.value("x", T0 + 10_000))
    with pytest.raises(ValueError):
        DecayedUsage(0.0)


def test_the_factor_is_two_to_the_minus_use_over_share():
    u = DecayedUsage(H)
    assert factors(u, ["alice", "bob"], {}, T0) == {"alice": 1.0, "bob": 1.0}       # nobody used anything
    u.add("alice", 4, T0, T0 + 600)
    f = factors(u, ["alice", "bob"], {}, T0 + 600)
    assert f["alice"] == pytest.approx(0.25) and f["bob"] == 1.0                     # all the use, half the share
    u.add("bob", 4, T0, T0 + 600)
    f = factors(u, ["alice", "bob"], {}, T0 + 600)
    assert f["alice"] == pytest.approx(0.5) == pytest.approx(f["bob"])                # each exactly at their share
    f = factors(u, ["alice", "bob"], {"alice": 3.0}, T0 + 600)                        # alice's share is 3/4
    assert f["alice"] == pytest.approx(2 ** (-0.5 / 0.75)) and f["bob"] == pytest.approx(2 ** (-0.5 / 0.25))
    u.add("carol", 1000, T0, T0 + 600)                     # carol, not competing now, still used the machine
    f = factors(u, ["alice", "bob"], {}, T0 + 600)
    assert f["alice"] > 0.9 and f["bob"] > 0.9
    assert factors(u, ["carol", "dave"], {"carol": 0.01}, T0 + 600)["carol"] == MIN_FACTOR


def test_the_fair_share_queue_starts_the_owner_who_used_least_then_first_come():
    q = JobQueue(ControllerConfig(max_jobs=1, queue="fairshare"))
    use = {"alice": 10.0, "bob": 0.0, "carol": 10.0}
    q.rank = lambda j: use[j.owner]
    jobs = {j.id: j for j in (owned("A2", "alice", submit=T0 + 1), owned("C", "carol", submit=T0 + 2),
                               owned("B", "bob", submit=T0 + 3))}
    for j in jobs.values():
        q.push(j)
    assert [j.id for j in q.queued(jobs)] == ["B", "A2", "C"]
    assert [j.id for j in q.admit(jobs, [], lambda j: True)] == ["B"]
    assert [j.id for j in q.queued(jobs)] == ["A2", "C"] and q.count == 2
    use["carol"] = 1.0                                     # the order moves with use
    assert [j.id for j in q.admit(jobs, [], lambda j: j.id != "X")] == ["C"]
    fcfs = JobQueue(ControllerConfig(max_jobs=1))
    for j in jobs.values():
        fcfs.push(j)
    assert [j.id for j in fcfs.queued(jobs)] == ["A2", "C", "B"]


# ---------------------------------------------------------------- a real controller

def alice_then_bob(objective: str, queue: str = "fcfs", store=None):
    """Alice's job runs alone on 16 nodes for 2 hours; then bob's, which scales a little worse,
    arrives. Half-life 4 hours."""
    cfg = ControllerConfig(objective=objective, queue=queue, tfwd=1000, max_jobs=4, fair_half_life=4 * H)
    ctl, clock = controller(NODES, cfg, store)
    ctl.submit(owned("A", "alice", hi=16, total=1e13, curve=((1, 16), (110.0, 1760.0))))
    ctl.step()
    clock.advance_to(T0 + 2 * H)
    ctl.step(ctl.dispatcher.poll(clock.now()))
    ctl.submit(owned("B", "bob", hi=16, total=1e13, curve=((1, 16), (100.0, 1600.0)), submit=clock.now()))
    ctl.step(ctl.dispatcher.poll(clock.now()))
    return ctl, clock


def held(ctl, jid: str) -> int:
    return len(ctl.held.get(jid, ()))


def test_throughput_keeps_the_nodes_with_the_better_job():
    ctl, _ = alice_then_bob("throughput")
    assert (held(ctl, "A"), held(ctl, "B")) == (16, 0)
    assert ctl.fair is None


def test_fairshare_gives_the_scarce_nodes_to_the_owner_below_their_share_and_back_as_use_evens_out():
    ctl, clock = alice_then_bob("fairshare")
    assert (held(ctl, "A"), held(ctl, "B")) == (0, 16)          # alice: factor 1/4, bob: 1
    for k in range(1, 25):                                      # bob's use grows, alice's decays
        clock.advance_to(T0 + 2 * H + k * 600)
        ctl.step(ctl.dispatcher.poll(clock.now()), force=True)
        if held(ctl, "A"):
            break
    assert held(ctl, "A") == 16 and held(ctl, "B") == 0, "alice never got the nodes back"
    # she gets them back once her weighted value beats bob's with his shrink paid: F_A * 1760 >
    # F_B * (1600 + 12 s * 1600 / 1000 s), F_A / F_B > 0.92: their uses are nearly even again
    f = factors(ctl.fair.usage, ["alice", "bob"], {}, clock.now())
    assert 0.92 < f["alice"] / f["bob"] < 1.0, f


def test_a_restart_weighs_the_owners_as_before(tmp_path):
    store = Store(tmp_path / "run.db")
    ctl, clock = alice_then_bob("fairshare", store=store)
    clock.advance_to(T0 + 2 * H + 900)
    ctl.step(ctl.dispatcher.poll(clock.now()), force=True)
    before = {o: ctl.fair.usage.value(o, clock.now()) for o in ("alice", "bob")}
    ctl.flush()
    store.close()
    ctl2 = restore(Store(tmp_path / "run.db"), SimulatedDispatcher(), SimClock(clock.now()), ctl.config, NODES)
    after = {o: ctl2.fair.usage.value(o, clock.now()) for o in ("alice", "bob")}
    assert after == pytest.approx(before, rel=1e-6) and before["alice"] > 0 and before["bob"] > 0
    assert ctl2.counters.owner_node_s == pytest.approx(ctl.counters.owner_node_s)


def test_the_fair_share_queue_in_a_controller():
    """One running slot: alice's second job was queued first, bob's later; when alice's first
    ends, bob's starts (fair share) or alice's second (first come)."""
    for queue, first in (("fairshare", "B"), ("fcfs", "A2")):
        cfg = ControllerConfig(queue=queue, tfwd=1000, max_jobs=1)
        ctl, clock = controller(NODES, cfg)
        ctl.submit(owned("A", "alice", hi=16, total=16 * 100.0 * 600, curve=((1, 16), (100.0, 1600.0))))
        ctl.submit(owned("A2", "alice", hi=16, total=1e12, submit=T0 + 1))
        ctl.submit(owned("B", "bob", hi=16, total=1e12, submit=T0 + 2))
        ctl.step()
        for k in range(1, 20):
            clock.advance_to(T0 + k * 60)
            ctl.step(ctl.dispatcher.poll(clock.now()))
            if "A" not in ctl.running:
                break
        assert list(ctl.running) == [first], (queue, list(ctl.running))


# ---------------------------------------------------------------- where owners and shares come from

def test_a_job_set_carries_owners_and_a_bad_one_is_refused_with_its_line(tmp_path):
    jobs = with_owners(load_jobset(ROOT / "data" / "jobs-imagenet-1001.csv")[:50], 4, seed=1)
    path = tmp_path / "owned.csv"
    with path.open("w") as fh:
        write_jobset(jobs, fh)
    back = load_jobset(path)
    assert [j.owner for j in back] == [j.owner for j in jobs] and {j.owner for j in back} <= {"o1", "o2", "o3", "o4"}
    assert sum(j.owner == "o1" for j in back) > sum(j.owner == "o4" for j in back)     # skewed: o1 submits most
    lines = path.read_text().splitlines()
    lines[3] = lines[3].rsplit(",", 1)[0] + ",bad\x07name"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"owned.csv:4: owner: must be printable text"):
        load_jobset(path)


def test_shares_come_from_the_users_file_and_the_users_cli(tmp_path):
    from app.auth import Users
    from werkzeug.security import generate_password_hash
    ph = generate_password_hash("x" * 10)
    doc = {"users": [{"name": "alice", "password_hash": ph, "share": 3},
                     {"name": "bob", "password_hash": ph}]}
    book = Users.parse(json.dumps(doc), "users.json").book
    assert book.shares == {"alice": 3.0} and book.empty           # a share alone sets no quota
    doc["users"][1]["share"] = 0
    with pytest.raises(ValueError, match="users.json: user bob: share: must be a positive number"):
        Users.parse(json.dumps(doc), "users.json")
    path = tmp_path / "users.json"

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "app.users", *args, "--file", str(path), "--password-stdin"],
                              input="a-long-password\n", capture_output=True, text=True, timeout=60)
    assert cli("add", "dave", "--share", "2.5").returncode == 0
    assert [u.get("share") for u in json.loads(path.read_text())["users"]] == [2.5]
    r = cli("add", "erin", "--share", "-1")
    assert r.returncode != 0 and "--share takes a positive number" in r.stderr
    assert [u["name"] for u in json.loads(path.read_text())["users"]] == ["dave"]


def test_the_app_takes_the_objective_and_half_life_and_refuses_bad_ones():
    def app(*args):
        return subprocess.run([sys.executable, "-m", "app", *args, "--print-config"], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
    r = app("--objective", "fairshare", "--queue", "fairshare", "--fair-half-life", "86400")
    assert r.returncode == 0, r.stderr
    assert 'objective = "fairshare"' in r.stdout and "fair_half_life = 86400" in r.stdout
    r = app("--objective", "fairshare", "--fair-half-life", "0")
    assert r.returncode == 2 and "--fair-half-life" in r.stderr and "positive" in r.stderr
    r = app("--objective", "fair")
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_the_server_weighs_owners_and_shows_their_factors(tmp_path):
    """A real server with --objective fairshare: alice's job holds all 8 nodes; bob's arrives
    (scaling a little worse) and takes them, since alice has all the use; /metrics gives both
    factors."""
    from tests.support.server import start_app, write_users
    from tests.support.waiting import wait
    users = write_users(tmp_path / "users.json")
    app = start_app(tmp_path / "app", "--dispatch", "simulated", "--local-nodes", "8", "--tick", "0.1",
                    "--objective", "fairshare", "--fair-half-life", "3600", users=users)
    try:
        def body(name, rate):
            return {"name": name, "min_nodes": 1, "max_nodes": 8, "total_samples": 1e12,
                    "curve": {"nodes": [1, 8], "samples_per_second": [rate, 8 * rate]}}
        status, a = app.request("POST", "/api/jobs", body("a", 11.0), token=app.token("alice"))
        assert status == 201, a
        wait(lambda: app.get(f"/api/jobs/{a['id']}")[1]["nodes"] == 8, 20, "alice's job on all 8 nodes")
        time.sleep(1.0)                                   # alice uses some node-seconds
        status, b = app.request("POST", "/api/jobs", body("b", 10.0), token=app.token("bob"))
        assert status == 201, b
        wait(lambda: app.get(f"/api/jobs/{b['id']}")[1]["nodes"] == 8, 20, "bob's job takes the nodes")
        factors = {line.split('"')[1]: float(line.rsplit(" ", 1)[1])
                   for line in app.get("/metrics")[1].splitlines()
                   if line.startswith("harvest_owner_fair_share_factor{")}
        assert set(factors) == {"alice", "bob"} and factors["alice"] < 0.5 < factors["bob"], factors
    finally:
        app.stop()


def test_a_replay_of_an_owned_job_set_refuses_the_demo_lane_and_leaves_nothing(tmp_path):
    """The demo lane tells registered jobs by their owner; a job set with owners would fill it.
    The refusal comes before anything is written: no store, no demo password file."""
    jobs = tmp_path / "owned.csv"
    with jobs.open("w") as fh:
        write_jobset(with_owners(load_jobset(ROOT / "data" / "jobs-imagenet-1001.csv")[:20], 3), fh)
    run = tmp_path / "run"
    run.mkdir()
    r = subprocess.run([sys.executable, "-m", "app", "--jobs", str(jobs), "--db", str(run / "h.db"), "--port", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--visitor-slots" in r.stderr and "owned.csv gives its jobs owners" in r.stderr, r.stderr
    assert list(run.iterdir()) == []
