"""GPU nodes (issue 14): a node runs `slots` ranks, one per GPU. The node stays the unit of
allocation; what changes is what is shown: each node's slots in /api/cluster, each job's ranks in
/api/jobs and on its page ("2 nodes × 2 GPUs = 4 ranks"), the GPUs held in /metrics
(`harvest_harvested_gpus`) and in the grid's hover.

Real workers: `python -m app --dispatch local --nodes FILE` on three 2-slot nodes, with a job
whose command only sleeps (what is counted is the allocation, not the training), read over HTTP
and in headless Chromium. Simulated workers run no ranks, so there the same figures are GPUs
held: a live harvester on mixed nodes, and replays (Summit's 6 GPUs per node by default).
"""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.format import extent
from core.assemble import build
from core.controller_config import ControllerConfig
from core.replay import Replay, ReplaySettings
from core.schemas import JobSpec
from core.settings import HarvesterSettings
from core.slots import Slots
from tests.support.procs import leftovers
from tests.support.server import CHROMIUM, CHROMIUM_ARGS, ROOT, browser_or_skip, start_app
from tests.support.waiting import wait

SHOTS = ROOT / "build" / "screenshots"
VIEWPORT = {"width": 1600, "height": 1000}
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
#: where on the page the first grid cell whose hover names the job is (for the mouse)
CELL_OF_JS = """job => { const gd = document.querySelector('#grid .js-plotly-plot');
    const text = gd.data[0].text, area = gd.querySelector('.nsewdrag').getBoundingClientRect();
    const r = text.findIndex(row => row.some(s => s.includes(job)));
    const c = text[r].findIndex(s => s.includes(job));
    return [area.left + (c + 0.5) * area.width / text[0].length, area.top + (r + 0.5) * area.height / text.length]; }"""
GRID_TEXT_JS = "() => document.querySelector('#grid .js-plotly-plot')?.data?.[0]?.text?.flat() || []"


# ---- what the words are -----------------------------------------------------------------------
@pytest.mark.parametrize("nodes,slots,ranks,runs,words", [
    (3, 4, 12, True, "3 nodes × 4 GPUs = 12 ranks"),
    (1, 6, 6, False, "1 node × 6 GPUs = 6 GPUs held"),
    (3, None, 10, True, "3 nodes, 10 GPUs = 10 ranks"),
    (3, None, 10, False, "3 nodes, 10 GPUs held"),
    (3, 1, 3, True, "3 nodes"),                   # one rank per node: the node count says it all
    (0, 6, 0, False, "0 nodes"),
    (1200, 6, 7200, True, "1,200 nodes × 6 GPUs = 7,200 ranks"),
])
def test_a_jobs_size_in_words(nodes, slots, ranks, runs, words):
    assert extent(nodes, slots, ranks, runs) == words


def test_slots_count_nodes_of_one_size_and_of_several():
    same = Slots(default=6)
    assert same.same == 6 and same.total(["a", "b"]) == 12 and same.common([]) == 6
    mixed = Slots({"a": 2, "b": 2, "c": 4})
    assert mixed("z") == 1 and mixed.same is None
    assert mixed.total(["a", "b", "c", "z"]) == 9
    assert mixed.common(["a", "b"]) == 2 and mixed.common(["a", "c"]) is None
    names = ("a", "c", "z")
    assert mixed.row(names) == (2, 4, 1) and mixed.row(tuple(names)) is mixed.row(names)
    assert Slots({"a": 1, "b": 1}).same == 1, "a list of one-slot nodes is a one-slot machine"
    with pytest.raises(ValueError):
        Slots(default=0)


