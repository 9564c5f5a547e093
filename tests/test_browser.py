"""The dashboard in a real browser: headless Chromium (Debian's, through Playwright) against one
`python -m app` process on the full Summit machine (4,734 nodes), replaying at 300x from
2021-02-10T20:00Z; the ImageNet job set starts arriving at 20:21 sim time (about 4 s wall).

The server runs with `--queue priority`: with the default first-come-first-served queue and at
most 10 running jobs, a job a person registers after 20:21 waits behind every ImageNet job that
arrived before it (measured: about 85 simulated minutes, 17 s wall at 300x). With the priority
queue, the test job (priority 1000) is admitted at the next free slot and, with its steep
curve, takes nodes within a few simulated minutes.

Screenshots of every page go to build/screenshots/<page>.png (docs/screenshot-cluster.png, the
README's, is a copy of one of them made by hand, so a test run leaves the checkout clean).
"""
from __future__ import annotations

import re
import sqlite3
import struct
import time
import uuid
from pathlib import Path

import pytest

from tests.support.browser import SHOTS, login, shoot as take_shot
from tests.support.server import browser_or_skip, password, start_app

sync_api = browser_or_skip()

VIEWPORT = {"width": 1600, "height": 1000}
N_NODES = 4734
SPEED = 300

GRID_JS = "document.querySelector('#grid .js-plotly-plot')"
GRID_READY = f"() => {{ const g = {GRID_JS}; return !!(g && g.data && g.data.length && g.data[0].z); }}"
#: labels of the cells that a job holds (the rest say "idle since …" / "busy since …")
JOB_CELLS_JS = (f"() => {GRID_JS}.data[0].text.flat()"
                ".filter(s => s && !s.startsWith('idle since') && !s.startsWith('busy since'))")
#: a curve far steeper than any ImageNet job's, so the allocator gives it nodes first
FAST_CURVE = "1:100000, 64:6400000"


# ---- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    app = start_app(tmp_path_factory.mktemp("browser"), "--fresh", "--speed", str(SPEED),
                    "--queue", "priority")
    yield app
    rc = app.stop()
    assert rc == 0, app.output()[-3000:]


class Watched:
    """A page plus every failed Dash callback and uncaught page error it saw."""

    def __init__(self, page):
        self.page = page
        self.failures: list[str] = []
        self.network: list[str] = []          # failed or refused requests: shown only beside a failure
        page.on("pageerror", lambda e: self.failures.append(f"page error: {e}"))
        page.on("response", self._response)
        page.on("requestfailed", lambda r: self.network.append(f"request failed: {r.url} ({r.failure})"))

    def _response(self, r) -> None:
        if r.status >= 400:
            self.network.append(f"{r.status} for {r.request.method} {r.url}")
        if "/_dash-update-component" in r.url and r.status >= 400:
            sent = (r.request.post_data or "")[:300]
            self.failures.append(f"callback answered {r.status} (see the server log) to: {sent}")

    def check(self) -> None:
        assert not self.failures, "\n".join(self.failures + self.network)


@pytest.fixture
def anon(browser):
    ctx = browser.new_context(viewport=VIEWPORT)
    w = Watched(ctx.new_page())
    yield w
    ctx.close()
    w.check()


@pytest.fixture(scope="module")
def alice_ctx(browser, server):
    ctx = browser.new_context(viewport=VIEWPORT)
    page = ctx.new_page()
    login(page, server.url, "alice")
    page.close()
    yield ctx
    ctx.close()


@pytest.fixture
def alice(alice_ctx):
    w = Watched(alice_ctx.new_page())
    yield w
    w.page.close()
    w.check()


@pytest.fixture(scope="module")
def api_job(server):
    """A job registered through the API as alice (for the job page)."""
    status, body = server.request("POST", "/api/jobs", {
        "name": "alice-resnet50", "min_nodes": 1, "max_nodes": 64, "total_samples": 1e12,
        "curve": FAST_CURVE, "priority": 1000}, token=server.token("alice"))
    assert status == 201, body
    return body


