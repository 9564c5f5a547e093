"""Jobs run as their owner's Unix account (`--run-as`, the users file's `unix` field), and the
harvester's own files stay out of that account's reach. The end-to-end test creates a Unix
account of its own (useradd; removed at the end), registers a job through the API as the login
mapped to it and reads, from the job's own log, that it ran as that account and was denied the
store, its -wal and -shm, the key, the lock, the users file and the harvester's environment;
its checkpoint file belongs to the account. Without a mapping a user's command job is refused."""
from __future__ import annotations

import os
import pwd
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from core.admission import runs_as
from core.errors import SettingsError
from core.settings import HarvesterSettings
from core.store import Store
from core.transports.runas import RunAs
from tests.support.accounts import LAUNCHER, unix_account
from tests.support.server import ROOT, password, start_app, write_users
from tests.support.waiting import wait

#: what the job does as its account: who it is, what it may read, a file of its own, then done
SCRIPT = r"""
echo "whoami=$(id -un) uid=$(id -u)"
for f in "$1" "$1-wal" "$1-shm" "$1.secret" "$1.lock" "$2" "/proc/$3/environ"; do
  if cat -- "$f" >/dev/null; then echo "READ $f"; else echo "DENIED $f"; fi
done
echo mine > "$HARVEST_CHECKPOINT_DIR/mine" && echo "wrote $HARVEST_CHECKPOINT_DIR/mine"
echo samples=640
"""


# ---- the rules, without processes ---------------------------------------------------------------
def test_the_launcher_is_checked_once_and_applied_per_worker():
    r = RunAs.parse(LAUNCHER)
    assert r.argv("alice1", {"B": "2", "A": "1"}, ["python", "x.py"]) == [
        "sudo", "-n", "-u", "alice1", "--preserve-env=A,B", "--", "python", "x.py"]
    for bad, why in (("", "give the launcher"), ("sudo -n", "{user}"), ("sudo -u {owner}", "{owner}"),
                     ("sudo -u {user", "braces"), ("'sudo {user}", "cannot split")):
        with pytest.raises(ValueError, match=why):
            RunAs.parse(bad)
    with pytest.raises(ValueError, match="not a Unix account"):
        r.argv("-oProxyCommand=x", {}, ["true"])


def test_who_runs_a_command():
    assert runs_as(False, "", False, False, False) == ("", None), "no command: nothing runs"
    assert runs_as(True, "alice1", True, False, False) == ("alice1", None)
    assert runs_as(True, "", True, True, False) == ("", None), "unmapped staff run as the harvester"
    assert runs_as(True, "", False, False, True) == ("", None), "a site that trusts its users"
    assert "not mapped" in runs_as(True, "", True, False, False)[1]
    assert "only for staff" in runs_as(True, "alice1", False, False, False)[1], "a mapping needs a launcher"


def test_settings_word_the_launcher_and_take_it_for_slurm_too():
    with pytest.raises(SettingsError) as e:
        HarvesterSettings.parse({"live": {"dispatch": "local", "local_nodes": 1, "run_as": "sudo -u {owner}"}})
    assert e.value.field == "live.run_as" and "{owner}" in str(e.value)
    s = HarvesterSettings.parse({"live": {"source": "slurm", "run_as": LAUNCHER}})   # the pilots apply it
    assert s.live.launcher == RunAs.parse(LAUNCHER)      # (tests/test_slurm_run_as.py)
    s = HarvesterSettings.parse({"live": {"dispatch": "ssh", "inventory": "n.txt", "run_as": LAUNCHER}})
    assert s.live.launcher == RunAs.parse(LAUNCHER)


def test_the_users_file_takes_a_unix_account(tmp_path):
    users = tmp_path / "users.json"
    add = lambda *a: subprocess.run([sys.executable, "-m", "app.users", "add", *a, "--file", str(users),
                                     "--password-stdin"], input="long-enough\n", capture_output=True, text=True,
                                    cwd=ROOT)
    r = add("alice", "--unix", "Root;rm")
    assert r.returncode == 2 and "not a Unix account name" in r.stderr and not users.exists()
    assert add("alice", "--unix", "alice1").returncode == 0
    from app.auth import Users
    assert Users.load(users).get("alice").unix == "alice1"
    assert stat.S_IMODE(users.stat().st_mode) == 0o600


def test_a_store_made_before_is_made_private_at_start(tmp_path):
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    for p in tmp_path.iterdir():
        p.chmod(0o644)
    store = Store(db)
    try:
        store.meta("live")
        for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
        fresh = Store(tmp_path / "new.db")
        assert stat.S_IMODE((tmp_path / "new.db").stat().st_mode) == 0o600
        fresh.close()
    finally:
        store.close()


