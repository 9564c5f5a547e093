"""What the profiler learned, in a real browser: headless Chromium (Debian's, through Playwright)
against `python -m app --curves learned`, the Summit trace from 2021-02-10T20:20Z at 600x, so
that the ImageNet job set's first jobs are measured and probed within seconds of wall time.

The job page of a probed job draws the fit's band, the measured points and the evidence cap,
says what was learned in a line, and lists the probes; the jobs table has a curve column that
filters; the grid's legend explains the probing shade. Screenshots go to
build/screenshots/profile-*.png.
"""
from __future__ import annotations

import re
import time

import pytest

from app.grid import N_CODES, PROBE_COLOURS
from tests.support.browser import shoot
from tests.support.server import browser_or_skip, start_app

sync_api = browser_or_skip()

VIEWPORT = {"width": 1600, "height": 1000}
WORDS = ("prior", "given", "low", "medium", "high")
CURVE_JS = "document.querySelector('#job-curve .js-plotly-plot')"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    app = start_app(tmp_path_factory.mktemp("profile-browser"), "--fresh", "--curves", "learned",
                    "--start", "2021-02-10T20:20:00Z", "--speed", "600")
    yield app
    assert app.stop() == 0, app.output()[-3000:]


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport=VIEWPORT)
    pg = ctx.new_page()
    failures: list[str] = []
    pg.on("pageerror", lambda e: failures.append(f"page error: {e}"))
    pg.on("response", lambda r: failures.append(f"callback answered {r.status}")
          if "/_dash-update-component" in r.url and r.status >= 400 else None)
    yield pg
    ctx.close()
    assert not failures, "\n".join(failures)


def probed_job(server, timeout: float = 40) -> tuple[str, dict]:
    """A job the profiler has probed and measured at two sizes or more, with its profile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for j in server.get("/api/jobs")[1]["jobs"]:
            if j["start_time"] is None:
                continue
            p = server.get(f"/api/jobs/{j['id']}")[1]["profile"]
            if p and any(x["kind"] != "try" for x in p["probes"]) and len(p["measured"]) >= 2:
                return j["id"], p
        time.sleep(0.5)
    raise AssertionError(f"no job was probed and measured within {timeout} s:\n{server.output()[-2000:]}")


def test_job_page_draws_what_the_profiler_learned(server, page):
    job_id, profile = probed_job(server)
    page.goto(f"{server.url}/jobs/{job_id}")
    page.wait_for_function(f"() => !!{CURVE_JS}?.data?.some(t => t.name === 'fit band (±2 sd, ~95 %)')", timeout=15_000)
    data = page.evaluate(f"() => {CURVE_JS}.data.map(t => ({{name: t.name, x: t.x, y: t.y, fill: t.fill}}))")
    by_name = {t["name"]: t for t in data}
    band, fit = by_name["fit band (±2 sd, ~95 %)"], by_name["fit (in use up to the cap)"]
    assert band["fill"] == "tonexty" and len(band["x"]) == len(fit["x"]) >= 2
    lows = data[[t["name"] for t in data].index("fit band (±2 sd, ~95 %)") - 1]["y"]
    assert all(lo <= hi for lo, hi in zip(lows, band["y"]))
    measured = by_name["measured"]
    assert len(measured["x"]) >= len(profile["measured"]) >= 2
    assert all(y > 0 for y in measured["y"])
    assert by_name["probes"]["x"], "the probes are marked on the chart"
    # drawn, not only present as data: a filled band, the fit's line, the points
    assert page.locator("#job-curve .scatterlayer path.js-fill").count() >= 1
    assert page.locator("#job-curve .scatterlayer path.js-line").count() >= 1
    assert page.locator("#job-curve .scatterlayer .points path.point").count() >= len(profile["measured"])
    assert re.search(r"evidence cap \d+", page.inner_text("#job-curve"))

    page.wait_for_function("() => (document.querySelector('#job-profile')?.innerText || '').includes('confidence')",
                           timeout=10_000)
    line = page.inner_text("#job-profile")
    assert re.search(r"learned rescale cost: grow [\d.]+ s \(.*\), shrink [\d.]+ s", line), line
    assert "USL model: σ" in line and "κ" in line and "fastest at" in line, line
    assert re.search(r"confidence (low|medium|high)", line), line
    assert "nan" not in line.lower() and "None" not in line, line

    page.wait_for_function("() => document.querySelectorAll('#job-probes tbody tr td').length > 0", timeout=10_000)
    assert re.match(r"Probes and untried sizes \(\d+\)", page.inner_text("#job-probes-title"))
    rows = page.locator("#job-probes tbody tr").all_inner_texts()
    cells = [r for r in rows if r.strip() and "why" not in r]
    assert cells, rows
    assert any(re.search(r"2021-02-1\d \d\d:\d\d:\d\d UTC\s+\d+\s+\w+", r) for r in cells), cells
    assert all(re.search(r"\t(probe|climb past the cap|back after a probe|allocator's choice)\t", r)
               for r in cells), cells
    forced = [x for x in profile["probes"] if x["kind"] != "try"]    # may be on a later page of the table
    assert forced and all(x["why"].startswith(("probe at", "back to", "climb to")) for x in forced), forced
    time.sleep(0.5)
    shoot(page, "profile-job", full=True)


def test_jobs_table_has_a_curve_column_that_filters(server, page):
    probed_job(server)
    page.goto(server.url + "/jobs")
    page.wait_for_function("() => document.querySelectorAll('#jobs-table tbody tr').length > 5", timeout=15_000)
    headers = [h.strip() for h in page.locator("#jobs-table th").all_inner_texts()]
    assert "curve" in headers, headers
    col = headers.index("curve")

    def column() -> list[str]:
        return page.evaluate(f"""() => [...document.querySelectorAll('#jobs-table tbody tr')]
            .map(r => r.querySelectorAll('td')[{col}]).filter(Boolean).map(td => td.innerText.trim())""")
    words = column()
    assert words and set(words) <= set(WORDS), words
    # keep only the jobs of one measured word (the newest jobs, first here, are mostly queued)
    measured = [j["confidence"] for j in server.get("/api/jobs")[1]["jobs"] if j["confidence"] in WORDS[2:]]
    word = max(set(measured), key=measured.count)
    page.click("#jobs-filter-curve")
    page.get_by_text(f"curve: {word}", exact=True).click()
    page.keyboard.press("Escape")
    page.wait_for_function(f"""() => {{ const rows = [...document.querySelectorAll('#jobs-table tbody tr')]
        .map(r => r.querySelectorAll('td')[{col}]).filter(Boolean);
        return rows.length > 0 && rows.every(td => td.innerText.trim() === '{word}'); }}""", timeout=10_000)
    count = page.inner_text("#jobs-count")
    assert re.match(r"[\d,]+ jobs?$", count), count
    shoot(page, "profile-jobs")


def test_grid_legend_explains_the_probing_shade(server, page):
    page.goto(server.url + "/")
    page.wait_for_function("() => !!document.querySelector('#grid .js-plotly-plot')?.data?.[0]?.z", timeout=20_000)
    page.wait_for_selector("#legend-probing", timeout=10_000)
    assert "probing" in page.inner_text("#legend-probing")
    assert page.locator("#legend-probing .swatch").is_visible()
    # the probing shades are in the grid's colour scale: a probing cell has a colour of its own
    scale = page.evaluate("() => document.querySelector('#grid .js-plotly-plot').data[0].colorscale")
    assert len(scale) == 2 * N_CODES and {c for _, c in scale} >= set(PROBE_COLOURS)
    shoot(page, "profile-cluster")
