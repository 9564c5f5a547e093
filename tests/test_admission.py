"""Admission that cannot be jammed (issue 17, item 4): a job that can never fit is refused, a job
that cannot start now holds no running slot while others could run, and one user cannot fill the
queue. Real controller with the MILP allocator; the API test runs the real server."""
from __future__ import annotations

import pytest

from core.admission import Slot, can_start, over_quota, stuck, too_big
from core.controller_config import ControllerConfig
from core.model import Event, EventKind, JobState
from tests.support.server import start_app
from tests.support.sim import T0, controller, job
from tests.support.waiting import wait

NODES = [f"a01n{i:02d}" for i in range(1, 9)]


def test_the_rules_on_plain_numbers():
    assert too_big(8, 8) is None and "more than the 8 node(s)" in too_big(9, 8)
    assert over_quota(2, 3, staff=False) is None and "(3)" in over_quota(3, 3, staff=False)
    assert over_quota(99, 3, staff=True) is None and over_quota(99, 0, staff=False) is None
    assert can_start(4, 4) and not can_start(5, 4)
    assert stuck([Slot("a", 5, 0), Slot("b", 5, 2), Slot("c", 1, 0)], idle=4) == ["a"]


def test_jobs_that_cannot_start_now_do_not_take_the_slots_of_one_that_can():
    """Ten jobs needing the whole machine, while only half of it is idle, ahead of a normal one
    with max_jobs 10: the normal job runs at once on the idle nodes."""
    ctl, clock = controller(NODES, ControllerConfig(max_jobs=10, tfwd=1000))
    for n in NODES[4:]:
        ctl.step([Event(T0, EventKind.NODE_LEAVE, node=n)])
    for k in range(10):
        ctl.submit(job(f"big{k}", lo=8, hi=8, submit=T0 + k))
    ctl.submit(job("small", lo=1, hi=4, submit=T0 + 20))
    clock.advance_to(T0 + 30)
    ctl.step()
    assert list(ctl.running) == ["small"] and len(ctl.held["small"]) == 4
    assert ctl.n_queued == 10 and all(ctl.jobs[f"big{k}"].state is JobState.QUEUED for k in range(10))
    assert ctl.jobs["big0"].start_time is None

    clock.advance_to(T0 + 60)                 # the whole machine idle: the first big job, in order
    ctl.step([Event(T0 + 60, EventKind.NODE_JOIN, node=n) for n in NODES[4:]])
    assert set(ctl.running) == {"small", *(f"big{k}" for k in range(9))}, "slots go in queue order"


def test_a_running_job_left_with_no_node_gives_its_slot_to_one_that_can_start():
    ctl, clock = controller(NODES, ControllerConfig(max_jobs=1, tfwd=1000))
    ctl.submit(job("big", lo=8, hi=8, total=1e9))
    ctl.step()
    assert list(ctl.running) == ["big"] and len(ctl.held["big"]) == 8
    clock.advance_to(T0 + 100)
    ctl.step([Event(T0 + 100, EventKind.NODE_LEAVE, node=n) for n in NODES[:3]])
    assert ctl.held["big"] == [] and list(ctl.running) == ["big"]     # nobody waits: it keeps its slot
    done = ctl.dispatcher.progress(ctl.jobs["big"], clock.now())
    ctl.submit(job("small", lo=1, hi=4, submit=T0 + 100))
    clock.advance_to(T0 + 110)
    ctl.step()
    assert list(ctl.running) == ["small"] and len(ctl.held["small"]) == 4
    big = ctl.jobs["big"]
    assert big.state is JobState.QUEUED and big.samples_done >= done > 0 and big.start_time is not None
    clock.advance_to(T0 + 200)                 # the machine back: small ends, big runs again
    ctl.cancel("small")
    ctl.step([Event(T0 + 200, EventKind.NODE_JOIN, node=n) for n in NODES[:3]])
    assert list(ctl.running) == ["big"] and len(ctl.held["big"]) == 8
    assert ctl.jobs["big"].samples_done >= done


def test_the_requeue_is_in_the_event_log(tmp_path):
    from core.store import Store
    store = Store(tmp_path / "run.db")
    ctl, clock = controller(NODES, ControllerConfig(max_jobs=1, tfwd=1000), store)
    ctl.submit(job("big", lo=8, hi=8, total=1e9))
    ctl.step()
    ctl.step([Event(T0, EventKind.NODE_LEAVE, node=NODES[0])])
    ctl.submit(job("small", lo=1, hi=2))
    ctl.step()
    ctl.flush()
    rows = list(store.db.execute("select kind, job, detail from events where kind = 'job_requeue'"))
    assert rows == [("job_requeue", "big", "back to the queue: needs 8 node(s), 7 idle")]


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    a = start_app(tmp_path_factory.mktemp("admission"), "--dispatch", "simulated", "--local-nodes", "8",
                  "--tick", "0.1", "--user-max-jobs", "3")
    yield a
    a.stop()


def spec(name: str, lo: int = 1, hi: int = 2, total: float = 1e12) -> dict:
    return {"name": name, "min_nodes": lo, "max_nodes": hi, "total_samples": total,
            "curve": {"nodes": [1, 2], "samples_per_second": [10.0, 19.0]}}


