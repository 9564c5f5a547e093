"""A failed or cancelled job continues (issue 56, item 4).

- The controller (core/requeue.py) on the simulated dispatcher with a real store: a JOB_FAILED
  whose failure is its nodes' only (unreachable, hung, killed from outside, its store process
  ending) sends the job back to the queue with its samples, a JOB_REQUEUE event in place of the
  failure, at most MAX_REQUEUES times, then it fails; the job's own failure fails it at once.
- `POST /api/jobs/<id>/resubmit`, `Client.resubmit` and `harvest resubmit` against a real
  `python -m app` with simulated live workers: a new job (its own id and events, the old one's
  owner and fields, `resubmitted_from`) from the old one's samples; only the owner or staff,
  only a failed or cancelled job, refused as a registration would be (quota) with nothing stored.
- Real workers (`--dispatch local`): an elastic-runtime job (examples/digits_cnn.py) and a
  torchrun job (examples/torchrun_digits.py) are cancelled midway and resubmitted through the
  client: the new job's first progress is the old one's checkpoint (not 0), its first generation
  starts at the checkpoint's step, and it ends at exactly its total samples.
"""
from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from app.client import ApiError, Client
from core import failures
from core.clock import SimClock
from core.controller_config import ControllerConfig
from core.dispatchers.simulated import SimulatedDispatcher
from core.model import Event, EventKind, JobState
from core.requeue import MAX_REQUEUES, nodes_only
from core.restore import restore
from core.store import Store
from tests.support.pace import PaceFile
from tests.support.procs import leftovers
from tests.support.server import ROOT, password, start_app
from tests.support.sim import T0, controller, job
from tests.support.waiting import wait


# ---- the controller: a failure of its nodes only is a requeue --------------------------------------

def _failure(kind: str, message: str = "it went away") -> dict:
    return failures.named(kind, message, "n1").to_dict()


def _events(store: Store, jid: str) -> list[tuple[str, str]]:
    return [(k, d or "") for k, d in store.db.execute("select kind, detail from events where job = ? order by id",
                                                      (jid,))]


def test_the_failure_kinds_that_are_the_nodes_only():
    assert nodes_only(_failure(failures.UNREACHABLE)) and nodes_only(_failure(failures.HUNG))
    assert nodes_only(_failure(failures.STORE_DOWN))
    assert nodes_only(_failure(failures.SIGNAL, "killed by SIGKILL")), "killed from outside: the node's"
    assert not nodes_only(_failure(failures.SIGNAL, "killed by SIGSEGV")), "a crash of its own"
    for own in (failures.EXCEPTION, failures.OUT_OF_MEMORY, failures.COMMAND_NOT_FOUND, failures.NO_PROGRESS,
                failures.CRASHES, failures.OTHER):
        assert not nodes_only(_failure(own)), own
    assert not nodes_only(None) and not nodes_only({"message": "no kind"})


