"""The pages as a newcomer reads them (issue 50, item 6): idle nodes held back by --max-jobs said
in words, the allocator's horizon in a plain sentence first, a solve-time histogram that fits
its data, an info badge that renders, job colours apart from the state colours, a curve chart
whose legend stays off its axis titles, a word for a swap, and no APScheduler skip chatter."""
from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import dash
import pytest
from apscheduler.schedulers.background import BackgroundScheduler

from app import logs
from app.capacity import held_back
from app.format import rescale_words
from app.grid import BUSY_COLOUR, IDLE_COLOUR, JOB_COLOURS, PROBE_COLOURS, RESCALE_COLOUR
from core.clock import SimClock
from core.controller import Controller
from core.controller_config import ControllerConfig
from core.dispatchers.simulated import SimulatedDispatcher
from tests.support.colour import delta_e2000, lab
from tests.support.files import ROOT
from tests.support.sim import job

dash.Dash(__name__, use_pages=True, pages_folder=str(ROOT / "app" / "pages"))
from app.pages.allocator import layout as allocator_layout, plain_horizon, solve_figure  # noqa: E402
from app.pages.job import job_log  # noqa: E402


# ---- 1: idle nodes unused because of --max-jobs ------------------------------------------------
def _snapshot(max_jobs: int, jobs: int, nodes: int = 40, hi: int = 4, visitor_slots: int = 0, owner=None):
    names = [f"a{1 + i // 18:02d}n{1 + i % 18:02d}" for i in range(nodes)]
    ctl = Controller(SimulatedDispatcher(), SimClock(1_700_000_000.0),
                     ControllerConfig(tfwd=10.0, max_jobs=max_jobs, visitor_slots=visitor_slots), None, names)
    ctl.start(names)
    for k in range(jobs):
        j = job(f"J{k}", hi=hi, curve=((1, 2, 4), (100.0, 190.0, 350.0)))
        j.owner = owner
        ctl.submit(j)
    ctl.step()
    return ctl.snapshot("running", 1)


def test_idle_nodes_held_back_by_max_jobs_are_said_in_words():
    """2 jobs of at most 4 nodes run on 40 idle nodes, 3 wait: 32 nodes sit idle because of the limit."""
    text = held_back(_snapshot(max_jobs=2, jobs=5))
    assert text == ("32 idle nodes unused while 3 jobs wait: at most 2 jobs run at once (--max-jobs 2). "
                    "A higher --max-jobs would start more.")


@pytest.mark.parametrize("max_jobs, jobs, nodes", [(10, 5, 40), (2, 2, 40), (2, 12, 8)],
                         ids=["slots free", "nothing queued", "no idle node unused"])
def test_nothing_is_said_when_the_limit_holds_nothing_back(max_jobs, jobs, nodes):
    assert held_back(_snapshot(max_jobs=max_jobs, jobs=jobs, nodes=nodes)) == ""


def test_the_demo_lane_is_named_only_when_a_registered_job_waits_for_it():
    text = held_back(_snapshot(max_jobs=2, jobs=5, visitor_slots=2))
    assert text.startswith("32 idle nodes unused while 3 jobs wait: at most 2 jobs run at once (--max-jobs 2). ")


def test_a_full_lane_says_so_too():
    """Registered jobs have --visitor-slots more: with the lane full too, it says both limits."""
    text = held_back(_snapshot(max_jobs=1, jobs=4, visitor_slots=1, owner="alice"))
    assert text.startswith("32 idle nodes unused while 2 jobs wait: at most 1 job runs at once (--max-jobs 1), "
                           "1 more for registered jobs (--visitor-slots 1)"), text


# ---- 2: the allocator page opens in plain words ------------------------------------------------
def test_the_allocator_page_opens_with_the_horizon_in_plain_words():
    learned = {"tfwd": "auto", "horizon": {"tfwd": 71.4, "learned": True, "stands": 817, "standing": 10}}
    assert plain_horizon(learned).startswith(
        "Jobs change size when the change pays off within ~71 s, the time allocations usually stand. ")
    assert plain_horizon({"tfwd": 60.0}).startswith("Jobs change size when the change pays off within 60 s, a fixed")
    early = plain_horizon({"tfwd": "auto", "horizon": {"tfwd": 10.0, "learned": False, "stands": 2}})
    assert early.startswith("Jobs change size when the change pays off within 10 s for now"), early
    bound = plain_horizon({"tfwd": "auto", "horizon": {"tfwd": 240.0, "learned": False, "bound": True}})
    assert "~240 s" in bound and "still learning" in bound
    first = [c.id for c in allocator_layout().children if getattr(c, "id", None)][:2]
    assert first == ["horizon-plain", "horizon"], "the plain sentence comes before the technical account"


# ---- 3: the solve-time histogram fits its data --------------------------------------------------
def test_solve_time_axis_fits_the_solves_not_the_slowest_one():
    """990 solves under 5 ms and 10 at 100 ms: the axis ends at 10 ms, the slow ones in the last bar, said."""
    times = [0.5 + 4.5 * k / 989 for k in range(990)] + [100.0] * 10
    fig = solve_figure(times)
    top = fig["layout"]["xaxis"]["range"][1]
    assert 5 < top <= 10, top
    bars = fig["data"][0]
    assert sum(bars["y"]) == 1000 and bars["y"][-1] == 10
    assert sum(1 for x, y in zip(bars["x"], bars["y"]) if y and x < 5) >= 10, "the fast solves spread over bars"
    assert "10 slower than 10 ms, up to 100 ms, in the last bar" in fig["layout"]["title"]["text"]
    even = solve_figure([float(k) for k in range(1, 101)])
    assert even["layout"]["xaxis"]["range"][1] == 100 and "slower" not in even["layout"]["title"]["text"]


