"""Small jobs and a started controller on the simulated dispatcher, at a fixed start time."""
from __future__ import annotations

from core.clock import SimClock
from core.controller import Controller, ControllerConfig
from core.dispatchers.simulated import SimulatedDispatcher
from core.model import Curve, Event, EventKind, Job
from core.timeutil import parse_iso

T0 = parse_iso("2021-02-10T00:00:00Z")


def job(jid: str, lo=1, hi=4, total=1e6, curve=((1, 2, 4), (100.0, 190.0, 350.0)), submit=T0, prio=1.0) -> Job:
    c = Curve(*curve)
    return Job(jid, lo, hi, total, c, 18.0, 12.0, prio, submit, true_curve=c)


def controller(nodes, config=None, store=None, t=T0):
    clock = SimClock(t)
    ctl = Controller(SimulatedDispatcher(), clock, config or ControllerConfig(), store, nodes)
    ctl.start(nodes)
    return ctl, clock


def churn(ctl: Controller, clock: SimClock, nodes, steps: int) -> None:
    """`steps` decisions 10 s apart, each a node leaving and coming back: history to store."""
    for t in range(1, steps + 1):
        clock.advance_to(T0 + 10 * t)
        node = nodes[t % len(nodes)]
        ctl.step([Event(clock.now(), EventKind.NODE_LEAVE, node=node),
                  Event(clock.now(), EventKind.NODE_JOIN, node=node)])
