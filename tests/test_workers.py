"""Real elastic PyTorch workers under the live harvester, dispatched as local processes: a job
starts on 2 nodes, grows to 3, is vacated down to 1 by its source (within 2 s), grows again,
loses a worker to SIGKILL, and finishes with exactly its total samples; nothing is left behind."""
from __future__ import annotations

import sys
import time

import pytest

from core.assemble import build
from core.schemas import JobSpec
from core.settings import HarvesterSettings
from tests.support.files import ROOT
from tests.support.procs import environ_of, leftovers
from tests.support.pace import PaceFile
from tests.support.waiting import wait

GLOBAL_BATCH = 64
TOTAL = GLOBAL_BATCH * 1200


@pytest.fixture
def live(tmp_path):
    h = build(HarvesterSettings.parse({"db": tmp_path / "live.db", "tick_s": 0.1, "live": {
        "dispatch": "local", "local_nodes": 4, "profiler": False, "config": {"tfwd": 60}, "trust_user_commands": True,
        "workers": {"rejoin_after_s": 2.0}}}))
    names = h.source.node_names()
    for n in names[2:]:
        h.source.reclaim(n, time.time())
    h.source.poll(time.time())
    h.open()
    yield h, names
    h.close()


def test_grow_shrink_vacate_kill_and_finish_exactly(live, tmp_path):
    h, names = live
    pace = PaceFile(tmp_path, 0.03)
    spec = JobSpec(name="digits", min_nodes=1, max_nodes=3, total_samples=TOTAL, curve="1:100, 3:300",
                   scale_up_seconds=0, scale_down_seconds=0, global_batch=GLOBAL_BATCH,
                   command=[sys.executable, str(ROOT / "examples" / "digits_cnn.py"), "--seed", "1",
                            "--log-every", "1000000", *pace.args])
    job = h.submit(spec, "alice")
    d = h.dispatcher
    st = lambda: d.status(job.id) or {}
    world = lambda n: (lambda: st().get("world_size") == n and not st().get("regrouping"))
    wait(world(2), 60, "the job on 2 nodes")
    first_loss = wait(lambda: st().get("loss"), 30, "a first loss")
    h.source.release(names[2], time.time())
    wait(world(3), 60, "growth to 3")
    t0 = time.monotonic()
    h.source.reclaim(names[0], time.time())
    h.source.reclaim(names[1], time.time())
    wait(world(1), 30, "vacated down to 1")
    wait(lambda: not any(n in d._runs[job.id].handles for n in names[:2]), 10, "workers gone")
    vacate_s = time.monotonic() - t0
    assert vacate_s < 2.0 + 1.0, f"vacating took {vacate_s:.2f} s"
    for n in names[:2]:
        h.source.release(n, time.time())
    wait(world(3), 60, "growth back to 3")
    mid_loss = wait(lambda: st().get("loss"), 30, "a loss at 3 nodes")
    victim = d._runs[job.id].handles[names[1]]
    d.transport.kill(victim)
    wait(lambda: names[1] in st().get("lost", []), 10, "the killed worker seen as lost")
    pace.release()
    losses = []

    def finished():
        loss = st().get("loss")
        if loss is not None:
            losses.append(loss)
        return h.snapshot.job(job.id)["state"] == "done"
    wait(finished, 240, "the job to finish",
         lambda: (h.snapshot.job(job.id), st(), d.generations(job.id)[-3:] if hasattr(d, "generations") else None))
    final = h.controller.job(job.id)
    assert final.samples_done == TOTAL, "every sample exactly once"
    assert mid_loss < first_loss and min(losses[-20:]) < 0.5 * first_loss, (first_loss, mid_loss, losses[-20:])
    reasons = [r[0] for r in h.controller.store.db.execute(
        "select reason from allocations where job = ? order by id", (job.id,))]
    # the owner's reclaims and the killed worker's node: each leave says why (issue 56)
    assert reasons[0] == "start" and "grow" in reasons and "reclaimed" in reasons and "lost" in reasons, reasons
    assert "preempted" not in reasons, "nobody preempted it"
    wait(lambda: not leftovers(job.id), 15, "every worker process to be gone")


def test_a_job_whose_workers_keep_crashing_fails_with_its_log(live):
    h, names = live
    spec = JobSpec(name="broken", min_nodes=1, max_nodes=2, total_samples=6400, curve="1:100, 2:200",
                   global_batch=64, command=[sys.executable, "-c",
                                             "import sys; print('boom: no such dataset'); sys.exit(1)"])
    job = h.submit(spec, "alice")
    wait(lambda: h.snapshot.job(job.id)["state"] == "failed", 60, "the job to fail")
    h.controller.flush()
    detail = h.controller.store.db.execute(
        "select detail from events where job = ? and kind = 'job_failed'", (job.id,)).fetchone()
    assert detail and "boom: no such dataset" in detail[0], detail
    wait(lambda: not leftovers(job.id), 10, "no worker left")




def test_workers_get_an_allowlisted_environment(tmp_path, monkeypatch):
    """A worker inherits PATH, HOME, LANG/LC_* and what the site lists, plus its own job's
    variables: never the harvester's secrets, nor another job's token."""
    secrets = {"HARVEST_SECRET_KEY": "s3cret-key", "HARVEST_PILOT_TOKEN": "pilot-tok", "AWS_SECRET_ACCESS_KEY": "aws"}
    for k, v in {**secrets, "SITE_LIBS": "/opt/site/lib", "LC_ALL": "C.UTF-8"}.items():
        monkeypatch.setenv(k, v)
    h = build(HarvesterSettings.parse({"db": tmp_path / "live.db", "tick_s": 0.1, "live": {
        "dispatch": "local", "local_nodes": 2, "profiler": False, "worker_env": ["SITE_LIBS"],
        "trust_user_commands": True}}))
    h.open()
    try:
        spec = dict(min_nodes=1, max_nodes=1, total_samples=GLOBAL_BATCH * 10**6, curve="1:100",
                    global_batch=GLOBAL_BATCH, command=[sys.executable, str(ROOT / "examples" / "digits_cnn.py"),
                                                        "--log-every", "1000000", "--step-seconds", "0.05"])
        jobs = [h.submit(JobSpec(name=f"env{i}", **spec), "alice") for i in range(2)]
        pids = {j.id: wait(lambda j=j: leftovers(j.id), 60, f"the worker of {j.id}") for j in jobs}
        envs = {jid: environ_of(p[0]) for jid, p in pids.items()}
        for jid, env in envs.items():
            leaked = {k for k in env if k in secrets} | {k for k, v in env.items() if v in secrets.values()}
            assert not leaked, f"the worker of {jid} got the harvester's {sorted(leaked)}"
            assert env["SITE_LIBS"] == "/opt/site/lib" and env["LC_ALL"] == "C.UTF-8" and "PATH" in env
            assert env["HARVEST_JOB"] == jid and env["HARVEST_TOKEN"]
        a, b = (envs[j.id] for j in jobs)
        assert a["HARVEST_TOKEN"] != b["HARVEST_TOKEN"]
        assert b["HARVEST_TOKEN"] not in a.values() and a["HARVEST_TOKEN"] not in b.values()
        for j in jobs:
            h.cancel(j.id)
        wait(lambda: not any(leftovers(j.id) for j in jobs), 30, "the workers gone")
    finally:
        h.close()