# ---- for real: a Unix account of the test's own -------------------------------------------------
@pytest.fixture
def account() -> Iterator[str]:
    with unix_account() as name:
        yield name


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder every account may enter (pytest's own are 0700): here only the files' own modes
    keep the store and the key private."""
    d = Path(tempfile.mkdtemp(prefix="harvtest-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _users(path: Path, account: str) -> Path:
    write_users(path)
    for name, role, unix in (("alice", "user", account), ("bob", "user", "")):
        r = subprocess.run([sys.executable, "-m", "app.users", "add", name, "--role", role, "--file", str(path),
                            "--password-stdin", *(["--unix", unix] if unix else [])],
                           input=password(name) + "\n", capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 0, r.stderr
    return path


def _job(app, token: str, db: Path, users: Path, name: str = "as-owner") -> tuple[int, dict]:
    return app.request("POST", "/api/jobs", {
        "name": name, "launcher": "torchrun", "min_nodes": 1, "max_nodes": 1, "total_samples": 640,
        "curve": "1:100", "stop_grace_seconds": 5,
        "command": ["/bin/sh", "-c", SCRIPT, "job", str(db), str(users), str(app.proc.pid)]}, token=token)


@pytest.mark.parametrize("dispatch", ["local", "ssh"])
def test_a_mapped_users_job_runs_as_their_account_and_cannot_read_the_harvesters_files(request, dispatch, account,
                                                                                     shared_dir):
    users = _users(shared_dir / "users.json", account)
    if dispatch == "local":
        where = ["--dispatch", "local", "--local-nodes", "1"]
    else:       # ssh to a real sshd (as root), then the launcher on the "node"
        sshd = request.getfixturevalue("sshd_server")
        (shared_dir / "nodes.txt").write_text("node0 node0\n")
        where = ["--dispatch", "ssh", "--nodes", str(shared_dir / "nodes.txt"), "--ssh-config",
                 str(sshd.client_config), "--workdir", str(shared_dir)]
    app = start_app(shared_dir, "--fresh", *where, "--tick", "0.1", "--profile-sizes", "0", "--run-as", LAUNCHER,
                    users=users, timeout=120)
    try:
        db = app.db
        status, body = _job(app, app.token("bob"), db, users, "unmapped")
        assert status == 422 and "not mapped to a Unix account" in body["errors"]["command"], body
        status, job = _job(app, app.token("alice"), db, users)
        assert status == 201, job
        get = lambda: app.get(f"/api/jobs/{job['id']}")[1]
        assert get()["run_as"] == account
        wait(lambda: get()["state"] in ("done", "failed"), 120, "the job to end", get)
        assert get()["state"] == "done", get()
        logs = list(Path(str(db) + ".workers", job["id"]).glob("*.log"))
        text = "\n".join(p.read_text() for p in logs)
        uid = pwd.getpwnam(account).pw_uid
        assert f"whoami={account} uid={uid}" in text, text
        for f in (db, f"{db}-wal", f"{db}-shm", f"{db}.secret", f"{db}.lock", users, f"/proc/{app.proc.pid}/environ"):
            assert f"DENIED {f}" in text and f"cat: {f}: Permission denied" in text, (f, text)
        assert "READ " not in text, text
        mine = Path(str(db) + ".workers", job["id"], "checkpoint", "mine")
        assert mine.stat().st_uid == uid and mine.read_text() == "mine\n"
        assert mine.parent.stat().st_uid == uid and stat.S_IMODE(mine.parent.stat().st_mode) == 0o700
        for f in (db, Path(f"{db}-wal"), Path(f"{db}-shm"), Path(f"{db}.secret"), Path(f"{db}.lock"), users,
                  *logs):
            st = f.stat()
            assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600, (f, oct(st.st_mode))
    finally:
        app.stop()


def test_without_a_mapping_only_staff_run_commands(tmp_path):
    app = start_app(tmp_path, "--fresh", "--dispatch", "local", "--local-nodes", "1", "--tick", "0.1",
                    "--profile-sizes", "0", trust_users=False, timeout=120)
    try:
        status, body = _job(app, app.token("alice"), app.db, tmp_path / "users.json")
        assert status == 422, body
        assert body["errors"]["command"].startswith("this site runs commands only for staff"), body
        assert app.get("/api/jobs")[1]["total"] == 0, "nothing stored"
        status, job = _job(app, app.token("staff1"), app.db, tmp_path / "users.json")
        assert status == 201, job
        get = lambda: app.get(f"/api/jobs/{job['id']}")[1]
        wait(lambda: get()["state"] in ("done", "failed"), 120, "the staff job to end", get)
    finally:
        app.stop()
