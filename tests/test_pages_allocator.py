"""The allocator page (app/pages/allocator.py): the horizon in use and what it was learned from."""
from __future__ import annotations

import dash

from core.clock import SimClock
from core.controller import Controller, ControllerConfig
from core.dispatchers.simulated import SimulatedDispatcher
from core.model import Event, EventKind
from tests.support.files import ROOT
from tests.support.sim import job

dash.Dash(__name__, use_pages=True, pages_folder=str(ROOT / "app" / "pages"))
from app.pages.allocator import horizon_text  # noqa: E402  (a page registers itself on import)


def test_a_fixed_tfwd_says_so():
    assert horizon_text({"tfwd": 60.0, "horizon": {"tfwd": 60.0, "learned": False}}).startswith(
        "Horizon: T_fwd 60 s, fixed")


def test_the_learned_horizon_comes_from_a_real_controller():
    """The snapshot a controller with --tfwd auto publishes: first the fallback, then (once a
    node's idle fragment ended) the median job's horizon and what it was learned from."""
    nodes = [f"a01n{i:02d}" for i in range(1, 9)]
    t0 = 1_700_000_000.0
    clock = SimClock(t0)
    ctl = Controller(SimulatedDispatcher(), clock, ControllerConfig(tfwd="auto"), None, nodes)
    ctl.start(nodes)
    ctl.submit(job("J", hi=8))
    ctl.step()
    text = horizon_text(ctl.snapshot("running", 1).config)
    assert text == "Horizon: learned (--tfwd auto); 10 s until the first idle fragment ends (8 nodes idle so far)."
    clock.advance_to(t0 + 300)
    ctl.step([Event(t0 + 300, EventKind.NODE_LEAVE, node="a01n01")])
    h = ctl.horizon
    text = horizon_text(ctl.snapshot("running", 2).config)
    assert text.startswith(f"Horizon: learned (--tfwd auto), {h.tfwd:,.0f} s for the median job")
    assert "Learned from 1 idle fragments that ended and 7 nodes idle now (censored)" in text
    assert f"an idle node expected to stay {h.node_life_s:,.0f} s" in text


def test_per_job_spread_and_median_fragment():
    config = {"tfwd": "auto", "horizon": {"tfwd": 41.0, "fragments": 115181, "nodes": 483, "median_s": 452.7,
                                          "node_life_s": 1370.7, "learned": True,
                                          "jobs": {"A": 12.0, "B": 41.0, "C": 600.0}}}
    assert horizon_text(config) == (
        "Horizon: learned (--tfwd auto), 41 s for the median job, from 12 to 600 s over 3 jobs: how long a "
        "job is expected to keep its nodes before one is reclaimed. Learned from 115,181 idle fragments that "
        "ended and 483 nodes idle now (censored); median fragment 453 s, an idle node expected to stay 1,371 s.")
