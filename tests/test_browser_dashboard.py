"""The dashboard as the people in front of it meet it (issue 19), in headless Chromium against one
`python -m app` replay of the full Summit machine at 300x: a Replay form that never loses the run,
charts that say "no data yet" instead of empty axes, the jobs page opening on running jobs.

Screenshots go to build/screenshots/ (look at them: the pages must read well)."""
from __future__ import annotations

import re
import time

import pytest

from tests.support.server import CHROMIUM, CHROMIUM_ARGS, ROOT, browser_or_skip, password, start_app

sync_api = browser_or_skip()

SHOTS = ROOT / "build" / "screenshots"
VIEWPORT = {"width": 1600, "height": 1000}
SPEED = 300


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    app = start_app(tmp_path_factory.mktemp("dashboard"), "--fresh", "--speed", str(SPEED))
    yield app
    rc = app.stop()
    assert rc == 0, app.output()[-3000:]


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


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
    page.goto(server.url + "/login")
    page.fill("#login-user", "staff1")
    page.fill("#login-password", password("staff1"))
    page.click("#login-submit")
    page.wait_for_url(re.compile(r".*/jobs$"), timeout=15_000)
    yield page
    ctx.close()


def health(server) -> dict:
    status, body = server.get("/api/health")
    assert status == 200, body
    return body


def shoot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


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
    shoot(staff, f"replay-error-{field}")
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
