"""What the pages and the API share in one process: the harvester, users, tokens, history.

Set once by `web.create_app`; pages read it when their callbacks run, never at import.
"""
from __future__ import annotations

import logging
import secrets
import sqlite3
from typing import Optional

import flask

from core.service import Harvester

from .auth import Tokens, User, Users, holder
from .grid import CellCache
from .gridupdates import UpdateCache
from .queries import History
from .sessions import SessionStore
from .signin import Gate

log = logging.getLogger(__name__)
BOOT = secrets.token_hex(4)   # tells a browser's cached grid apart from another process's

harvester: Optional[Harvester] = None
users: Optional[Users] = None
tokens: Optional[Tokens] = None
history: Optional[History] = None
cells = CellCache()
updates: UpdateCache = UpdateCache()   # grid updates, one per pair of snapshots for every viewer
gate = Gate()
sessions: Optional[SessionStore] = None    # browser logins, server-side (app.sessions)


def current_user() -> Optional[User]:
    """The logged-in user of this request: the session cookie, or a bearer token."""
    auth = flask.request.headers.get("Authorization", "")
    if auth.startswith("Bearer "):
        return tokens.user_of(auth[7:].strip(), users)
    return session_user()


def session_user() -> Optional[User]:
    """The browser's user: the cookie's session id must name a live server-side session (not
    logged out, within its idle and absolute lifetimes) bound to the user's current password."""
    found = sessions.find(flask.session.get("sid"))
    user = holder(tokens.secret, users, found.user, found.stamp) if found is not None else None
    if user is None:
        if found is not None:
            end_stale_sessions()             # the password changed: every older session of theirs ends
        for k in [k for k in flask.session if k != "_flashes"]:
            flask.session.pop(k, None)
    return user


def start_session(user: User) -> None:
    """Log this browser in as `user`: a new session id (never the one it came with)."""
    end_session()
    flask.session["sid"] = sessions.open(user.name, tokens.stamp(user))
    flask.session.permanent = True


def end_session() -> None:
    """Log this browser out: its session ends server-side, so the old cookie is worth nothing."""
    sessions.end(flask.session.get("sid"))
    flask.session.clear()


def end_stale_sessions() -> None:
    """End the sessions of removed users and of passwords changed since (users file re-read)."""
    try:
        ended = sessions.end_stale({u.name: tokens.stamp(u) for u in users.listed()})
    except sqlite3.Error as e:          # they are refused anyway (their stamp no longer matches)
        log.error("stale browser sessions not ended: %s", e)
        return
    if ended:
        log.info("%d browser session(s) ended: their user was removed or changed password", ended)