# ---- simulated workers on nodes of different sizes ----------------------------------------------
def test_a_job_on_mixed_nodes_counts_the_gpus_it_holds(tmp_path):
    inventory = tmp_path / "nodes.txt"
    inventory.write_text("a 2\nb 2\nc 4\nd\n")
    h = build(HarvesterSettings.parse({"db": tmp_path / "live.db", "tick_s": 0.05, "live": {
        "dispatch": "simulated", "inventory": inventory, "config": {"tfwd": 60}}}))
    h.source.poll(time.time())
    h.open()
    try:
        job = h.submit(JobSpec(name="mlp", min_nodes=1, max_nodes=4, total_samples=1e12, curve="1:100, 4:400",
                               scale_up_seconds=0, scale_down_seconds=0), "alice")
        wait(lambda: h.snapshot.job(job.id)["nodes"] == 4, 5, "the job on all 4 nodes", period=0.02)
        snap = h.snapshot
        assert dict(zip(snap.nodes, snap.slots)) == {"a": 2, "b": 2, "c": 4, "d": 1}
        info = snap.job(job.id)
        assert (info["slots"], info["ranks"]) == (None, 9)
        assert (snap.kpis["gpus"], snap.kpis["idle_gpus"], snap.kpis["harvested_gpus"]) == (9, 9, 9)
        assert snap.config["runs_workers"] is False
        assert extent(info["nodes"], info["slots"], info["ranks"], False) == "4 nodes, 9 GPUs held"
        for node in ("c", "d"):          # the owner takes back the 4-GPU node and the 1-GPU one
            h.source.reclaim(node, time.time())
        wait(lambda: h.snapshot.job(job.id)["nodes"] == 2, 5, "c and d vacated", period=0.02)
        snap = h.snapshot
        info = snap.job(job.id)
        assert (info["slots"], info["ranks"]) == (2, 4)
        assert (snap.kpis["idle_gpus"], snap.kpis["harvested_gpus"]) == (4, 4)
    finally:
        h.close()


def test_local_nodes_bring_their_slots_to_the_snapshot(tmp_path):
    h = build(HarvesterSettings.parse({"db": tmp_path / "live.db", "tick_s": 0.05, "live": {
        "dispatch": "simulated", "local_nodes": 2, "local_slots": 3}}))
    h.open()
    try:
        snap = h.snapshot
        assert snap.slots == (3, 3) and (snap.kpis["gpus"], snap.kpis["idle_gpus"]) == (6, 6)
    finally:
        h.close()


# ---- replays: GPUs held, 6 per node on Summit ----------------------------------------------------
def test_a_replay_counts_the_gpus_of_its_nodes_and_keeps_them_on_resume(tmp_path, small_trace, small_jobs):
    def replay(gpus, db=None, resume=False) -> Replay:
        return Replay(ReplaySettings(trace=small_trace, jobs=small_jobs, hours=10, gpus_per_node=gpus,
                                     config=ControllerConfig(tfwd=600)), db, resume=resume)

    plain = replay(None)
    assert set(plain.controller.snapshot("running", 1).slots) == {1}, "a trace of no known machine: 1 per node"
    first = replay(4, tmp_path / "r.db")
    first.advance(first.start + 20 * 60)           # the three jobs arrived and run
    snap = first.controller.snapshot("running", 1)
    assert snap.slots == (4,) * 8 and snap.kpis["gpus"] == 32
    assert snap.kpis["harvested"] > 0 and snap.kpis["harvested_gpus"] == 4 * snap.kpis["harvested"]
    assert all(j["ranks"] == 4 * j["nodes"] and j["slots"] == 4 for j in snap.jobs)
    first.checkpoint()
    first.store.close()
    resumed = replay(4, tmp_path / "r.db", resume=True)
    again = resumed.controller.snapshot("running", 2)
    assert again.slots == (4,) * 8 and again.kpis["harvested_gpus"] == 4 * again.kpis["harvested"]
    resumed.store.close()
    with pytest.raises(ValueError, match="other settings"):
        replay(6, tmp_path / "r.db", resume=True)


def test_summit_nodes_have_six_gpus_in_a_replay(tmp_path, small_jobs):
    summit = Replay(ReplaySettings(racks="a01", hours=1, start="2021-02-10T20:00:00Z", jobs=small_jobs))
    snap = summit.controller.snapshot("running", 1)
    assert len(snap.nodes) == 18 and set(snap.slots) == {6} and snap.kpis["gpus"] == 108


# ---- real workers: a server, its API, /metrics and pages ----------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Local workers on three 2-slot nodes; the profiler is off so that sizes follow the curve."""
    workdir = tmp_path_factory.mktemp("gpus")
    inventory = workdir / "nodes.txt"
    inventory.write_text("name,slots\nw0,2\nw1,2\nw2,2\n")
    app = start_app(workdir, "--fresh", "--dispatch", "local", "--nodes", str(inventory), "--tick", "0.1",
                    "--workdir", str(ROOT), "--no-profiler")
    yield app
    rc = app.stop()
    assert rc == 0, app.output()[-3000:]


