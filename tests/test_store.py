"""The SQLite store (core/store.py), a real file in WAL mode, from which a controller is restored."""
from __future__ import annotations

import sqlite3

import pytest

from core.clock import SimClock
from core.controller import ControllerConfig
from core.dispatchers.simulated import SimulatedDispatcher
from core.model import Event, EventKind
from core.restore import restore
from core.store import Store
from tests.support.sim import T0, controller, job


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
