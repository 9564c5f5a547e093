"""A store that survives faults (issue 17, item 3 and part of 6): failed writes are kept and
written again, a damaged, read-only or busy store is refused at start in one line naming the
file, a second process on the same store is refused, and the secret key file is never empty.
Real SQLite files; faults made for real (another connection holding the write lock, bytes
overwritten, a read-only bind mount in a private mount namespace)."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from app.auth import MIN_KEY_CHARS, secret_key
from core.controller_config import ControllerConfig
from core.errors import StoreError
from core.model import Event, EventKind
from core.restore import restore
from core.dispatchers.simulated import SimulatedDispatcher
from core.store import Store, StoreWriteError
from core.storelock import StoreLock
from tests.support.files import ROOT
from tests.support.server import start_app, write_users
from tests.support.sim import T0, churn, controller, job
from tests.support.waiting import wait

NODES = [f"a01n{i:02d}" for i in range(1, 9)]


class WriteLock:
    """Another connection holding the store's write lock (as a backup tool or a stuck process
    would): every write of the store under test waits out its busy timeout and fails."""

    def __init__(self, db: Path) -> None:
        self.conn = sqlite3.connect(db, isolation_level=None)
        self.conn.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        self.conn.execute("ROLLBACK")
        self.conn.close()


def events_in(db: Path) -> int:
    with sqlite3.connect(db) as c:
        return c.execute("select count(*) from events").fetchone()[0]


def test_a_write_that_fails_twice_loses_no_row_and_the_run_goes_on(tmp_path):
    db = tmp_path / "run.db"
    store = Store(db, busy_timeout_s=0.1)
    ctl, clock = controller(NODES, ControllerConfig(max_jobs=3, tfwd=1000), store)
    for k, jid in enumerate("AB"):
        ctl.submit(job(jid, submit=T0 + k, total=1e9))
    ctl.step()
    ctl.flush()
    logged = events_in(db)
    assert ctl.writer.problem is None

    lock = WriteLock(db)
    for t in (100, 200):                      # two flushes fail, each with new events
        clock.advance_to(T0 + t)
        victim = ctl.held["A"][0]
        ctl.step([Event(T0 + t, EventKind.NODE_LEAVE, node=victim),
                  Event(T0 + t, EventKind.NODE_JOIN, node=victim)])
        logged += 2
        ctl.flush()
        assert ctl.writer.problem is not None and "locked" in ctl.writer.problem
        assert ctl.writer.failing_since == T0 + 100 and ctl.writer.unsaved_rows > 0
    with pytest.raises(StoreWriteError):      # a person's job is refused, not half-registered
        ctl.submit(job("C", submit=T0 + 200), durable=True)
    assert ctl.job("C") is None
    lock.release()

    clock.advance_to(T0 + 300)
    ctl.step()
    ctl.flush()
    assert ctl.writer.problem is None and ctl.writer.unsaved_rows == 0
    assert events_in(db) == logged
    store.close()
    back = restore(Store(db), SimulatedDispatcher(), clock, node_names=NODES)
    assert back.held == ctl.held and back.counters == ctl.counters
    assert {j: back.jobs[j].samples_done for j in "AB"} == pytest.approx({j: ctl.jobs[j].samples_done for j in "AB"})


def _filled_store(db: Path) -> None:
    """A store with a few dozen pages of history."""
    store = Store(db)
    ctl, clock = controller(NODES, ControllerConfig(max_jobs=3, tfwd=1000), store)
    for k in range(6):
        ctl.submit(job(f"J{k}", submit=T0 + k, total=1e9))
    churn(ctl, clock, NODES, 399)
    ctl.flush()
    store.close()


def _damage(db: Path, kind: str) -> None:
    data = bytearray(db.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    pages = len(data) // page
    assert pages > 20
    mid = (pages // 2) * page
    if kind == "header":
        data[0:100] = os.urandom(100)
    elif kind == "zeroed page":
        data[mid:mid + page] = bytes(page)
    elif kind == "random page":
        data[mid:mid + page] = os.urandom(page)
    elif kind == "truncated":
        del data[mid + page // 2:]
    elif kind == "empty page headers":         # every other page's b-tree header zeroed
        for p in range(2, pages, 2):
            data[p * page:p * page + 12] = bytes(12)
    db.write_bytes(bytes(data))


KINDS = ("header", "zeroed page", "random page", "truncated", "empty page headers")


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_store_is_refused_in_one_line_naming_the_file(tmp_path, kind):
    db = tmp_path / "run.db"
    _filled_store(db)
    _damage(db, kind)
    with pytest.raises(StoreError) as err:
        Store(db)
    text = str(err.value)
    assert text.startswith(f"{db}: ") and "\n" not in text
    assert "damaged" in text and "move the file" in text


def run_app(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", "--port", "1", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def test_the_command_line_says_one_line_for_a_damaged_store_also_with_fresh(tmp_path):
    db = tmp_path / "run.db"
    _filled_store(db)
    _damage(db, "random page")
    for extra in ((), ("--fresh",)):
        r = run_app("--db", str(db), "--dispatch", "simulated", "--local-nodes", "2", *extra)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"error: {db}: the store is damaged"), r.stderr


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _unshare_works(), reason="needs `unshare -m` (a private mount namespace) to make a "
                                                 "file read-only for root")
def test_a_read_only_store_is_one_line_naming_the_file(tmp_path):
    db = tmp_path / "run.db"
    _filled_store(db)
    inner = (f"mount --bind -o ro {db} {db} && exec {sys.executable} -m app --port 1 --db {db} "
             "--dispatch simulated --local-nodes 2")
    r = subprocess.run(["unshare", "-m", "sh", "-c", inner], cwd=ROOT, capture_output=True, text=True, timeout=60)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: {db}: the store is read-only") and "writable" in lines[0]


def test_a_store_locked_by_another_program_is_one_line(tmp_path):
    db = tmp_path / "run.db"
    _filled_store(db)
    lock = WriteLock(db)
    try:
        with pytest.raises(StoreError, match="locked by another program"):
            Store(db, busy_timeout_s=0.1)
    finally:
        lock.release()


def test_an_empty_or_short_secret_is_refused_and_a_new_one_is_written_whole(tmp_path, monkeypatch):
    monkeypatch.delenv("HARVEST_SECRET_KEY", raising=False)
    db = tmp_path / "run.db"
    key = secret_key(db)
    path = Path(str(db) + ".secret")
    assert len(key) >= MIN_KEY_CHARS and path.read_text() == key and secret_key(db) == key
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["run.db.secret"]     # no temporary left
    for bad in ("", "short-key\n"):
        path.write_text(bad)
        with pytest.raises(ValueError, match="empty or short key"):
            secret_key(db)
    r = run_app("--db", str(db), "--dispatch", "simulated", "--local-nodes", "2",
                env={"HARVEST_SECRET_KEY": ""})
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {path}: holds an empty"), r.stderr
    monkeypatch.setenv("HARVEST_SECRET_KEY", "x" * 8)
    with pytest.raises(ValueError, match="HARVEST_SECRET_KEY"):
        secret_key(db)


def test_the_store_lock_refuses_a_second_holder_until_released(tmp_path):
    db = tmp_path / "run.db"
    first, second = StoreLock(db), StoreLock(db)
    first.acquire()
    with pytest.raises(StoreError, match=f"in use by another harvester \\(pid {os.getpid()}\\)"):
        second.acquire()
    first.release()
    second.acquire()
    assert second.path.read_text() == str(os.getpid())
    second.release()
    assert not second.path.exists()


def test_an_empty_file_or_another_programs_database_is_refused_in_one_line(tmp_path):
    """Issue 47, rows 7: a store truncated to 0 bytes no longer starts a new run in silence, and
    an SQLite file of another program is never given our tables (not even with --fresh)."""
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    r = run_app("--db", str(empty), "--dispatch", "simulated", "--local-nodes", "2")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0] == (f"error: {empty}: is empty (0 bytes), not a harvester's store: restore it from a backup, "
                        "or give --fresh to start a new run in it"), lines
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER)")
    for extra in ((), ("--fresh",)):
        r = run_app("--db", str(other), "--dispatch", "simulated", "--local-nodes", "2", *extra)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1, r.stderr
        assert "is an SQLite file of another program (tables invoices)" in lines[0] and "another --db" in lines[0]
    with sqlite3.connect(other) as conn:
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["invoices"]


def test_a_damaged_json_record_names_the_file_the_table_and_the_remedy(tmp_path):
    """Issue 47, row 8: one byte changed in a stored job's curve (valid SQLite, broken JSON)."""
    users = write_users(tmp_path / "users.json")
    app = start_app(tmp_path, "--dispatch", "simulated", "--local-nodes", "2", "--tick", "0.1", users=users)
    try:
        status, body = app.request("POST", "/api/jobs", {"name": "kept", "min_nodes": 1, "max_nodes": 2,
                                                         "total_samples": 1e9, "curve": "1:10, 2:19"},
                                   token=app.token("alice"))
        assert status == 201, body
    finally:
        app.stop()
    with sqlite3.connect(app.db) as conn:
        conn.execute("UPDATE jobs SET curve = replace(curve, ',', ';') WHERE id = ?", (body["id"],))
    r = run_app("--db", str(app.db), "--users", str(users), "--dispatch", "simulated", "--local-nodes", "2")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: {app.db}: damaged record in table jobs, job {body['id']!r} (JSONDecodeError: "), lines
    assert lines[0].endswith("restore the store from a backup, or give --fresh to start a new run"), lines


def test_the_store_lock_sees_the_store_through_a_symlink_and_a_hard_link(tmp_path):
    """Issue 47, row 4: a second harvester on the same store under another name (a symlink to
    it, a symlinked folder, a hard link) is refused as under the same name."""
    db = tmp_path / "run.db"
    db.write_bytes(b"")
    (tmp_path / "link.db").symlink_to(db)
    (tmp_path / "dir-link").symlink_to(tmp_path)
    os.link(db, tmp_path / "hard.db")
    first = StoreLock(db)
    first.acquire()
    others = [tmp_path / "link.db", tmp_path / "dir-link" / "run.db", tmp_path / "hard.db"]
    for other in others:
        with pytest.raises(StoreError, match=f"in use by another harvester \\(pid {os.getpid()}\\)"):
            StoreLock(other).acquire()
    first.release()
    for other in others:
        lock = StoreLock(other)
        lock.acquire()
        lock.release()
    assert not list(tmp_path.glob("*.lock"))


def test_a_second_process_on_the_same_store_is_refused_and_fresh_wipes_nothing(tmp_path):
    users = write_users(tmp_path / "users.json")
    app = start_app(tmp_path, "--dispatch", "simulated", "--local-nodes", "4", "--tick", "0.1", users=users)
    try:
        token = app.token("alice")
        status, body = app.request("POST", "/api/jobs", {"name": "keep me", "min_nodes": 1, "max_nodes": 2,
                                                         "total_samples": 1e9,
                                                         "curve": {"nodes": [1, 2], "samples_per_second": [10, 19]}},
                                   token=token)
        assert status == 201, body
        for extra in ((), ("--fresh",)):
            r = run_app("--db", str(app.db), "--users", str(users), "--dispatch", "simulated",
                        "--local-nodes", "4", *extra)
            lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
            assert r.returncode == 2 and len(lines) == 1, r.stderr
            assert f"{app.db}: in use by another harvester (pid {app.proc.pid})" in lines[0]
        status, listed = app.get("/api/jobs")
        assert [j["name"] for j in listed["jobs"]] == ["keep me"]
        with sqlite3.connect(app.db) as c:
            assert c.execute("select name from jobs").fetchall() == [("keep me",)]
    finally:
        app.stop()


def status_bar(app) -> str:
    """The status bar as the dashboard's own callback renders it for a browser."""
    status, body = app.request("POST", "/_dash-update-component", {
        "output": "status-bar.children", "outputs": {"id": "status-bar", "property": "children"},
        "inputs": [{"id": "tick", "property": "n_intervals", "value": 1}],
        "changedPropIds": ["tick.n_intervals"], "state": []})
    assert status == 200, body
    return json.dumps(body["response"]["status-bar"]["children"])


def test_health_says_store_failing_while_writes_fail_and_recovers_by_itself(tmp_path):
    app = start_app(tmp_path, "--dispatch", "simulated", "--local-nodes", "2", "--tick", "0.1")
    try:
        lock = WriteLock(app.db)            # held past the server's 5 s busy timeout
        try:
            wait(lambda: app.get("/api/health")[0] == 503, timeout=20, what="health turns 503")
            status, body = app.get("/api/health")
            assert body["status"] == "store failing" and body["store"]["state"] == "failing"
            assert "locked" in body["store"]["detail"] and body["store"]["unsaved_rows"] > 0
            assert "store failing" in status_bar(app)
        finally:
            lock.release()
        wait(lambda: app.get("/api/health")[0] == 200, timeout=20, what="health recovers")
        assert app.get("/api/health")[1]["status"] == "ok"
        assert "store failing" not in status_bar(app)
        assert app.proc.poll() is None
    finally:
        app.stop()
