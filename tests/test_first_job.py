"""A user's first real jobs across three hosts (network namespaces, each with its own sshd and
loopback), the way the README's first steps go wrong, and that each says why where the user
looks, within seconds: the job's events, its why-line, `GET /api/jobs/<id>` (`failure`), its
logs and the client's exception; and that no node stays held by a job with no live process.

- a relative command with no `--workdir` (ssh starts in the home folder): one set-up failure;
- node names that resolve to loopback here (`vm` is 127.0.0.1 in /etc/hosts, also inside the
  namespaces): the runtime binds the interface that reaches the head, no GLOO_SOCKET_IFNAME;
- a torchrun script whose rank 0 exits 0 early; one that prints progress without flushing
  (PYTHONUNBUFFERED); one that prints nothing, and a runtime job that never steps (start timeout).
"""
from __future__ import annotations

import sqlite3
import subprocess
import sys
import time

import pytest

from app.client import Client, JobFailed
from tests.support.procs import leftovers
from tests.support.server import ROOT, start_app
from tests.support.waiting import wait

START_TIMEOUT = 20
PY = sys.executable


@pytest.fixture(scope="module")
def app(tmp_path_factory, netns_cluster):
    tmp = tmp_path_factory.mktemp("first-job")
    inventory = netns_cluster.write_inventory(tmp / "nodes.txt")
    with inventory.open("a") as f:
        f.write(f"node-dead {netns_cluster.dead_alias}\n")      # fails its check: never offered
    proc = start_app(tmp, "--fresh", "--dispatch", "ssh", "--nodes", str(inventory),
                     "--ssh-config", str(netns_cluster.ssh_config), "--advertise", netns_cluster.head,
                     "--tick", "0.1", "--no-profiler", "--start-timeout", str(START_TIMEOUT))
    proc.tmp, proc.inventory = tmp, inventory
    yield proc
    proc.stop()


def _submit(app, token, **fields) -> str:
    body = {"min_nodes": 1, "max_nodes": 3, "curve": "1:100, 3:300", "scale_up_seconds": 0,
            "scale_down_seconds": 0, **fields}
    status, job = app.request("POST", "/api/jobs", body, token=token)
    assert status == 201, job
    return job["id"]


def _events(app, jid: str) -> list[tuple[str, str]]:
    with sqlite3.connect(f"file:{app.db}?mode=ro", uri=True) as db:
        return db.execute("SELECT kind, detail FROM events WHERE job = ? ORDER BY id", (jid,)).fetchall()


def _held_by(app, jid: str) -> list[str]:
    return [n["name"] for n in app.get("/api/cluster")[1]["nodes"] if n["job"] == jid]


def _failed_with(app, jid: str, kind: str, within: float, alice: str) -> dict:
    """The job failed with `kind`, said in the API, its why-line, its events and the client's
    exception; returns the API's failure."""
    get = lambda: app.get(f"/api/jobs/{jid}")[1]
    job = wait(lambda: get()["state"] == "failed" and get(), within, f"job {jid} failed", get)
    failure = job["failure"]
    assert failure["kind"] == kind, failure
    assert failure["message"] and failure["hint"], failure
    assert kind.replace("_", " ") in job["why"] and failure["message"][:40] in job["why"], job["why"]
    wait(lambda: any(k == "job_failed" and kind.replace("_", " ") in d for k, d in _events(app, jid)), 5,
         "the failure in the job's events", lambda: _events(app, jid))
    with pytest.raises(JobFailed) as err:
        Client(app.url, token=alice).wait(jid, timeout=5, check=True)
    assert err.value.failure["kind"] == kind and kind in str(err.value)
    wait(lambda: not _held_by(app, jid), 30, "its nodes given back", lambda: _held_by(app, jid))
    return failure


