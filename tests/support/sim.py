"""Small jobs and a started controller on the simulated dispatcher, at a fixed start time."""
from __future__ import annotations

from core.clock import SimClock
from core.controller import Controller
from core.controller_config import ControllerConfig
from core.dispatchers.simulated import SimulatedDispatcher
from core.model import Curve, Event, EventKind, Job
from core.timeutil import parse_iso

T0 = parse_iso("2021-02-10T00:00:00Z")


def job(jid: str, lo=1, hi=4, total=1e6, curve=((1, 2, 4), (100.0, 190.0, 350.0)), submit=T0, prio=1.0) -> Job:
    c = Curve(*curve)
    return Job(jid, lo, hi, total, c, 18.0, 12.0, prio, submit, true_curve=c)


#: a curve that makes two jobs on 16 nodes worth more than one, once a rescale is amortised over long enough
CONCAVE_16 = ((1, 2, 4, 8, 16), (100.0, 195.0, 370.0, 680.0, 1150.0))


def a_then_b(ctl: Controller, clock: SimClock, after: float, step=None) -> None:
    """A (up to 16 nodes, CONCAVE_16) starts alone; B, the same job, arrives `after` seconds later
    in a step of its own. `step` steps the controller (ctl.step unless a loop does it)."""
    step = step or ctl.step
    ctl.submit(job("A", hi=16, total=1e12, curve=CONCAVE_16))
    step()
    clock.advance_to(T0 + after)
    ctl.submit(job("B", hi=16, total=1e12, curve=CONCAVE_16, submit=T0 + after))
    step()


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
