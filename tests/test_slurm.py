"""The Slurm node source against a real Slurm 22.05 on loopback (tests/support/slurm.py: munged,
slurmctld and 8 slurmd in their own PID namespace, a preemptible `scavenger` partition).

The acceptance path goes through `python -m app --source slurm`: pilots take the 8 idle nodes, a
job registered through the API trains on them with real worker processes inside the pilots, a
main job of 4 nodes starts within 2 s because the pilots give the nodes back, the job shrinks
and keeps training, nothing of a preempted pilot is left, the nodes are harvested again when the
main job ends and the job grows back; with slurmctld gone the source is stale and the job keeps
its nodes, and when slurmctld returns everything goes on."""
from __future__ import annotations

import os
import signal
import time

import pytest

from app.web import source_badge
from core.assemble import build
from core.schemas import JobSpec
from core.service import Harvester
from core.settings import HarvesterSettings
from core.snapshot import HELD
from core.pilots.hub import PilotHub
from core.pilots.wire import HELLO, dial
from core.slurm.watch import resolve_watch
from core.slurm.cli import SlurmCli
from core.pilots.settings import SettingError, PilotSettings, split_list
from tests.support.procs import run_module
from tests.support.server import ROOT, start_app
from tests.support.slurm import MAIN_JOB_S, parent, processes_with_env, slurm_cluster, steps_into_generation, submit_digits  # noqa: F401  (the fixture)
from tests.support.waiting import wait

NODES = [f"node{i}" for i in range(1, 9)]


def pilot_processes(job_ids) -> list[int]:
    return [p for j in job_ids for p in processes_with_env(f"SLURM_JOB_ID={j}")]


@pytest.fixture
def cluster(slurm_cluster):
    slurm_cluster.wait_quiet()
    yield slurm_cluster
    slurm_cluster.wait_quiet()


# ---- the acceptance path, through the API ------------------------------------------------------
def test_pilots_harvest_idle_nodes_and_give_them_back_to_main_jobs(cluster, tmp_path):
    # the job's curve is taken as given: the sizes this test expects are the harvest's alone, not
    # the profiler's probes (tests/test_jpa_live.py tests those on real workers). One rank per
    # node although each has 2 GPUs: 8 workers are what 2 cores run well (2 ranks per node:
    # tests/test_slurm_gpus.py)
    app = start_app(tmp_path / "app", "--source", "slurm", *cluster.app_args(),
                    "--slurm-pilot-logs", str(tmp_path), "--tfwd", "600", "--workdir", str(ROOT),
                    "--no-profiler", "--slurm-slots", "1", "--metrics-interval", "0")   # /metrics as of now
    try:
        jid = _acceptance(app, cluster)
    finally:
        app.stop()
    print(app.output()[-3000:])
    assert not [j for j in cluster.jobs().values() if j["job_state"] in ("RUNNING", "PENDING")
                and j["name"] == "harvest-pilot"], "the harvester cancels its pilots when it stops"
    wait(lambda: not processes_with_env(f"HARVEST_JOB={jid}"), 15, "every worker gone with its pilot")


