"""The controller (core/controller.py) on the simulated dispatcher: leaves are vacated before
anything else, the job limit and queue order, a finished job frees its slot, one solve per batch
of events, cancellation."""
from __future__ import annotations

import pytest

from core.clock import SimClock
from core.controller import Controller
from core.controller_config import ControllerConfig
from core.horizon import MIN_STANDS
from core.dispatchers.simulated import SimulatedDispatcher
from core.model import Event, EventKind, JobState
from tests.support.sim import T0, a_then_b, controller, job


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


def test_auto_horizon_learns_from_how_long_allocations_stand():
    """--tfwd auto: the fallback until MIN_STANDS allocations have changed, then the median
    time they stood (never the future); placement learns from the first fragment that ends; the
    snapshot says what both were learned from."""
    nodes = [f"a01n{i:02d}" for i in range(1, 9)]
    clock = SimClock(T0)
    ctl = Controller(SimulatedDispatcher(), clock, ControllerConfig(tfwd="auto"), None, nodes)
    assert ctl.config.learns_horizon and ctl.horizon.tfwd == 10.0 and not ctl.horizon.learned
    ctl.start(nodes)
    ctl.submit(job("J", hi=8, total=1e9, curve=((1, 2, 4, 8), (100.0, 190.0, 350.0, 650.0))))
    ctl.step()
    assert len(ctl.held["J"]) == 8 and not ctl.horizon.learned and ctl.horizon.fragments == 0
    # J's allocation stands 300, 100, 200, 300, 100 s: each reclaim changes it (nothing to refill)
    for k, t in enumerate((300, 400, 600, 900, 1000)):
        clock.advance_to(T0 + t)
        ctl.step([Event(T0 + t, EventKind.NODE_LEAVE, node=ctl.held["J"][0])])
        h = ctl.horizon
        assert h.fragments == k + 1 and h.stands == k + 1 and h.learned == (k + 1 >= MIN_STANDS)
    assert len(ctl.held["J"]) == 3 and h.standing == 1
    assert 150.0 < h.tfwd < 350.0 and h.jobs == {"J": h.tfwd}      # the median of 100, 100, 200, 300, 300
    assert ctl.snapshot("running", 1).config["horizon"]["stands"] == 5
    with pytest.raises(Exception, match="positive number of seconds or auto"):
        ControllerConfig(tfwd="soon")


@pytest.mark.parametrize("tfwd", ["auto", 10.0])
def test_on_a_calm_machine_the_second_job_does_not_wait_for_the_first_changes(tfwd):
    """Nothing has changed for ten minutes when B arrives, so no stand has ended: BFTrainer's 10 s
    would not repay A's pause and B would wait until something changes. `auto` looks ahead as far
    as A's allocation has already stood, and shares."""
    nodes = [f"a01n{i:02d}" for i in range(1, 17)]
    ctl, clock = controller(nodes, ControllerConfig(tfwd=tfwd))
    concave = ((1, 2, 4, 8, 16), (100.0, 195.0, 370.0, 680.0, 1150.0))
    ctl.submit(job("A", hi=16, total=1e12, curve=concave))
    ctl.step()
    assert len(ctl.held["A"]) == 16
    clock.advance_to(T0 + 600)
    ctl.submit(job("B", hi=16, total=1e12, curve=concave, submit=T0 + 600))
    ctl.step()
    shared = tfwd == "auto"
    assert (len(ctl.held.get("B", [])) > 0) == shared and (len(ctl.held["A"]) < 16) == shared
    if shared:
        assert ctl.horizon.bound and not ctl.horizon.learned and ctl.horizon.tfwd > 500.0


@pytest.mark.parametrize("tfwd", ["auto", 10.0])
def test_a_quiet_machine_is_planned_again_as_the_horizon_grows(tfwd):
    """B arrives 5 s after A took every node: A's allocation vouches for no more than 10 s yet, so
    B waits. Nothing happens after that. `auto` wakes the controller once a horizon has passed
    (`replan_at`) and plans again when the horizon has doubled since the last plan: B gets nodes
    within minutes, not at the next event. A fixed T_fwd never wakes it."""
    nodes = [f"a01n{i:02d}" for i in range(1, 17)]
    ctl, clock = controller(nodes, ControllerConfig(tfwd=tfwd))
    a_then_b(ctl, clock, 5)
    assert len(ctl.held["A"]) == 16 and not ctl.held.get("B")
    if tfwd != "auto":
        assert ctl.replan_at is None and ctl.step() is None
        return
    wakes = 0
    while not ctl.held.get("B"):
        assert ctl.replan_at is not None and ctl.replan_at > clock.now()
        assert ctl.step() is None                      # nothing is due before replan_at
        clock.advance_to(ctl.replan_at)
        assert ctl.step() is not None
        wakes += 1
        assert wakes < 12 and clock.now() < T0 + 3600
    assert len(ctl.held["A"]) < 16 and ctl.horizon.bound and ctl.horizon.tfwd >= 20.0
    assert clock.now() - T0 < 600 and ctl.counters.solves <= 2 + wakes


