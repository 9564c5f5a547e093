"""Quotas: per owner and per account, the most nodes at once and node-hours per UTC day or week.

Pure policy on plain records (the users file's quota fields in, caps and reasons out), and one
small stateful piece, `Quotas`, that the controller holds: the node-seconds each owner has used
in the current periods (counted from what actually happened, seeded from the store's allocation
history on a restart) and the reasons its jobs wait.

- `max_nodes`: the allocator never gives an owner's jobs (an account's: all its owners' jobs)
  more nodes together; an exact constraint of the solve (core.policies.caps, one MILP row).
- `node_hours_per_day` / `node_hours_per_week`: once an owner (or their account) has used that
  many node-hours in the current UTC day (from 00:00 UTC) or week (from Monday 00:00 UTC), their
  jobs get no nodes (the running ones are shrunk to 0, the queued ones are not admitted) until
  the period rolls over; each such job's why-line says so ("alice has used 96 of 96 node-hours
  today"). A running owner is stopped when the quota is used up, not at the next event: the
  controller wakes at that moment (`wake_at`), and again at the roll-over.

Jobs without an owner (a replay's job set) have no quota. In the users file:

    {"quota_defaults": {"user": {"max_nodes": 64, "node_hours_per_day": 96},
                        "account": {"node_hours_per_week": 5000}},
     "accounts": {"physics": {"max_nodes": 512}},
     "users": [{"name": "alice", ..., "account": "physics", "quota": {"max_nodes": 16}}]}

A field left out takes the default; `null` means no limit (also over a default).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields
from typing import Callable, Iterable, Mapping, Optional, Sequence

from .objective import Cap

DAY_S = 86400.0
WEEK_S = 7 * DAY_S
MONDAY_S = 4 * DAY_S          # 1970-01-01 was a Thursday: the first Monday 00:00 UTC after the epoch
PERIODS = ("day", "week")
PERIOD_WORDS = {"day": "today", "week": "this week"}
LIMIT_FIELDS = ("max_nodes", "node_hours_per_day", "node_hours_per_week")
EPS_S = 1e-3                  # node-seconds: a quota this close to used up is used up (float sums)


def period_start(period: str, t: float) -> float:
    """Start of the UTC day (00:00) or week (Monday 00:00) holding t."""
    if period == "day":
        return math.floor(t / DAY_S) * DAY_S
    return math.floor((t - MONDAY_S) / WEEK_S) * WEEK_S + MONDAY_S


def period_end(period: str, t: float) -> float:
    return period_start(period, t) + (DAY_S if period == "day" else WEEK_S)


@dataclass(frozen=True)
class Limits:
    """One owner's or account's limits (None: no limit)."""
    max_nodes: Optional[int] = None
    node_hours_per_day: Optional[float] = None
    node_hours_per_week: Optional[float] = None

    def hours(self, period: str) -> Optional[float]:
        return self.node_hours_per_day if period == "day" else self.node_hours_per_week

    @property
    def any(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))


NO_LIMITS = Limits()


def parse_limits(raw: object, where: str) -> dict:
    """The limit fields given in a users-file object (absent ones left out, so defaults can fill
    them). ValueError naming `where` for anything else."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected an object with {', '.join(LIMIT_FIELDS)}")
    unknown = sorted(set(raw) - set(LIMIT_FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r}; the quota fields are {', '.join(LIMIT_FIELDS)}")
    out = {}
    for name, v in raw.items():
        if v is None:
            out[name] = None
        elif name == "max_nodes":
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{where}: max_nodes must be a whole number of at least 0, or null, not {v!r}")
            out[name] = v
        else:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{where}: {name} must be a number of at least 0, or null, not {v!r}")
            out[name] = float(v)
    return out


def parse_share(v: object, where: str) -> float:
    """A user's fair share (the `fairshare` objective weighs owners by it): a positive number."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"{where}: must be a positive number, not {v!r}")
    return float(v)


@dataclass(frozen=True)
class QuotaBook:
    """Every limit the users file sets, resolved against the site defaults."""
    users: Mapping[str, Limits] = field(default_factory=dict)
    account_of: Mapping[str, str] = field(default_factory=dict)
    accounts: Mapping[str, Limits] = field(default_factory=dict)
    default_user: Limits = NO_LIMITS
    default_account: Limits = NO_LIMITS
    shares: Mapping[str, float] = field(default_factory=dict)   # user -> fair share (core.fairshare; 1 unless set)

    @property
    def empty(self) -> bool:
        return not (self.default_user.any or self.default_account.any
                    or any(x.any for x in self.users.values()) or any(x.any for x in self.accounts.values()))

    def owner(self, name: str) -> Limits:
        """An owner's limits (a job without an owner has none; an owner the file no longer lists
        has the defaults)."""
        if not name:
            return NO_LIMITS
        return self.users.get(name, self.default_user)

    def account(self, name: str) -> Limits:
        if not name:
            return NO_LIMITS
        return self.accounts.get(name, self.default_account)

    @classmethod
    def parse(cls, data: Mapping, rows: Sequence[Mapping], source: str) -> "QuotaBook":
        """From a users file: its top-level `quota_defaults` and `accounts`, and each user row's
        `quota` (and `account`). ValueError naming the file and the place."""
        defaults = data.get("quota_defaults") or {}
        if not isinstance(defaults, dict) or set(defaults) - {"user", "account"}:
            raise ValueError(f'{source}: quota_defaults: expected {{"user": {{...}}, "account": {{...}}}}')
        d_user = parse_limits(defaults.get("user"), f"{source}: quota_defaults.user")
        d_account = parse_limits(defaults.get("account"), f"{source}: quota_defaults.account")
        table = data.get("accounts") or {}
        if not isinstance(table, dict):
            raise ValueError(f'{source}: accounts: expected {{"NAME": {{"max_nodes": ...}}, ...}}')
        accounts = {str(name): Limits(**{**d_account, **parse_limits(raw, f"{source}: accounts.{name}")})
                    for name, raw in table.items()}
        users, account_of, shares = {}, {}, {}
        for row in rows:
            name = row["name"]
            if row.get("share") is not None:
                shares[name] = parse_share(row["share"], f"{source}: user {name}: share")
            users[name] = Limits(**{**d_user, **parse_limits(row.get("quota"), f"{source}: user {name}: quota")})
            if row.get("account"):
                account_of[name] = str(row["account"]).strip()
        return cls(users, account_of, accounts, Limits(**d_user), Limits(**d_account), shares)


def hours(node_s: float) -> str:
    """Node-seconds as node-hours for a sentence: 96, 95.5, 0.25."""
    h = node_s / 3600.0
    return f"{round(h, 2):g}"


@dataclass(frozen=True)
class Block:
    """Why an owner's jobs get no nodes now, and until when."""
    who: str              # "alice", or "account physics"
    used_s: float         # node-seconds used in the period
    limit_h: float
    period: str
    until: float          # the roll-over

    def line(self) -> str:
        return (f"{self.who} has used {hours(self.used_s)} of {self.limit_h:g} "
                f"node-hours {PERIOD_WORDS[self.period]}; "
                f"nodes again at {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(self.until))}")


