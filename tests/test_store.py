"""The SQLite store (core/store.py), a real file in WAL mode, from which a controller is restored."""
from __future__ import annotations

import sqlite3

import pytest

from core.clock import SimClock
from core.controller_config import ControllerConfig
from core.dispatchers.simulated import SimulatedDispatcher
from core.model import Event, EventKind
from core.restore import restore
from core.store import Store
from tests.support.sim import T0, a_then_b, controller, job


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
    ctl2 = restore(store2, SimulatedDispatcher(), clock2, node_names=nodes)
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


def test_restore_takes_up_the_horizon_learner(tmp_path):
    """tfwd auto: the idle fragments and allocation stands seen before a restart are learned from
    after it (the allocations standing at the restart start their stands again), and the
    restored controller decides the same horizon as the one that was stopped."""
    db = tmp_path / "run.db"
    store = Store(db)
    nodes = [f"a01n{i:02d}" for i in range(1, 9)]
    ctl, clock = controller(nodes, ControllerConfig(max_jobs=2, tfwd="auto"), store)
    ctl.submit(job("A", total=1e9))
    ctl.step()
    for k, t in enumerate((200, 450, 900, 1000, 1300, 1700)):
        clock.advance_to(T0 + t)
        ctl.step([Event(T0 + t, EventKind.NODE_LEAVE, node=nodes[k])])
    ctl.flush()
    before = ctl.horizon
    assert before.learned and before.fragments == 6 and before.stands >= 5
    store.close()

    store2 = Store(db)
    ctl2 = restore(store2, SimulatedDispatcher(), SimClock(T0 + 1700), node_names=nodes)
    assert ctl2.config.learns_horizon
    assert ctl2.horizon_learner.state() == ctl.horizon_learner.state()
    assert ctl2.horizon_learner.survival.count == 6 and ctl2.horizon_learner.stands.count == before.stands
    ctl2.step([Event(T0 + 1700, EventKind.NODE_JOIN, node=nodes[0])])
    ctl.step([Event(T0 + 1700, EventKind.NODE_JOIN, node=nodes[0])])
    assert ctl2.horizon.learned and ctl2.horizon.fragments == 6 and ctl2.horizon.standing == 1
    assert ctl2.horizon.tfwd == pytest.approx(ctl.horizon.tfwd)
    assert ctl2.horizon.median_s == pytest.approx(ctl.horizon.median_s)


def test_a_restored_quiet_controller_is_planned_again_as_the_horizon_grows(tmp_path):
    """A restart with A on every node and B waiting for a longer horizon, and nothing happening
    after it: the restored controller is due for a look at once (`replan_at`), and B gets nodes
    without an event, as it would have had the service not restarted."""
    db = tmp_path / "run.db"
    store = Store(db)
    nodes = [f"a01n{i:02d}" for i in range(1, 17)]
    ctl, clock = controller(nodes, ControllerConfig(tfwd="auto"), store)
    a_then_b(ctl, clock, 5)
    assert len(ctl.held["A"]) == 16 and not ctl.held.get("B")
    ctl.flush()
    store.close()

    clock2 = SimClock(T0 + 5)
    ctl2 = restore(Store(db), SimulatedDispatcher(), clock2, node_names=nodes)
    assert ctl2.replan_due(T0 + 5)
    for _ in range(12):
        assert ctl2.step() is not None
        if ctl2.held.get("B"):
            break
        clock2.advance_to(ctl2.replan_at)
    assert ctl2.held.get("B") and len(ctl2.held["A"]) < 16 and clock2.now() - T0 < 600


def test_a_horizon_state_from_another_grid_is_refused():
    from core.horizon import HorizonLearner
    h = HorizonLearner()
    h.ended(300.0)
    h.changed("J", 0.0)
    h.changed("J", 120.0)
    state = h.state()
    for part in ("fragments", "stands"):
        with pytest.raises(ValueError, match="another grid"):
            HorizonLearner().load({**state, part: {**state[part], "per_decade": 10}})
        with pytest.raises(ValueError, match="counted"):
            HorizonLearner().load({**state, part: {**state[part], "count": 2}})
    fresh = HorizonLearner()
    fresh.load(state)
    assert fresh.state() == state


def test_a_failed_job_keeps_its_failure_and_story_across_a_restore(tmp_path):
    """A JOB_FAILED event's named failure becomes the job's, with whatever the dispatcher kept
    of its workers (`story`), in the store, and both come back in a restored controller."""
    db = tmp_path / "run.db"
    store = Store(db)
    nodes = ["n1", "n2"]
    ctl, clock = controller(nodes, ControllerConfig(max_jobs=2, tfwd=1000), store)
    ctl.submit(job("A", submit=T0, total=1e7))
    ctl.step()
    failure = {"kind": "exception", "node": "n1", "message": "ValueError: bad", "hint": "fix it",
               "tail": ["Traceback (most recent call last):", "ValueError: bad"], "address": ""}
    ctl.jobs["A"].story = {"losses": [[1, 2.3], [2, 2.1]], "generations": [{"gen": 1}]}
    clock.advance_to(T0 + 10)
    ctl.step([Event(T0 + 10, EventKind.JOB_FAILED, job="A", node="n1", detail="exception", failure=failure)])
    ctl.step([Event(T0 + 11, EventKind.JOB_FAILED, job="A", detail="a second word on it")])   # the first stays
    ctl.flush()
    store.close()
    ctl2 = restore(Store(db), SimulatedDispatcher(), SimClock(T0 + 20), node_names=nodes)
    a = ctl2.jobs["A"]
    assert a.state.value == "failed" and a.failure == failure
    assert a.story == {"losses": [[1, 2.3], [2, 2.1]], "generations": [{"gen": 1}]}


def test_a_store_from_before_resubmission_gains_its_columns_and_keeps_its_jobs(tmp_path):
    """`resubmitted_from` and `requeues` (issue 56) are added to an older store's jobs table at
    open; its jobs read as neither resubmitted nor requeued, and a new job's values come back."""
    db = tmp_path / "run.db"
    store = Store(db)
    ctl, _ = controller(["n1"], ControllerConfig(tfwd=1000), store)
    ctl.submit(job("OLD", total=1e7))
    ctl.step()
    ctl.flush()
    store.close()
    with sqlite3.connect(db) as conn:
        conn.execute("alter table jobs drop column resubmitted_from")
        conn.execute("alter table jobs drop column requeues")
    store = Store(db)
    assert {"resubmitted_from", "requeues"} <= set(store.db["jobs"].columns_dict)
    (old, _), = store.jobs()
    assert old.id == "OLD" and old.resubmitted_from == "" and old.requeues == 0
    new = job("NEW", total=1e7)
    new.resubmitted_from, new.requeues, new.samples_done = "OLD", 2, 1234.0
    from core.store import Batch, job_row
    store.write(Batch(jobs={"NEW": job_row(new)}))
    back = {j.id: j for j, _ in store.jobs()}["NEW"]
    assert (back.resubmitted_from, back.requeues, back.samples_done) == ("OLD", 2, 1234.0)