# ---- helpers ----------------------------------------------------------------------------------
def store_count(db: Path, sql: str, args=()) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql, args).fetchone()[0]
    finally:
        conn.close()


def alice_jobs(server) -> tuple[int, int]:
    """(jobs of alice the API reports, jobs of alice in the store)."""
    status, body = server.get("/api/jobs?owner=alice")
    assert status == 200, body
    return body["count"], store_count(server.db, "select count(*) from jobs where owner = ?", ("alice",))


def sim_now(server) -> float:
    return server.get("/api/health")[1]["time"]


def wait_grid(page) -> None:
    page.wait_for_function(GRID_READY, timeout=20_000)


def grid_cells(page) -> tuple[int, int]:
    """(cells with a value, cells with a hover line) of the heatmap in the page."""
    return page.evaluate(f"""() => {{ const d = {GRID_JS}.data[0];
        return [d.z.flat().filter(v => v !== null && v !== undefined).length,
                d.text.flat().filter(s => !!s).length]; }}""")


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def shoot(page, name: str) -> Path:
    path = take_shot(page, name)
    assert png_size(path) == (VIEWPORT["width"], VIEWPORT["height"])
    return path


def fill_form(page, **values) -> None:
    for field, value in values.items():
        page.fill(f"#job-form-{field}", str(value))


def valid_job(name: str) -> dict:
    return {"name": name, "min_nodes": 1, "max_nodes": 64, "total_samples": "1e12", "curve": FAST_CURVE,
            "priority": 1000}


# ---- 1. the cluster grid ----------------------------------------------------------------------
def test_cluster_grid_has_every_node_and_kpis_move(server, anon):
    page = anon.page
    page.goto(server.url + "/")
    wait_grid(page)
    z, text = grid_cells(page)
    assert z == N_NODES, f"the grid shows {z} cells, the machine has {N_NODES} nodes"
    assert text == N_NODES, f"{text} cells have a hover line, expected {N_NODES}"
    assert server.get("/api/health")[1]["nodes"] == N_NODES

    def read():
        page.wait_for_function("() => (document.querySelector('#kpi-idle')?.innerText || '–') !== '–'", timeout=10_000)
        return {k: page.inner_text(f"#{k}") for k in
                ("kpi-idle", "kpi-harvested", "kpi-rate", "kpi-jobs", "status-bar")}

    first = read()
    assert re.match(r"2021-02-1\d \d\d:\d\d:\d\d UTC", first["status-bar"]), first
    deadline = time.monotonic() + 15
    while True:
        time.sleep(1.5)
        now = read()
        kpis_moved = any(now[k] != first[k] for k in ("kpi-idle", "kpi-harvested", "kpi-rate", "kpi-jobs"))
        if (now["status-bar"] > first["status-bar"] and kpis_moved) or time.monotonic() > deadline:
            break
    assert now["status-bar"][:19] > first["status-bar"][:19], f"sim time did not move: {first} -> {now}"
    assert kpis_moved, f"no KPI changed in 15 s of replay at {SPEED}x: {first} -> {now}"
    # the page kept the whole machine through its patches
    assert tuple(grid_cells(page)) == (N_NODES, N_NODES)


