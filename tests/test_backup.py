"""python -m core.backup: an online copy of a store that another connection keeps writing (WAL),
whole and consistent; a missing store, a backup onto the store itself and a restore over a
running harvester's store are refused in one line. The service as a whole: tests/test_systemd_unit.py."""
from __future__ import annotations

import sqlite3
import threading
from contextlib import closing

import pytest

from core.backup import backup, main, restore
from core.errors import StoreError
from core.storelock import StoreLock


def test_a_backup_while_another_connection_writes_is_consistent(tmp_path):
    db = tmp_path / "harvest.db"
    writer = sqlite3.connect(db, check_same_thread=False, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, a INTEGER, b INTEGER)")
    stop = threading.Event()

    def write():
        k = 0
        while not stop.is_set():     # each transaction keeps a == b; a torn copy would not
            writer.execute("BEGIN")
            writer.execute("INSERT INTO t (a, b) VALUES (?, ?)", (k, k))
            writer.execute("UPDATE t SET a = a + 1, b = b + 1 WHERE k % 7 = 0")
            writer.execute("COMMIT")
            k += 1
    (tmp_path / "harvest.db.secret").write_text("k" * 64)
    t = threading.Thread(target=write)
    t.start()
    try:
        lines = [backup(db, tmp_path / f"b{i}.db") for i in range(5)]
    finally:
        stop.set()
        t.join()
        writer.close()
    assert all("integrity ok, with b" in line for line in lines), lines
    counts = []
    for i in range(5):
        with closing(sqlite3.connect(tmp_path / f"b{i}.db")) as c:
            assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            assert c.execute("SELECT count(*) FROM t WHERE a != b").fetchone()[0] == 0
            counts.append(c.execute("SELECT count(*) FROM t").fetchone()[0])
        assert (tmp_path / f"b{i}.db.secret").read_text() == "k" * 64
        assert not (tmp_path / f"b{i}.db.part").exists()
    assert counts == sorted(counts) and counts[-1] > 0


def test_refusals_are_one_line(tmp_path, capsys):
    assert main([str(tmp_path / "none.db"), str(tmp_path / "b.db")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'none.db'}: no such store"
    assert not (tmp_path / "none.db").exists(), "a missing store is not created"
    db = tmp_path / "s.db"
    with closing(sqlite3.connect(db)) as c:
        c.execute("CREATE TABLE t (x)")
    with pytest.raises(StoreError, match="would replace the store itself"):
        backup(db, db)
    backup(db, tmp_path / "b.db")
    lock = StoreLock(db)
    lock.acquire()                   # as a running harvester holds it
    try:
        with pytest.raises(StoreError, match="in use by another harvester"):
            restore(tmp_path / "b.db", db)
    finally:
        lock.release()
    assert restore(tmp_path / "b.db", db).startswith(f"restored {tmp_path / 'b.db'} to {db}; the old files moved")
