"""The pages as a newcomer reads them (issue 50, item 6), in headless Chromium: the scaling
curve's legend off its axis titles at any width (drawn with the dashboard's plotly.js, no
server), then against `python -m app --curves learned --max-jobs 2` at 600x: the Cluster page
says why idle nodes sit unused, the Allocator page opens in plain words with an info badge that
renders, a probing job's chart keeps its legend clear, and the log has no APScheduler skip lines.
Screenshots go to build/screenshots/newcomer-*.png (look at them)."""
from __future__ import annotations

import re
import time

import pytest

from app.curve import given_figure, learned_figure
from tests.support.browser import shoot
from tests.support.plotly_render import draw, overlap
from tests.support.server import browser_or_skip, start_app
from tests.support.sim import job

sync_api = browser_or_skip()

VIEWPORT = {"width": 1600, "height": 1000}
CURVE_JS = "document.querySelector('#job-curve .js-plotly-plot')"


def probing_profile() -> dict:
    """A profile as the JPA serves it while it probes 38 nodes: six legend entries."""
    ns = list(range(1, 65))
    mean = [2800.0 * n / (1 + 0.003 * (n - 1)) for n in ns]
    return {"fit": {"nodes": ns, "mean": mean, "lo": [m * 0.95 for m in mean], "hi": [m * 1.05 for m in mean]},
            "measured": [{"nodes": n, "samples_per_second": 2800.0 * n, "weight": 3.0, "sd_pct": 2.0}
                         for n in (1, 3, 4, 6, 10)],
            "given": {"nodes": [1, 8, 32], "samples_per_second": [2700.0, 21000.0, 80000.0]},
            "probes": [{"nodes": n, "time": 1613000000.0 + n, "why": f"probe at {n} nodes", "kind": "probe"}
                       for n in (4, 10)],
            "probing": True, "cap": 17, "size": 38}


def clashes(parts: dict) -> list[str]:
    """What the legend overlaps: axis titles, tick labels, the chart's title or the plot area."""
    legend = parts["legend"][0]
    return [k for k in ("xtitle", "ytitle", "title", "xticks", "plot") for box in parts[k] if overlap(legend, box)]


@pytest.mark.parametrize("width", [300, 420, 520, 760])
def test_the_curve_legend_overlaps_no_axis_title_at_any_width(browser, width):
    page = browser.new_page(viewport=VIEWPORT)
    j = job("J", lo=1, hi=64, curve=((1, 64), (2800.0, 150000.0)))
    learned = learned_figure(j, {"nodes": 38}, probing_profile())
    assert any("(probing)" in t["name"] for t in learned["data"])
    given = given_figure(j, {"nodes": 38}, [{"nodes": n, "samples_per_second": 2800.0 * n} for n in (1, 3, 4)])
    for fig in (learned, given):
        parts = draw(page, fig, width)
        assert parts["legend"] and parts["xtitle"] and parts["ytitle"], parts
        assert clashes(parts) == [], (width, parts)
    page.close()


# ---- against a real server ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    app = start_app(tmp_path_factory.mktemp("newcomer"), "--fresh", "--curves", "learned", "--max-jobs", "2",
                    "--start", "2021-02-10T20:20:00Z", "--speed", "600")
    yield app
    assert app.stop() == 0, app.output()[-3000:]


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport=VIEWPORT)
    pg = ctx.new_page()
    yield pg
    ctx.close()


def test_the_cluster_page_says_why_idle_nodes_sit_unused(server, page):
    page.goto(server.url + "/")
    page.wait_for_function("() => (document.querySelector('#held-back')?.innerText || '').includes('--max-jobs 2')",
                           timeout=60_000)
    text = page.inner_text("#held-back")
    assert re.fullmatch(r"[\d,]+ idle nodes? unused while [\d,]+ jobs? waits?: at most 2 jobs run at once "
                        r"\(--max-jobs 2\)\. A higher --max-jobs would start more\.", text), text
    assert page.locator("#held-back").is_visible()
    time.sleep(1)
    shoot(page, "newcomer-cluster")


def test_the_allocator_page_opens_in_plain_words_and_its_badge_renders(server, page):
    page.goto(server.url + "/allocator")
    page.wait_for_function("() => (document.querySelector('#horizon-plain')?.innerText || '')"
                           ".startsWith('Jobs change size when the change pays off within')", timeout=30_000)
    first = page.evaluate("() => [...document.querySelectorAll('#_pages_content p, .page p')].map(p => p.id)")
    assert first.index("horizon-plain") < first.index("horizon"), first
    header = page.locator('#solver-runs th[data-dash-column="objective"]')
    header.wait_for(timeout=15_000)
    assert "\u24d8" not in page.inner_text("#solver-runs")
    badge = page.evaluate("""() => { const e = document.querySelector(
        '#solver-runs th[data-dash-column="objective"] .column-header-name');
        const s = getComputedStyle(e, '::after'); return [s.content, s.width, s.borderRadius]; }""")
    assert badge == ['"i"', "13px", "50%"], badge
    page.wait_for_function("() => document.querySelector('#solve-hist .js-plotly-plot')?.data?.length > 0",
                           timeout=30_000)
    top = page.evaluate("() => document.querySelector('#solve-hist .js-plotly-plot').layout.xaxis.range[1]")
    assert top > 0
    time.sleep(1)
    shoot(page, "newcomer-allocator", full=True)


def _probing_jobs(server):
    """Running jobs the profiler is probing now (each is, for a few seconds of wall time at 600x)."""
    for j in server.get("/api/jobs")[1]["jobs"]:
        if j["state"] == "running" and j["nodes"]:
            p = server.get(f"/api/jobs/{j['id']}")[1].get("profile")
            if p and p.get("probing"):
                yield j["id"]


LEGEND_PARTS_JS = f"""() => {{
    const g = {CURVE_JS}, box = sel => [...g.querySelectorAll(sel)].map(e => {{
        const r = e.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; }})
        .filter(b => b[2] > 0 && b[3] > 0);
    return {{legend: box('.legend .bg'), xtitle: box('.g-xtitle text'), ytitle: box('.g-ytitle text'),
             title: box('.g-gtitle text'), xticks: box('.xaxislayer-above .xtick text'), plot: box('.nsewdrag')}};
}}"""


def test_a_probing_jobs_legend_stays_off_the_nodes_axis_title(server, page):
    """The page of a job while it probes, its legend with the "now: N nodes (probing)" entry. The
    replay is paused once a job probes (a probe lasts a few seconds of wall time at 600x), so the
    page is drawn while it still does."""
    staff = server.token("staff1")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for job_id in _probing_jobs(server):
            assert server.request("POST", "/api/replay/pause", token=staff)[0] == 200
            try:
                if not any(j == job_id for j in _probing_jobs(server)):
                    continue        # it stopped probing before the pause: another one
                page.goto(f"{server.url}/jobs/{job_id}")
                page.wait_for_function(f"() => !!{CURVE_JS}?.data?.some(t => (t.name || '').endsWith('(probing)'))",
                                       timeout=15_000)
                parts = page.evaluate(LEGEND_PARTS_JS)
                assert parts["legend"] and parts["xtitle"], parts
                assert clashes(parts) == [], parts
                shoot(page, "newcomer-job-probing", full=True)
                return
            finally:
                assert server.request("POST", "/api/replay/resume", token=staff)[0] == 200
        time.sleep(0.3)
    raise AssertionError("no job probed within 120 s")


def test_the_log_has_no_skipped_tick_lines(server):
    time.sleep(2)
    assert "maximum number of running instances" not in server.output()
    assert ("harvest_ticks_skipped_total", ()) in server.metrics()
