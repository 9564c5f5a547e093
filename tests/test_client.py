"""The Python client (app/client.py) against a real `python -m app` with simulated live jobs (a
job runs at its curve in wall time, so that one finishes in seconds): submit, a refused job's
field errors, job, jobs and their filters, cancel, wait, and every refusal as one ApiError type;
staff reclaiming and releasing a node; the client file copied alone, run by a Python without
site-packages; the `harvest` command (app/harvest_cli.py) as a user runs it: login (password from
the environment, or typed at a terminal's prompt), submit, status, wait, cancel, and every error
one line with exit status 2. Against a second server with real worker processes: a failing
job's failure (kind, node, message, hint, log tail) through `wait(check=True)` and `harvest
wait`, and the workers' logs through `Client.logs` and `harvest logs`. The installed package:
tests/test_client_install.py."""
from __future__ import annotations

import ast
import json
import os
import pickle
import pty
import select
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.client import FINISHED, ApiError, Client, JobFailed
from tests.support.server import ROOT, free_port, password, start_app
from tests.support.waiting import wait

LONG = {"min_nodes": 1, "max_nodes": 2, "total_samples": 1e9, "curve": "1:100, 2:190"}


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    proc = start_app(tmp_path_factory.mktemp("client"), "--fresh", "--dispatch", "simulated",
                     "--local-nodes", "4", "--tick", "0.1")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def alice(app) -> Client:
    return Client.login(app.url, "alice", password("alice"))


def test_submit_job_jobs_cancel_and_wait(app, alice):
    job = alice.submit(name="client long", **LONG)
    assert job["id"] and job["owner"] == "alice" and job["state"] in ("queued", "running")
    assert alice.wait(job["id"], states=("running",), timeout=10, poll_s=0.1)["state"] == "running"
    one = alice.job(job["id"])
    assert one["name"] == "client long" and one["curve"]["nodes"] == [1, 2] and "why" in one
    assert job["id"] in {j["id"] for j in alice.jobs(state="running")}
    assert job["id"] in {j["id"] for j in alice.jobs(owner="alice")}
    assert job["id"] not in {j["id"] for j in alice.jobs(owner="bob")}
    assert job["id"] not in {j["id"] for j in alice.jobs(state="done")}
    with pytest.raises(TimeoutError, match="still running"):
        alice.wait(job["id"], timeout=0.3, poll_s=0.1)
    assert alice.cancel(job["id"])["state"] == "cancelled"
    assert alice.wait(job["id"], timeout=5, poll_s=0.1)["state"] == "cancelled"
    with pytest.raises(ApiError) as again:
        alice.cancel(job["id"])
    assert again.value.status == 409

    short = alice.submit(name="client short", min_nodes=1, max_nodes=2, total_samples=300, curve="1:100, 2:190",
                         scale_up_seconds=0, scale_down_seconds=0)
    done = alice.wait(short["id"], timeout=30, poll_s=0.1)
    assert done["state"] == "done" and done["samples_done"] == pytest.approx(300), done
    assert short["id"] in {j["id"] for j in alice.jobs(state="done", owner="alice")}
    assert done["state"] in FINISHED


def test_a_refused_job_raises_api_error_with_the_servers_field_errors(app, alice):
    before = len(alice.jobs())
    with pytest.raises(ApiError) as refused:
        alice.submit(name="", min_nodes=3, max_nodes=2, total_samples=-1, curve="1:100")
    e = refused.value
    assert e.status == 422 and e.message == "invalid job"
    assert set(e.field_errors) == {"name", "max_nodes", "total_samples"}, e.field_errors
    assert "at least min nodes" in e.field_errors["max_nodes"]
    assert "max_nodes: max nodes (2) must be at least min nodes (3)" in str(e)
    with pytest.raises(ApiError) as unknown:
        alice.submit(name="typo", min_nodes=1, max_nodes=1, total_samples=10, curve="1:1", nodes=3)  # type: ignore[call-arg]
    assert unknown.value.status == 422 and "nodes" in unknown.value.field_errors
    assert len(alice.jobs()) == before, "a refused job is not stored"


