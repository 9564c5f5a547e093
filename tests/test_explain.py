"""The plain-words explanation of an allocation (core/explain.py)."""
from __future__ import annotations

from core.explain import horizon_of, why
from core.model import Curve, Job, JobState


def _job(**kw):
    base = dict(id="J", min_nodes=2, max_nodes=16, total_samples=1e9,
                curve=Curve((1, 2, 4, 8, 16), (100, 200, 390, 500, 520)), scale_up_seconds=18,
                scale_down_seconds=12, state=JobState.RUNNING)
    base.update(kw)
    return Job(**base)


def test_why_says_what_holds_a_job_back():
    assert why(_job(state=JobState.QUEUED), 0, 50, 50, 10, 10, 10, queue_position=3).startswith(
        "queued: 10 jobs already running (at most 10 at once), number 3")
    assert why(_job(state=JobState.QUEUED, min_nodes=8), 0, 5, 5, 1, 10, 10) == \
        "queued: needs 8 idle nodes to start, 5 are idle"
    assert why(_job(), 16, 100, 40, 3, 10, 10) == "holds 16 nodes: its maximum"
    line = why(_job(), 8, 100, 20, 3, 10, 10)     # 80 free nodes, but 8 -> 16 adds 20 samples/s only
    assert line.startswith("holds 8 nodes: growing to 16 adds 20 samples/s") and "18 s rescale pause" in line
    assert "all 30 idle nodes are in use" in why(_job(), 4, 30, 30, 3, 10, 10)
    assert why(_job(), 0, 0, 0, 3, 10, 10) == "waiting: no node is idle"
    assert "needs at least 2 nodes" in why(_job(), 0, 10, 9, 3, 10, 10)
    assert why(_job(state=JobState.DONE, end_time=0.0), 0, 10, 9, 3, 10, 10).startswith("done at 1970-01-01")


def test_why_quotes_the_learned_horizon():
    """tfwd auto: the line says how long the new allocation must stand for growing to pay off and
    how long allocations have stood (the learned horizon)."""
    job = _job(curve=Curve((1, 2, 4, 8, 16), (100, 200, 390, 500, 560)))
    line = why(job, 8, 100, 20, 3, 10, 40.0, learned=True)
    # 8 -> 16 adds 60 samples/s; the 18 s pause at 500 samples/s loses 9,000: 150 s to repay
    assert line == ("holds 8 nodes: growing to 16 pays off if the new allocation stands 150 s (+60 samples/s "
                    "against 9,000 samples lost in its 18 s rescale pause); allocations have stood 40 s (median)")
    assert "T_fwd = 40 s" in why(job, 8, 100, 20, 3, 10, 40.0)          # a fixed T_fwd: the old words
    assert "free, but the milp policy" in why(job, 8, 100, 20, 3, 10, 400.0, learned=True)


def test_horizon_of_reads_the_snapshot_config():
    learned = {"tfwd": "auto", "horizon": {"tfwd": 55.0, "learned": True, "jobs": {"J": 410.0}}}
    assert horizon_of(learned, "J") == (410.0, True)
    assert horizon_of(learned, "K") == (55.0, True)                      # not in the last decision
    fallback = {"tfwd": "auto", "horizon": {"tfwd": 10.0, "learned": False, "jobs": {}}}
    assert horizon_of(fallback, "J") == (10.0, False)
    assert horizon_of({"tfwd": 60.0, "horizon": {"tfwd": 60.0, "learned": False}}, "J") == (60.0, False)
    assert horizon_of({"tfwd": 30.0}, "J") == (30.0, False)