class Tally:
    """Node-seconds each owner has used in the current UTC day and week. Time only moves
    forward per owner: what falls before a period already counted is ignored."""

    def __init__(self) -> None:
        self._used: dict[tuple[str, str], tuple[float, float]] = {}   # (owner, period) -> (start, node-s)

    def add(self, owner: str, nodes: int, t0: float, t1: float) -> None:
        if not owner or nodes <= 0 or t1 <= t0:
            return
        for period in PERIODS:
            start = period_start(period, t1)
            secs = nodes * (t1 - max(t0, start))
            kept_start, kept = self._used.get((owner, period), (start, 0.0))
            if kept_start > start:
                continue               # an older period than the one counted: over already
            self._used[(owner, period)] = (start, (kept if kept_start == start else 0.0) + secs)

    def used(self, owner: str, period: str, now: float) -> float:
        start, secs = self._used.get((owner, period), (None, 0.0))
        return secs if start == period_start(period, now) else 0.0

    def account_used(self, book: "QuotaBook", account: str, period: str, now: float) -> float:
        """Node-seconds all the account's owners used in the period (those with no job now too)."""
        return sum(self.used(o, period, now) for o, p in self._used if p == period
                   and book.account_of.get(o, "") == account)


def block_of(book: QuotaBook, owner: str, tally: Tally, now: float) -> Optional[Block]:
    """Why `owner` may have no nodes now (their own period quota or their account's, the one
    that lasts longest), or None."""
    found: list[Block] = []
    for period in PERIODS:
        limit = book.owner(owner).hours(period)
        if limit is not None:
            used = tally.used(owner, period, now)
            if used + EPS_S >= limit * 3600.0:
                found.append(Block(owner, used, limit, period, period_end(period, now)))
        account = book.account_of.get(owner, "")
        limit = book.account(account).hours(period)
        if account and limit is not None:
            used = tally.account_used(book, account, period, now)
            if used + EPS_S >= limit * 3600.0:
                found.append(Block(f"account {account}", used, limit, period, period_end(period, now)))
    return max(found, key=lambda b: b.until) if found else None