# ---- 2. log in, register through the form, see it in the table and on the grid ----------------
def test_register_through_form_shows_in_table_and_grid(server, alice):
    page = alice.page
    page.goto(server.url + "/jobs")
    page.wait_for_function("() => (document.querySelector('#nav-user')?.innerText || '').includes('alice (user)')",
                           timeout=10_000)
    page.wait_for_selector("#job-form-submit")
    name = f"alice-bert-{uuid.uuid4().hex[:8]}"
    fill_form(page, **valid_job(name))
    page.click("#job-form-submit")
    page.wait_for_function("() => /Registered u-/.test(document.querySelector('#job-form-result')?.innerText || '')",
                           timeout=10_000)
    result = page.inner_text("#job-form-result")
    job_id = re.search(r"(u-[0-9a-f]{8})", result).group(1)
    assert name in result
    t_registered = sim_now(server)
    for f in ("name", "min_nodes", "max_nodes", "total_samples", "curve"):
        assert page.inner_text(f"#job-form-{f}-error") == "", f

    status, job = server.get(f"/api/jobs/{job_id}")
    assert status == 200 and job["owner"] == "alice" and job["name"] == name, job
    assert job["max_nodes"] == 64 and job["total_samples"] == 1e12
    assert store_count(server.db, "select count(*) from jobs where id = ? and owner = 'alice'", (job_id,)) == 1

    # the table: search for the unique name
    page.fill("#jobs-filter-search", name)
    page.press("#jobs-filter-search", "Enter")
    page.wait_for_function(
        f"() => (document.querySelector('#jobs-table')?.innerText || '').includes('{job_id}')", timeout=10_000)
    table = page.inner_text("#jobs-table")
    assert name in table and "alice" in table
    assert page.inner_text("#jobs-count").strip() == "1 job"

    # the grid: within a few simulated minutes, cells say they are held by the job
    page.goto(server.url + "/")
    wait_grid(page)
    held, deadline = [], time.monotonic() + 30
    while not held and time.monotonic() < deadline:
        held = [s for s in page.evaluate(JOB_CELLS_JS) if job_id in s]
        if not held:
            time.sleep(0.5)
    t_seen = sim_now(server)
    info = server.get(f"/api/jobs/{job_id}")[1]
    assert held, (f"no grid cell shows {job_id} after {(t_seen - t_registered) / 60:.0f} simulated minutes; "
                  f"the API says {info['state']} on {info['nodes']} nodes")
    assert all(name in s for s in held)
    # Summit's nodes have 6 GPUs: the hover says so, and what the job holds in all (no ranks run in a replay)
    assert all(re.search(r"<br>6 GPUs · the job: [\d,]+ nodes? × 6 GPUs = [\d,]+ GPUs held$", s) for s in held), held
    assert info["nodes"] > 0, info
    assert t_seen - t_registered < 30 * 60, f"took {(t_seen - t_registered) / 60:.0f} simulated minutes"
    # the legend links the job too
    page.wait_for_selector(f"#legend a[href='/jobs/{job_id}']", timeout=10_000)


# ---- 3. an invalid form stores nothing ---------------------------------------------------------
INVALID = [
    ("min-above-max", {"min_nodes": 10, "max_nodes": 5}, "max_nodes", "at least min nodes"),
    ("negative-min", {"min_nodes": -3}, "min_nodes", "must be at least 1"),
    ("negative-samples", {"total_samples": "-1e6"}, "total_samples", "must be more than 0"),
    ("text-in-min", {"min_nodes": "abc"}, "min_nodes", "must be a whole number, not 'abc'"),
    ("text-in-samples", {"total_samples": "abc"}, "total_samples", "number"),
    ("huge-name", {"name": "x" * 10_000}, "name", "at most 100 characters"),
]