def test_a_job_its_nodes_failed_goes_back_to_the_queue_and_fails_only_after_a_few_times(tmp_path):
    db = tmp_path / "run.db"
    store = Store(db)
    nodes = ["n1", "n2", "n3", "n4"]
    ctl, clock = controller(nodes, ControllerConfig(max_jobs=2, tfwd=1000), store)
    ctl.submit(job("A", total=1e7))
    ctl.step()
    assert len(ctl.held["A"]) == 4
    for i in range(1, MAX_REQUEUES + 1):
        clock.advance_to(T0 + 100 * i)
        before = ctl.dispatcher.progress(ctl.jobs["A"], clock.now())
        assert before > 0
        ctl.step([Event(clock.now(), EventKind.JOB_FAILED, job="A", node="n1",
                        failure=_failure(failures.STORE_DOWN, "the job's store ended 3 times"))])
        a = ctl.jobs["A"]
        # back to the queue and, with the nodes idle, admitted and placed again in the same step
        assert a.state is JobState.RUNNING and a.failure is None and a.requeues == i, a
        assert a.samples_done == pytest.approx(before), "its samples are kept"
        assert len(ctl.held["A"]) == 4
        ctl.flush()
        kinds = [k for k, _ in _events(store, "A")]
        assert kinds.count("job_requeue") == i and "job_failed" not in kinds, kinds
        assert store.db.execute("select requeues from jobs where id = 'A'").fetchone()[0] == i
    detail = [d for k, d in _events(store, "A") if k == "job_requeue"][0]
    assert "its nodes failed it, not itself (1 of 3)" in detail and "store down" in detail, detail
    reasons = [r[0] for r in store.db.execute("select reason from allocations where job = 'A' order by id")]
    assert reasons.count("requeued") == MAX_REQUEUES and reasons.count("start") == MAX_REQUEUES + 1, reasons

    clock.advance_to(T0 + 1000)            # once more: it has had its chances
    ctl.step([Event(clock.now(), EventKind.JOB_FAILED, job="A", failure=_failure(failures.UNREACHABLE))])
    assert ctl.jobs["A"].state is JobState.FAILED and ctl.jobs["A"].failure["kind"] == failures.UNREACHABLE
    ctl.flush()
    store.close()
    back = restore(Store(db), SimulatedDispatcher(), SimClock(T0 + 1100), node_names=nodes)
    assert back.jobs["A"].requeues == MAX_REQUEUES and back.jobs["A"].state is JobState.FAILED


def test_a_job_that_failed_of_its_own_fails_at_once(tmp_path):
    store = Store(tmp_path / "run.db")
    ctl, clock = controller(["n1", "n2"], ControllerConfig(max_jobs=2, tfwd=1000), store)
    ctl.submit(job("A", total=1e7))
    ctl.step()
    clock.advance_to(T0 + 10)
    ctl.step([Event(clock.now(), EventKind.JOB_FAILED, job="A", failure=_failure(failures.EXCEPTION, "ValueError"))])
    assert ctl.jobs["A"].state is JobState.FAILED and ctl.jobs["A"].requeues == 0
    ctl.flush()
    assert [k for k, _ in _events(store, "A")][-1] == "job_failed"


# ---- the API, the client and `harvest resubmit` on simulated workers -------------------------------

LONG = {"min_nodes": 1, "max_nodes": 2, "total_samples": 1e9, "curve": "1:1000, 2:1900"}


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    proc = start_app(tmp_path_factory.mktemp("resubmit"), "--fresh", "--dispatch", "simulated",
                     "--local-nodes", "4", "--tick", "0.1", "--user-max-jobs", "2")
    yield proc
    proc.stop()