def caps_for(book: QuotaBook, jobs: Sequence[tuple[str, str]], blocked: Iterable[str] = ()) -> list[Cap]:
    """Node caps over the jobs given as (job id, owner): each owner's `max_nodes` (0 for an owner
    `blocked` by a period quota) and each account's over all its owners' jobs."""
    off = set(blocked)
    by_owner: dict[str, list[str]] = {}
    for jid, owner in jobs:
        if owner:
            by_owner.setdefault(owner, []).append(jid)
    caps: list[Cap] = []
    by_account: dict[str, list[str]] = {}
    for owner, ids in by_owner.items():
        limit = 0 if owner in off else book.owner(owner).max_nodes
        if limit is not None:
            caps.append(Cap(limit, tuple(ids), owner))
        account = book.account_of.get(owner, "")
        if account:
            by_account.setdefault(account, []).extend(ids)
    for account, ids in by_account.items():
        limit = book.account(account).max_nodes
        if limit is not None:
            caps.append(Cap(limit, tuple(ids), f"account {account}"))
    return caps


def cap_line(book: QuotaBook, owner: str, held: Mapping[str, int]) -> Optional[str]:
    """Why an owner's job gets no more nodes when a node cap is what stops it: the owner's (or
    the account's) jobs hold all the cap allows. `held`: nodes each owner's jobs hold now."""
    if not owner:
        return None
    limit = book.owner(owner).max_nodes
    if limit is not None and held.get(owner, 0) >= limit:
        return f"{owner}'s jobs may hold at most {limit} node{'s' if limit != 1 else ''} at once (the node cap)"
    account = book.account_of.get(owner, "")
    limit = book.account(account).max_nodes if account else None
    if limit is not None and sum(n for o, n in held.items() if book.account_of.get(o, "") == account) >= limit:
        return (f"account {account}'s jobs may hold at most {limit} node{'s' if limit != 1 else ''} at once "
                f"(the node cap)")
    return None