def test_a_reclaimed_job_is_refilled_for_what_outlasts_its_pause():
    """A reclaim already pauses the job for its scale-down; a refill decided at the same moment
    ends in the same regroup, so it costs only what outlasts that pause (18 - 12 s here) and pays
    off where a refill later, at the full 18 s, does not."""
    nodes = [f"a01n{i:02d}" for i in range(1, 6)]
    clock = SimClock(T0)
    d = SimulatedDispatcher()
    ctl = Controller(d, clock, ControllerConfig(tfwd=30), None, nodes)
    ctl.start(nodes)
    ctl.submit(job("J", hi=4, total=1e9))
    ctl.step()
    assert len(ctl.held["J"]) == 4 and d.lost_samples == 0
    spare = next(n for n in nodes if n not in ctl.held["J"])
    victim = ctl.held["J"][0]
    clock.advance_to(T0 + 100)
    # +80/s over 30 s = 2,400 samples against 6 s x 270/s = 1,620 lost: refill now
    ctl.step([Event(T0 + 100, EventKind.NODE_LEAVE, node=victim)])
    assert sorted(ctl.held["J"]) == sorted(n for n in nodes if n != victim)
    assert spare in ctl.held["J"]
    assert d.lost_samples == pytest.approx(12 * 350 + 6 * 270)
    assert ctl.rescaling_until["J"] == T0 + 100 + 18
    # the same gap opened with no pause under way: 18 s x 270/s = 4,860 > 2,400, so it stays
    clock.advance_to(T0 + 400)
    ctl.step([Event(T0 + 400, EventKind.NODE_LEAVE, node=spare)])
    clock.advance_to(T0 + 500)
    ctl.step([Event(T0 + 500, EventKind.NODE_JOIN, node=victim)])
    assert len(ctl.held["J"]) == 3 and victim not in ctl.held["J"]


def test_a_lost_node_is_no_preemption_and_teaches_the_horizon_nothing():
    """A node lost for a fault of its own (a leave with cause `lost`) leaves its job like any
    leave, but is recorded as `lost`, not counted as a preemption, and not fed to the learned
    horizon (it says nothing about when the owner takes nodes back); the owner's reclaim is
    recorded as `reclaimed` and does teach it."""
    from core.model import LEFT_LOST, LEFT_RECLAIMED
    from core.store import Batch
    nodes = [f"a01n{i:02d}" for i in range(1, 5)]
    clock = SimClock(T0)
    ctl = Controller(SimulatedDispatcher(), clock, ControllerConfig(tfwd="auto"), None, nodes)
    ctl.start(nodes)
    ctl.submit(job("J", hi=4))
    ctl.step()
    first, second = ctl.held["J"][:2]
    seen = []
    ctl._batch, keep = Batch(), ctl._batch
    clock.advance_to(T0 + 60)
    ctl.step([Event(T0 + 60, EventKind.NODE_LEAVE, node=first, job="J", cause=LEFT_LOST,
                    detail="unreachable on a01n01: did not answer")])
    seen += [a["reason"] for a in ctl._batch.allocations]
    assert ctl.horizon_learner.survival.count == 0 and ctl.counters.preemptions == 0
    assert first not in ctl.held["J"] and first not in ctl.idle
    clock.advance_to(T0 + 120)
    ctl.step([Event(T0 + 120, EventKind.NODE_LEAVE, node=second, cause=LEFT_RECLAIMED)])
    seen += [a["reason"] for a in ctl._batch.allocations]
    assert ctl.horizon_learner.survival.count == 1 and ctl.counters.preemptions == 1
    assert seen[:1] == ["lost"] and "reclaimed" in seen, seen
    ctl._batch = keep
