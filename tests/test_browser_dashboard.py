"""The dashboard as the people in front of it meet it (issue 19), in headless Chromium against one
`python -m app` replay of the full Summit machine at 300x: a Replay form that never loses the run,
charts that say "no data yet" instead of empty axes, the jobs page opening on running jobs.

Screenshots go to build/screenshots/ (look at them: the pages must read well)."""
from __future__ import annotations

import re
import time

import pytest

from tests.support.browser import login, shoot
from tests.support.server import browser_or_skip, start_app

sync_api = browser_or_skip()

VIEWPORT = {"width": 1600, "height": 1000}
SPEED = 300


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    app = start_app(tmp_path_factory.mktemp("dashboard"), "--fresh", "--speed", str(SPEED))
    yield app
    rc = app.stop()
    assert rc == 0, app.output()[-3000:]


@pytest.fixture(scope="module")
def staff(browser, server):
    """A page logged in as staff1, with every dialog it was shown (and whether it was accepted)."""
    ctx = browser.new_context(viewport=VIEWPORT)
    page = ctx.new_page()
    page.dialogs = []
    page.accept_dialogs = False

    def on_dialog(d):
        page.dialogs.append(d.message)
        d.accept() if page.accept_dialogs else d.dismiss()
    page.on("dialog", on_dialog)
    login(page, server.url, "staff1")
    yield page
    ctx.close()


def health(server) -> dict:
    status, body = server.get("/api/health")
    assert status == 200, body
    return body


def open_replay(page, server) -> None:
    page.goto(server.url + "/replay")
    page.wait_for_function("() => document.querySelector('#rp-state')?.innerText?.includes('nodes')",
                           timeout=15_000)


# ---- item 0: the Replay form never loses the run ------------------------------------------------
BAD = [("hours", "#rp-hours", "-2", "more than 0 hours"),
       ("nodes", "#rp-nodes", "0", "whole number of at least 1"),
       ("racks", "#rp-racks", "zz99", "no such rack: zz99"),
       ("start", "#rp-start", "yesterday", "a date and time such as 2021-02-10T20:00:00Z")]


@pytest.mark.parametrize("field,selector,value,words", BAD, ids=[b[0] for b in BAD])
def test_bad_replay_input_is_a_field_error_and_the_run_goes_on(server, staff, field, selector, value, words):
    before = health(server)
    open_replay(staff, server)
    staff.fill(selector, value)
    staff.dialogs.clear()
    staff.click("#rp-new")
    staff.wait_for_function(f"() => document.querySelector('#rp-{field}-error')?.innerText?.length > 0",
                            timeout=15_000)
    assert words in staff.inner_text(f"#rp-{field}-error")
    assert "Not started" in staff.inner_text("#rp-result")
    for other in ("start", "hours", "nodes", "racks", "gpus", "tfwd", "speed"):
        if other != field:
            assert staff.inner_text(f"#rp-{other}-error") == "", other
    shoot(staff, f"dashboard-replay-error-{field}", full=True)
    time.sleep(1.5)
    after = health(server)
    assert not staff.dialogs, f"a refused run still asked for confirmation: {staff.dialogs}"
    assert after["status"] == "ok" and after["replay"] == "running", after
    assert after["time"] > before["time"], f"the clock stood still: {before['time']} -> {after['time']}"
    assert after["nodes"] == 4734, after
    status, cluster = server.get("/api/cluster?nodes=0")
    assert cluster["config"].get("policy") == "milp"


def test_start_new_run_and_restart_ask_first(server, staff):
    """A valid new run asks before it replaces the running one; dismissed, nothing changes."""
    before = health(server)
    open_replay(staff, server)
    staff.fill("#rp-hours", "2")
    staff.fill("#rp-nodes", "500")
    staff.dialogs.clear()
    staff.click("#rp-new")
    deadline = time.monotonic() + 15
    while not staff.dialogs and time.monotonic() < deadline:
        staff.wait_for_timeout(200)
    assert staff.dialogs and "Replace the running replay" in staff.dialogs[0], staff.dialogs
    assert "first 500 nodes" in staff.dialogs[0]
    staff.click("#rp-restart")
    while len(staff.dialogs) < 2 and time.monotonic() < deadline + 10:
        staff.wait_for_timeout(200)
    assert len(staff.dialogs) == 2 and "Restart this run" in staff.dialogs[1], staff.dialogs
    time.sleep(1.5)
    after = health(server)
    assert after["nodes"] == 4734 and after["time"] > before["time"], (before, after)


