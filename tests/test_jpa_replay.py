"""The profiler in replay, on the real Summit trace (a subset of nodes): curves hidden from the
allocator and learned from the simulated profiler's noisy samples, probes in the event log,
samples in the store, a resumed run that remembers what was learned; the linear guess; and the
mixed workload of synthetic poorly scaling jobs."""
from __future__ import annotations

import io
import math
import sqlite3
import statistics

import numpy as np
import pytest

from core.controller import ControllerConfig
from core.dispatchers.simulated import Measurement
from core.jobsets import load_jobset
from core.model import RateSample
from core.replay import DEFAULT_JOBS, Replay, ReplaySettings, linear_guess
from core.workloads import KAPPA, SIGMA, mixed, write_jobset

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


def test_the_simulated_profiler_measures_with_the_stated_noise_reproducibly():
    m = Measurement(noise=0.03, every_s=30.0, seed=4)
    xs = [math.log(m.factor("J1", t * 30.0, "rate")) for t in range(4000)]
    assert 0.027 < statistics.pstdev(xs) < 0.033 and abs(statistics.mean(xs)) < 0.003
    assert m.factor("J1", 60.0, "rate") == Measurement(0.03, 30.0, 4).factor("J1", 60.0, "rate")
    short = [math.log(m.factor("J1", t * 10.0, "rate", 10.0)) for t in range(4000)]
    assert statistics.pstdev(short) == pytest.approx(0.03 * math.sqrt(3), rel=0.1)
    assert isinstance(RateSample(0.0, "J", 1, 1.0), RateSample)


def test_mixed_replaces_a_seeded_fraction_by_poorly_scaling_jobs():
    jobs = load_jobset(DEFAULT_JOBS)
    a, b, c = mixed(jobs, 0.3, seed=1), mixed(jobs, 0.3, seed=1), mixed(jobs, 0.3, seed=2)
    poor = [i for i, (old, new) in enumerate(zip(jobs, a)) if new.true_curve != old.true_curve]
    assert len(poor) == round(0.3 * len(jobs))
    assert poor == [i for i, (old, new) in enumerate(zip(jobs, b)) if new.true_curve != old.true_curve]
    assert poor != [i for i, (old, new) in enumerate(zip(jobs, c)) if new.true_curve != old.true_curve]
    for i in poor:
        old, new = jobs[i], a[i]
        assert (new.id, new.name, new.submit_time, new.total_samples) == (old.id, old.name, old.submit_time,
                                                                          old.total_samples)
        assert new.true_curve(1) == pytest.approx(old.true_curve(1))
        rates = [new.true_curve(n) for n in range(1, 65)]
        assert 5 <= int(np.argmax(rates)) + 1 <= 14, "USL peak outside the range the parameters give"
        assert rates[-1] < 0.6 * max(rates)          # well past its peak at 64 nodes
    assert SIGMA == (0.05, 0.15) and KAPPA == (0.005, 0.02)
    buf = io.StringIO()
    write_jobset(a, buf)
    assert buf.getvalue().startswith("job,model,submit_time")


def test_mixed_job_set_round_trips_through_csv(tmp_path):
    jobs = mixed(load_jobset(DEFAULT_JOBS), 0.3, seed=0)
    p = tmp_path / "mixed.csv"
    with p.open("w") as fh:
        write_jobset(jobs, fh)
    back = load_jobset(p)
    assert [j.id for j in back] == [j.id for j in jobs]
    for x, y in zip(jobs, back):
        for n in (1, 7, 64):
            assert y.true_curve(n) == pytest.approx(x.true_curve(n), rel=1e-6)
    with pytest.raises(ValueError):
        mixed(jobs, 1.5)