def _harvest(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.harvest_cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


def test_a_cancelled_job_is_resubmitted_from_where_it_stopped(sim, tmp_path):
    alice = Client.login(sim.url, "alice", password("alice"))
    old = alice.submit(name="continued", **LONG)
    wait(lambda: alice.job(old["id"])["samples_done"] > 5000, 30, "some samples done")
    stopped = alice.cancel(old["id"])
    done = alice.job(old["id"])["samples_done"]
    assert stopped["state"] == "cancelled" and done > 5000
    new = alice.resubmit(old["id"])
    assert new["id"] != old["id"] and new["owner"] == "alice" and new["resubmitted_from"] == old["id"], new
    one = alice.job(new["id"])
    assert one["resubmitted_from"] == old["id"] and one["name"] == "continued" and one["max_nodes"] == 2
    assert one["samples_done"] >= done and one["state"] in ("queued", "running"), (one, done)
    assert alice.job(old["id"])["state"] == "cancelled", "the old job stays as it was"
    submitted = wait(lambda: [e for e in alice.events(new["id"]) if e["kind"] == "job_submit"], 10,
                     "its submit event")[0]
    assert f"resubmitted from job {old['id']} (cancelled): continues at {done:,.0f}" in submitted["detail"], submitted
    assert not [e for e in alice.events(old["id"]) if e["kind"] == "job_submit" and "resubmitted" in
                (e["detail"] or "")], "the new job's events are its own"

    # a second resubmission of the same old job is one more job; the quota (2) counts it
    staff = Client.login(sim.url, "staff1", password("staff1"))
    twice = staff.resubmit(old["id"])
    assert twice["owner"] == "alice" and twice["id"] not in (new["id"], old["id"])
    before = len(alice.jobs())
    with pytest.raises(ApiError) as quota:
        alice.resubmit(old["id"])
    assert quota.value.status == 422 and "the most one user may have (2)" in quota.value.field_errors["job"], quota
    assert len(alice.jobs()) == before, "a refused resubmission stores nothing"
    for jid in (new["id"], twice["id"]):
        alice.cancel(jid)

    env = {**os.environ, "HARVEST_URL": sim.url, "HARVEST_PASSWORD": password("alice"),
           "HARVEST_TOKEN_FILE": str(tmp_path / "token")}
    assert _harvest("login", "alice", env=env).returncode == 0
    r = _harvest("resubmit", old["id"], env=env)
    assert r.returncode == 0, r
    third = r.stdout.strip()
    assert re.fullmatch(r"u-[0-9a-f]{8}", third) and f"continues job {old['id']} from its checkpoint" in r.stderr, r
    assert alice.job(third)["resubmitted_from"] == old["id"]
    alice.cancel(third)
    r = _harvest("resubmit", third + "-nope", env=env)
    assert r.returncode == 2 and r.stdout == "" and "404" in r.stderr, r


def test_only_its_owner_or_staff_resubmit_only_a_failed_or_cancelled_job(sim):
    alice = Client.login(sim.url, "alice", password("alice"))
    bob = Client.login(sim.url, "bob", password("bob"))
    running = alice.submit(name="still running", **LONG)
    wait(lambda: alice.job(running["id"])["state"] == "running", 20, "the job to run")
    for call, status, words in ((lambda: alice.resubmit(running["id"]), 409, "only a failed or cancelled job"),
                                (lambda: bob.resubmit(running["id"]), 403, "only its owner or staff"),
                                (lambda: Client(sim.url).resubmit(running["id"]), 401, "log in"),
                                (lambda: alice.resubmit("u-00000000"), 404, "no job")):
        with pytest.raises(ApiError) as refused:
            call()
        assert refused.value.status == status and words in refused.value.message, refused.value
    alice.cancel(running["id"])
    with pytest.raises(ApiError) as not_yours:
        bob.resubmit(running["id"])
    assert not_yours.value.status == 403
    short = alice.submit(name="short", min_nodes=1, max_nodes=2, total_samples=300, curve="1:100, 2:190",
                         scale_up_seconds=0, scale_down_seconds=0)
    assert alice.wait(short["id"], timeout=30, poll_s=0.1)["state"] == "done"
    with pytest.raises(ApiError) as finished:
        alice.resubmit(short["id"])
    assert finished.value.status == 409 and "is done" in finished.value.message
    status, body = sim.request("POST", f"/api/jobs/{running['id']}/resubmit", raw=b"[1]", token=sim.token("alice"))
    assert status == 400, body


# ---- real workers: the checkpoint carries over -----------------------------------------------------

GLOBAL_BATCH = 64
TOTAL = GLOBAL_BATCH * 400


@pytest.fixture
def local(tmp_path):
    app = start_app(tmp_path, "--fresh", "--dispatch", "local", "--local-nodes", "1", "--no-profiler",
                    "--tick", "0.1")
    yield app
    assert app.stop() == 0, app.output()[-3000:]


def _first_progress(app, jid: str) -> float:
    with sqlite3.connect(f"file:{app.db}?mode=ro", uri=True) as conn:
        row = conn.execute("select samples_done from throughput where job = ? and samples_done is not null "
                           "order by id limit 1", (jid,)).fetchone()
    assert row is not None, f"no progress stored for {jid}"
    return row[0]


def _cancel_midway(api: Client, jid: str, at_least: float) -> None:
    wait(lambda: api.job(jid)["samples_done"] >= at_least, 120, f"{at_least:.0f} samples", lambda: api.job(jid))
    api.cancel(jid)
    wait(lambda: not leftovers(jid), 60, "the cancelled job's workers to be gone")


def test_a_cancelled_runtime_job_continues_from_its_checkpoint(local, tmp_path):
    alice = Client.login(local.url, "alice", password("alice"))
    pace = PaceFile(tmp_path, 0.03)
    old = alice.submit(name="digits", min_nodes=1, max_nodes=1, total_samples=TOTAL, global_batch=GLOBAL_BATCH,
                       curve="1:1000", scale_up_seconds=0, scale_down_seconds=0,
                       command=[sys.executable, str(ROOT / "examples" / "digits_cnn.py"), "--seed", "1",
                                "--log-every", "1000000", "--checkpoint-every", "0.2", *pace.args])
    _cancel_midway(alice, old["id"], GLOBAL_BATCH * 60)
    ckpt = Path(f"{local.db}.workers") / old["id"] / "checkpoint"
    step = json.loads((ckpt / "checkpoint.json").read_text())["step"]
    assert 60 <= step < TOTAL // GLOBAL_BATCH, step
    assert (ckpt / "checkpoint.pt").is_file(), "the checkpoint outlives its job"
    pace.release()

    new = alice.resubmit(old["id"])
    assert new["samples_done"] == step * GLOBAL_BATCH, (new, step)
    get = lambda: alice.job(new["id"])
    first = wait(lambda: ((get().get("workers") or {}).get("generations") or [None])[0], 120,
                 "the new job's first generation", get)
    wait(lambda: get()["workers"]["generations"][0].get("start_step") is not None, 60, "its first step", get)
    assert get()["workers"]["generations"][0]["start_step"] == step, (first, step)
    done = alice.wait(new["id"], timeout=240, poll_s=0.3)
    assert done["state"] == "done" and done["samples_done"] == TOTAL, done
    assert _first_progress(local, new["id"]) == step * GLOBAL_BATCH, "the new job's progress starts at the checkpoint"
    assert json.loads((ckpt / "checkpoint.json").read_text())["step"] == step, "the old job's folder is left alone"
    wait(lambda: not leftovers(new["id"]), 30, "every worker gone")


def test_a_cancelled_torchrun_job_continues_from_its_checkpoint(local, tmp_path):
    alice = Client.login(local.url, "alice", password("alice"))
    pace = PaceFile(tmp_path, 0.03)
    command = [sys.executable, "examples/torchrun_digits.py", "--total-samples", str(TOTAL), "--global-batch",
               str(GLOBAL_BATCH), *pace.args, "--checkpoint-every", "20", "--log-every", "5"]
    old = alice.submit(name="torchrun digits", launcher="torchrun", min_nodes=1, max_nodes=1, total_samples=TOTAL,
                       curve="1:1000", scale_up_seconds=0, scale_down_seconds=0, stop_grace_seconds=20,
                       command=command)
    _cancel_midway(alice, old["id"], GLOBAL_BATCH * 60)
    logs = Path(f"{local.db}.workers") / old["id"]
    said = [int(n) for log in logs.glob("*-g*.log")
            for n in re.findall(r"^checkpoint step=\d+ samples=(\d+) kind=signal", log.read_text(), re.M)]
    assert said and said[-1] >= GLOBAL_BATCH * 60, said       # rank 0 checkpointed as it was stopped
    checkpointed = said[-1]
    pace.release()

    new = alice.resubmit(old["id"])
    assert 0 < new["samples_done"] <= checkpointed, (new, checkpointed)
    done = alice.wait(new["id"], timeout=240, poll_s=0.3)
    assert done["state"] == "done" and done["samples_done"] == TOTAL, done
    first = _first_progress(local, new["id"])
    assert 0 < first <= checkpointed, (first, checkpointed)
    starts = [int(n) for log in (Path(f"{local.db}.workers") / new["id"]).glob("*-g0.log")
              for n in re.findall(r"^start step=\d+ samples=(\d+) .*resumed=True", log.read_text(), re.M)]
    assert starts == [checkpointed], f"its first generation resumes at the checkpoint: {starts}"
    wait(lambda: not leftovers(new["id"]), 30, "every worker gone")
