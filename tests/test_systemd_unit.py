"""The harvester run as deploy/harvester.service runs it (issue 50, item 2): the command line of
its ExecStart (a configuration file only), its Environment and WorkingDirectory (the state
folder), JSON log lines on stderr for the journal; a live job with a daemonised child; the store
backed up while it runs (python -m core.backup) and a restore refused while it runs; then the
unit's stop, SIGTERM to the main process (KillMode=mixed), which must end it, with exit status
0, within the unit's TimeoutStopSec, leaving no process, no lock file and a consistent store;
the backup is then restored in place of the store."""
from __future__ import annotations

import json
import os
import random
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import closing
from pathlib import Path

import pytest

from tests.support.files import ROOT
from tests.support.ports import free_port
from tests.support.procs import processes_with_cmdline
from tests.support.server import password, write_users
from tests.support.waiting import wait

UNIT = ROOT / "deploy" / "harvester.service"
CHECKOUT = "/opt/harvester"        # where the unit expects the checkout
CONFIG = "/etc/harvester/harvester.toml"
#: the job: a daemon out of the worker's session, then trains on (sleeps)
SCRIPT = "setsid sh -c 'exec sleep 4242.{tag}' & echo started; exec sleep 600.{tag}"


def unit_service() -> dict[str, list[str]]:
    """The [Service] section of the unit: {key: [values]}."""
    out: dict[str, list[str]] = {}
    section = ""
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]":
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def seconds(text: str) -> float:
    m = re.fullmatch(r"(\d+)(s|min)?", text)
    assert m, f"TimeoutStopSec={text}: give seconds"
    return float(m.group(1)) * (60 if m.group(2) == "min" else 1)