class Quotas:
    """What the controller keeps of the quotas: where the limits come from (`source`, re-read at
    every step: the users file may change), the tally, and the owners blocked now."""

    def __init__(self, source: Optional[Callable[[], Optional[QuotaBook]]] = None) -> None:
        self.source = source
        self.tally = Tally()
        self.book: QuotaBook = QuotaBook()
        self.blocked: dict[str, Block] = {}

    def count(self, held: Mapping[str, int], t0: float, t1: float) -> None:
        """Owners held `held` nodes from t0 to t1."""
        for owner, n in held.items():
            self.tally.add(owner, n, t0, t1)

    @staticmethod
    def held(pairs: Iterable[tuple[str, int]]) -> dict[str, int]:
        """Nodes per owner from (owner, nodes) of each running job (jobs without an owner left out)."""
        out: dict[str, int] = {}
        for owner, n in pairs:
            if owner and n:
                out[owner] = out.get(owner, 0) + n
        return out

    def seed(self, holds: Iterable[tuple[str, float, float]]) -> None:
        """Usage from the store's history, (owner, start, end) of each node held: a restart
        continues the same figures."""
        for owner, start, end in sorted(holds, key=lambda h: h[2]):
            self.tally.add(owner, 1, start, end)

    def review(self, owners: Iterable[str], now: float) -> bool:
        """Re-read the limits and work out who is blocked now; True when that changed (the
        allocation must be made again: someone is over quota, or a period rolled over)."""
        if self.source is None and self.book.empty:
            return False
        book = (self.source() if self.source is not None else None) or QuotaBook()
        owners = {o for o in owners if o}
        blocked = {}
        if not book.empty:
            for o in owners:
                b = block_of(book, o, self.tally, now)
                if b is not None:
                    blocked[o] = b
        changed = book != self.book or blocked.keys() != self.blocked.keys()
        self.book, self.blocked = book, blocked
        return changed

    @property
    def on(self) -> bool:
        return not self.book.empty

    def caps(self, jobs: Sequence[tuple[str, str]]) -> list[Cap]:
        return caps_for(self.book, jobs, self.blocked) if self.on else []

    def wake_at(self, held: Mapping[str, int], now: float) -> Optional[float]:
        """The next moment the quotas change who may run without any event: a blocked owner's
        roll-over, or the moment a running owner (or account) uses up a period quota."""
        if not self.on:
            return None
        times = [b.until for b in self.blocked.values()]
        book = self.book
        per_account: dict[str, int] = {}
        for owner, n in held.items():
            if n <= 0 or owner in self.blocked:
                continue
            acct = book.account_of.get(owner, "")
            if acct:
                per_account[acct] = per_account.get(acct, 0) + n
            for period in PERIODS:
                limit = book.owner(owner).hours(period)
                if limit is not None:
                    left = limit * 3600.0 - self.tally.used(owner, period, now)
                    times.append(now + max(0.0, left) / n)
        for acct, n in per_account.items():
            for period in PERIODS:
                limit = book.account(acct).hours(period)
                if limit is not None:
                    used = self.tally.account_used(book, acct, period, now)
                    times.append(now + max(0.0, limit * 3600.0 - used) / n)
        later = [t for t in times if t > now]
        return min(later) if later else None

    def may_run(self, owner: str) -> bool:
        """Not blocked by a period quota (a queued job of a blocked owner is not admitted)."""
        return owner not in self.blocked

    def reason(self, owner: str) -> Optional[str]:
        b = self.blocked.get(owner)
        return b.line() if b is not None else None

    def standing(self, owners: Iterable[str], held: Mapping[str, int], now: float) -> list[dict]:
        """Where each owner with a limit stands (for /metrics): nodes held against the node cap,
        node-hours used this day and week against the period quotas, and whether a period quota
        blocks them now. Owners: those named and every one the users file gives limits."""
        if not self.on:
            return []
        out = []
        for owner in sorted({o for o in owners if o} | set(self.book.users)):
            limits = self.book.owner(owner)
            if not limits.any:
                continue
            row = {"owner": owner, "held": held.get(owner, 0), "max_nodes": limits.max_nodes,
                   "blocked": owner in self.blocked}
            for period in PERIODS:
                row[period] = {"used_h": self.tally.used(owner, period, now) / 3600.0, "limit_h": limits.hours(period)}
            out.append(row)
        return out

    def lines(self, owner: str, finished: bool, held: Mapping[str, int]) -> dict:
        """A job's quota lines for its why-line (core.explain): `quota`, its owner is over a
        period quota; `node_cap`, its owner's (or account's) jobs hold all their node cap allows;
        {} when neither. `held`: nodes each owner's jobs hold now."""
        if not self.on or finished or not owner:
            return {}
        out = {}
        reason = self.reason(owner)
        if reason:
            out["quota"] = reason
        cap = cap_line(self.book, owner, held)
        if cap:
            out["node_cap"] = cap
        return out
