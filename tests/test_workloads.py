"""The mixed workload (core/workloads.py): synthetic poorly scaling jobs in place of a seeded
fraction of a job set, written back as a job-set file."""
from __future__ import annotations

import io

import numpy as np
import pytest

from core.jobsets import load_jobset
from core.replay import DEFAULT_JOBS
from core.workloads import KAPPA, SIGMA, mixed, write_jobset


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
