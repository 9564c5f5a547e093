"""What the pages and the API share in one process: the harvester, users, tokens, history.

Set once by `web.create_app`; pages read it when their callbacks run, never at import.
"""
from __future__ import annotations

import secrets
import time
from typing import Optional

import flask

from core.service import Harvester

from .auth import Tokens, User, Users, holder
from .grid import CellCache
from .gridupdates import UpdateCache
from .queries import History
from .signin import Gate
from .webconfig import WebConfig

BOOT = secrets.token_hex(4)   # tells a browser's cached grid apart from another process's

harvester: Optional[Harvester] = None
users: Optional[Users] = None
tokens: Optional[Tokens] = None
history: Optional[History] = None
cells = CellCache()
updates: UpdateCache = UpdateCache()   # grid updates, one per pair of snapshots for every viewer
gate = Gate()
session_idle_s: float = WebConfig.session_idle_s


def current_user() -> Optional[User]:
    """The logged-in user of this request: the session cookie, or a bearer token."""
    auth = flask.request.headers.get("Authorization", "")
    if auth.startswith("Bearer "):
        return tokens.user_of(auth[7:].strip(), users)
    return session_user()


def session_user() -> Optional[User]:
    """The browser's user: its session must be bound to the user's current password and have
    been used within `session_idle_s`; the time of use is renewed now and then, not at every
    request, so that the cookie does not change every second."""
    s = flask.session
    if "user" not in s:
        return None
    now = time.time()
    seen = s.get("seen")
    user = holder(tokens.secret, users, s.get("user"), s.get("stamp"))
    if user is None or not isinstance(seen, (int, float)) or now - seen > session_idle_s:
        for k in ("user", "stamp", "seen"):
            s.pop(k, None)
        return None
    if now - seen > min(60.0, session_idle_s / 4):
        s["seen"] = now
    return user


def start_session(user: User) -> None:
    """Log this browser in as `user`."""
    flask.session.clear()
    flask.session.update(user=user.name, stamp=tokens.stamp(user), seen=time.time())
    flask.session.permanent = True