# ---- 4: no glyph that the fonts lack -----------------------------------------------------------
def test_no_circled_i_anywhere_in_the_pages():
    """ⓘ (U+24D8) shows as an empty box in Chromium without a font that has it: a CSS badge instead."""
    files = [*(ROOT / "app").rglob("*.py"), *(ROOT / "assets").glob("*")]
    assert [str(f) for f in files if "\u24d8" in f.read_text(encoding="utf-8")] == []
    css = (ROOT / "assets" / "style.css").read_text()
    assert re.search(r'th\[data-dash-column="objective"\] \.column-header-name::after \{ content: "i"; \}', css)


# ---- 5: job colours apart from the state colours -----------------------------------------------
#: CIEDE2000 below which two colours in small grid cells are easily taken for each other
APART, SHADE_APART = 25.0, 18.0


@pytest.mark.parametrize("state", [BUSY_COLOUR, IDLE_COLOUR, RESCALE_COLOUR, "#ffffff"],
                         ids=["busy", "idle", "rescaling", "gap"])
def test_no_job_colour_or_probing_shade_is_close_to_a_state_colour(state):
    near = [(c, round(delta_e2000(c, state), 1)) for c in JOB_COLOURS if delta_e2000(c, state) < APART]
    assert near == []
    shades = [(c, round(delta_e2000(c, state), 1)) for c in PROBE_COLOURS if delta_e2000(c, state) < SHADE_APART]
    assert shades == []


def test_no_job_colour_is_near_black_and_the_old_navy_would_fail():
    """A near-black cell (navy, maroon) reads as busy whatever its hue."""
    assert min(lab(c)[0] for c in JOB_COLOURS) >= 30
    assert delta_e2000("#000075", "#4c566a") < APART, "the check catches the colour the issue named"
    assert all(delta_e2000(a, b) >= 15 for i, a in enumerate(JOB_COLOURS) for b in JOB_COLOURS[i + 1:])


# ---- 7: a word for a swap ------------------------------------------------------------------------
@pytest.mark.parametrize("before, after, added, removed, words", [
    (8, 32, 32, 8, "8 → 32 nodes: 24 more, 8 swapped for others"),
    (1, 17, 17, 1, "1 → 17 nodes: 16 more, 1 swapped for another"),
    (32, 8, 2, 26, "32 → 8 nodes: 24 fewer, 2 swapped for others"),
    (8, 8, 3, 3, "8 → 8 nodes: 3 swapped for others"),
    (6, 38, 32, 0, "6 → 38 nodes"),
    (38, 1, 0, 37, "38 → 1 node"),
])
def test_a_step_that_both_takes_and_gives_back_nodes_is_named(before, after, added, removed, words):
    assert rescale_words(before, after, added, removed) == words


def test_the_job_events_name_the_swap():
    alloc = {"time": 1_613_000_000.0, "reason": "grow", "from_nodes": 8, "to_nodes": 32,
             "added": str([f"h{k:02d}n01" for k in range(32)]).replace("'", '"'),
             "removed": str([f"b{k:02d}n01" for k in range(8)]).replace("'", '"')}
    row = job_log([], [alloc])[0]
    assert row["node"].startswith("+32: h00n01") and "; −8: b00n01" in row["node"]
    assert row["detail"] == "8 → 32 nodes: 24 more, 8 swapped for others"


# ---- 8: no APScheduler skip chatter --------------------------------------------------------------
@pytest.fixture
def root_logging():
    """logs.setup changes the root logger: put it back after the test."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def _slow_ticks(seconds: float = 1.6) -> None:
    """An interval job that takes longer than its interval, as a slow step does at a high speed."""
    scheduler = BackgroundScheduler(daemon=True)
    scheduler.add_job(lambda: time.sleep(0.35), "interval", seconds=0.1, max_instances=1, coalesce=True)
    scheduler.start()
    time.sleep(seconds)
    scheduler.shutdown(wait=True)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_skipped_tick_is_counted_not_logged(capsys, root_logging, fmt):
    logs.setup(fmt, "info")
    before = logs.skipped_ticks.count
    _slow_ticks()
    logging.getLogger("apscheduler.scheduler").warning("a real scheduler warning still shows")
    err = capsys.readouterr().err
    assert logs.skipped_ticks.count > before, "the slow job was skipped at least once"
    assert "maximum number of running instances" not in err
    assert "a real scheduler warning still shows" in err


def test_at_debug_a_skipped_tick_is_written_as_debug(capsys, root_logging):
    logs.setup("text", "debug")
    _slow_ticks(1.0)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "maximum number of running instances" in ln]
    assert lines and all(" DEBUG apscheduler.scheduler: " in ln for ln in lines), lines[:3]


# ---- docs: backups point to the tool -------------------------------------------------------------
def test_the_backup_page_gives_the_backup_command():
    text = (ROOT / "docs" / "operators" / "backups.md").read_text()
    assert "python -m core.backup harvest.db" in text and "import sqlite3" not in text