def _acceptance(app, cluster):
    clu = lambda: app.get("/api/cluster")[1]
    c = clu()
    assert [n["name"] for n in c["nodes"]] == NODES, "the grid shows Slurm's own node names"
    assert c["source"]["state"] == "ok" and c["config"]["dispatcher"] == "pilot", c["source"]
    assert all("Slurm: " in n["source"] for n in c["nodes"]), c["nodes"][0]

    # pilots come for a job that can use the nodes, not before
    jid = submit_digits(app, "digits on slurm", 8)
    wait(lambda: clu()["kpis"]["idle"] == 8, 60, "pilots on all 8 nodes", clu)
    pilots = {j["nodes"]: j["job_id"] for j in cluster.jobs().values()
              if j["name"] == "harvest-pilot" and j["job_state"] == "RUNNING"}
    assert sorted(pilots) == NODES, pilots
    get = lambda: app.get(f"/api/jobs/{jid}")[1]
    workers = lambda: get().get("workers") or {}
    world = lambda k: (lambda: workers().get("world_size") == k and not workers().get("regrouping")
                       and get()["nodes"] == k)
    wait(world(8), 150, "the job training on 8 nodes", workers)
    wait(lambda: steps_into_generation(workers(), 10), 30, "10 steps into the generation", workers)
    for n in NODES:       # each worker runs inside the pilot that holds its node: the pilot's child
        found = {p: e for p, e in processes_with_env(f"HARVEST_NODE={n}").items() if f"HARVEST_JOB={jid}".encode() in e}
        assert len(found) == 1, n
        (pid, env), = found.items()
        assert parent(pid) in pilot_processes([pilots[n]]), n
        assert f"SLURM_JOB_ID={pilots[n]}".encode() in env.split(b"\0"), n
        assert not [v for v in env.split(b"\0") if v.startswith(b"HARVEST_PILOT_")], "the pilot's token stays its own"

    # a main job needs 4 nodes: Slurm preempts 4 pilots, which give their nodes back at once
    t0 = time.monotonic()
    main = cluster.sbatch("-p", "main", "-N", "4", "--wrap", f"sleep {MAIN_JOB_S}", "-o", "/dev/null")
    wait(lambda: cluster.job_state(main) == "RUNNING", 10, "the main job to start", period=0.02)
    main_start = time.monotonic() - t0
    taken = cluster.run("scontrol", "show", "hostnames", cluster.jobs()[main]["nodes"]).stdout.split()
    assert main_start < 2.0, f"the main job started {main_start:.2f} s after its submission"
    print(f"main job started {main_start:.2f} s after its submission")
    step = wait(lambda: world(4)() and workers()["committed_step"], 30, "the job shrunk to 4", workers)
    nodes = lambda: {n["name"]: n for n in clu()["nodes"]}
    wait(lambda: all(nodes()[n]["state"] == "busy" and nodes()[n]["source"] == "Slurm: allocated" for n in taken),
         5, "the grid to show the main job's nodes busy, allocated in Slurm", nodes)
    wait(lambda: not pilot_processes(pilots[n] for n in taken), 10, "nothing left of the preempted pilots")
    m = wait(lambda: (lambda m: m if m.get(("harvest_slurm_vacate_seconds_count", ())) == 4 else None)(app.metrics()),
             5, "4 vacates in /metrics", lambda: app.metrics())
    assert m[("harvest_slurm_pilots_total", (("outcome", "preempted"),))] == 4, m
    # 8 at the start, and perhaps one sent to a preempted node in the instant it looked free (cancelled)
    assert m[("harvest_slurm_pilots_total", (("outcome", "submitted"),))] >= 8, m
    assert m[("harvest_slurm_pilots_total", (("outcome", "lost"),))] == 0, m
    assert m[("harvest_slurm_hub_connections",())] == 4 and m[("harvest_slurm_hub_connections_peak", ())] == 8, m
    assert 0 < m[("harvest_slurm_vacate_seconds_sum", ())] < 4 * 5.0, "each vacate within the pilot's grace"
    wait(lambda: workers()["committed_step"] > step + 5, 30, "the job to keep training on 4 nodes", workers)

    # the main job ends: the 4 nodes are harvested again and the job grows back
    wait(lambda: cluster.job_state(main) not in ("RUNNING", "COMPLETING"), MAIN_JOB_S + 15, "the main job's end")
    wait(lambda: clu()["kpis"]["idle"] == 8, 60, "the 4 nodes harvested again", clu)
    wait(world(8), 150, "the job grown back to 8", workers)
    assert get()["state"] == "running"

    # slurmctld goes away: the source is stale, the job keeps its nodes and trains on
    cluster.stop_controller()
    try:
        src = wait(lambda: (lambda s: s if s["state"] == "stale" else None)(clu()["source"]), 30,
                   "the source marked stale", clu)
        assert "Slurm" in src["detail"], src
        step = workers()["committed_step"]
        wait(lambda: workers()["committed_step"] > step + 5, 30, "training while slurmctld is away", workers)
        assert get()["nodes"] == 8 and clu()["kpis"]["idle"] == 8
        assert app.get("/api/health")[1]["source"]["state"] == "stale"
    finally:
        cluster.start_controller()
    wait(lambda: clu()["source"]["state"] == "ok", 30, "the source back to ok", clu)
    assert get()["nodes"] == 8 and get()["state"] == "running"
    # long enough that the job stands on 6 nodes (cancelled then): a 1 s main job can end, and its
    # nodes come back, before the shrink's regroup is over, and the job never stands on 6 (CI, once)
    main = cluster.sbatch("-p", "main", "-N", "2", "--wrap", "sleep 20", "-o", "/dev/null")
    wait(world(6), 30, "a leave after slurmctld's return", workers)
    cluster.run("scancel", main)
    wait(lambda: cluster.job_state(main) not in ("PENDING", "RUNNING", "COMPLETING"), 30, "the main job's end")
    return jid


