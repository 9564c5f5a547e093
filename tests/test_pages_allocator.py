"""The allocator page (app/pages/allocator.py): the horizon in use and what it was learned from,
and the unit of the solver runs' objective."""
from __future__ import annotations

import dash
import pytest

from core.clock import SimClock
from core.controller import Controller
from core.controller_config import ControllerConfig
from core.dispatchers.simulated import SimulatedDispatcher
from core.model import Event, EventKind
from tests.support.files import ROOT
from tests.support.sim import job

dash.Dash(__name__, use_pages=True, pages_folder=str(ROOT / "app" / "pages"))
from app.pages.allocator import horizon_text, objective_text  # noqa: E402  (a page registers itself on import)


def test_a_fixed_tfwd_says_so():
    assert horizon_text({"tfwd": 60.0, "horizon": {"tfwd": 60.0, "learned": False}}).startswith(
        "Horizon: T_fwd 60 s, fixed")


@pytest.mark.parametrize("tfwd, unit, value", [("auto", "samples/s", 650.0), (60.0, "samples", 60 * 650.0)])
def test_the_objective_is_named_in_the_unit_the_controller_computes_it_in(tfwd, unit, value):
    """One job starting on 8 idle nodes (a start pays no pause): under --tfwd auto the objective
    is its throughput in samples/s, with a fixed T_fwd the samples it trains over T_fwd."""
    nodes = [f"a01n{i:02d}" for i in range(1, 9)]
    ctl = Controller(SimulatedDispatcher(), SimClock(1_700_000_000.0), ControllerConfig(tfwd=tfwd), None, nodes)
    ctl.start(nodes)
    ctl.submit(job("J", hi=8, curve=((1, 2, 4, 8), (100.0, 190.0, 350.0, 650.0))))
    ctl.step()
    assert ctl.last_plan.sizes == {"J": 8} and ctl.last_plan.objective == pytest.approx(value)
    shown, hint = objective_text(ctl.snapshot("running", 1).config)
    assert shown == unit and hint.startswith(f"Objective ({unit}): ")
    assert ("horizon" in hint) == (tfwd == "auto") and ("T_fwd" in hint) == (tfwd != "auto")


def test_a_weighted_objective_says_so():
    unit, hint = objective_text({"tfwd": "auto", "objective": "priority"})
    assert unit == "weighted samples/s" and "weighted by its priority" in hint
    unit, hint = objective_text({"tfwd": 10.0, "objective": "efficiency"})
    assert unit == "weighted samples" and "throughput on one node" in hint


def test_the_learned_horizon_comes_from_a_real_controller():
    """The snapshot a controller with --tfwd auto publishes: first the fallback, then (once
    enough allocations have changed) the median stand, and what placement learned from."""
    nodes = [f"a01n{i:02d}" for i in range(1, 9)]
    t0 = 1_700_000_000.0
    clock = SimClock(t0)
    ctl = Controller(SimulatedDispatcher(), clock, ControllerConfig(tfwd="auto"), None, nodes)
    ctl.start(nodes)
    ctl.submit(job("J", hi=8, curve=((1, 2, 4, 8), (100.0, 190.0, 350.0, 650.0))))
    ctl.step()
    text = horizon_text(ctl.snapshot("running", 1).config)
    assert text == ("Horizon: learned (--tfwd auto); 10 s until 5 allocations have changed (0 so far). "
                    "Placement: 0 idle fragments ended, 8 nodes idle now. The main scheduler's order within a "
                    "cohort is not known yet (no reclaim has taken part of a cohort yet), so jobs fill from its "
                    "first node.")
    for k in range(1, 6):
        clock.advance_to(t0 + 300 * k)
        ctl.step([Event(t0 + 300 * k, EventKind.NODE_LEAVE, node=ctl.held["J"][0])])
        if k == 2:        # 300, 300 ended, J's allocation standing 0 s: the bound is their median
            assert horizon_text(ctl.snapshot("running", 2).config).startswith(
                f"Horizon: learned (--tfwd auto), at least {ctl.horizon.tfwd:,.0f} s so far: the median time an "
                f"allocation stands, each of the 1 standing now counted as if it changed now; 2 have changed")
            assert 250.0 < ctl.horizon.tfwd < 350.0
    h = ctl.horizon
    text = horizon_text(ctl.snapshot("running", 2).config)
    assert h.learned and text.startswith(
        f"Horizon: learned (--tfwd auto), {h.tfwd:,.0f} s: the median time a job's allocation stands before "
        f"it changes, from 5 that changed and 1 standing now (censored). Placement: 5 idle fragments ended, "
        f"3 nodes idle now; median fragment")
    assert f"an idle node expected to stay {h.node_life_s:,.0f} s" in text


def test_what_the_learned_horizon_says():
    config = {"tfwd": "auto", "horizon": {"tfwd": 71.0, "fragments": 115181, "nodes": 483, "median_s": 452.7,
                                          "node_life_s": 1370.7, "learned": True, "stands": 3012, "standing": 10,
                                          "jobs": {"A": 71.0, "B": 71.0}}}
    assert horizon_text(config) == (
        "Horizon: learned (--tfwd auto), 71 s: the median time a job's allocation stands before it changes, "
        "from 3,012 that changed and 10 standing now (censored). Placement: 115,181 idle fragments ended, "
        "483 nodes idle now; median fragment 453 s, an idle node expected to stay 1,371 s. The main scheduler's "
        "order within a cohort is not known yet (no reclaim has taken part of a cohort yet), so jobs fill from its "
        "first node.")


def test_what_the_horizon_says_before_enough_allocations_have_changed():
    config = {"tfwd": "auto", "horizon": {"tfwd": 612.4, "fragments": 0, "nodes": 16, "median_s": None,
                                          "node_life_s": None, "learned": False, "bound": True, "stands": 2,
                                          "standing": 3, "jobs": {}}}
    assert horizon_text(config).startswith(
        "Horizon: learned (--tfwd auto), at least 612 s so far: the median time an allocation stands, each of the 3 "
        "standing now counted as if it changed now; 2 have changed (the median itself is used once 5 have and "
        "it lies within what has been seen). Placement: 0 idle fragments ended, 16 nodes idle now.")


def test_what_the_learned_order_says():
    """Which end of a cohort placement fills from, in the scheduler's order learned so far."""
    fixed = {"tfwd": 60.0, "horizon": {"tfwd": 60.0, "learned": False}}
    first = {**fixed, "reclaim_order": {"direction": 1, "reclaims": 9469, "mean_position": 0.25}}
    assert horizon_text(first).endswith(
        "The main scheduler takes a cohort's first nodes first (9,469 reclaims took part of a cohort, the nodes "
        "taken at 0.25 of it on average; 0 is its first node, 1 its last), so jobs fill from its last node.")
    last = {**fixed, "reclaim_order": {"direction": -1, "reclaims": 40, "mean_position": 0.8}}
    assert horizon_text(last).endswith("takes a cohort's last nodes first (40 reclaims took part of a cohort, the "
                                       "nodes taken at 0.80 of it on average; 0 is its first node, 1 its last), so "
                                       "jobs fill from its first node.")
    unsure = {**fixed, "reclaim_order": {"direction": 0, "reclaims": 7, "mean_position": 0.3}}
    assert horizon_text(unsure).endswith(
        "not known yet (7 reclaims took part of a cohort, the nodes taken at 0.30 of it on average), so jobs fill "
        "from its first node.")
