"""The PBS node source against a real OpenPBS (tests/support/openpbs.py: the daemons in a network
namespace of their own, 8 vnodes from one MoM, queue `main` preempting queue `scavenger` by
requeue), through `python -m app --source pbs` as docs/operators/pbs.md sets it up.

- The acceptance path: pilots hold 3 idle vnodes, a job registered through the API trains on
  them with real workers inside the pilots and grows to 3; a main job in `main` preempts one
  pilot and starts; the job shrinks and trains on; the preempted pilot is deleted, never
  requeued onto the main job's vnode; after the main job the vnode is held again and the job
  grows back; it ends with its exact samples, and a stopped harvester leaves no pilot.
- Restart adoption: a harvester killed with SIGKILL and started again on the same store keeps
  its pilots (the same PBS job ids) and the job trains on.
- Back-off: pilots that fail at start wait longer after each failure, say why on the badge and
  the node, and staff's clear gives the node a pilot at once.
Each test watches vnodes of its own, so the module shares one cluster."""
from __future__ import annotations

import signal
import sys
import time

from tests.support.openpbs import PbsCluster, pbs_cluster  # noqa: F401  (the fixture)
from tests.support.pace import PaceFile
from tests.support.pbs_harvest import GLOBAL_BATCH, PILOT, STEPS, app_args, on, pilots, register, workers_of
from tests.support.ports import free_port
from tests.support.procs import run_module
from tests.support.server import start_app
from tests.support.slurm import parent, processes_with_env, steps_into_generation
from tests.support.waiting import wait

def test_pilots_hold_idle_vnodes_and_give_one_back_to_a_main_job(pbs_cluster, tmp_path):
    pbs, watch = pbs_cluster, ["vn001", "vn002", "vn003"]
    pace = PaceFile(tmp_path, 0.5)
    app = start_app(tmp_path / "app", *app_args(pbs, tmp_path, watch))
    try:
        clu = lambda: app.get("/api/cluster")[1]
        c = clu()
        assert [n["name"] for n in c["nodes"]] == watch, "the grid shows PBS's own vnode names"
        assert c["source"]["state"] == "ok" and c["source"]["name"] == "pbs", c["source"]
        assert all(n["source"].startswith("PBS: free") for n in c["nodes"]), c["nodes"]

        jid = register(app, "digits on pbs", 3, pace)
        wait(lambda: clu()["kpis"]["idle"] == 3, 90, "pilots on all 3 vnodes", clu)
        held = pilots(pbs, "R")
        assert sorted(held.values()) == watch, held
        by_vnode = {v: j for j, v in held.items()}
        wait(on(app, jid, 3), 150, "the job training on 3 vnodes", lambda: workers_of(app, jid))
        wait(lambda: steps_into_generation(workers_of(app, jid), 5), 60, "5 steps into the generation",
             lambda: workers_of(app, jid))
        for v in watch:        # each worker is its pilot's child, with the pilot's PBS job
            found = {p: e for p, e in processes_with_env(f"HARVEST_NODE={v}").items() if f"HARVEST_JOB={jid}".encode() in e}
            assert len(found) == 1, v
            (pid, env), = found.items()
            assert parent(pid) in processes_with_env(f"PBS_JOBID={by_vnode[v]}"), v
            assert not [x for x in env.split(b"\0") if x.startswith(b"HARVEST_PILOT_")], "the pilot's token stays its own"

        # a main job takes vn002: PBS requeues its pilot, which leaves; the harvester deletes it
        victim = by_vnode["vn002"]
        t0 = time.monotonic()
        main = pbs.submit_main("vn002", 20)
        pbs.wait_job(main, "R", 30)
        print(f"main job running {time.monotonic() - t0:.2f} s after its qsub")
        step = wait(lambda: (on(app, jid, 2)() or {}).get("committed_step"), 60, "the job shrunk to 2",
                    lambda: workers_of(app, jid))
        wait(lambda: not processes_with_env(f"PBS_JOBID={victim}"), 15, "nothing left of the preempted pilot")
        wait(lambda: victim not in pilots(pbs), 15, "the preempted pilot deleted, not queued again", lambda: pilots(pbs))
        nodes = lambda: {n["name"]: n for n in clu()["nodes"]}
        wait(lambda: nodes()["vn002"]["state"] == "busy" and nodes()["vn002"]["source"].startswith("PBS: job-busy"),
             10, "the grid to show the main job's vnode busy", nodes)
        m = wait(lambda: (lambda m: m if m.get(("harvest_slurm_pilots_total", (("outcome", "preempted"),))) == 1
                          else None)(app.metrics()), 10, "the preemption in /metrics", app.metrics)
        assert m[("harvest_slurm_pilots_total", (("outcome", "lost"),))] == 0, m
        wait(lambda: workers_of(app, jid)["committed_step"] > step + 5, 60, "training on 2 vnodes",
             lambda: workers_of(app, jid))

        # the main job ends: vn002 is held by a new pilot and the job grows back
        pbs.wait_job(main, "F", 60)
        wait(lambda: "vn002" in pilots(pbs, "R").values() and clu()["kpis"]["idle"] == 3, 60,
             "vn002 held again", lambda: pilots(pbs))
        wait(on(app, jid, 3), 150, "the job grown back to 3", lambda: workers_of(app, jid))

        pace.release()
        job = wait(lambda: (lambda j: j if j["state"] in ("done", "failed", "cancelled") else None)(
            app.get(f"/api/jobs/{jid}")[1]), 180, "the job's end")
        assert job["state"] == "done" and job["samples_done"] == job["total_samples"] == GLOBAL_BATCH * STEPS, job
    finally:
        app.stop()
        print(app.output()[-3000:])
    wait(lambda: not pilots(pbs), 30, "the harvester deletes its pilots when it stops", lambda: pilots(pbs))
    wait(lambda: not processes_with_env(f"HARVEST_JOB={jid}"), 15, "every worker gone with its pilot")