def test_speed_control_snaps_and_takes_a_number(server, staff):
    open_replay(staff, server)
    assert float(staff.input_value("#rp-speed-box")) == SPEED
    staff.fill("#rp-speed-box", "600")
    staff.click("#rp-apply-speed")
    staff.wait_for_function("() => document.querySelector('#rp-result')?.innerText?.includes('600x')",
                            timeout=10_000)
    status, body = server.get("/api/cluster?nodes=0")
    assert body["speed"] == 600
    staff.fill("#rp-speed-box", str(SPEED))
    staff.click("#rp-apply-speed")
    staff.wait_for_function(f"() => document.querySelector('#rp-result')?.innerText?.includes('{SPEED}x')",
                            timeout=10_000)


# ---- item 3: charts that read at a glance --------------------------------------------------------
FAST_CURVE = "1:100000, 64:6400000"


def plot_js(graph: str, expr: str) -> str:
    """A function (not an expression: the page's CSP forbids the eval Playwright polls those with)."""
    return f"() => {{ const g = document.querySelector('#{graph} .js-plotly-plot'); return g ? {expr} : null; }}"


def test_queued_job_page_says_no_data_yet(server, staff):
    """A job that has not run has no history: its charts say so instead of drawing default axes
    (which on a date axis run over the year 2000)."""
    staff_token = server.token("staff1")
    assert server.request("POST", "/api/replay/pause", {}, token=staff_token)[0] == 200
    try:
        status, job = server.request("POST", "/api/jobs", {
            "name": "visitor-queued", "min_nodes": 1, "max_nodes": 8, "total_samples": 1e9, "curve": FAST_CURVE},
            token=server.token("alice"))
        assert status == 201 and job["state"] == "queued", job
        staff.goto(f"{server.url}/jobs/{job['id']}")
        for graph in ("job-nodes", "job-progress"):
            staff.wait_for_function(plot_js(graph, "(g.layout.annotations || []).some(a => a.text.startsWith('no data yet'))"),
                                    timeout=15_000)
            assert staff.evaluate(plot_js(graph, "g.layout.xaxis.visible === false && g.layout.yaxis.visible === false"))
            assert staff.locator(f"#{graph} .xtick").count() == 0, f"{graph} draws default axes"
            assert "no data yet" in staff.inner_text(f"#{graph}")
        assert "2000" not in staff.inner_text("#job-nodes")
        shoot(staff, "dashboard-job-queued", full=True)
    finally:
        assert server.request("POST", "/api/replay/resume", {}, token=staff_token)[0] == 200


def wait_running(server, timeout: float = 90) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, body = server.get("/api/jobs?state=running")
        running = [j for j in body["jobs"] if j["nodes"] > 0]
        if len(running) >= 2:
            return running
        time.sleep(1)
    raise AssertionError(f"no two jobs running on nodes within {timeout} s")


def test_cluster_and_allocator_charts_read_at_a_glance(server, staff):
    running = wait_running(server)
    staff.goto(server.url + "/")
    staff.wait_for_function(plot_js("timeline-nodes", "g.data[0].x.length > 1 && g.layout.xaxis.visible !== false"),
                            timeout=20_000)
    assert staff.evaluate(plot_js("timeline-nodes", "g.layout.xaxis.title.text")) == "simulated time (UTC)"
    assert staff.evaluate(plot_js("timeline-nodes", "g.layout.yaxis.title.text")) == "nodes"
    assert staff.evaluate(plot_js("timeline-nodes", "Number.isInteger(g.layout.yaxis.dtick)"))
    assert staff.evaluate(plot_js("timeline-rate", "g.layout.yaxis.title.text")) == "samples/s"
    staff.wait_for_function("() => document.querySelectorAll('#legend a').length >= 2", timeout=15_000)
    legend = staff.inner_text("#legend")
    # the replay moves on while the charts draw: the jobs running now count too (seen under load)
    running += server.get("/api/jobs?state=running")[1]["jobs"]
    assert any(f'{j["id"]} {j["name"]} · ' in legend for j in running), legend
    time.sleep(1)
    shoot(staff, "dashboard-cluster", full=True)

    staff.goto(server.url + "/allocator")
    staff.wait_for_function(plot_js("solve-hist", "g.data.length > 0 && g.data[0].y.length > 0"), timeout=15_000)
    assert staff.evaluate(plot_js("solve-hist", "g.layout.yaxis.type")) in (None, "linear", "-")
    assert staff.evaluate(plot_js("solve-hist", "Number.isInteger(g.layout.yaxis.dtick)"))
    assert staff.evaluate(plot_js("solve-hist", "g.layout.xaxis.title.text")) == "solve time (ms)"
    shoot(staff, "dashboard-allocator", full=True)


