"""Who may do what. Anyone may look; registering and cancelling need a login.

Users come from a JSON file of hashed passwords (`python -m app.users add NAME`), named by
`--users` or `HARVEST_USERS_FILE`, or from `HARVEST_USERS` holding the same JSON. Roles:
`staff` may pause the harvester and cancel any job, `user` only their own; a user's `unix` field
names the Unix account their jobs run as (where the site has a launcher, `--run-as`), `account`
the account or project their usage is reported under (`GET /api/usage?by=account`), `quota`
their node cap and node-hours per day or week (with the file's `quota_defaults` and `accounts`:
core.quotas, docs/operators/quotas.md). A browser's login is a
server-side session (app.sessions; the signed cookie holds only its id); the API takes a bearer
token from `POST /api/token` (signed with the same secret, valid for `TOKEN_TTL_S`, kept nowhere).
Both carry a stamp of the user's password hash: changing the password (`python -m app.users
passwd`) revokes every token and ends every session of that user. A users file is re-read when
it changes, and whoever watches it (`Users.watch`) is told.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from itsdangerous import BadSignature, SignatureExpired, URLSafeTimedSerializer
from werkzeug.security import check_password_hash, generate_password_hash

from core.privatefiles import link_private, write_private
from core.quotas import QuotaBook
from core.settings import UNIX_NAME

ROLES = ("staff", "user")
ACCOUNT_MAX = 64              # characters of a user's account/project name
TOKEN_TTL_S = 7 * 24 * 3600
MIN_KEY_CHARS = 32
RELOAD_CHECK_S = 1.0          # how often a users file is looked at for changes
log = logging.getLogger(__name__)
_DUMMY_HASH = generate_password_hash("not a password")


@dataclass(frozen=True)
class User:
    name: str
    role: str
    password_hash: str
    unix: str = ""          # the Unix account this login's jobs run as, where the site maps them
    account: str = ""       # the account or project their usage is reported under (GET /api/usage?by=account)

    @property
    def is_staff(self) -> bool:
        return self.role == "staff"

    def may_cancel(self, owner: str) -> bool:
        return self.is_staff or owner == self.name


class Users:
    def __init__(self, users: dict[str, User], source: str, path: Optional[Path] = None,
                 book: Optional[QuotaBook] = None) -> None:
        self.users = users
        self.book = book or QuotaBook()     # quotas: node caps, node-hours per day or week
        self.source = source
        self._path = path
        self._seen = _file_state(path) if path else None
        self._next_look = time.monotonic() + RELOAD_CHECK_S
        self._lock = threading.Lock()
        self._watchers: list[Callable[[], None]] = []

    def watch(self, changed: Callable[[], None]) -> None:
        """Call `changed()` each time the users file is read again (sessions end stale logins)."""
        self._watchers.append(changed)

    def _refresh(self) -> None:
        """Take in the users file's changes (a new password, a removed user) while running."""
        if self._path is None or time.monotonic() < self._next_look:
            return
        with self._lock:
            self._next_look = time.monotonic() + RELOAD_CHECK_S
            state = _file_state(self._path)
            if state == self._seen:
                return
            try:
                fresh = Users.parse(self._path.read_text(), str(self._path))
                self.users, self.book = fresh.users, fresh.book
            except (OSError, ValueError) as e:
                log.error("users file not reloaded, the previous users stay: %s", e)
            self._seen = state
        for changed in self._watchers:
            changed()

    @classmethod
    def parse(cls, text: str, source: str) -> "Users":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{source}: not JSON ({e.msg}, line {e.lineno})")
        rows = data.get("users") if isinstance(data, dict) else None
        if not isinstance(rows, list):
            raise ValueError(f'{source}: expected {{"users": [...]}}')
        users: dict[str, User] = {}
        for k, row in enumerate(rows):
            try:
                name, role, ph = row["name"], row.get("role", "user"), row["password_hash"]
            except (KeyError, TypeError, AttributeError):
                raise ValueError(f"{source}: user {k + 1} needs name and password_hash")
            if not isinstance(name, str) or not name:
                raise ValueError(f"{source}: user {k + 1}: name must be text")
            if not isinstance(ph, str) or not ph:
                raise ValueError(f"{source}: user {name}: password_hash must be text")
            if role not in ROLES:
                raise ValueError(f"{source}: user {name}: role must be staff or user")
            if name in users:
                raise ValueError(f"{source}: user {name} listed twice")
            unix = row.get("unix") or ""
            if not isinstance(unix, str) or (unix and not UNIX_NAME.match(unix)):
                raise ValueError(f"{source}: user {name}: unix must be a Unix account name (lower case, "
                                 f"at most 32 characters), not {unix!r}")
            account = row.get("account") or ""
            if not isinstance(account, str) or not account.isprintable() or len(account) > ACCOUNT_MAX:
                raise ValueError(f"{source}: user {name}: account must be printable text of at most {ACCOUNT_MAX} "
                                 f"characters, not {account!r}")
            users[name] = User(name, role, ph, unix, account.strip())
        return cls(users, source, book=QuotaBook.parse(data, rows, source))

    @classmethod
    def load(cls, path: Optional[Path] = None) -> Optional["Users"]:
        """The configured users, or None when nothing is configured (the demo account case)."""
        path = path or (Path(os.environ["HARVEST_USERS_FILE"]) if os.environ.get("HARVEST_USERS_FILE") else None)
        if path is not None:
            parsed = cls.parse(Path(path).read_text(), str(path))
            return cls(parsed.users, str(path), Path(path), parsed.book)
        if os.environ.get("HARVEST_USERS"):
            return cls.parse(os.environ["HARVEST_USERS"], "HARVEST_USERS")
        return None

    @classmethod
    def demo(cls, db: Path, fresh: bool = False) -> tuple["Users", str]:
        """One staff account, for `make demo` without a users file. Its password is kept beside
        the store (`<db>.demo`, 0600) so that it stays the same from one start to the next;
        `fresh` makes a new one (and so revokes the old one's tokens)."""
        path = Path(str(db) + ".demo")
        try:
            kept = None if fresh else json.loads(path.read_text())
            password, ph = kept["password"], kept["password_hash"]
        except (OSError, ValueError, TypeError, KeyError):
            password = secrets.token_urlsafe(9)
            ph = generate_password_hash(password)
            write_private(path, json.dumps({"password": password, "password_hash": ph}))
        return cls({"demo": User("demo", "staff", ph)}, "demo"), password

    def check(self, name: str, password: str) -> Optional[User]:
        self._refresh()
        user = self.users.get(name or "")
        if user is None:
            check_password_hash(_DUMMY_HASH, password or "")   # same time whether or not the name exists
            return None
        return user if check_password_hash(user.password_hash, password or "") else None

    def accounts(self) -> dict[str, str]:
        """Each user's account or project, as the users file says now (those with one)."""
        self._refresh()
        return {u.name: u.account for u in self.users.values() if u.account}

    def quotas(self) -> QuotaBook:
        """The quotas as the users file says now (what the controller reads at every step)."""
        self._refresh()
        return self.book

    def get(self, name: Optional[str]) -> Optional[User]:
        self._refresh()
        return self.users.get(name) if name else None

    def listed(self) -> list[User]:
        """Every user as the users file says now."""
        self._refresh()
        return list(self.users.values())