# ---- the source in process ---------------------------------------------------------------------
def harvester(tmp_path, cluster, **settings) -> Harvester:
    h = build(HarvesterSettings.parse({"db": tmp_path / "h.db", "tick_s": 0.2, "live": {
        "source": "slurm", "dispatch": "simulated", "config": {"tfwd": 600},
        "slurm": {**cluster.slurm_settings(), **settings}}}))
    h.open()
    return h


def test_dry_run_only_shows_what_it_would_harvest(cluster, tmp_path):
    main = cluster.sbatch("-p", "main", "-N", "2", "-w", "node1,node2", "--wrap", "sleep 30", "-o", "/dev/null")
    wait(lambda: cluster.job_state(main) == "RUNNING", 15, "a main job on node1, node2")
    h = harvester(tmp_path, cluster, dry_run=True, max_pilots=5)
    try:
        st = wait(lambda: (lambda s: s if "would" in s["detail"] else None)(h.snapshot.source_status), 15,
                  "the dry run's verdict")
        assert st["state"] == "dry-run"
        assert st["detail"] == "would harvest 5 node(s): node3, node4, node5, node6, node7", st
        time.sleep(1.5)
        live = [j["name"] for j in cluster.jobs().values() if j["job_state"] in ("PENDING", "RUNNING", "COMPLETING")]
        assert live == ["wrap"], "nothing submitted but the main job"
        snap = h.snapshot
        assert snap.kpis["idle"] == 0 and set(snap.state) != {HELD}
        info = dict(zip(snap.nodes, snap.node_info))
        assert info["node1"] == "Slurm: allocated" and info["node3"] == "Slurm: idle, would harvest (dry run)"
        assert info["node8"] == "Slurm: idle"
    finally:
        h.close()
        cluster.run("scancel", main)