def test_every_refusal_is_an_api_error(app, alice):
    with pytest.raises(ApiError) as wrong_token:
        Client(app.url, "not-a-token").submit(name="x", **LONG)
    assert wrong_token.value.status == 401 and "log in" in wrong_token.value.message
    with pytest.raises(ApiError) as no_token:
        Client(app.url).cancel("u-00000000")
    assert no_token.value.status == 401
    with pytest.raises(ApiError) as bad_password:
        Client.login(app.url, "alice", "wrong")
    assert bad_password.value.status == 401 and bad_password.value.message == "wrong user name or password"
    with pytest.raises(ApiError) as missing:
        alice.job("u-does-not-exist")
    assert missing.value.status == 404 and missing.value.field_errors == {}
    job = alice.submit(name="alice's", **LONG)
    with pytest.raises(ApiError) as not_yours:
        Client.login(app.url, "bob", password("bob")).cancel(job["id"])
    assert not_yours.value.status == 403
    staff = Client.login(app.url, "staff1", password("staff1"))
    assert staff.cancel(job["id"])["state"] == "cancelled"
    with pytest.raises(ApiError) as away:
        Client(f"http://127.0.0.1:{free_port()}").jobs()
    assert away.value.status == 0 and "cannot reach" in away.value.message


def test_the_client_file_alone_needs_only_the_standard_library(app, tmp_path):
    tree = ast.parse((ROOT / "app" / "client.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= sys.stdlib_module_names, imported - sys.stdlib_module_names
    shutil.copy(ROOT / "app" / "client.py", tmp_path / "client.py")
    script = ("import sys, client\n"
              "api = client.Client.login(sys.argv[1], 'alice', sys.argv[2])\n"
              "job = api.submit(name='copied client', min_nodes=1, max_nodes=1, total_samples=1e9, curve='1:10')\n"
              "print(api.cancel(job['id'])['state'])\n")
    # -E: no PYTHONPATH, -s: no user site, -S: no site-packages at all; the copy is found in the cwd
    r = subprocess.run([sys.executable, "-E", "-s", "-S", "-c", script, app.url, password("alice")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "cancelled", r.stdout + r.stderr


# ---- staff operating nodes ---------------------------------------------------------------------

def _node_states(app) -> dict[str, str]:
    status, body = app.get("/api/cluster")
    assert status == 200, body
    return {n["name"]: n["state"] for n in body["nodes"]}


def test_staff_reclaim_and_release_a_node_through_the_client(app, alice):
    staff = Client.login(app.url, "staff1", password("staff1"))
    node = sorted(_node_states(app))[-1]
    assert staff.reclaim(node) == {"node": node, "command": "reclaim"}
    wait(lambda: _node_states(app)[node] == "busy", 10, f"{node} taken back by its owner", lambda: _node_states(app))
    assert staff.release(node) == {"node": node, "command": "release"}
    wait(lambda: _node_states(app)[node] != "busy", 10, f"{node} offered again", lambda: _node_states(app))
    for call, status, words in ((lambda: alice.reclaim(node), 403, "only staff"),
                                (lambda: Client(app.url).release(node), 401, "log in"),
                                (lambda: staff.reclaim("no-such-node"), 404, "no node no-such-node"),
                                (lambda: staff.clear(node), 409, "holds no node out")):
        with pytest.raises(ApiError) as refused:
            call()
        assert refused.value.status == status and words in refused.value.message, refused.value
    assert _node_states(app)[node] != "busy"


# ---- JobFailed, without a server -------------------------------------------------------------

def test_job_failed_says_what_the_server_said_and_leaves_out_what_it_did_not():
    job = {"id": "u-1", "state": "failed", "failure": {
        "kind": "command_not_found", "node": "n3", "message": "python9: not found", "hint": "give a full path",
        "tail": ["a", "b"]}}
    e = JobFailed(job)  # type: ignore[arg-type]
    assert str(e) == "job u-1 failed: command_not_found on n3: python9: not found (give a full path)"
    assert e.job is job and e.failure == job["failure"]
    assert str(JobFailed({**job, "failure": {"kind": "hung", "node": None, "message": "", "hint": "", "tail": []}})) \
        == "job u-1 failed: hung"
    assert str(JobFailed({"id": "u-2", "state": "failed"})) == "job u-2 failed"       # type: ignore[arg-type]
    assert str(JobFailed({"id": "u-2", "state": "failed", "failure": None})) == "job u-2 failed"  # type: ignore[arg-type]
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is JobFailed and str(again) == str(e) and again.failure == e.failure


# ---- the harvest command -----------------------------------------------------------------------

def _env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment with its own HOME (so ~/.config/harvest/token is the test's)
    and none of harvest's variables but those given."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HARVEST_URL", "HARVEST_PASSWORD", "HARVEST_TOKEN_FILE", "XDG_CONFIG_HOME", "HARVEST_DEBUG")}
    return {**env, "HOME": str(home), **extra}


def harvest(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.harvest_cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _one_error_line(r: subprocess.CompletedProcess, *words: str) -> str:
    assert r.returncode == 2 and r.stdout == "", r
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("harvest: error: "), r.stderr
    assert all(w in lines[0] for w in words), (words, lines[0])
    return lines[0]


def test_the_harvest_command_logs_in_submits_follows_and_cancels(app, tmp_path):
    env = _env(tmp_path, HARVEST_PASSWORD=password("alice"))
    r = harvest("login", app.url, "alice", env=env)
    assert r.returncode == 0 and f"logged in to {app.url} as alice" in r.stdout, r
    saved = tmp_path / ".config" / "harvest" / "token"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600 and stat.S_IMODE(saved.parent.stat().st_mode) == 0o700
    kept = json.loads(saved.read_text())
    assert kept["url"] == app.url and kept["user"] == "alice" and kept["token"]
    assert password("alice") not in saved.read_text(), "the password is never kept"
    del env["HARVEST_PASSWORD"]                       # from here on the saved login (its URL and token)

    r = harvest("submit", "--name", "cli long", "--min-nodes", "1", "--max-nodes", "2", "--total-samples", "1e9",
                "--curve", "1:100, 2:190", "--global-batch", "64", "--", "python", "train.py", "--lr", "0.1", env=env)
    assert r.returncode == 0, r
    long_id = r.stdout.strip()
    assert long_id.startswith("u-") and "\n" not in long_id
    job = Client(app.url).job(long_id)
    assert job["owner"] == "alice" and job["name"] == "cli long" and job["max_nodes"] == 2

    r = harvest("status", long_id, env=env)
    assert r.returncode == 0 and r.stdout.startswith(f"{long_id} ") and "'cli long'" in r.stdout, r
    assert r.stdout.split()[1] in ("queued", "running") and "%" in r.stdout
    r = harvest("status", "--owner", "alice", env=env)
    rows = r.stdout.splitlines()
    assert r.returncode == 0 and rows[0].split() == ["ID", "STATE", "NODES", "PROGRESS", "OWNER", "NAME"], r
    assert any(row.startswith(long_id) and row.endswith("cli long") for row in rows[1:]), rows
    r = harvest("status", "--state", "done", "--owner", "alice", env=env)
    assert r.returncode == 0 and long_id not in r.stdout

    r = harvest("cancel", long_id, env=env)
    assert r.returncode == 0 and r.stdout.strip() == f"{long_id} cancelled", r
    r = harvest("wait", long_id, env=env)
    assert r.returncode == 1 and r.stdout.startswith(f"{long_id} cancelled"), r

    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"name": "from the file", "min_nodes": 1, "max_nodes": 2, "total_samples": 300,
                                "curve": "1:100, 2:190", "scale_up_seconds": 0, "scale_down_seconds": 0}))
    r = harvest("submit", "--json", str(spec), "--name", "cli short", env=env)   # the flag wins over the file
    assert r.returncode == 0, r
    short_id = r.stdout.strip()
    r = harvest("wait", short_id, "--timeout", "30", "--poll", "0.1", env=env)
    assert r.returncode == 0 and r.stdout.startswith(f"{short_id} done 100.0%") and "'cli short'" in r.stdout, r

    r = harvest("wait", short_id, "--url", app.url + "/", "--timeout", "5", env=env)     # --url after the command
    assert r.returncode == 0, r


def test_harvest_errors_are_one_line_and_exit_2(app, tmp_path):
    env = _env(tmp_path, HARVEST_URL=app.url)
    _one_error_line(harvest("status", "u-nope", env=env), "404", "no job u-nope")
    _one_error_line(harvest("submit", "--name", "x", "--min-nodes", "1", "--max-nodes", "1", "--total-samples", "1",
                            "--curve", "1:1", env=env), "401", "harvest login")
    _one_error_line(harvest("login", "bob", env={**env, "HARVEST_PASSWORD": "wrong"}),
                    "401: wrong user name or password")
    assert not (tmp_path / ".config" / "harvest" / "token").exists()
    r = harvest("login", "bob", env={**env, "HARVEST_PASSWORD": password("bob")})
    assert r.returncode == 0, r
    _one_error_line(harvest("submit", "--name", "", "--min-nodes", "3", "--max-nodes", "2", "--total-samples", "-1",
                            env=env), "422: invalid job (", "max_nodes: max nodes (2) must be at least min nodes (3)")
    job_id = harvest("submit", "--name", "bob's", "--min-nodes", "1", "--max-nodes", "1", "--total-samples", "1e9",
                     "--curve", "1:10", env=env).stdout.strip()
    assert harvest("cancel", job_id, env=env).returncode == 0
    _one_error_line(harvest("cancel", job_id, env=env), "409")
    # the token goes to the address it came from only: the same server by another name gets none
    other = app.url.replace("127.0.0.1", "localhost")
    _one_error_line(harvest("--url", other, "cancel", job_id, env=env), "401", "harvest login")
    _one_error_line(harvest("status", "--url", f"http://127.0.0.1:{free_port()}", env=env), "cannot reach")
    _one_error_line(harvest("status", env=_env(tmp_path / "nobody")), "no server")
    _one_error_line(harvest("submit", "--json", str(tmp_path / "missing.json"), env=env), "missing.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    _one_error_line(harvest("submit", "--json", str(tmp_path / "list.json"), env=env), "JSON object")
    _one_error_line(harvest("submit", "--name", "x", "--", env=env), "no command")
    r = harvest("frobnicate", env=env)                     # argparse's own usage error: also exit 2
    assert r.returncode == 2 and "Traceback" not in r.stderr and "harvest: error: argument" in r.stderr, r


def test_the_password_prompt_reads_a_terminal_and_does_not_echo(app, tmp_path):
    env = _env(tmp_path, HARVEST_TOKEN_FILE=str(tmp_path / "elsewhere" / "token"))
    pid, fd = pty.fork()
    if pid == 0:                                           # the child: harvest on a terminal of its own
        try:
            os.chdir(ROOT)
            os.execve(sys.executable, [sys.executable, "-m", "app.harvest_cli", "login", app.url, "bob"], env)
        finally:
            os._exit(127)
    out = b""

    def read(until: bytes = b"") -> bool:
        nonlocal out
        if until and until in out:
            return True
        if select.select([fd], [], [], 0.1)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:                                # EIO: the child has gone
                chunk = b""
            out += chunk
            return bool(until) and until in out or not chunk
        return False
    try:
        wait(lambda: read(b"password for bob"), 30, "the password prompt", lambda: out)
        os.write(fd, password("bob").encode() + b"\n")
        wait(lambda: read(), 30, "harvest login to end", lambda: out)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, out
    assert b"logged in to" in out and password("bob").encode() not in out, out
    saved = tmp_path / "elsewhere" / "token"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600 and json.loads(saved.read_text())["user"] == "bob"


# ---- a failing job on real workers (needs the server's `failure` and GET /api/jobs/<id>/logs) ---

FAILING = [sys.executable, "-c", "import sys; print('starting up'); print('boom: the last line'); sys.exit(3)"]


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    proc = start_app(tmp_path_factory.mktemp("client-local"), "--fresh", "--dispatch", "local", "--local-nodes", "1",
                     "--no-profiler", "--tick", "0.1")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def failed(local) -> tuple[Client, str]:
    """alice's job whose command exits 3 at once."""
    api = Client.login(local.url, "alice", password("alice"))
    job = api.submit(name="fails", min_nodes=1, max_nodes=1, total_samples=1e6, curve="1:100", command=FAILING,
                     global_batch=64, scale_up_seconds=0, scale_down_seconds=0)
    return api, job["id"]


def test_wait_with_check_raises_job_failed_with_the_servers_failure(local, failed, tmp_path):
    api, job_id = failed
    with pytest.raises(JobFailed) as failure:
        api.wait(job_id, timeout=60, poll_s=0.2, check=True)
    e = failure.value
    assert e.job["id"] == job_id and e.job["state"] == "failed"
    f = e.failure
    assert f == e.job.get("failure") and f["kind"] and f["message"], e.job
    assert any("boom: the last line" in line for line in f["tail"]), f
    assert str(e).startswith(f"job {job_id} failed: {f['kind']}") and f["message"] in str(e)
    assert api.wait(job_id, timeout=5, poll_s=0.1)["state"] == "failed", "without check: returned as before"

    env = _env(tmp_path, HARVEST_URL=local.url, HARVEST_PASSWORD=password("alice"))
    assert harvest("login", "alice", env=env).returncode == 0
    r = harvest("wait", job_id, "--timeout", "10", env=env)
    assert r.returncode == 1 and r.stderr == "", r
    assert r.stdout.startswith(f"{job_id} failed") and f"job {job_id} failed\n  kind:    {f['kind']}\n" in r.stdout, r
    assert f"  message: {f['message']}" in r.stdout and "  log tail:\n" in r.stdout
    assert "    boom: the last line" in r.stdout.splitlines(), r.stdout
    r = harvest("status", job_id, env=env)
    assert r.returncode == 0 and f"kind:    {f['kind']}" in r.stdout, r


def test_the_workers_logs_through_the_client_and_the_command(local, failed, tmp_path):
    api, job_id = failed
    wait(lambda: api.job(job_id)["state"] in FINISHED, 60, "the failing job to end")
    logs = api.logs(job_id, lines=5)
    assert logs["job"] == job_id and logs["state"] == "failed" and logs["workers"], logs
    first = next(iter(logs["workers"].values()))
    assert 0 < len(first) <= 5 and any("boom: the last line" in line for line in first), logs
    assert len(next(iter(api.logs(job_id, lines=1)["workers"].values()))) == 1
    for call, status in ((lambda: Client.login(local.url, "bob", password("bob")).logs(job_id), 403),
                         (lambda: Client(local.url).logs(job_id), 401),
                         (lambda: api.logs("u-nope"), 404),
                         (lambda: api.logs(job_id, lines=501), 400)):
        with pytest.raises(ApiError) as refused:
            call()
        assert refused.value.status == status, refused.value
    staff = Client.login(local.url, "staff1", password("staff1"))
    assert staff.logs(job_id, lines=5) == logs

    env = _env(tmp_path, HARVEST_URL=local.url, HARVEST_PASSWORD=password("alice"))
    assert harvest("login", "alice", env=env).returncode == 0
    r = harvest("logs", job_id, "--lines", "5", env=env)
    assert r.returncode == 0 and r.stdout.startswith("==> ") and "boom: the last line" in r.stdout, r
    _one_error_line(harvest("logs", job_id, "--lines", "501", env=env), "400", "lines")


# ---- following a job: its events, `harvest watch`, `harvest wait`'s progress, an ended job's logs ----

FOLLOWED = {"min_nodes": 1, "max_nodes": 2, "total_samples": 1500, "curve": "1:100, 2:190",
            "scale_up_seconds": 0, "scale_down_seconds": 0}     # ~8 s on 2 simulated nodes


def _percent(line: str) -> float:
    return float(next(w for w in line.split() if w.endswith("%"))[:-1])


def test_harvest_watch_streams_a_jobs_events_and_progress_until_it_ends(app, alice, tmp_path):
    env = _env(tmp_path, HARVEST_URL=app.url, HARVEST_PASSWORD=password("alice"))
    assert harvest("login", "alice", env=env).returncode == 0
    jid = alice.submit(name="watched", **FOLLOWED)["id"]
    r = harvest("watch", jid, "--poll", "0.3", env=env, timeout=120)
    assert r.returncode == 0 and r.stderr == "", r
    lines = r.stdout.splitlines()
    events = alice.events(jid)
    kinds = [e["kind"] for e in events]
    assert "job_submit" in kinds and kinds[-1] == "job_done", events
    shown = [line.split()[1] for line in lines if f" {jid} " not in line]       # the event lines, in order
    assert shown == kinds, (shown, kinds)
    running = [line for line in lines if f" {jid} running " in line]
    assert running and "samples/s" in running[-1], lines
    percents, said = [_percent(x) for x in running], [x.split(" ", 1)[1] for x in running]
    assert percents == sorted(percents) and all(a != b for a, b in zip(said, said[1:])), running   # a line per change
    assert any(f" {jid} done 100.0%" in line for line in lines), lines
    assert lines.index(next(x for x in lines if x.split()[1] == "job_done")) > lines.index(running[0])

    # the client: every event after a sequence number, page after page
    assert alice.events(jid, limit=1) == events
    assert alice.events(jid, after=events[0]["seq"]) == events[1:]
    assert alice.events(jid, after=events[-1]["seq"]) == []
    with pytest.raises(ApiError) as missing:
        alice.events("u-nope")
    assert missing.value.status == 404

    # a cancelled job: watch says so and exits 1 as wait does; Ctrl-C stops watching, not the job
    long_id = alice.submit(name="watched long", **LONG)["id"]
    watcher = subprocess.Popen([sys.executable, "-m", "app.harvest_cli", "watch", long_id, "--poll", "0.3"], cwd=ROOT,
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait(lambda: alice.job(long_id)["state"] == "running", 20, "the long job to run")
    alice.cancel(long_id)
    out, err = watcher.communicate(timeout=60)
    assert watcher.returncode == 1 and err == "", (out, err)
    assert "job_cancel" in out and f"{long_id} cancelled" in out, out
    other = alice.submit(name="watched, then left", **LONG)["id"]
    # its output to files: the test waits for the watcher's own exit, not for its pipes' EOF
    # (in two full runs `communicate` timed out here; this says which of the two it was)
    out_file, err_file = tmp_path / "watch.out", tmp_path / "watch.err"
    with out_file.open("w") as o, err_file.open("w") as e:
        watcher = subprocess.Popen([sys.executable, "-m", "app.harvest_cli", "watch", other, "--poll", "0.3"],
                                   cwd=ROOT, env=env, stdout=o, stderr=e, text=True)
    try:
        wait(lambda: alice.job(other)["state"] == "running", 20, "the other job to run")
        time.sleep(1.5)                                  # past its first look
        watcher.send_signal(2)                           # Ctrl-C
        try:
            watcher.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"harvest watch did not exit on Ctrl-C: {out_file.read_text()!r}") from None
        out, err = out_file.read_text(), err_file.read_text()
        assert watcher.returncode == 130 and "Traceback" not in err, (out, err)
        assert alice.job(other)["state"] == "running", "watching is not the job: it goes on"
    finally:
        if watcher.poll() is None:
            watcher.kill()
        alice.cancel(other)


def test_harvest_wait_says_how_far_the_job_is_while_it_waits(app, alice, tmp_path):
    env = _env(tmp_path, HARVEST_URL=app.url, HARVEST_PASSWORD=password("alice"))
    assert harvest("login", "alice", env=env).returncode == 0
    jid = alice.submit(name="waited", **FOLLOWED)["id"]
    r = harvest("wait", jid, "--poll", "0.1", "--timeout", "60", env=env)
    assert r.returncode == 0 and r.stdout.startswith(f"{jid} done 100.0%"), r
    progress = r.stderr.splitlines()
    assert progress and all(line.startswith(f"harvest: {jid} ") for line in progress), progress
    assert any(" running " in line and " samples/s" in line for line in progress), progress
    # a line when the state or size changes, else one per 5 s of progress: a few, not one per look (~80)
    assert len(progress) <= 6, progress
    quiet = alice.submit(name="waited quietly", **FOLLOWED)["id"]
    r = harvest("wait", quiet, "--poll", "0.1", "--timeout", "60", "--quiet", env=env)
    assert r.returncode == 0 and r.stderr == "" and r.stdout.startswith(f"{quiet} done"), r
    r = harvest("logs", quiet, env=env)              # simulated workers write no log: said, and exit 1
    assert r.returncode == 1 and r.stdout == "", r
    assert r.stderr.strip() == f"harvest: job {quiet} (done) has no worker logs: its workers left no log files " \
                               "(simulated workers write none)", r.stderr


def test_an_ended_jobs_logs_are_read_from_its_log_files(local, tmp_path):
    """A job that is done (its workers gone, no failure to keep a tail): its log file's last
    lines, through the API, the client and `harvest logs`; its owner's and staff's only."""
    api = Client.login(local.url, "alice", password("alice"))
    script = ("import time\nfor i in range(1, 6):\n    print(f'line {i} samples={i * 128}', flush=True)\n"
              "    time.sleep(0.2)\n")
    jid = api.submit(name="ends", launcher="torchrun", min_nodes=1, max_nodes=1, total_samples=640, curve="1:100",
                     command=[sys.executable, "-c", script])["id"]
    assert api.wait(jid, timeout=90, poll_s=0.2)["state"] == "done"
    files = sorted((Path(str(local.db) + ".workers") / jid).glob("*.log"))
    assert files, "the job's log file is on disk"
    logs = api.logs(jid, lines=2)
    assert logs["state"] == "done" and list(logs["workers"].values()) == [["line 4 samples=512", "line 5 samples=640"]]
    assert Client.login(local.url, "staff1", password("staff1")).logs(jid, lines=2) == logs
    with pytest.raises(ApiError) as not_yours:
        Client.login(local.url, "bob", password("bob")).logs(jid)
    assert not_yours.value.status == 403
    env = _env(tmp_path, HARVEST_URL=local.url, HARVEST_PASSWORD=password("alice"))
    assert harvest("login", "alice", env=env).returncode == 0
    r = harvest("logs", jid, "-n", "3", env=env)
    assert r.returncode == 0 and r.stderr == "", r
    assert r.stdout.splitlines()[1:] == ["line 3 samples=384", "line 4 samples=512", "line 5 samples=640"], r.stdout