@pytest.fixture(scope="module")
def job(server):
    """A job of alice's that runs (sleeps) on two of the three nodes: 4 ranks."""
    status, body = server.request("POST", "/api/jobs", {
        "name": "gpu-probe", "min_nodes": 1, "max_nodes": 2, "total_samples": 1e12, "global_batch": 64,
        "curve": "1:100, 2:200", "scale_up_seconds": 0, "scale_down_seconds": 0, "command": SLEEPER},
        token=server.token("alice"))
    assert status == 201, body
    wait(lambda: server.get(f"/api/jobs/{body['id']}")[1]["nodes"] == 2, 20, "the job on 2 nodes",
         lambda: server.get(f"/api/jobs/{body['id']}"), period=0.1)
    yield body["id"]
    status, cancelled = server.request("DELETE", f"/api/jobs/{body['id']}", token=server.token("alice"))
    assert status == 200, cancelled
    wait(lambda: not leftovers(body["id"]), 20, "the job's workers gone", lambda: leftovers(body["id"]))


def test_the_api_gives_each_nodes_slots_and_each_jobs_ranks(server, job):
    _, cluster = server.get("/api/cluster")
    assert [(n["name"], n["slots"]) for n in cluster["nodes"]] == [("w0", 2), ("w1", 2), ("w2", 2)]
    held = [n["name"] for n in cluster["nodes"] if n["job"] == job]
    assert len(held) == 2
    assert cluster["config"]["runs_workers"] is True
    k = cluster["kpis"]
    assert (k["gpus"], k["idle_gpus"], k["harvested_gpus"]) == (6, 6, 4)
    _, one = server.get(f"/api/jobs/{job}")
    assert (one["nodes"], one["slots"], one["ranks"]) == (2, 2, 4)
    _, listed = server.get("/api/jobs?owner=alice")
    (mine,) = [j for j in listed["jobs"] if j["id"] == job]
    assert (mine["nodes"], mine["slots"], mine["ranks"]) == (2, 2, 4)


def test_metrics_count_the_gpus_of_the_held_nodes(server, job):
    status, text = server.get("/metrics")
    assert status == 200
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    value = lambda name: next(s.value for s in fams[name].samples)
    assert fams["harvest_harvested_gpus"].type == "gauge"
    assert value("harvest_harvested_nodes") == 2
    assert value("harvest_harvested_gpus") == 2 * 2, "held nodes × slots"
    assert value("harvest_idle_gpus") == 3 * 2


@pytest.fixture(scope="module")
def page(server):
    sync_api = browser_or_skip()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        ctx = browser.new_context(viewport=VIEWPORT)
        pg = ctx.new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        yield pg
        browser.close()
        assert not errors, errors


def shoot(page, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def test_the_job_page_says_nodes_gpus_and_ranks(server, job, page):
    page.goto(f"{server.url}/jobs/{job}")
    page.wait_for_function("() => (document.querySelector('#job-holds')?.innerText || '').includes('ranks')",
                           timeout=15_000)
    assert page.inner_text("#job-holds").strip() == "2 nodes × 2 GPUs = 4 ranks"
    assert "1 to 2 nodes" in page.inner_text("#job-head")
    page.wait_for_function("() => document.querySelector('#job-curve .js-plotly-plot')?.data?.length > 0",
                           timeout=15_000)
    shoot(page, "gpus-job")


def test_a_node_cells_hover_shows_its_gpus_and_the_jobs_ranks(server, job, page):
    page.goto(server.url + "/")
    page.wait_for_function(f"() => ({GRID_TEXT_JS})().length === 3", timeout=15_000)
    text = page.evaluate(GRID_TEXT_JS)
    held = [s for s in text if job in s]
    idle = [s for s in text if s.startswith("idle")]
    assert len(held) == 2 and len(idle) == 1, text
    assert all(s.endswith("<br>2 GPUs · the job: 2 nodes × 2 GPUs = 4 ranks") for s in held), held
    assert re.fullmatch(r"idle since .+<br>2 GPUs", idle[0]), idle
    page.wait_for_function("() => (document.querySelector('#kpi-harvested')?.innerText || '').includes('GPUs')",
                           timeout=10_000)
    assert re.sub(r"\s+", " ", page.inner_text("#kpi-harvested")) == "2 · 4 GPUs"
    assert re.sub(r"\s+", " ", page.inner_text("#kpi-idle")) == "3 · 6 GPUs"
    x, y = page.evaluate(CELL_OF_JS, job)
    page.mouse.move(x, y)
    page.wait_for_selector("#grid .hoverlayer .hovertext", timeout=10_000)
    hover = page.evaluate("() => [...document.querySelectorAll('#grid .hoverlayer .hovertext tspan.line')]"
                          ".map(t => t.textContent)")
    assert hover[-1] == "2 GPUs · the job: 2 nodes × 2 GPUs = 4 ranks", hover
    shoot(page, "gpus-cluster")
