"""Counters that cannot lie (issue 57, item 6): random sequences of register, cancel, steps,
node reclaims and returns, ends and requeues on a real controller (simulated dispatcher, a real
SQLite store); after every step each KPI of the snapshot equals a recount from the jobs' states,
and the timeline stored never holds a count the jobs do not."""
from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from core import failures
from core.controller_config import ControllerConfig
from core.model import Event, EventKind, JobState
from core.store import Store
from tests.support.sim import T0, controller, job

NODES = [f"n{i}" for i in range(6)]
CURVES = (((1, 2, 4), (100.0, 190.0, 350.0)), ((1, 3), (50.0, 60.0)), ((1,), (0.0,)))
ENDED = {"done": JobState.DONE, "failed": JobState.FAILED, "cancelled": JobState.CANCELLED}


def recount(jobs, ctl) -> dict:
    """The KPIs as the jobs' states and the nodes say they must be."""
    by_state = {s: sum(1 for j in jobs if j.state is s) for s in JobState}
    return {"queued": by_state[JobState.QUEUED], "running": by_state[JobState.RUNNING],
            **{k: by_state[s] for k, s in ENDED.items()},
            "harvested": sum(len(ctl.held.get(j.id, ())) for j in jobs if j.state is JobState.RUNNING),
            "idle": len(ctl.idle)}


class Harvester(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.store = Store(Path(self.dir.name) / "run.db")
        self.ctl, self.clock = controller(NODES, ControllerConfig(max_jobs=3, tfwd=1000), self.store)
        self.ctl.timeline.every = 0.0           # a timeline point every step: each one is checked
        self.jobs = []
        self.t = 0.0

    def teardown(self) -> None:
        self.store.close()
        self.dir.cleanup()

    def _step(self, events=()) -> None:
        self.t += 10.0
        self.clock.advance_to(T0 + self.t)
        self.ctl.step(list(events))
        self.ctl.flush()
        want = recount(self.jobs, self.ctl)
        queued = self.store.db.execute("select queued from timeline order by time desc limit 1").fetchone()
        assert queued is None or queued[0] == want["queued"], (queued, want)

    def _pick(self, data, state):
        live = [j for j in self.jobs if j.state is state and j.id in self.ctl.running] if state is JobState.RUNNING \
            else [j for j in self.jobs if not j.state.finished]
        return data.draw(st.sampled_from(live)) if live else None

    @rule(lo=st.integers(1, 3), extra=st.integers(0, 3), curve=st.sampled_from(CURVES))
    def register(self, lo, extra, curve):
        j = job(f"J{len(self.jobs)}", lo=lo, hi=lo + extra, total=1e7, curve=curve, submit=T0 + self.t)
        self.jobs.append(j)
        self.ctl.submit(j)

    @rule(data=st.data())
    def cancel(self, data):
        j = self._pick(data, None)
        if j is not None:
            self.ctl.cancel(j.id)

    @rule()
    def step(self):
        self._step()

    @rule(node=st.sampled_from(NODES))
    def reclaim(self, node):
        self._step([Event(T0 + self.t + 10, EventKind.NODE_LEAVE, node=node)])

    @rule(node=st.sampled_from(NODES))
    def give_back(self, node):
        self._step([Event(T0 + self.t + 10, EventKind.NODE_JOIN, node=node)])

    @rule(data=st.data(), kind=st.sampled_from([EventKind.JOB_DONE, EventKind.JOB_FAILED]))
    def end(self, data, kind):
        j = self._pick(data, JobState.RUNNING)
        if j is not None:
            self._step([Event(T0 + self.t + 10, kind, job=j.id, detail="ended")])

    @rule(data=st.data())
    def nodes_fail_it(self, data):
        j = self._pick(data, JobState.RUNNING)
        if j is not None:
            failure = {"kind": failures.UNREACHABLE, "message": "gone", "node": "", "hint": "", "tail": []}
            self._step([Event(T0 + self.t + 10, EventKind.JOB_FAILED, job=j.id, failure=failure)])

    @invariant()
    def kpis_match_a_recount(self):
        kpis = self.ctl.snapshot("running", 0).kpis
        want = recount(self.jobs, self.ctl)
        assert {k: kpis.get(k) for k in want} == want
        assert kpis["harvested"] == len(self.ctl.owner) and self.ctl.n_queued >= 0


Harvester.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None,
                                       suppress_health_check=[HealthCheck.too_slow])
TestKpisMatchARecount = Harvester.TestCase


def test_a_job_cancelled_before_the_next_step_is_not_taken_off_the_queue_twice(tmp_path):
    """The finding: cancelled while still registered (never queued), it was subtracted from the
    queue anyway, and the negative count went into the timeline."""
    store = Store(tmp_path / "run.db")
    ctl, clock = controller(NODES, ControllerConfig(max_jobs=3, tfwd=1000), store)
    for k in range(4):
        ctl.submit(job(f"C{k}"))
        ctl.cancel(f"C{k}")
    clock.advance_to(T0 + 10)
    ctl.step()
    ctl.flush()
    assert ctl.n_queued == 0 and ctl.snapshot("running", 0).kpis["queued"] == 0
    assert ctl.snapshot("running", 0).kpis["cancelled"] == 4
    assert [r[0] for r in store.db.execute("select queued from timeline")] == [0]