def test_a_killed_harvester_is_restarted_with_its_pilots_and_the_job_trains_on(pbs_cluster, tmp_path):
    pbs, watch = pbs_cluster, ["vn004", "vn005"]
    pace = PaceFile(tmp_path, 0.2)
    args = app_args(pbs, tmp_path, watch, "--slurm-orphan-timeout", "60")
    app = start_app(tmp_path / "app", *args)
    again = None
    try:
        jid = register(app, "digits through a restart", 2, pace)
        wait(on(app, jid, 2), 150, "the job training on 2 vnodes", lambda: workers_of(app, jid))
        before = pilots(pbs, "R")
        assert sorted(before.values()) == watch, before
        pids = set(processes_with_env(f"HARVEST_JOB={jid}"))
        assert app.stop(signal.SIGKILL) == -signal.SIGKILL
        time.sleep(2.0)
        assert pilots(pbs, "R") == before, "the pilots outlive the harvester"
        again = start_app(tmp_path / "app", *args, db=app.db, users=tmp_path / "app" / "users.json")
        w = wait(on(again, jid, 2), 20, "the job training on 2 vnodes after the restart",
                 lambda: (workers_of(again, jid), again.output()[-2000:]))
        step = w["committed_step"]
        wait(lambda: workers_of(again, jid)["committed_step"] > step + 5, 30, "training on")
        assert pilots(pbs, "R") == before, "no pilot deleted or submitted anew: the same PBS job ids"
        assert set(processes_with_env(f"HARVEST_JOB={jid}")) == pids, "the same worker processes"
    finally:
        for a in (again, app):
            if a is not None:
                a.stop()
                print(a.output()[-2000:])
    wait(lambda: not pilots(pbs), 30, "no pilot left", lambda: pilots(pbs))


BROKEN = "this python cannot start"


def test_pilots_that_fail_at_start_back_off_and_say_why(pbs_cluster, tmp_path):
    pbs, watch = pbs_cluster, ["vn006"]
    python = tmp_path / "broken-python"
    python.write_text(f"#!/bin/sh\necho \"{BROKEN}\" >&2\nexit 1\n")
    python.chmod(0o755)
    logs = tmp_path / "pilot-logs"
    logs.mkdir()
    pace = PaceFile(tmp_path, 0.5)
    app = start_app(tmp_path / "app", *app_args(pbs, logs, watch, "--slurm-python", str(python),
                                                "--slurm-backoff", "8"))
    try:
        register(app, "a job for broken pilots", 1, pace)
        clu = lambda: app.get("/api/cluster")[1]
        src = wait(lambda: (lambda s: s if "failing on 1 node(s)" in s["detail"] else None)(clu()["source"]),
                   90, "the first pilot's failure on the badge", clu)
        assert "ended before it connected" in src["detail"] and BROKEN in src["detail"], src
        assert "1 failed pilot(s) in a row" in clu()["nodes"][0]["source"], clu()["nodes"][0]
        count = lambda: sum(1 for j in pbs.jobs_json(history=True).get("Jobs", {}).values() if j.get("Job_Name") == PILOT)
        wait(lambda: "2 failed pilot(s) in a row" in clu()["nodes"][0]["source"], 60, "a second failure after ~8 s",
             clu)
        n = count()
        time.sleep(8)          # the second failure doubled the wait to 16 s: no pilot meanwhile
        assert count() == n, "no pilot while the node waits"
        status, body = app.request("POST", "/api/nodes/vn006/clear", {}, token=app.token("staff1"))
        assert status == 200 and body["cleared"] is True, body
        wait(lambda: count() > n, 20, "a pilot at once on the cleared vnode")
    finally:
        app.stop()
        print(app.output()[-2000:])


def test_a_queue_or_vnode_pbs_lacks_is_refused_with_the_option_named(pbs_cluster, tmp_path):
    pbs = pbs_cluster
    base = ["--source", "pbs", "--pbs-bin", str(pbs.bin_dir), "--pbs-conf", str(pbs.conf), "--advertise",
            pbs.head_address, "--db", str(tmp_path / "h.db")]
    for extra, said in ((["--pbs-queue", "nosuch"], "error: --slurm-partition / --pbs-queue: PBS 23.06.06 has no "
                                                    "queue 'nosuch' (it has "),
                        (["--slurm-watch", "vn001,vn999"], "error: --slurm-watch: PBS has no vnode or host named vn999"),
                        (["--pbs-bin", str(tmp_path)], "error: cannot read PBS: cannot run ")):
        r = run_module("app", *base, *extra, "--port", str(free_port()), timeout=60)
        assert r.returncode == 2 and said in r.stderr, r.stderr
    assert not pilots(pbs), "nothing was submitted"