def test_a_pilot_killed_without_a_word_is_a_leave_and_its_node_is_harvested_again(cluster, tmp_path):
    h = harvester(tmp_path, cluster, watch=("node[1-3]",), backoff_s=2)
    try:
        assert h.source.node_names() == ["node1", "node2", "node3"]
        job = h.submit(JobSpec(name="sim", min_nodes=1, max_nodes=3, total_samples=1e12, curve="1:100, 3:300",
                               scale_up_seconds=0, scale_down_seconds=0), "alice")
        wait(lambda: h.snapshot.kpis["idle"] == 3, 30, "pilots on node1..3")
        wait(lambda: h.snapshot.job(job.id)["nodes"] == 3, 10, "the job on 3 nodes")
        pilot = h.source.hub.link("node2")
        pids = list(processes_with_env(f"SLURM_JOB_ID={pilot.job}"))
        assert pids
        for pid in pids:
            os.kill(pid, signal.SIGKILL)     # no SIGTERM, no message: the connection just ends
        wait(lambda: h.snapshot.job(job.id)["nodes"] == 2, 5, "the leave")
        h.controller.flush()
        details = [r[0] for r in h.controller.store.db.execute(
            "select detail from events where node = 'node2' and kind = 'node_leave'")]
        assert details and "lost its connection" in details[-1], details
        # dead seconds after it connected: that counts against node2, which waits (2 s here) first
        assert "1 failed pilot(s) in a row" in h.source.node_states()["node2"], h.source.node_states()
        wait(lambda: h.snapshot.job(job.id)["nodes"] == 3, 30, "node2 harvested again by a new pilot")
        assert h.source.hub.link("node2").job != pilot.job
    finally:
        h.close()
    assert not pilot_processes([pilot.job])


def live_pilots(cluster) -> list[str]:
    return sorted(j["nodes"] for j in cluster.jobs().values()
                  if j["name"] == "harvest-pilot" and j["job_state"] in ("PENDING", "RUNNING"))


def test_pilots_are_held_only_for_the_nodes_jobs_can_use(cluster, tmp_path):
    """No job, no pilot; pilots for the sum of the jobs' max nodes; a job's end releases its
    nodes' pilots after the grace (Slurm counts pilots as the harvester's usage)."""
    spec = lambda name, k: JobSpec(name=name, min_nodes=1, max_nodes=k, total_samples=1e12,
                                   curve=f"1:100, {k}:{100 * k}" if k > 1 else "1:100",
                                   scale_up_seconds=0, scale_down_seconds=0)
    h = harvester(tmp_path, cluster, watch=("node[1-5]",), release_grace_s=1.0)
    try:
        time.sleep(3.0)                      # three polls of Slurm with 5 idle nodes and no job
        assert live_pilots(cluster) == [] and h.snapshot.kpis["idle"] == 0
        assert "0 node(s) held by pilots, 0 used by jobs, 0 wanted" in h.snapshot.source_status["detail"]
        a = h.submit(spec("a", 2), "alice")
        wait(lambda: h.snapshot.job(a.id)["nodes"] == 2, 30, "job a on 2 nodes")
        b = h.submit(spec("b", 1), "bob")
        wait(lambda: h.snapshot.job(b.id)["nodes"] == 1, 30, "job b on 1 node")
        time.sleep(2.0)                      # two more polls: nothing beyond the 3 nodes wanted
        assert len(live_pilots(cluster)) == 3 and h.snapshot.kpis["idle"] == 3, live_pilots(cluster)
        detail = h.snapshot.source_status["detail"]
        assert "3 node(s) held by pilots, 3 used by jobs, 3 wanted" in detail, detail
        assert (h.snapshot.source_status["held"], h.snapshot.source_status["used"]) == (3, 3)

        h.cancel(a.id)                        # a's 2 nodes: unused, released after the grace
        wait(lambda: len(live_pilots(cluster)) == 1, 20, "a's pilots cancelled", lambda: live_pilots(cluster))
        wait(lambda: h.snapshot.kpis["idle"] == 1, 10, "a's nodes no longer harvested")
        assert h.snapshot.job(b.id)["nodes"] == 1, "b keeps its node"
        wait(lambda: "1 node(s) held by pilots, 1 used by jobs, 1 wanted" in h.snapshot.source_status["detail"],
             5, "the status to say so", lambda: h.snapshot.source_status)

        c = h.submit(spec("c", 2), "carol")   # demand returns: pilots are submitted again
        wait(lambda: h.snapshot.job(c.id)["nodes"] == 2, 30, "job c on 2 nodes")
        assert len(live_pilots(cluster)) == 3
    finally:
        h.close()
    wait(lambda: live_pilots(cluster) == [], 15, "every pilot cancelled at close")


