"""Which end of a cohort the main scheduler takes first (core/reclaim_order.py), learned from
partial reclaims, and placement filling jobs from the other end; on a real controller and store."""
from __future__ import annotations

import pytest

from core.clock import SimClock
from core.controller import Controller
from core.controller_config import ControllerConfig
from core.dispatchers.simulated import SimulatedDispatcher
from core.model import Event, EventKind, node_order
from core.objective import JobRequest
from core.placement import place
from core.reclaim_order import MIN_OBSERVED, ReclaimOrder
from core.restore import restore
from core.store import Store
from tests.support.sim import T0, job


def test_node_order_compares_numbers_as_numbers():
    names = ["n10", "b01n01", "n2", "a02n10", "a02n07", "n1", "a10n01"]
    assert sorted(names, key=node_order) == ["a02n07", "a02n10", "a10n01", "b01n01", "n1", "n2", "n10"]


def test_a_partial_reclaim_is_one_observation_of_where_it_took():
    order = ReclaimOrder()
    cohort = {f"n{i}": 100.0 for i in range(1, 11)}            # n1 .. n10, freed together
    gone = {"n1": 100.0, "n2": 100.0}
    idle = {n: s for n, s in cohort.items() if n not in gone}
    idle["m1"] = 50.0                                           # another cohort, untouched
    order.taken(gone, idle)
    assert order.count == 1 and order.mean == pytest.approx((0 + 1) / 2 / 9)
    order.taken({"n10": 100.0}, {n: s for n, s in idle.items() if n != "n10"} | {"n3": 100.0})
    assert order.count == 2 and order.mean == pytest.approx((1 / 18 + 1.0) / 2)   # n10 is the last, not the 2nd
    order.taken({"m1": 50.0}, {"n3": 100.0})                    # a whole cohort says nothing about order
    order.taken({"x": 7.0}, {})
    assert order.count == 2


def test_the_direction_needs_enough_observations_off_the_middle():
    first = ReclaimOrder()
    for k in range(MIN_OBSERVED - 1):
        first.observe(0.1 + 0.02 * (k % 3))
    assert first.direction == 0                                  # too few to say
    first.observe(0.2)
    assert first.direction == 1
    last = ReclaimOrder()
    for k in range(MIN_OBSERVED):
        last.observe(0.9 - 0.05 * (k % 2))
    assert last.direction == -1
    none = ReclaimOrder()
    for k in range(200):
        none.observe((k * 37 % 101) / 100)                       # spread over [0, 1]: no preference
    assert none.direction == 0 and 0.4 < none.mean < 0.6
    with pytest.raises(ValueError):
        none.observe(1.5)


def test_state_round_trips_and_nonsense_is_refused():
    a = ReclaimOrder()
    for p in (0.1, 0.3, 0.25, 0.0, 1.0):
        a.observe(p)
    b = ReclaimOrder()
    b.load(a.state())
    assert b.state() == a.state() and b.mean == a.mean and b.to_dict() == a.to_dict()
    for bad in ({"count": 2, "total": 3.0, "squares": 1.0}, {"count": -1, "total": 0.0, "squares": 0.0},
                {"count": 2, "total": 1.0, "squares": 0.1}):
        with pytest.raises(ValueError, match="does not add up"):
            ReclaimOrder().load(bad)
    assert ReclaimOrder().to_dict() == {"direction": 0, "reclaims": 0, "mean_position": None}


def _request(jid: str, nodes=()) -> JobRequest:
    j = job(jid, hi=16)
    return JobRequest(jid, j.min_nodes, j.max_nodes, j.curve, 18.0, 12.0, tuple(nodes))


def test_placement_fills_from_the_end_the_scheduler_takes_last():
    nodes = [f"a01n{i:02d}" for i in range(1, 9)]
    since = {n: 100.0 for n in nodes}
    for order, want in ((0, nodes[:3]), (-1, nodes[:3]), (1, nodes[-3:])):
        got = place([_request("J")], [3], nodes, None, since, order)["J"]
        assert sorted(got, key=node_order) == want, order
    # a growing job keeps its own nodes of a cohort and adds the free ones from the far end
    got = place([_request("J", nodes[:2])], [3], nodes, None, since, 1)["J"]
    assert sorted(got, key=node_order) == [*nodes[:2], nodes[-1]]
    # racks (no cohorts known) follow the same order
    got = place([_request("J")], [2], nodes, None, None, 1)["J"]
    assert sorted(got, key=node_order) == nodes[-2:]


def test_a_controller_learns_the_order_and_it_survives_a_restart(tmp_path):
    """Batch jobs take each cohort's first nodes: once that is known, a job placed on a fresh
    cohort gets its last nodes, the first ones stay free for the next reclaim; the learned order
    is in the snapshot and comes back from the store after a restart."""
    db = tmp_path / "run.db"
    nodes = [f"c{c:02d}n{i:02d}" for c in range(1, 2 * MIN_OBSERVED + 2) for i in range(1, 5)]
    clock = SimClock(T0)
    store = Store(db)
    ctl = Controller(SimulatedDispatcher(), clock, ControllerConfig(tfwd=60), store, nodes)
    ctl.start([])
    ctl.submit(job("J", hi=2, total=1e12))
    t = T0
    for c in range(1, MIN_OBSERVED + 1):          # a cohort of 4 joins; the scheduler takes 2 of it back
        cohort = [f"c{c:02d}n{i:02d}" for i in range(1, 5)]
        t += 600
        clock.advance_to(t)
        ctl.step([Event(t, EventKind.NODE_JOIN, node=n) for n in cohort])
        t += 600
        clock.advance_to(t)
        older = [n for n in ctl.idle if n not in cohort]            # the rest of the last cohort, whole
        ctl.step([Event(t, EventKind.NODE_LEAVE, node=n) for n in (*cohort[:2], *older)])
    assert ctl.reclaim_order.count == MIN_OBSERVED and ctl.reclaim_order.direction == 1
    assert ctl.snapshot("running", 1).config["reclaim_order"] == {
        "direction": 1, "reclaims": MIN_OBSERVED, "mean_position": pytest.approx(1 / 6, abs=1e-3)}
    fresh = [f"c{MIN_OBSERVED + 1:02d}n{i:02d}" for i in range(1, 5)]
    t += 600
    clock.advance_to(t)
    ctl.step([Event(t, EventKind.NODE_LEAVE, node=n) for n in list(ctl.idle)]
             + [Event(t, EventKind.NODE_JOIN, node=n) for n in fresh])
    assert sorted(ctl.held["J"], key=node_order) == fresh[2:]      # the end the scheduler takes last
    ctl.flush()
    store.close()
    ctl2 = restore(Store(db), SimulatedDispatcher(), SimClock(t), node_names=nodes)
    assert ctl2.reclaim_order.state() == ctl.reclaim_order.state() and ctl2.reclaim_order.direction == 1