def test_a_relative_command_without_a_working_folder_fails_once_and_says_so(app):
    alice = app.token("alice")
    t0 = time.monotonic()
    jid = _submit(app, alice, name="relative", total_samples=64 * 100, global_batch=64,
                  command=[".venv/bin/python", "examples/digits_cnn.py"])
    failure = _failed_with(app, jid, "command_not_found", 10, alice)
    assert time.monotonic() - t0 < 15
    assert ".venv/bin/python" in failure["message"] and "--workdir" in failure["hint"]
    assert sum(k == "job_failed" for k, _ in _events(app, jid)) == 1        # one message, not one per node
    assert not any(k == "node_leave" for k, _ in _events(app, jid))         # no node counted as lost


def test_node_names_that_resolve_to_loopback_need_no_interface_setting(app, netns_cluster):
    """`vm` (every namespace's host name) is 127.0.0.1 here: gloo alone would advertise that;
    the runtime binds the interface that reaches the head (eth0), the job trains on 3 nodes."""
    assert "GLOO_SOCKET_IFNAME" not in app.output()
    alice = app.token("alice")
    jid = _submit(app, alice, name="loopback names", total_samples=64 * 100_000, global_batch=64,
                  command=[PY, str(ROOT / "examples" / "digits_cnn.py"), "--step-seconds", "0.02"])
    get = lambda: app.get(f"/api/jobs/{jid}")[1]
    stepping = lambda: (lambda w: w.get("world_size") == 3 and (w.get("committed_step") or 0) > 5)(
        get().get("workers") or {})
    wait(stepping, 60, "3 nodes stepping", get)
    assert app.request("DELETE", f"/api/jobs/{jid}", token=alice)[0] == 200
    wait(lambda: not _held_by(app, jid), 30, "its nodes given back")


def _torchrun_script(app, name: str, body: str) -> str:
    path = app.tmp / name
    path.write_text("import os, sys, time\nrank = int(os.environ['RANK'])\n" + body)
    return str(path)


def test_a_torchrun_job_whose_rank_0_exits_early_holds_no_node(app):
    """Rank 0 exits 0 short of the total while the other ranks wait on it: the job fails,
    named, and neither node stays held."""
    alice = app.token("alice")
    script = _torchrun_script(app, "early.py", (
        "if rank == 0:\n"
        "    for i in range(3):\n"
        "        print(f'samples={64 * (i + 1)}', flush=True); time.sleep(0.3)\n"
        "    sys.exit(0)\n"
        "time.sleep(600)\n"))
    jid = _submit(app, alice, name="early exit", launcher="torchrun", min_nodes=2, max_nodes=2,
                  curve="2:200", total_samples=64 * 1000, command=[PY, script])
    get = lambda: app.get(f"/api/jobs/{jid}")[1]
    wait(lambda: get()["nodes"] == 2, 30, "2 nodes", get)
    failure = _failed_with(app, jid, "exited_early", 15, alice)
    assert "rank 0 exited at 192 of 64,000 samples" in failure["message"], failure
    wait(lambda: not leftovers(jid), 10, "every rank of the job gone", lambda: leftovers(jid))


def test_a_buffered_script_shows_its_progress_in_steps_and_finishes(app):
    """print() without flush: its lines reach the log as printed (PYTHONUNBUFFERED); it counts
    steps, not samples (`samples_per_step`), and the job finishes with exactly its total."""
    alice = app.token("alice")
    script = _torchrun_script(app, "buffered.py", (
        "for step in range(1, 41):\n"
        "    if rank == 0:\n"
        "        print(f'step {step} of 40')\n"
        "    time.sleep(0.25)\n"))
    jid = _submit(app, alice, name="buffered", launcher="torchrun", min_nodes=1, max_nodes=1, curve="1:100",
                  total_samples=64 * 40, progress_pattern=r"step (\d+) of", samples_per_step=64,
                  command=[PY, script])
    get = lambda: app.get(f"/api/jobs/{jid}")[1]
    job = wait(lambda: (lambda j: 0 < j["samples_done"] < 64 * 40 and j)(get()), 20, "progress before the end", get)
    assert job["samples_done"] % 64 == 0 and job["samples_per_step"] == 64, job
    assert (job.get("workers") or {}).get("last_output", "").startswith("step "), job
    wait(lambda: get()["state"] == "done", 30, "done", get)
    assert get()["samples_done"] == 64 * 40