def test_the_hub_refuses_a_pilot_without_the_token():
    seen = []
    hub = PilotHub("the-right-token", lambda link: seen.append(link), lambda link, why: None)
    try:
        address = "%s:%d" % hub.address
        for token in ("a-wrong-token", 12, None):
            w = dial(address, hub.fingerprint)
            w.send({"op": HELLO, "token": token, "job": "1", "node": "node1", "pid": 1})
            assert w.recv() is None, "the hub closes the connection"
            w.close()
        w = dial(address, hub.fingerprint)
        try:
            w.send({"op": HELLO, "token": "the-right-token", "job": "7", "node": "node1", "pid": 1})
            wait(lambda: hub.link("node1") and seen, 5, "the valid pilot")   # registered, then on_hello
        finally:
            w.close()
        assert [l.job for l in seen] == ["7"]
        wait(lambda: hub.link("node1") is None, 5, "its end")
    finally:
        hub.close()


def test_watch_takes_partitions_nodes_and_hostlists(cluster):
    cli = SlurmCli(str(cluster.conf), bin_dir=cluster.bin)
    nodes = cli.nodes()
    assert [n.name for n in nodes] == NODES and all(n.free for n in nodes)
    watch = lambda *w: resolve_watch(PilotSettings(watch=w), nodes, cli)
    assert watch() == NODES
    assert watch("main") == NODES
    assert watch("node[2-3,7]", "node1") == ["node1", "node2", "node3", "node7"]
    with pytest.raises(SettingError, match="no partition or node named 'gpu'"):
        watch("gpu")
    with pytest.raises(SettingError, match="does not have: node9"):
        watch("node[8-9]")
    with pytest.raises(SettingError, match="no partition 'debug'"):
        resolve_watch(PilotSettings(partition="debug"), nodes, cli)


def test_settings_are_checked_with_the_option_named():
    assert split_list("main, node[1-4,7],gpu01") == ("main", "node[1-4,7]", "gpu01")
    for bad, field in ((dict(max_pilots=0), "max_pilots"), (dict(poll_s=float("nan")), "poll_s"),
                       (dict(partition="scav enger"), "partition"), (dict(time_limit_min=0), "time_limit_min"),
                       (dict(watch=("node[1-2]; rm",)), "watch"), (dict(python="python3"), "python"),
                       (dict(worker_grace_s=-1), "worker_grace_s"), (dict(release_grace_s=-1), "release_grace_s")):
        with pytest.raises(SettingError) as e:
            PilotSettings(**bad)
        assert e.value.field == field
    r = run_module("app", "--source", "slurm", "--slurm-time-limit", "0")
    assert r.returncode == 2 and "error: --slurm-time-limit: must be a whole number" in r.stderr, r.stderr
    r = run_module("app", "--source", "slurm", "--slurm-release-grace", "-5")
    assert r.returncode == 2 and "error: --slurm-release-grace: must be a number" in r.stderr, r.stderr
    r = run_module("app", "--source", "slurm", "--dispatch", "ssh")
    assert r.returncode == 2 and "use --dispatch pilot" in r.stderr, r.stderr
    r = run_module("app", "--source", "slurm", "--slurm-conf", "/nonexistent/slurm.conf")
    assert r.returncode == 2 and "error: cannot read Slurm" in r.stderr, r.stderr


def test_the_status_bar_badge_shows_a_stale_source():
    badge = source_badge({"name": "slurm", "state": "stale", "detail": "cannot read Slurm: sinfo: ...",
                          "since": 1_700_000_000.0})
    assert "source-stale" in badge.className and badge.children.startswith("slurm: stale since")
    assert badge.title.startswith("cannot read Slurm")
    assert "source-ok" in source_badge({"name": "slurm", "state": "ok"}).className
    held = source_badge({"name": "slurm", "state": "ok", "held": 8, "used": 5})
    assert held.children == "slurm: ok · 8 held, 5 used"
