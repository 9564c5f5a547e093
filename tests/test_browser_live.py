"""Live mode as the people in front of it see it (issue 19), in headless Chromium: real elastic
PyTorch workers (the digits example as local processes) under `python -m app --dispatch local`.
A node taken back shows on the cluster timeline and on the job page within 10 s, and the loss the
job reports is on its job page (and in its API record), so a user sees that it learns.

Screenshots go to build/screenshots/ (look at them)."""
from __future__ import annotations

import sys
import time

import pytest

from tests.support.browser import shoot
from tests.support.server import ROOT, browser_or_skip, start_app
from tests.support.waiting import wait

sync_api = browser_or_skip()

VIEWPORT = {"width": 1600, "height": 1000}
GLOBAL_BATCH = 64


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    app = start_app(tmp_path_factory.mktemp("live-browser"), "--fresh", "--dispatch", "local",
                    "--local-nodes", "3", "--no-profiler", "--tfwd", "60")
    yield app
    assert app.stop() == 0, app.output()[-3000:]


def _plot(page, graph_id: str) -> list:
    """The traces Plotly draws in a dcc.Graph (x and y of each), read from the page itself."""
    return page.evaluate(
        "(id) => { const p = document.querySelector('#' + id + ' .js-plotly-plot');"
        " return p && p.data ? p.data.map(t => ({x: Array.from(t.x || []), y: Array.from(t.y || [])})) : []; }",
        graph_id)


def test_a_rescale_shows_within_10_s_and_the_loss_is_on_the_job_page(live, browser):
    token = live.token("staff1")
    spec = {"name": "digits", "min_nodes": 1, "max_nodes": 3, "total_samples": GLOBAL_BATCH * 100_000,
            "curve": "1:100, 3:300", "scale_up_seconds": 0, "scale_down_seconds": 0,
            "global_batch": GLOBAL_BATCH,
            "command": [sys.executable, str(ROOT / "examples" / "digits_cnn.py"), "--seed", "3",
                        "--log-every", "1000000", "--step-seconds", "0.03"]}
    status, job = live.request("POST", "/api/jobs", spec, token=token)
    assert status == 201, job
    jid = job["id"]

    def record() -> dict:
        return live.get(f"/api/jobs/{jid}")[1]
    wait(lambda: record().get("nodes") == 3 and (record().get("workers") or {}).get("world_size") == 3,
         120, "the job on 3 nodes")
    wait(lambda: len((record().get("workers") or {}).get("losses") or []) >= 3, 60, "three losses reported")
    workers = record()["workers"]
    steps = [s for s, _ in workers["losses"]]
    assert workers["loss"] is not None and steps == sorted(set(steps)), workers

    ctx = browser.new_context(viewport=VIEWPORT)
    try:
        cluster, job_page = ctx.new_page(), ctx.new_page()
        cluster.goto(live.url + "/")
        job_page.goto(live.url + f"/jobs/{jid}")
        # the loss: a fact with its value and a chart of loss against step
        job_page.wait_for_selector("#job-loss-now", timeout=20_000)
        assert float(job_page.inner_text("#job-loss-now")) > 0
        job_page.wait_for_function(
            "() => { const p = document.querySelector('#job-loss .js-plotly-plot');"
            " return p && p.data && p.data[0] && p.data[0].x && p.data[0].x.length >= 2; }", timeout=20_000)
        cluster.wait_for_function(
            "() => { const p = document.querySelector('#timeline-nodes .js-plotly-plot');"
            " const y = p && p.data && p.data[0].y; return y && y.length && y[y.length - 1] === 3; }",
            timeout=20_000)

        held = [n["name"] for n in live.get("/api/cluster")[1]["nodes"] if n["job"] == jid]
        assert len(held) == 3, held
        status, body = live.request("POST", f"/api/nodes/{held[0]}/reclaim", token=token)
        assert status == 200, body
        t0 = time.monotonic()
        cluster.wait_for_function(
            "() => { const p = document.querySelector('#timeline-nodes .js-plotly-plot');"
            " const y = p && p.data && p.data[0].y; return y && y.length && y[y.length - 1] === 2; }",
            timeout=10_000)
        on_cluster = time.monotonic() - t0
        job_page.wait_for_function(
            "(node) => { const p = document.querySelector('#job-nodes .js-plotly-plot');"
            " const y = p && p.data && p.data[0].y;"
            " const ev = document.querySelector('#job-events')?.innerText || '';"
            " return y && y.includes(3) && y[y.length - 1] === 2 && ev.includes(node); }",
            arg=held[0], timeout=max(1_000, int((10 - (time.monotonic() - t0)) * 1000)))
        on_job = time.monotonic() - t0
        assert on_cluster <= 10 and on_job <= 10, (on_cluster, on_job)
        # the timeline kept the step: a point at 3 used nodes, then one at 2 (not one smoothed line)
        used = _plot(cluster, "timeline-nodes")[0]["y"]
        assert 3 in used and used[-1] == 2, used
        shoot(cluster, "live-cluster", full=True)
        shoot(job_page, "live-job", full=True)
    finally:
        ctx.close()
        live.request("DELETE", f"/api/jobs/{jid}", token=token)
