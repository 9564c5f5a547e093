"""The learned curve chart and its line (app/curve.py), without a server, from a real JPA fed
with throughput samples of a known curve."""
from __future__ import annotations

import math

import numpy as np

from app.curve import BAND, FIT, GIVEN, MEASURED, curve_figure, probe_rows, probes_title, profile_line
from core.jpa import JPA, JPAConfig
from core.model import Curve, Job, PauseSample, RateSample
from core.scaling import usl


def truth(n: int) -> float:
    return float(usl(n, 2000.0, 0.02, 0.0005))


def measured_job(given: Curve | None = None) -> tuple[JPA, Job]:
    """A job measured at 2, 4 and 8 nodes (more windows at 4), with one grow and one shrink."""
    jpa = JPA(JPAConfig())
    job = Job("J1", 1, 32, 1e9, Curve((1,), (0.0,)), name="resnet", given_curve=given)
    jpa.register(job)
    rng = np.random.default_rng(3)
    t = 0.0
    for n, windows in ((2, 2), (4, 6), (8, 2)):
        jpa.ran("J1", n, t)
        for _ in range(windows):
            t += 30.0
            jpa.observe(RateSample(t, "J1", n, truth(n) * math.exp(0.02 * rng.standard_normal()), 30.0))
    jpa.observe(PauseSample(t, "J1", "up", 15.0))
    jpa.observe(PauseSample(t, "J1", "down", 9.0))
    return jpa, job


def trace(fig: dict, name: str) -> dict:
    return next(t for t in fig["data"] if t["name"] == name)


def test_learned_chart_draws_points_fit_band_and_cap():
    jpa, job = measured_job()
    view = jpa.view("J1")
    fig = curve_figure(job, {"nodes": 8}, [], view)
    names = [t["name"] for t in fig["data"]]
    band = trace(fig, BAND)
    low = fig["data"][names.index(BAND) - 1]
    assert band["fill"] == "tonexty" and low["showlegend"] is False, "the band fills down to its low edge"
    assert band["y"] == view["fit"]["hi"] and low["y"] == view["fit"]["lo"]
    assert trace(fig, FIT)["y"] == view["fit"]["mean"] and trace(fig, FIT)["x"] == list(range(1, 33))
    points = trace(fig, MEASURED)
    assert points["x"] == [2, 4, 8]
    sizes = dict(zip(points["x"], points["marker"]["size"]))
    assert sizes[4] > sizes[2], "more windows, a bigger marker"
    assert [round(c[0], 6) for c in points["customdata"]] == [round(m["weight"], 6) for m in view["measured"]]
    assert GIVEN not in names, "no curve was given"
    cap = view["cap"]
    assert any(s["type"] == "line" and s["x0"] == s["x1"] == cap for s in fig["layout"]["shapes"])
    assert any(a["text"] == f"evidence cap {cap}" for a in fig["layout"]["annotations"])
    now = trace(fig, "now: 8 nodes")
    assert now["x"] == [8] and now["y"] == [view["measured"][-1]["samples_per_second"]]
    assert fig["layout"]["yaxis"]["range"][1] >= max(view["fit"]["mean"])


def test_a_given_curve_is_drawn_in_its_own_style():
    given = Curve((1, 8, 32), (1800.0, 13000.0, 40000.0))
    jpa, job = measured_job(given)
    fig = curve_figure(job, {"nodes": 0}, [], jpa.view("J1"))
    g = trace(fig, GIVEN)
    assert g["x"] == [1, 8, 32] and g["y"] == [1800.0, 13000.0, 40000.0]
    assert g["line"]["dash"] == "dash" and g["line"]["color"] != trace(fig, FIT)["line"]["color"]
    assert not [t for t in fig["data"] if t["name"].startswith("now:")], "a job on no nodes has no 'now'"


def test_the_line_says_costs_model_peak_and_confidence():
    jpa, _ = measured_job()
    view = jpa.view("J1")
    line = profile_line(view)
    assert f"grow {view['scale_up_seconds']:.1f} s (1 pause measured)" in line, line
    assert f"shrink {view['scale_down_seconds']:.1f} s (1 pause measured)" in line, line
    assert 9.0 < view["scale_down_seconds"] < view["scale_up_seconds"] < 18.0    # 15 s / 9 s measured
    assert "USL model: σ " in line and "κ " in line
    assert f"fastest at {view['fit']['peak']} nodes" in line
    assert f"confidence {view['confidence']}" in line and "%" in line
    assert "probing" not in line
    jpa.ran("J1", 16, 1000.0)                                 # a size with no sample yet
    assert "probing: no sample at 16 nodes yet" in profile_line(jpa.view("J1"))
    rows = probe_rows(view)                                   # its first runs at 2, 4 and 8 nodes
    assert probes_title(view) == "Probes and untried sizes (3)" and [r["nodes"] for r in rows] == [8, 4, 2]
    assert {r["kind"] for r in rows} == {"allocator's choice"} and rows[0]["why"].startswith("untried size 8 nodes")


def test_without_a_profile_the_chart_is_the_given_curve_as_before():
    job = Job("J2", 2, 16, 1e9, Curve((2, 8, 16), (100.0, 380.0, 700.0)))
    fig = curve_figure(job, {"nodes": 8}, [{"nodes": 8, "samples_per_second": 370.0}], None)
    assert [t["name"] for t in fig["data"]] == ["curve in use", "given points", "measured", "now: 8 nodes"]
    assert fig["layout"]["height"] == 280 and "range" not in fig["layout"]["yaxis"]
