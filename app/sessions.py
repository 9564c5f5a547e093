"""Browser sessions kept server-side, so that they can end: the cookie carries only a random id,
and the row it names (in `<db>.sessions`, SQLite through sqlite-utils) says whose login it is.

A session ends at logout, when its user's password changes, after `idle_s` unused or `absolute_s`
after the login; an ended row is deleted, so a replayed cookie finds nothing, after a restart
too. Only a digest of each id is stored: reading the file gives no usable cookie. The table stays
bounded: expired rows are purged, and a user keeps their newest `MAX_PER_USER` sessions.
"""
from __future__ import annotations

import hashlib
import logging
import os
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional

import sqlite_utils

MAX_PER_USER = 32             # a user's sessions at once (browsers, devices); the oldest go first
PURGE_EVERY_S = 60.0          # expired rows are deleted at a login, and at most this often otherwise
BUSY_TIMEOUT_S = 5.0
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lifetimes:
    idle_s: float             # unused this long: ended
    absolute_s: float         # this long after the login: ended, however much it is used

    @property
    def touch_every_s(self) -> float:
        """How stale the time of last use may be stored (not a write per request)."""
        return min(60.0, self.idle_s / 4)


@dataclass(frozen=True)
class Session:
    user: str
    stamp: str                # the user's password stamp at login (app.auth.password_stamp)


def digest(sid: str) -> str:
    return hashlib.sha256(sid.encode()).hexdigest()


class SessionStore:
    """Thread-safe: one connection, used under a lock; each change is one transaction."""

    def __init__(self, path: Path, lifetimes: Lifetimes, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.lifetimes = lifetimes
        self._clock = clock
        self._lock = threading.Lock()
        self._next_purge = 0.0
        self._conn = _open(self.path)
        self._db = sqlite_utils.Database(self._conn)
        self._db["sessions"].create({"id": str, "user": str, "stamp": str, "created": float, "seen": float},
                                    pk="id", if_not_exists=True)
        self._db["sessions"].create_index(["user"], if_not_exists=True)

    def open(self, user: str, stamp: str) -> str:
        """A new session for `user`: its id, for the cookie."""
        sid = secrets.token_urlsafe(32)
        now = self._clock()
        with self._lock, self._conn:
            self._purge(now)
            self._conn.execute("INSERT INTO sessions VALUES (?, ?, ?, ?, ?)", (digest(sid), user, stamp, now, now))
            self._conn.execute("DELETE FROM sessions WHERE user = ? AND id NOT IN (SELECT id FROM sessions "
                               "WHERE user = ? ORDER BY created DESC LIMIT ?)", (user, user, MAX_PER_USER))
        return sid

    def find(self, sid: object) -> Optional[Session]:
        """The live session `sid` names (its time of use renewed), None if it has ended."""
        if not isinstance(sid, str) or not sid:
            return None
        key, now, life = digest(sid), self._clock(), self.lifetimes
        with self._lock:
            if now >= self._next_purge:
                with self._conn:
                    self._purge(now)
            row = self._conn.execute("SELECT user, stamp, created, seen FROM sessions WHERE id = ?", (key,)).fetchone()
            if row is None:
                return None
            user, stamp, created, seen = row
            if now - seen > life.idle_s or now - created > life.absolute_s:
                with self._conn:
                    self._conn.execute("DELETE FROM sessions WHERE id = ?", (key,))
                return None
            if now - seen > life.touch_every_s:
                with self._conn:
                    self._conn.execute("UPDATE sessions SET seen = ? WHERE id = ?", (now, key))
            return Session(user, stamp)

    def end(self, sid: object) -> None:
        """Logout: the session is gone for good."""
        if isinstance(sid, str) and sid:
            with self._lock, self._conn:
                self._conn.execute("DELETE FROM sessions WHERE id = ?", (digest(sid),))

    def end_stale(self, stamps: Mapping[str, str]) -> int:
        """End every session whose user is gone or whose password changed since its login
        (`stamps`: each user's current password stamp); how many ended."""
        with self._lock, self._conn:
            rows = self._conn.execute("SELECT id, user, stamp FROM sessions").fetchall()
            stale = [(k,) for k, user, stamp in rows if stamps.get(user) != stamp]
            self._conn.executemany("DELETE FROM sessions WHERE id = ?", stale)
        return len(stale)

    def count(self) -> int:
        with self._lock:
            return self._conn.execute("SELECT count(*) FROM sessions").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _purge(self, now: float) -> None:
        life = self.lifetimes
        self._conn.execute("DELETE FROM sessions WHERE seen < ? OR created < ?",
                           (now - life.idle_s, now - life.absolute_s))
        self._next_purge = now + PURGE_EVERY_S


def _open(path: Path) -> sqlite3.Connection:
    """The sessions file, private (0600; SQLite gives its -wal and -shm files the same mode). One
    that is not a usable database is started afresh: sessions are disposable (users log in again)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    os.chmod(path, 0o600)
    try:
        return _connect(path)
    except sqlite3.DatabaseError as e:
        log.warning("%s: not a usable sessions file (%s): started afresh, every browser logs in again", path, e)
        for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            p.unlink(missing_ok=True)
        return _open(path)


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, check_same_thread=False, timeout=BUSY_TIMEOUT_S)   # `with conn`: one transaction
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError:
        conn.close()
        raise
    return conn
