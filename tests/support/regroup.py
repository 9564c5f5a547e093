"""A RegroupMachine driven by hand: the worker events a real job would send it, at moments passed
by hand (tests/test_regroup.py, and the hostile-output tests that feed it bad numbers)."""
from __future__ import annotations

from typing import Optional

from core.runtime import protocol as P
from core.runtime.regroup import Instant, RegroupMachine, Send

GB, TOTAL = 64, 64 * 1000
WALL0 = 1_700_000_000.0


def at(t: float) -> Instant:
    """The moment t seconds into the test, on both clocks."""
    return Instant(WALL0 + t, t)


def ops(cmds: list[Send]) -> list[tuple]:
    """Commands as (op, node[, gen, rank, world]) tuples, in order."""
    out = []
    for c in cmds:
        if c.op == P.OP_RUN:
            out.append((c.op, c.node, c.msg["gen"], c.msg["rank"], c.msg["world"]))
        elif c.op == P.OP_STOP:
            out.append((c.op, c.node, c.msg["gen"]))
        else:
            out.append((c.op, c.node))
    return out


class Job:
    """A RegroupMachine and the worker events a real job would send it."""

    def __init__(self, **kw) -> None:
        self.m = RegroupMachine(GB, TOTAL, **kw)
        self.inc: dict[str, int] = {}

    def start(self, node: str, t: float = 0.0) -> list[Send]:
        self.inc[node], cmds = self.m.worker_started(node, at(t))
        return cmds

    def ev(self, node: str, kind: str, t: float, inc: Optional[int] = None, **fields) -> list[Send]:
        msg = {"ev": kind, "node": node, "inc": self.inc[node] if inc is None else inc,
               "pid": 100, **fields}
        return self.m.worker_event(msg, at(t))

    def warm(self, *nodes: str, t: float = 0.0, step: int = 0) -> None:
        for n in nodes:
            if n not in self.inc:
                self.start(n, t)
            self.ev(n, P.EV_HELLO, t, host="h")
            self.ev(n, P.EV_READY, t, step=step)

    def stopped(self, gen: int, *nodes: str, t: float, step: int,
                reason: str = P.STOP_ASKED) -> list[Send]:
        out = []
        for n in nodes:
            out += self.ev(n, P.EV_STOPPED, t, gen=gen, step=step, reason=reason, checksum="c")
        return out

    def running(self, nodes: list[str], t: float = 0.0, step: int = 0) -> int:
        """Bring up a first generation on `nodes` (warm, regroup, synced, first step)."""
        self.warm(*nodes, t=t, step=step)
        gen = self.m.regroup(nodes, at(t))
        assert [c.op for c in self.m.tick(at(t))] == [P.OP_RUN] * len(nodes)
        for rank, n in enumerate(nodes):
            self.ev(n, P.EV_SYNCED, t, gen=gen, rank=rank, step=step, checksum="c")
        self.ev(nodes[0], P.EV_FIRST_STEP, t, gen=gen, step=step + 1)
        return gen
