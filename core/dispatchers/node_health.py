"""Nodes held out for reasons of their own, apart from the jobs that ran on them.

A node whose workers were lost because of the node (it did not answer, its heartbeats stopped,
a signal nobody in the job sent killed them) is not offered to any job until a check of the
node passes: the check is tried again with back-off (`FIRST_CHECK_S` doubling up to
`MAX_CHECK_S`, so a node that recovers is back within that), and staff can clear it by hand.
Policy and bookkeeping only: the dispatcher runs the checks (over the node's transport) and
turns `passed` into the node's join.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Optional

from ..snapshot import LOST_PREFIX

#: seconds from a node's loss to its first check; each failed check doubles the wait ...
FIRST_CHECK_S = 2.0
#: ... up to this: a node that recovers is offered again at most this long (plus one check) later
MAX_CHECK_S = 16.0


@dataclass
class Sick:
    """A node held out: why, since when (wall clock), and its checks so far."""
    node: str
    reason: str
    since: float
    checks: int = 0                 # failed checks since it was held out
    last_check: str = ""            # what the last failed check said
    next_at: float = 0.0            # monotonic: when it is checked next
    checking: bool = False          # a check is running now

    def line(self, now: Optional[float] = None) -> str:
        """What the cluster page and /api/cluster say about the node."""
        now = time.time() if now is None else now
        out = f"{LOST_PREFIX}{_ago(now - self.since)} ago: {self.reason}"
        if self.checks:
            out += f"; {self.checks} check(s) failed since (last: {self.last_check})"
        return out + "; not offered until a check passes"

    def to_dict(self) -> dict:
        return {"node": self.node, "reason": self.reason, "since": self.since, "checks": self.checks,
                "last_check": self.last_check}


class NodeHealth:
    """The book of held-out nodes (thread-safe: checks finish on the dispatcher's pool)."""

    def __init__(self, first_check_s: float = FIRST_CHECK_S, max_check_s: float = MAX_CHECK_S) -> None:
        self.first_check_s = first_check_s
        self.max_check_s = max_check_s
        self._sick: dict[str, Sick] = {}
        self._lock = threading.Lock()

    def hold_out(self, node: str, reason: str) -> bool:
        """`node` lost its workers for a reason of its own: it is not offered until a check
        passes. False when it was held out already (the first reason stays)."""
        with self._lock:
            if node in self._sick:
                return False
            self._sick[node] = Sick(node, reason, time.time(), next_at=time.monotonic() + self.first_check_s)
            return True

    def is_out(self, node: str) -> bool:
        with self._lock:
            return node in self._sick

    def due(self) -> list[str]:
        """The held-out nodes whose next check is due (marked as being checked)."""
        t = time.monotonic()
        with self._lock:
            out = [s.node for s in self._sick.values() if not s.checking and s.next_at <= t]
            for n in out:
                self._sick[n].checking = True
            return out

    def passed(self, node: str) -> Optional[Sick]:
        """A check of `node` passed: it is offered again. What it had been held out for (None
        if staff cleared it meanwhile)."""
        with self._lock:
            return self._sick.pop(node, None)

    def failed(self, node: str, why: str) -> float:
        """A check of `node` failed: the next waits twice as long, up to `max_check_s`. Returns
        the wait (0 when the node is no longer held out)."""
        with self._lock:
            s = self._sick.get(node)
            if s is None:
                return 0.0
            s.checks += 1
            s.last_check = why
            s.checking = False
            wait = min(self.max_check_s, self.first_check_s * 2 ** s.checks)
            s.next_at = time.monotonic() + wait
            return wait

    def clear(self, node: str) -> Optional[Sick]:
        """Staff vouch for the node: it is offered again at once."""
        with self._lock:
            return self._sick.pop(node, None)

    def held_out(self) -> dict[str, Sick]:
        with self._lock:
            return dict(self._sick)

    def states(self) -> dict[str, str]:
        now = time.time()
        with self._lock:
            return {n: s.line(now) for n, s in self._sick.items()}


def _ago(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s} s" if s < 120 else f"{s // 60} min" if s < 7200 else f"{s // 3600} h"