# ---- item 4: the jobs page opens on running jobs --------------------------------------------------
def test_jobs_page_opens_on_running_jobs_with_the_form_in_view(server, staff):
    wait_running(server)
    staff.goto(server.url + "/jobs")
    staff.wait_for_function("() => document.querySelectorAll('#jobs-table tbody tr td').length > 5", timeout=15_000)
    time.sleep(1.5)
    state_col = staff.evaluate("""() => [...document.querySelectorAll('#jobs-table th')]
                                   .findIndex(th => th.innerText.trim().startsWith('state'))""")
    rows = staff.evaluate(f"""() => [...document.querySelectorAll('#jobs-table tbody tr')]
                              .map(tr => tr.querySelectorAll('td')[{state_col}]?.innerText?.trim()).filter(Boolean)""")
    assert rows and rows[0] == "running", rows
    seen = [STATE for STATE in rows]
    assert seen == sorted(seen, key=lambda s: {"running": 0, "waiting for nodes": 0, "queued": 1}.get(s, 2)), seen
    box = staff.locator("#job-form-name").bounding_box()
    assert box is not None and box["y"] + box["height"] <= VIEWPORT["height"], f"the form is below the fold: {box}"
    assert not staff.locator("#job-form-command").is_visible(), "a replay's form shows the live-only Command field"
    shoot(staff, "dashboard-jobs", full=True)


# ---- item 2: a visitor's job runs in the demo ----------------------------------------------------
def test_a_job_registered_through_the_form_runs_within_two_simulated_minutes(server, staff):
    """The demo scenario (this server's defaults) has a lane for registered jobs: with the job
    set's ten slots full and a hundred jobs queued, a visitor's job still starts at once, on nodes."""
    wait_running(server)
    status, cluster = server.get("/api/cluster?nodes=0")
    assert cluster["config"]["visitor_slots"] == 2 and cluster["kpis"]["queued"] > 10, cluster["kpis"]
    token = server.token("staff1")
    assert server.request("POST", "/api/replay/speed", {"speed": 60}, token=token)[0] == 200   # a tick: 30 s sim
    try:
        staff.goto(server.url + "/jobs")
        staff.wait_for_selector("#job-form-name")
        staff.fill("#job-form-name", "visitor-resnet")
        staff.fill("#job-form-total_samples", "1e9")
        staff.fill("#job-form-curve", "1:1200, 8:9000, 32:30000")
        staff.click("#job-form-submit")
        staff.wait_for_function("() => (document.querySelector('#job-form-result')?.innerText || '').includes('Registered')",
                                timeout=15_000)
        answer = staff.inner_text("#job-form-result")
        assert "Demo lane" in answer and "next step" in answer, answer
        job_id = re.search(r"Registered (u-[0-9a-f]+)", answer).group(1)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            job = server.get(f"/api/jobs/{job_id}")[1]
            if job["state"] == "running" and job["nodes"] > 0:
                break
            time.sleep(0.2)
        assert job["state"] == "running" and job["nodes"] > 0, job
        assert job["start_time"] - job["submit_time"] <= 120, job
        shoot(staff, "dashboard-jobs-registered", full=True)
    finally:
        assert server.request("POST", "/api/replay/speed", {"speed": SPEED}, token=token)[0] == 200


# ---- items 5 and 6: only what fits the mode -------------------------------------------------------
def test_job_list_refuses_an_unknown_state_naming_the_states(server):
    status, body = server.get("/api/jobs?state=bogus")
    assert status == 422, body
    for state in ("queued", "running", "done", "failed", "cancelled"):
        assert state in body["error"]
    assert body["states"] == ["queued", "running", "done", "failed", "cancelled"]
    assert server.get("/api/jobs?state=running")[0] == 200


