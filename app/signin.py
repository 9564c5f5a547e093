"""The one way to log in, shared by the form (`POST /login`) and the API (`POST /api/token`).

Failed attempts are throttled per user name and per client address, and password hashing (a
32 MiB scrypt for werkzeug's default hashes) runs in a few slots only, so that guesses, however
parallel, neither go fast nor occupy every server thread. Each failed or refused attempt is one
warning in the log: the name as given, escaped (`repr`, cut to `LOGGED_NAME_CHARS`) so that no
name can forge a line, and the client's address; never the password.
"""
from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass, field
from typing import Optional

from .auth import User, Users
from .throttle import FailureWindow, Limit

LOGGED_NAME_CHARS = 64        # of a refused name, in the log (a name may be a megabyte of anything)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoginPolicy:
    per_user: Limit = field(default_factory=lambda: Limit(5, 60.0))
    per_address: Limit = field(default_factory=lambda: Limit(20, 60.0))
    hashing_slots: int = 2        # password checks at once; the other threads stay free
    hashing_wait_s: float = 2.0   # how long a login waits for a slot before "busy, retry"


class Refused(Exception):
    """A login not even checked: `status` 429 (throttled) or 503 (hashing slots busy)."""

    def __init__(self, status: int, retry_after_s: float, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = max(1, math.ceil(retry_after_s))


class Gate:
    def __init__(self, policy: LoginPolicy = LoginPolicy()) -> None:
        self.policy = policy
        self._users = FailureWindow(policy.per_user)
        self._addresses = FailureWindow(policy.per_address)
        self._slots = threading.BoundedSemaphore(policy.hashing_slots)

    def login(self, users: Users, name: str, password: str, address: str) -> Optional[User]:
        """The user, None for a wrong name or password; raises Refused when throttled or busy.
        Either way but success, one log line says so."""
        try:
            user = self._login(users, name, password, address)
        except Refused as e:
            log.warning("login refused (%s) for user %s from %s", "throttled" if e.status == 429 else "busy",
                        _shown(name), address)
            raise
        if user is None:
            log.warning("failed login for user %s from %s", _shown(name), address)
        return user

    def _login(self, users: Users, name: str, password: str, address: str) -> Optional[User]:
        ukey, akey = f"user:{name}", f"addr:{address}"
        wait, ustamp = self._users.reserve(ukey)      # counted as failed until it succeeds
        if wait > 0:
            raise Refused(429, wait, f"too many failed logins; try again in {math.ceil(wait)} s")
        wait, astamp = self._addresses.reserve(akey)
        if wait > 0:
            self._users.forgive(ukey, ustamp)
            raise Refused(429, wait, f"too many failed logins; try again in {math.ceil(wait)} s")
        if not self._slots.acquire(timeout=self.policy.hashing_wait_s):
            self._users.forgive(ukey, ustamp)
            self._addresses.forgive(akey, astamp)
            raise Refused(503, 1, "too many logins at once; try again in a second")
        try:
            user = users.check(name, password)
        finally:
            self._slots.release()
        if user is not None:
            self._users.clear(ukey)
            self._addresses.forgive(akey, astamp)
        return user


def _shown(name: str) -> str:
    """A user name as the log shows it: quoted, its control characters escaped, cut short."""
    return repr(name[:LOGGED_NAME_CHARS]) + ("..." if len(name) > LOGGED_NAME_CHARS else "")