def test_jobs_that_never_step_fail_at_the_start_timeout_with_their_last_words(app):
    """Both launchers: a runtime job whose script never reaches its loop and a torchrun job whose
    rank 0 prints no progress line fail after --start-timeout, with rank 0's last line."""
    alice = app.token("alice")
    quiet = _torchrun_script(app, "quiet.py", "print('loading the data set', flush=True)\ntime.sleep(600)\n")
    stuck = _torchrun_script(app, "stuck.py", "print('waiting for a lock', flush=True)\ntime.sleep(600)\n")
    t0 = time.monotonic()
    jobs = [_submit(app, alice, name="quiet", launcher="torchrun", min_nodes=1, max_nodes=1, curve="1:100",
                    total_samples=6400, command=[PY, quiet]),
            _submit(app, alice, name="stuck", min_nodes=1, max_nodes=1, curve="1:100", total_samples=6400,
                    global_batch=64, command=[PY, stuck])]
    for jid, said in zip(jobs, ("loading the data set", "waiting for a lock")):
        failure = _failed_with(app, jid, "no_progress", START_TIMEOUT + 20, alice)
        assert said in failure["message"], failure
    assert time.monotonic() - t0 < START_TIMEOUT + 30


def test_nodes_are_checked_before_they_are_trusted(app, netns_cluster):
    """A node that fails its check at the start is shown with the reason and never offered; the
    same checks run from the command line, naming each node's problem."""
    nodes = {n["name"]: n for n in app.get("/api/cluster")[1]["nodes"]}
    assert nodes["node-dead"]["state"] == "busy", nodes["node-dead"]
    assert nodes["node-dead"]["source"].startswith("not used: cannot reach the node"), nodes["node-dead"]
    assert not any(nodes[n]["source"] for n in ("node1", "node2", "node3"))
    check = lambda *extra: subprocess.run(
        [PY, "-m", "app", "check", "--nodes", str(app.inventory), "--ssh-config", str(netns_cluster.ssh_config),
         "--advertise", netns_cluster.head, *extra], cwd=ROOT, capture_output=True, text=True, timeout=60)
    r = check("--workdir", str(ROOT), "--command", ".venv/bin/python")
    lines = {line.split()[0]: line for line in r.stdout.splitlines()}
    assert r.returncode == 1, r.stdout + r.stderr
    for n in ("node1", "node2", "node3"):     # their name is loopback here, eth0 reaches the head
        assert lines[n].split()[1] == "ok" and "is 127.0.0.1" in lines[n] and "ranks bind eth0" in lines[n], lines[n]
    assert lines["node-dead"].split()[1] == "FAIL" and "cannot reach the node" in lines["node-dead"]
    r = check("--workdir", "/srv/no-such-folder", "--command", "python9")
    assert "no working directory '/srv/no-such-folder'" in r.stdout and "command not found: 'python9'" in r.stdout


def test_a_script_that_raises_at_start_fails_once_with_its_exception(app):
    """The same exception would end it on every node: one failure naming the exception's line,
    no node counted lost, and its log's last lines through the logs endpoint."""
    alice = app.token("alice")
    jid = _submit(app, alice, name="raises", total_samples=6400, global_batch=64,
                  command=[PY, "-c", "import json\nimport no_such_module_for_the_test"])
    failure = _failed_with(app, jid, "exception", 10, alice)
    assert failure["message"].endswith("ModuleNotFoundError: No module named 'no_such_module_for_the_test'"), failure
    assert failure["tail"][0].startswith("Traceback") and failure["node"] in ("node1", "node2", "node3")
    assert sum(k == "job_failed" for k, _ in _events(app, jid)) == 1
    assert not any(k == "node_leave" for k, _ in _events(app, jid))
    status, logs = app.get(f"/api/jobs/{jid}/logs?lines=2", token=alice)
    assert status == 200 and list(logs["workers"].values())[0][-1] == failure["tail"][-1], logs
    assert app.get(f"/api/jobs/{jid}/logs", token=app.token("bob"))[0] == 403