def test_job_page_events_fit_and_name_the_nodes_of_each_rescale(server, staff):
    """A running job's events fit a 1,600 px window, its grow rows name the nodes it took, a
    running job on 0 nodes reads "waiting for nodes", and Cancel asks first."""
    running = wait_running(server)
    job = min(running, key=lambda j: j["progress"])      # the one furthest from done
    staff.goto(f"{server.url}/jobs/{job['id']}")
    staff.wait_for_function("() => (document.querySelector('#job-events tbody')?.innerText || '').includes('→')",
                            timeout=15_000)
    rows = staff.evaluate("""() => [...document.querySelectorAll('#job-events tbody tr')].map(tr =>
                             [...tr.querySelectorAll('td')].map(td => td.innerText.trim()))""")
    grows = [r for r in rows if len(r) == 4 and "→" in r[3]]
    changed = [r for r in grows if r[3].split(" → ")[0] != r[3].split(" → ")[1].split()[0]]
    assert changed, rows
    for r in changed:
        assert re.match(r"^[+−]\d+: [a-h]\d\dn\d\d", r[2]), f"a rescale row without its nodes: {r}"
    shoot(staff, "dashboard-job-running", full=True)
    width = staff.evaluate("() => document.documentElement.scrollWidth")
    assert width <= VIEWPORT["width"], f"the page is {width} px wide"
    status, jobs = server.get("/api/jobs?state=running")
    idle = [j for j in jobs["jobs"] if j["nodes"] == 0]
    if idle:
        staff.goto(f"{server.url}/jobs/{idle[0]['id']}")
        staff.wait_for_function("() => (document.querySelector('#job-head')?.innerText || '').length > 0",
                                timeout=15_000)
        if server.get(f"/api/jobs/{idle[0]['id']}")[1]["nodes"] == 0:
            assert "waiting for nodes" in staff.inner_text("#job-head")
    staff.goto(f"{server.url}/jobs/{job['id']}")
    staff.wait_for_selector("#job-cancel", state="visible", timeout=15_000)
    staff.dialogs.clear()
    staff.click("#job-cancel")
    deadline = time.monotonic() + 10
    while not staff.dialogs and time.monotonic() < deadline:
        staff.wait_for_timeout(200)
    assert staff.dialogs and f"Cancel job {job['id']}?" in staff.dialogs[0], staff.dialogs
    time.sleep(1)
    assert server.get(f"/api/jobs/{job['id']}")[1]["state"] != "cancelled", "a dismissed cancel cancelled the job"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A live harvester (wall clock, 8 static nodes, simulated workers): no replay anywhere."""
    app = start_app(tmp_path_factory.mktemp("live"), "--fresh", "--dispatch", "simulated", "--local-nodes", "8")
    yield app
    assert app.stop() == 0, app.output()[-3000:]


def test_live_mode_shows_no_replay(live, browser):
    status, body = live.get("/api/health")
    assert status == 200 and body["mode"] == "live" and "replay" not in body, body
    ctx = browser.new_context(viewport=VIEWPORT)
    try:
        page = ctx.new_page()
        page.goto(live.url + "/")
        page.wait_for_selector("header nav a")
        links = [a.inner_text() for a in page.locator("header nav a").all()]
        assert "Replay" not in links and "Cluster" in links, links
        page.wait_for_function("() => (document.querySelector('#status-bar')?.innerText || '').includes('live')",
                               timeout=15_000)
        assert "replay" not in page.inner_text("#status-bar").lower()
        page.goto(live.url + "/replay")
        page.wait_for_selector("main h2")
        assert "`" not in page.inner_text("main")
        page.goto(live.url + "/allocator")
        page.wait_for_selector("#solver-runs")
        page.wait_for_function("() => (document.querySelector('#objective-hint')?.innerText || '')"
                               ".startsWith('Objective (samples/s): ')", timeout=15_000)   # filled by the page's tick
        assert "(sim)" not in page.inner_text("main")
        shoot(page, "dashboard-live-allocator", full=True)
    finally:
        ctx.close()


# ---- item 0, last: a confirmed new run replaces the run, and the page says when it is running ------
def test_confirmed_new_run_starts_and_the_loading_line_clears(server, staff):
    open_replay(staff, server)
    staff.fill("#rp-hours", "1")
    staff.fill("#rp-nodes", "300")
    staff.accept_dialogs = True
    try:
        staff.click("#rp-new")
        staff.wait_for_function(
            "() => (document.querySelector('#rp-result')?.innerText || '').includes('The new run is running')",
            timeout=60_000)
    finally:
        staff.accept_dialogs = False
    assert health(server)["nodes"] == 300
    assert "Loading" not in staff.inner_text("#rp-result")