def _file_state(path: Path) -> Optional[tuple[int, int, int]]:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def password_stamp(secret: str, user: User) -> str:
    """A short keyed digest of the user's password hash: what a token or a session is bound to."""
    return hmac.new(secret.encode(), user.password_hash.encode(), hashlib.sha256).hexdigest()[:16]


def holder(secret: str, users: Users, name: object, stamp: object) -> Optional[User]:
    """The user `name` if `stamp` matches their password as it is now, else None."""
    user = users.get(name) if isinstance(name, str) else None
    if user is None or not isinstance(stamp, str):
        return None
    return user if hmac.compare_digest(stamp, password_stamp(secret, user)) else None


class Tokens:
    def __init__(self, secret: str, ttl_s: int = TOKEN_TTL_S) -> None:
        self._secret = secret
        self._s = URLSafeTimedSerializer(secret, salt="api-token")
        self.ttl_s = ttl_s

    def issue(self, user: User) -> str:
        return self._s.dumps({"u": user.name, "p": password_stamp(self._secret, user)})

    @property
    def secret(self) -> str:
        return self._secret

    def stamp(self, user: User) -> str:
        return password_stamp(self._secret, user)

    def user_of(self, token: str, users: Users) -> Optional[User]:
        try:
            data = self._s.loads(token, max_age=self.ttl_s)
        except (BadSignature, SignatureExpired):
            return None
        return holder(self._secret, users, data.get("u"), data.get("p")) if isinstance(data, dict) else None


def secret_key(db: Path) -> str:
    """HARVEST_SECRET_KEY, or a random key kept beside the store (so logins survive a restart).
    The file appears whole or not at all (written aside, then linked in)."""
    key = stored_key(db)
    if key is None:
        link_private(Path(str(db) + ".secret"), secrets.token_hex(32))
        key = stored_key(db)
    assert key is not None
    return key


def stored_key(db: Path) -> Optional[str]:
    """The key already given (variable or file), None if there is none yet; an empty or short key
    is refused (ValueError) rather than signing with it."""
    env = os.environ.get("HARVEST_SECRET_KEY")
    if env:
        if len(env) < MIN_KEY_CHARS:
            raise ValueError(f"HARVEST_SECRET_KEY is {len(env)} characters: give at least {MIN_KEY_CHARS}")
        return env
    path = Path(str(db) + ".secret")
    if not path.exists():
        return None
    key = path.read_text().strip()
    if len(key) < MIN_KEY_CHARS:
        raise ValueError(f"{path}: holds an empty or short key ({len(key)} characters, at least {MIN_KEY_CHARS} "
                         "needed): delete the file and a new key is made at the next start (logins end)")
    return key