def test_ten_jobs_above_the_cluster_are_refused_and_a_normal_job_runs(app):
    staff = app.token("staff1")
    for k in range(10):
        status, body = app.request("POST", "/api/jobs", spec(f"huge{k}", lo=100_000, hi=100_000), token=staff)
        assert status == 422, body
        assert body["errors"]["min_nodes"].startswith("100000 is more than the 8 node(s) this harvester can ever")
    status, body = app.request("POST", "/api/jobs", spec("normal"), token=staff)
    assert status == 201, body
    wait(lambda: (app.get(f"/api/jobs/{body['id']}")[1]["nodes"] or 0) > 0, 20, "the normal job gets nodes")
    assert app.get("/api/jobs?state=queued")[1]["count"] == 0
    app.request("DELETE", f"/api/jobs/{body['id']}", token=staff)


def test_a_user_may_have_at_most_user_max_jobs_and_staff_are_exempt(app):
    alice, staff = app.token("alice"), app.token("staff1")
    ids = []
    for k in range(3):
        status, body = app.request("POST", "/api/jobs", spec(f"a{k}"), token=alice)
        assert status == 201, body
        ids.append(body["id"])
    status, body = app.request("POST", "/api/jobs", spec("a3"), token=alice)
    assert status == 422 and "the most one user may have (3)" in body["errors"]["job"], body
    assert app.request("POST", "/api/jobs", spec("bob's"), token=app.token("bob"))[0] == 201
    for k in range(4):
        assert app.request("POST", "/api/jobs", spec(f"s{k}"), token=staff)[0] == 201
    assert app.request("DELETE", f"/api/jobs/{ids[0]}", token=alice)[0] == 200
    assert app.request("POST", "/api/jobs", spec("a4"), token=alice)[0] == 201, "an ended job frees a place"


def _visitor(jid: str, submit: float, curve=((1, 2, 4), (10.0, 19.0, 35.0))):
    """A job registered by a person (it has an owner), with a curve far worse than the job set's."""
    j = job(jid, lo=1, hi=2, total=1e9, curve=curve, submit=submit)
    j.owner = "alice"
    return j


def test_the_demo_lane_runs_visitors_past_a_full_queue_without_taking_the_job_sets_slots():
    """max_jobs 2 taken by the job set with more queued, visitor_slots 1: the first visitor runs
    at once, on nodes, although its curve is the worst; the second waits for the lane; when a job
    set's job ends, its slot goes to the visitor first in the queue (visitors go first) and the
    job set keeps its two slots otherwise."""
    ctl, clock = controller(NODES, ControllerConfig(max_jobs=2, tfwd=1000, visitor_slots=1))
    for k in range(4):
        ctl.submit(job(f"set{k}", lo=1, hi=8, total=1e12, submit=T0 + k))
    clock.advance_to(T0 + 10)
    ctl.step()
    assert set(ctl.running) == {"set0", "set1"} and ctl.n_queued == 2
    ctl.submit(_visitor("v1", T0 + 20))
    ctl.submit(_visitor("v2", T0 + 21))
    clock.advance_to(T0 + 30)
    ctl.step()
    assert set(ctl.running) == {"set0", "set1", "v1"}, "the lane's slot is the visitor's"
    assert len(ctl.held["v1"]) >= 1, "a visitor's job gets at least its minimum"
    assert ctl.queue.free_slots(False, ctl._running_jobs()) == 0 and ctl.queue.free_slots(True, ctl._running_jobs()) == 0

    clock.advance_to(T0 + 40)
    ctl.step([Event(T0 + 40, EventKind.JOB_CANCEL, job="set0")])
    assert set(ctl.running) == {"set1", "v1", "v2"}, "visitors are first in the queue"
    clock.advance_to(T0 + 50)
    ctl.step([Event(T0 + 50, EventKind.JOB_CANCEL, job="v1")])
    assert set(ctl.running) == {"set1", "v2", "set2"}, "v2 now counts in the lane: the job set has 2 slots again"


def test_without_the_lane_a_visitor_waits_its_turn():
    ctl, clock = controller(NODES, ControllerConfig(max_jobs=2, tfwd=1000))
    for k in range(3):
        ctl.submit(job(f"set{k}", lo=1, hi=8, total=1e12, submit=T0 + k))
    ctl.submit(_visitor("v1", T0 + 20))
    clock.advance_to(T0 + 30)
    ctl.step()
    assert set(ctl.running) == {"set0", "set1"} and ctl.jobs["v1"].state is JobState.QUEUED


ZERO = ((1, 4), (0.0, 0.0))


def test_a_job_with_zero_throughput_takes_no_running_slot_on_no_node():
    """Issue 57: a job whose throughput is 0 at every size it may have was admitted (its minimum
    fits the idle nodes), got 0 nodes from the allocator and kept its running slot for ever, with
    the job behind it queued. It waits in the queue instead; a running job whose curve falls to
    0 everywhere goes back to the queue, keeping its place."""
    ctl, clock = controller(NODES, ControllerConfig(max_jobs=1, tfwd=1000))
    ctl.submit(job("Z", curve=ZERO, submit=T0))
    ctl.submit(job("A", submit=T0 + 1))
    clock.advance_to(T0 + 10)
    ctl.step()
    assert list(ctl.running) == ["A"] and len(ctl.held["A"]) == 4, (list(ctl.running), ctl.held)
    assert ctl.jobs["Z"].state is JobState.QUEUED and ctl.n_queued == 1
    ctl.jobs["A"].curve = job("x", curve=ZERO).curve        # what the allocator believes of A now
    clock.advance_to(T0 + 20)
    ctl.step(force=True)
    assert not ctl.running and not ctl.owner and ctl.n_queued == 2
    assert ctl.jobs["A"].state is JobState.QUEUED and ctl.jobs["A"].start_time is not None
    snap = ctl.snapshot("running", 0)
    assert snap.kpis["running"] == 0 and snap.kpis["queued"] == 2