@pytest.mark.parametrize("bad,field,words", [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_form_shows_error_and_stores_nothing(server, alice, bad, field, words):
    page = alice.page
    before = alice_jobs(server)
    page.goto(server.url + "/jobs")
    page.wait_for_selector("#job-form-submit")
    values = {**valid_job(f"bad-{uuid.uuid4().hex[:8]}"), **bad}
    fill_form(page, **values)
    assert page.input_value(f"#job-form-{field}") == str(bad[field])   # the browser kept what was typed
    page.click("#job-form-submit")
    page.wait_for_function(f"() => document.querySelector('#job-form-{field}-error')?.innerText?.length > 0",
                           timeout=10_000)
    err = page.inner_text(f"#job-form-{field}-error")
    assert words in err, err
    # next to the field: visible, in the same form row as the input
    assert page.locator(f"#job-form-{field}-error").is_visible()
    assert page.evaluate(f"() => document.querySelector('#job-form-{field}-error').parentElement"
                         f".contains(document.querySelector('#job-form-{field}'))")
    assert "Nothing was registered" in page.inner_text("#job-form-result")
    for other in ("name", "min_nodes", "max_nodes", "total_samples", "curve"):
        if other != field:
            assert page.inner_text(f"#job-form-{other}-error") == "", (other, page.inner_text(f"#job-form-{other}-error"))
    time.sleep(0.5)
    assert alice_jobs(server) == before, "an invalid form stored a job"


# ---- 4. the job page ---------------------------------------------------------------------------
def test_job_page_draws_curve_and_says_why(server, anon, api_job):
    page = anon.page
    job_id = api_job["id"]
    page.goto(f"{server.url}/jobs/{job_id}")
    page.wait_for_function(
        "() => { const g = document.querySelector('#job-curve .js-plotly-plot');"
        " return !!(g && g.data && g.data.some(t => t.name === 'curve in use')); }", timeout=15_000)
    curve = page.evaluate("() => document.querySelector('#job-curve .js-plotly-plot').data"
                          ".find(t => t.name === 'curve in use')")
    assert len(curve["x"]) > 10 and len(curve["x"]) == len(curve["y"])
    assert max(curve["y"]) == pytest.approx(6_400_000)          # the curve's top point at 64 nodes
    assert curve["y"][0] == 0                                    # 0 nodes: nothing
    assert any(y > 0 for y in curve["y"])
    # the curve is drawn (an SVG path in the plot), not only present as data
    assert page.locator("#job-curve .scatterlayer path.js-line").count() >= 1
    page.wait_for_function("() => document.querySelector('#job-why')?.innerText?.trim().length > 0", timeout=10_000)
    why = page.inner_text("#job-why").strip()
    assert re.match(r"^(queued|waiting|holds|done|failed|cancelled)\b[\w\s,.:;()=%/'-]*$", why), why
    assert "{" not in why and "None" not in why and "Traceback" not in why, why
    head = page.inner_text("#job-head")
    assert job_id in head and api_job["name"] in head
    # what it holds, in nodes and in Summit's 6 GPUs per node
    page.wait_for_function("() => / × 6 GPUs = /.test(document.querySelector('#job-holds')?.innerText || '')",
                           timeout=30_000)
    holds = page.inner_text("#job-holds").strip()
    m = re.fullmatch(r"([\d,]+) nodes? × 6 GPUs = ([\d,]+) GPUs held", holds)
    assert m and 6 * int(m[1].replace(",", "")) == int(m[2].replace(",", "")), holds
    # numbers a person can read: 1e12 samples is "1T" or "1,000G", never "1e+03G"
    facts = head.replace(job_id, "")            # a hex job id may hold "4e3" by chance
    assert not re.search(r"\de[+-]?\d", facts), f"the job's facts print a number in e-notation: {head!r}"


# ---- 5. screenshots ----------------------------------------------------------------------------
def test_screenshots_of_every_page(server, anon, alice, api_job):
    pa = anon.page
    # cluster: once jobs hold nodes (several colours on the grid and in the legend)
    pa.goto(server.url + "/")
    wait_grid(pa)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        held = pa.evaluate(JOB_CELLS_JS)
        jobs = {re.sub(r"\s+since.*$", "", s).removeprefix("rescaling ") for s in held}
        if len(held) >= 50 and len(jobs) >= 3 and pa.locator("#legend a").count() >= 3:
            break
        time.sleep(1)
    assert len(held) >= 50 and len(jobs) >= 3, f"only {len(held)} cells held by {len(jobs)} jobs"
    pa.wait_for_function("() => document.querySelector('#timeline-nodes .js-plotly-plot')?.data?.[0]?.x?.length > 5",
                         timeout=10_000)
    time.sleep(1.2)     # let the last patch paint
    shoot(pa, "cluster")

    p = alice.page
    p.goto(server.url + "/jobs")
    p.wait_for_selector("#job-form-submit")
    p.wait_for_function("() => document.querySelectorAll('#jobs-table tbody tr').length > 5", timeout=10_000)
    shoot(p, "jobs")

    p.goto(f"{server.url}/jobs/{api_job['id']}")
    p.wait_for_function("() => document.querySelector('#job-why')?.innerText?.trim().length > 0"
                        " && document.querySelector('#job-curve .js-plotly-plot')?.data?.length > 0",
                        timeout=15_000)
    time.sleep(0.5)
    shoot(p, "job")

    pa.goto(server.url + "/allocator")
    pa.wait_for_function("() => document.querySelectorAll('#solver-runs tbody tr').length > 2"
                         " && document.querySelectorAll('#event-log tbody tr').length > 2"
                         " && document.querySelector('#solve-hist .js-plotly-plot')?.data?.[0]?.x?.length > 0",
                         timeout=15_000)
    assert pa.inner_text("#horizon").startswith("Horizon: learned (--tfwd auto)")   # the default
    assert pa.inner_text("#objective-hint").startswith("Objective (samples/s): ")    # auto's unit, named
    assert pa.inner_text("#solver-runs tbody tr:nth-child(2) td[data-dash-column=objective]").endswith(" samples/s")
    shoot(pa, "allocator")

    pa.goto(server.url + "/replay")
    pa.wait_for_function("() => document.querySelector('#rp-state')?.innerText?.includes('nodes')", timeout=10_000)
    assert "4,734 nodes" in pa.inner_text("#rp-state")
    shoot(pa, "replay")

    pa.goto(server.url + "/login")
    pa.wait_for_selector("#login-submit")
    shoot(pa, "login")

    for name in ("cluster", "jobs", "job", "allocator", "replay", "login"):
        assert (SHOTS / f"{name}.png").is_file(), name


def test_replay_page_shows_speed_as_speed(server, anon):
    """The speed slider is logarithmic; whatever number the page shows next to it must be the
    speed itself (300x), not its logarithm."""
    page = anon.page
    page.goto(server.url + "/replay")
    page.wait_for_function("() => document.querySelector('#rp-state')?.innerText?.includes('300x')", timeout=10_000)
    shown = [i.input_value() for i in page.locator("#rp-speed input").all() if i.is_visible()]
    for value in shown:
        assert float(value) == pytest.approx(SPEED), (
            f"the replay page shows {value} beside the speed slider ('simulated seconds per wall second'), "
            f"the speed is {SPEED}x")


# ---- 6. anonymous users ------------------------------------------------------------------------
def test_anonymous_cannot_control_or_register(server, anon):
    page = anon.page
    page.goto(server.url + "/replay")
    page.wait_for_selector("#rp-pause")
    for b in ("rp-new", "rp-pause", "rp-resume", "rp-restart", "rp-apply-speed"):
        assert page.locator(f"#{b}").is_disabled(), f"#{b} is enabled for an anonymous user"
    assert "Log in as staff" in page.inner_text("#rp-result")
    page.wait_for_function("() => (document.querySelector('#nav-user')?.innerText || '').includes('Log in')",
                           timeout=10_000)

    page.goto(server.url + "/jobs")
    page.wait_for_selector("#jobs-table")
    main = page.inner_text("main")
    assert "Log in to register a job" in main
    assert page.locator("#job-form-submit").count() == 0
    assert page.locator("#job-form-name").count() == 0
    assert page.locator("main a[href='/login']").count() >= 1

    # a wrong password does not log anyone in
    page.goto(server.url + "/login")
    page.fill("#login-user", "alice")
    page.fill("#login-password", "not-" + password("alice"))
    page.click("#login-submit")
    page.wait_for_function("() => (document.querySelector('#login-result')?.innerText || '').includes('Wrong')",
                           timeout=10_000)
    page.goto(server.url + "/jobs")
    page.wait_for_selector("#jobs-table")
    assert page.locator("#job-form-submit").count() == 0