def test_a_pilot_suspended_for_a_main_job_gives_its_vnode_back_and_is_ended(tmp_path):
    """preempt_order "S": PBS stops the pilot with SIGSTOP, which it cannot catch or report. The
    harvester reads it suspended at its next poll: the vnode leaves the job, and the pilot is
    deleted with `qdel -W force` (a plain qdel leaves its processes stopped for ever)."""
    pace = PaceFile(tmp_path, 0.2)
    with PbsCluster(tmp_path / "pbs", vnodes=2, preempt_order="S") as pbs:
        app = start_app(tmp_path / "app", *app_args(pbs, tmp_path, ["vn001", "vn002"]))
        try:
            jid = register(app, "digits under suspension", 2, pace)
            wait(on(app, jid, 2), 150, "the job training on 2 vnodes", lambda: workers_of(app, jid))
            victim = {v: j for j, v in pilots(pbs, "R").items()}["vn002"]
            procs = processes_with_env(f"PBS_JOBID={victim}")
            assert procs
            main = pbs.submit_main("vn002", 30)
            pbs.wait_job(main, "R", 30)
            wait(lambda: on(app, jid, 1)(), 60, "the job shrunk to 1", lambda: workers_of(app, jid))
            wait(lambda: victim not in pilots(pbs, "RQS"), 20, "the suspended pilot ended", lambda: pilots(pbs, "RQS"))
            wait(lambda: not processes_with_env(f"PBS_JOBID={victim}"), 20, "no stopped process of it left",
                 lambda: processes_with_env(f"PBS_JOBID={victim}"))
            step = workers_of(app, jid)["committed_step"]
            wait(lambda: workers_of(app, jid)["committed_step"] > step + 5, 60, "training on 1 vnode")
        finally:
            app.stop()
            print(app.output()[-3000:])


def test_a_gpu_vnode_runs_a_rank_per_gpu_and_its_pilot_asks_for_them(pbs_cluster, tmp_path):
    """vn007 and vn008 have `ngpus = 2`: the source gives them 2 slots, each pilot asks PBS for the
    vnode's 2 GPUs (its exec_vnode says so), and a worker the pilot starts carries the pilot's PBS
    job, not its token. (This OpenPBS has no cgroup hook, so PBS sets no CUDA_VISIBLE_DEVICES: the
    pilot hands on whatever device variables it got, which tests/test_slurm_gpus.py checks on Slurm.)"""
    from core.assemble import build
    from core.pilots.transport import PilotTransport
    from core.schemas import JobSpec
    from core.settings import HarvesterSettings
    from core.transports.base import NodeSpec
    from tests.support.procs import environ_of
    pbs = pbs_cluster
    h = build(HarvesterSettings.parse({"db": tmp_path / "h.db", "tick_s": 0.2, "live": {
        "source": "pbs", "dispatch": "simulated", "advertise": pbs.head_address, "config": {"tfwd": 600},
        "slurm": {"conf": str(pbs.conf), "bin_dir": str(pbs.bin_dir), "watch": ("vn007", "vn008")}}}))
    h.open()
    try:
        assert [h.source.slots_of(n) for n in ("vn007", "vn008")] == [2, 2]
        h.submit(JobSpec(name="sim", min_nodes=1, max_nodes=2, total_samples=1e12, curve="1:100, 2:200",
                         scale_up_seconds=0, scale_down_seconds=0), "alice")
        wait(lambda: h.snapshot.kpis["idle"] == 2, 60, "pilots on vn007 and vn008")
        held = pilots(pbs, "R")
        jobs = pbs.jobs_json()["Jobs"]
        assert {jobs[j]["exec_vnode"] for j in held} == {"(vn007:ncpus=1:ngpus=2)", "(vn008:ncpus=1:ngpus=2)"}, jobs
        pilot7 = {v: j for j, v in held.items()}["vn007"]
        transport = PilotTransport(h.source.hub)
        handle = transport.start(NodeSpec("vn007", slots=2), [sys.executable, "-c", "import time; time.sleep(60)"],
                                 {"HARVEST_PROBE": "pbs"}, "", str(tmp_path / "probe.log"))
        try:
            env = environ_of(wait(lambda: list(processes_with_env("HARVEST_PROBE=pbs")), 15, "the worker")[0])
            assert env["PBS_JOBID"] == pilot7
            assert not [k for k in env if k.startswith("HARVEST_PILOT_")], "the pilot's token stays its own"
        finally:
            transport.stop(handle, 1.0)
    finally:
        h.close()
    wait(lambda: not processes_with_env("HARVEST_PROBE=pbs"), 10, "the probe worker gone")
    wait(lambda: not pilots(pbs), 30, "no pilot left", lambda: pilots(pbs))