def descendants(pid: int) -> dict[int, str]:
    """The live descendants of `pid`: {pid: command line}."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = {}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            try:
                out[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                continue
            todo.append(child)
    return out


def alive(pid: int, cmdline: str) -> bool:
    """The process still runs (the same command line: not a new process with a reused PID, not a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        now = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return False
    return state != "Z" and now == cmdline


def request(url: str, method: str = "GET", body=None, token: str | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@pytest.fixture
def tag():
    t = f"{os.getpid()}{random.randint(100000, 999999)}"
    yield t
    for pid in processes_with_cmdline(t):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_unit_is_what_the_docs_describe():
    svc = unit_service()
    argv = shlex.split(svc["ExecStart"][0])
    assert argv == [f"{CHECKOUT}/.venv/bin/python", "-m", "app", "--config", CONFIG], "a configuration file only"
    assert svc["User"] == ["harvester"] and svc["StateDirectory"] == ["harvester"]
    assert svc["WorkingDirectory"] == ["/var/lib/harvester"]
    assert svc["KillMode"] == ["mixed"] and svc["KillSignal"] == ["SIGTERM"]
    assert seconds(svc["TimeoutStopSec"][0]) >= 30


def test_the_service_starts_from_its_file_backs_up_live_and_stops_clean_on_sigterm(tmp_path, tag):
    svc = unit_service()
    timeout_stop = seconds(svc["TimeoutStopSec"][0])
    state = tmp_path / "var-lib-harvester"          # the StateDirectory, the WorkingDirectory
    state.mkdir(mode=0o700)
    etc = tmp_path / "etc-harvester"
    etc.mkdir()
    users = write_users(etc / "users.json")
    port = free_port()
    conf = etc / "harvester.toml"
    conf.write_text(f"""# as deploy/harvester.toml, on this machine's loopback, with local workers
host = "127.0.0.1"
port = {port}
db = "harvest.db"                 # relative: in the state folder, the unit's WorkingDirectory
users = "{users}"
log_format = "json"

[web]
secure_cookies = true

[live]
dispatch = "local"
local_nodes = 1
trust_user_commands = true
no_profiler = true
tfwd = 60
""")
    # the unit's command and environment, its checkout and configuration paths put where they are here
    argv = [a.replace(CONFIG, str(conf)) for a in shlex.split(svc["ExecStart"][0])]
    argv[0] = sys.executable
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HARVEST_", "PYTHON"))}
    for assignment in svc.get("Environment", []):
        for item in shlex.split(assignment):
            key, _, value = item.partition("=")
            env[key] = value.replace(CHECKOUT, str(ROOT))
    assert env["PYTHONPATH"] == str(ROOT)
    out, err = (state / "stdout.log").open("w"), (state / "stderr.log").open("w")
    proc = subprocess.Popen(argv, cwd=state, env=env, stdout=out, stderr=err)
    url = f"http://127.0.0.1:{port}"
    try:
        def healthy() -> bool:
            assert proc.poll() is None, (state / "stderr.log").read_text()[-3000:]
            try:
                return request(url + "/api/health")[0] == 200
            except OSError:
                return False
        wait(healthy, 90, "the service to answer")
        status, body = request(url + "/api/token", "POST", {"username": "staff1", "password": password("staff1")})
        assert status == 200, body
        token = body["token"]
        status, job = request(url + "/api/jobs", "POST", {
            "name": "service-test", "launcher": "torchrun", "min_nodes": 1, "max_nodes": 1, "total_samples": 640,
            "curve": "1:100", "stop_grace_seconds": 2, "command": ["/bin/sh", "-c", SCRIPT.format(tag=tag)]},
            token=token)
        assert status == 201, job
        wait(lambda: {c for c in processes_with_cmdline(tag).values() if c.startswith("sleep ")}
             == {f"sleep 4242.{tag}", f"sleep 600.{tag}"}, 60, "the job's two processes",
             lambda: processes_with_cmdline(tag))

        # a backup while it runs; a restore is refused while it runs
        backups = tmp_path / "backups"
        backups.mkdir()
        r = subprocess.run([sys.executable, "-m", "core.backup", "harvest.db", str(backups / "harvest.db")],
                           cwd=state, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("backed up harvest.db to") and "integrity ok" in r.stdout, r.stdout
        assert (backups / "harvest.db.secret").read_text() == (state / "harvest.db.secret").read_text()
        with closing(sqlite3.connect(backups / "harvest.db")) as db:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            assert db.execute("SELECT count(*) FROM jobs WHERE id = ?", (job["id"],)).fetchone()[0] == 1
        r = subprocess.run([sys.executable, "-m", "core.backup", "--restore", str(backups / "harvest.db"),
                            "harvest.db"], cwd=state, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "in use by another harvester" in r.stderr, (r.stdout, r.stderr)

        # the unit's stop: SIGTERM to the main process, SIGKILL to all after TimeoutStopSec
        before = descendants(proc.pid)
        assert any(f"sleep 600.{tag}" in c for c in before.values()), before
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout_stop)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        out.close()
        err.close()
    stdout, stderr = (state / "stdout.log").read_text(), (state / "stderr.log").read_text()
    assert rc == 0, stderr[-3000:]
    assert took < timeout_stop, f"the stop took {took:.1f} s, TimeoutStopSec is {timeout_stop:g}"
    left = {pid: cmd for pid, cmd in before.items() if alive(pid, cmd)}
    assert not left, f"processes of the service outlived it: {left}"
    assert not processes_with_cmdline(tag), processes_with_cmdline(tag)
    assert not (state / "harvest.db.lock").exists(), "the store's lock is removed"
    assert "stopped; state saved in harvest.db" in stdout
    with closing(sqlite3.connect(state / "harvest.db")) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT count(*) FROM jobs WHERE id = ?", (job["id"],)).fetchone()[0] == 1

    # the journal's lines: one JSON object per record, with its level and logger
    records = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    assert records, "the service logs"
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records), records[:3]
    assert {"INFO"} <= {r["level"] for r in records}

    # restore the backup now that it is stopped: the old files go aside, the backup's run is in place
    r = subprocess.run([sys.executable, "-m", "core.backup", "--restore", str(tmp_path / "backups" / "harvest.db"),
                        "harvest.db"], cwd=state, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("restored ") and "before-restore-" in r.stdout
    assert list(state.glob("harvest.db.before-restore-*")), "the replaced store is kept aside"
    with closing(sqlite3.connect(state / "harvest.db")) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT count(*) FROM jobs WHERE id = ?", (job["id"],)).fetchone()[0] == 1
    assert not (state / "harvest.db.lock").exists()
