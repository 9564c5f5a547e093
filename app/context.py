"""What the pages and the API share in one process: the harvester, users, tokens, history.

Set once by `web.create_app`; pages read it when their callbacks run, never at import.
"""
from __future__ import annotations

import secrets
from typing import Optional

import flask

from core.service import Harvester

from .auth import Tokens, User, Users
from .grid import CellCache
from .queries import History
from .signin import Gate

BOOT = secrets.token_hex(4)   # tells a browser's cached grid apart from another process's

harvester: Optional[Harvester] = None
users: Optional[Users] = None
tokens: Optional[Tokens] = None
history: Optional[History] = None
cells = CellCache()
gate = Gate()


def current_user() -> Optional[User]:
    """The logged-in user of this request: the session cookie, or a bearer token."""
    auth = flask.request.headers.get("Authorization", "")
    if auth.startswith("Bearer "):
        return tokens.user_of(auth[7:].strip(), users)
    return users.get(flask.session.get("user"))


def start_session(user: User) -> None:
    """Log this browser in as `user`."""
    flask.session.clear()
    flask.session["user"] = user.name
    flask.session.permanent = True
