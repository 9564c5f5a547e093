"""The plain-words explanation of an allocation (core/explain.py)."""
from __future__ import annotations

from core.explain import horizon_of, why
from core.jpa import JPA, JPAConfig
from core.model import Curve, Job, JobState, RateSample


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


def test_why_counts_one_node_as_one_node():
    one = _job(min_nodes=1, max_nodes=1)
    assert why(one, 1, 10, 1, 3, 10, 10) == "holds 1 node: its maximum"
    assert why(_job(state=JobState.QUEUED, min_nodes=1), 0, 0, 0, 1, 1, 10) == \
        "queued: needs 1 idle node to start, 0 are idle"
    assert why(_job(state=JobState.QUEUED), 0, 50, 50, 1, 1, 10) == "queued: 1 job already running (at most 1 at once)"
    assert "needs at least 2 nodes and only 1 of the 3 nodes idle is free" in why(_job(), 0, 3, 2, 3, 10, 10)
    flat = _job(min_nodes=1, curve=Curve((1, 2), (100, 100)))
    assert why(flat, 1, 1, 1, 1, 10, 10) == \
        "holds 1 node: the one idle node is in use, and one more would not speed it up"
    assert why(_job(min_nodes=1), 1, 2, 1, 1, 10, 100, policy="greedy") == \
        "holds 1 node: 1 node is free, but the greedy policy did not give it more"


def _profiled():
    """A job of 1 to 4 nodes without a curve, under the live profiler (3 sizes early on), and a
    way to measure it at a size and to read its why-line as the job page and the API build it."""
    jpa = JPA(JPAConfig.live(3))
    job = Job("P", 1, 4, 1e9, Curve((1,), (0.0,)), state=JobState.RUNNING)
    jpa.register(job)
    clock = [0.0]

    def measure(n: int) -> None:
        jpa.ran("P", n, clock[0])
        for _ in range(2):
            clock[0] += 5.0
            jpa.observe(RateSample(clock[0], "P", n, 100.0 * n ** 0.9, 5.0))

    def line(n: int) -> tuple[str, dict]:
        job.curve = jpa.belief("P").curve          # what the allocator (and the line) use
        view = jpa.view("P")
        return why(job, n, 4, n, 1, 10, 10.0, profile=view), view

    return jpa, measure, line, clock


def test_while_profiling_the_line_says_which_size_is_tried_and_why():
    """The profiler asks for a size, the job runs there, the size is measured: before, during and
    after, the line names what the chart's probes name (never "no faster at N" while N is tried)."""
    jpa, measure, line, clock = _profiled()
    measure(1)
    probe = jpa.wanted_probes(clock[0], {"P": 1e9}, measured={"P"}, room=3)["P"]
    text, view = line(1)
    assert view["probe"] == probe.size and view["probes"][-1]["why"] == probe.why
    assert text.startswith(f"holds 1 node: trying {probe.size} nodes next to measure its throughput there "
                           "(profiling: "), text
    fit_there = f'{view["fit"]["mean"][view["fit"]["nodes"].index(probe.size)]:,.0f}'
    assert f"fit at {probe.size}: {fit_there}" in text, (text, fit_there)      # the chart's fit, the same figure
    jpa.ran("P", probe.size, clock[0])
    text, view = line(probe.size)
    assert view["probing"] and text.startswith(
        f"holds {probe.size} nodes: trying {probe.size} nodes to measure its throughput there (profiling: "), text
    measure(probe.size)
    nxt = jpa.wanted_probes(clock[0], {"P": 1e9}, measured={"P"}, room=4 - probe.size)["P"]
    text, _ = line(probe.size)
    assert text == (f"holds {probe.size} nodes: trying {nxt.size} nodes next to measure its throughput there "
                    f"(profiling: 2 of 3 sizes measured)"), text
    jpa.ran("P", nxt.size, clock[0])
    assert line(nxt.size)[0] == (f"holds {nxt.size} nodes: trying {nxt.size} nodes to measure its throughput "
                                 f"there (profiling: 2 of 3 sizes measured)")
    measure(nxt.size)
    text, view = line(nxt.size)
    assert not view["probing"] and view["probe"] is None and "profiling" not in text, text


def test_a_size_no_faster_says_whether_measured_or_the_fits_beside_the_fits_peak():
    """The chart says "fastest at 3 nodes" (the fit's peak) while 2 nodes measured more than the
    fit expects at 3: the line says which figure is which instead of contradicting the chart."""
    job = _job(min_nodes=1, max_nodes=4, curve=Curve((1, 2, 3, 4), (105.0, 200.0, 195.0, 190.0)))
    profile = {"measured": [{"nodes": 1}, {"nodes": 2}], "cap": 4, "scale_up_seconds": 1.0, "probe": None,
               "probing": False, "size": 2, "probes": [],
               "fit": {"nodes": [1, 2, 3, 4], "mean": [105.0, 190.0, 195.0, 190.0], "peak": 3}}
    assert why(job, 2, 4, 2, 1, 10, 10.0, profile=profile) == (
        "holds 2 nodes: 3 nodes would be no faster: the fit expects 195 samples/s there, against 200 measured at "
        "2 nodes now (the fit peaks at 3 nodes, below what 2 nodes measured)")
    profile["measured"].append({"nodes": 3})
    assert why(job, 2, 4, 2, 1, 10, 10.0, profile=profile) == (
        "holds 2 nodes: 3 nodes would be no faster: measured 195 samples/s there, against 200 measured at "
        "2 nodes now (the fit peaks at 3 nodes, below what 2 nodes measured)")
    profile["fit"]["peak"] = 2                  # the fit agrees: nothing to reconcile
    assert why(job, 2, 4, 2, 1, 10, 10.0, profile=profile).endswith("against 200 measured at 2 nodes now")
    assert why(job, 2, 4, 2, 1, 10, 10.0) == \
        "holds 2 nodes: the curve in use is no faster at 3 nodes (195 against 200 samples/s now)"
