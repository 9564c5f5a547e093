"""What the pages make of the profiler's view, without a server: the learned curve chart and its
line from a real JPA fed with throughput samples of a known curve, the grid's probing cells and
their patches, and the jobs table's curve column."""
from __future__ import annotations

import math

import dash
import numpy as np
import pytest

from app.curve import BAND, FIT, GIVEN, MEASURED, curve_figure, probe_rows, probes_title, profile_line
from app.grid import (C_JOB0, C_PROBE0, JOB_COLOURS, N_CODES, PROBE_COLOURS, CellCache, ColourBook, cells_of,
                      colourscale, grid_patch, lighter)
from core.jpa import JPA, JPAConfig
from core.model import Curve, Job, PauseSample, RateSample
from core.scaling import usl
from core.snapshot import BUSY, HELD, Snapshot
from tests.support.files import ROOT

dash.Dash(__name__, use_pages=True, pages_folder=str(ROOT / "app" / "pages"))
from app.pages.jobs import CONFIDENCE, table_rows  # noqa: E402  (a page registers itself on import)


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


# ---- the grid ----------------------------------------------------------------------------------
NAMES = [f"a01n{i:02d}" for i in range(1, 7)]


def snapshot(seq: int, probing=frozenset(), rescaling=frozenset()) -> Snapshot:
    jobs = ({"id": "J1", "name": "bert", "state": "running", "nodes": 3},
            {"id": "J2", "name": "vgg", "state": "running", "nodes": 2})
    return Snapshot(1000.0 + seq, seq, "running", tuple(NAMES), (BUSY, HELD, HELD, HELD, HELD, HELD),
                    (None, "J1", "J1", "J1", "J2", "J2"), jobs, {}, (1000.0,) * 6, frozenset(rescaling),
                    probing=frozenset(probing))


def test_probing_nodes_take_a_lighter_shade_and_say_so():
    book = ColourBook()
    c = cells_of(snapshot(1, probing={"J1"}), book)
    slot1, slot2 = book.slot("J1"), book.slot("J2")
    assert c.codes.tolist()[1:] == [C_PROBE0 + slot1] * 3 + [C_JOB0 + slot2] * 2
    assert all("probing: no sample at 3 nodes yet" in t and "bert (J1)" in t for t in c.text[1:4])
    assert not any("probing" in t for t in c.text[4:])
    # rescaling says more than probing: the job is paused, not measuring
    r = cells_of(snapshot(2, probing={"J1"}, rescaling={"J1"}), book)
    assert all(t.startswith("rescaling") for t in r.text[1:4])


def test_every_code_has_its_colour_and_a_probe_shade_is_lighter():
    scale = colourscale()
    assert len(scale) == 2 * N_CODES == 2 * (C_PROBE0 + len(JOB_COLOURS))
    assert [scale[2 * (C_PROBE0 + k)][1] for k in range(len(JOB_COLOURS))] == list(PROBE_COLOURS)
    for base, shade in zip(JOB_COLOURS, PROBE_COLOURS):
        assert sum(int(shade[k:k + 2], 16) for k in (1, 3, 5)) > sum(int(base[k:k + 2], 16) for k in (1, 3, 5))
    assert lighter("#000000", 0.5) == "#808080" and lighter("#1f77b4", 0.0) == "#1f77b4"


def test_a_probe_starting_patches_only_that_jobs_cells():
    cache = CellCache()
    lay = cache.layout(tuple(NAMES))
    before, during = cache.cells(snapshot(1)), cache.cells(snapshot(2, probing={"J2"}))
    ops = grid_patch(lay, before, during).to_plotly_json()["operations"]
    cells = {tuple(o["location"][3:]) for o in ops}
    assert len(ops) == 4 and cells == {(int(lay.row[i]), int(lay.col[i])) for i in (4, 5)}


# ---- the jobs table ----------------------------------------------------------------------------
def table_job(jid: str, word: str) -> dict:
    return {"id": jid, "name": jid, "owner": "", "state": "running", "nodes": 1, "samples_per_second": 1.0,
            "progress": 0.5, "eta": None, "submit_time": 0.0, "confidence": word}


def test_the_curve_column_sorts_by_confidence_and_filters():
    jobs = [table_job(f"J{k}", w) for k, w in enumerate(("high", "prior", "medium", "given", "low", "high"))]
    rows, total = table_rows(jobs, None, "", [{"column_id": "curve", "direction": "asc"}], 0)
    assert total == 6 and [r["curve"] for r in rows] == ["prior", "given", "low", "medium", "high", "high"]
    rows, _ = table_rows(jobs, None, "", [{"column_id": "curve", "direction": "desc"}], 0)
    assert [r["curve"] for r in rows][:2] == ["high", "high"]
    rows, total = table_rows(jobs, None, "", None, 0, curves=["high", "low"])
    assert total == 3 and {r["curve"] for r in rows} == {"high", "low"}
    assert set(CONFIDENCE) == {"prior", "given", "low", "medium", "high"}


@pytest.mark.parametrize("word", ["", None])
def test_a_job_without_a_word_still_sorts(word):
    jobs = [table_job("J1", "high"), {**table_job("J2", "low"), "confidence": word}]
    rows, total = table_rows(jobs, None, "", [{"column_id": "curve", "direction": "asc"}], 0)
    assert total == 2 and rows[0]["curve"] in ("high", "")
