"""The profiler in replay, on the real Summit trace (a subset of nodes): curves hidden from the
allocator and learned from the simulated profiler's noisy samples, probes in the event log,
samples in the store, a resumed run that remembers what was learned; and the linear guess."""
from __future__ import annotations

import math
import sqlite3
import statistics

import pytest

from core.controller_config import ControllerConfig
from core.replay import DEFAULT_JOBS, Replay, ReplaySettings, linear_guess

WINDOW = dict(start="2021-02-10T20:00:00Z", hours=6.0, nodes=512)


def settings(curves: str, jobs=DEFAULT_JOBS, **kw) -> ReplaySettings:
    return ReplaySettings(jobs=jobs, config=ControllerConfig(), curves=curves, **WINDOW, **kw)


def test_learned_replay_hides_the_curves_and_learns_them(tmp_path):
    r = Replay(settings("learned"), tmp_path / "r.db")
    out = r.run()
    assert out["curves"] == "learned" and out["jobs_finished"] > 0
    ctl, jpa = r.controller, r.advisor
    db = sqlite3.connect(tmp_path / "r.db")
    kinds = dict(db.execute("select kind, count(*) from samples group by kind"))
    assert kinds.get("rate", 0) > 100 and kinds.get("up", 0) + kinds.get("down", 0) > 0, kinds
    assert db.execute("select count(*) from events where kind = 'probe'").fetchone()[0] > 0
    measured = [j for j in ctl.jobs.values() if len((jpa.view(j.id) or {}).get("measured", [])) >= 2]
    assert len(measured) >= 5
    errors = []
    for job in measured:
        for m in jpa.view(job.id)["measured"]:
            errors.append(abs(math.log(m["samples_per_second"] / job.true_curve(m["nodes"]))))
    assert statistics.median(errors) < 0.03, "measured means far from the true rates"
    never = [j for j in ctl.jobs.values() if not jpa.view(j.id)["measured"]]
    assert never and all(j.curve != j.true_curve for j in never), "a curve leaked to the allocator"


def test_a_resumed_learned_replay_remembers_what_it_learned(tmp_path):
    db = tmp_path / "r.db"

    class Stop(Exception):
        pass
    first = Replay(settings("learned"), db)
    steps = []

    def stop(res):
        steps.append(res)
        if len(steps) == 400:
            raise Stop
    with pytest.raises(Stop):
        first.run(on_step=stop)
    first.checkpoint()
    before = {jid: first.advisor.view(jid)["measured"] for jid in first.controller.jobs}
    first.store.close()
    again = Replay(settings("learned"), db, resume=True)
    after = {jid: again.advisor.view(jid)["measured"] for jid in again.controller.jobs}
    assert any(before.values())
    for jid, points in before.items():
        assert [(p["nodes"], round(p["samples_per_second"], 6)) for p in after[jid]] == \
               [(p["nodes"], round(p["samples_per_second"], 6)) for p in points], jid
    assert again.run()["jobs_finished"] > 0


def test_linear_mode_tells_the_allocator_a_straight_line_from_the_1_node_rate():
    r = Replay(settings("linear"))
    job = r.jobset[0]
    assert job.curve == linear_guess(job) and job.true_curve.nodes == (1, 2, 4, 8, 16, 32, 64)
    assert job.curve(64) == pytest.approx(64 * job.true_curve(1))