def test_the_docs_torchrun_template_trains_through_a_restart(app):
    """The minimal torchrun script of the docs (docs/users/torchrun.md), as a user copies it (its steps slowed to 20 ms and
    its total halved, so that the restart comes mid-way and the test stays short): on 2 nodes, restarted on 1
    when staff reclaim a node (every rank stops at the same step, rank 0 checkpoints, no rank
    prints a traceback), and done with exactly its samples."""
    text = (ROOT / "docs" / "users" / "torchrun.md").read_text()
    block = text[text.index("A minimal script that meets the contract"):].split("```python\n", 1)[1].split("```")[0]
    script = app.tmp / "template.py"
    assert block.count("    step += 1\n") == 1 and block.count("GLOBAL_BATCH, TOTAL = 64, 64_000") == 1
    script.write_text("import time\n" + block.replace("    step += 1\n", "    step += 1\n    time.sleep(0.02)\n")
                      .replace("GLOBAL_BATCH, TOTAL = 64, 64_000", "GLOBAL_BATCH, TOTAL = 64, 32_000"))
    alice, staff = app.token("alice"), app.token("staff1")
    jid = _submit(app, alice, name="template", launcher="torchrun", min_nodes=1, max_nodes=2, curve="1:100, 2:200",
                  total_samples=32_000, stop_grace_seconds=20, command=[PY, str(script)])
    get = lambda: app.get(f"/api/jobs/{jid}")[1]
    wait(lambda: get()["nodes"] == 2 and get()["samples_done"] > 0, 60, "2 nodes training", get)
    node = [n for n in _held_by(app, jid)][-1]
    assert app.request("POST", f"/api/nodes/{node}/reclaim", token=staff)[0] == 200
    wait(lambda: get()["state"] == "done", 120, "done", get)
    assert app.request("POST", f"/api/nodes/{node}/release", token=staff)[0] == 200
    assert get()["samples_done"] == 32_000
    logs = list((app.db.parent / (app.db.name + ".workers") / jid).glob("*.log"))
    assert len(logs) >= 3 and not any("Traceback" in p.read_text() for p in logs), [p.name for p in logs]


def test_a_rendezvous_that_cannot_form_is_named_with_the_address_and_what_to_set(tmp_path, netns_cluster):
    """The site forces gloo onto each node's loopback (GLOO_SOCKET_IFNAME=lo through
    --worker-env): the ranks advertise 127.0.0.1 and cannot connect. The first failed generation
    is named in the job's events within 30 s, with the address and what to set, and the job
    fails with that reason at once: every retry would advertise the same loopback address."""
    inventory = netns_cluster.write_inventory(tmp_path / "nodes.txt")
    app = start_app(tmp_path, "--fresh", "--dispatch", "ssh", "--nodes", str(inventory),
                    "--ssh-config", str(netns_cluster.ssh_config), "--advertise", netns_cluster.head,
                    "--tick", "0.1", "--no-profiler", "--worker-env", "GLOO_SOCKET_IFNAME",
                    env={"GLOO_SOCKET_IFNAME": "lo"})
    try:
        alice = app.token("alice")
        jid = _submit(app, alice, name="no rendezvous", min_nodes=2, max_nodes=2, curve="2:200",
                      total_samples=64 * 1000, global_batch=64,
                      command=[PY, str(ROOT / "examples" / "digits_cnn.py")])
        trouble = lambda: [d for k, d in _events(app, jid) if k == "job_trouble"]
        said = wait(trouble, 30, "the failed generation named in the events", lambda: _events(app, jid))
        assert "rendezvous" in said[0] and "127.0.0.1" in said[0] and "GLOO_SOCKET_IFNAME" in said[0], said
        failure = _failed_with(app, jid, "rendezvous", 10, alice)
        assert "127.0.0.1" in failure["hint"] and failure["address"].startswith("127.0.0.1:"), failure
    finally:
        app.stop()
