"""When a harvested node reaches the controller: joins are held back until the burst of pilots
they came with has connected, so a cold start of thousands of nodes is one decision, while a
node freed alone in steady state joins as soon as its own pilot is in."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Collection, Optional, Sequence

from ..model import Event, EventKind
from .settings import PilotSettings

#: held joins go at the latest this many pilot connect timeouts after the first of their burst came
JOIN_CAP_TIMEOUTS = 2


@dataclass
class JoinHold:
    """Joins wait for the rest of their burst, and reach the controller together.

    A burst is the pilots sent for one lot of free nodes: one poll's submissions, and the next
    poll's as long as the previous one left free nodes it wanted (the batch, the rate), so a cold
    start of thousands of nodes over many polls is one burst. Handed over as they come, every
    join would be a decision: the first job grows once per pilot or round, and once its pause
    has run out the last few nodes no longer repay a regroup of all it holds (on 128 nodes a job
    stayed on 112 for minutes). So a join waits until no pilot of its burst is starting (sent,
    not connected, not given up: a pilot counts as starting for the pilot connect timeout at
    most, and one whose node was taken is cancelled at the next squeue), never past `cap_s`
    after the first held join of its burst. A quiet gap is no sign that a burst is over (on 2
    loaded cores the last 16 of 128 pilots came more than 10 s after the others), and other
    bursts are none of its business: on a whole machine some pilot is always starting, and a
    join held for all of them waited up to the cap (hello → allocation p99 27 s at 10,624
    nodes). Leaves never wait, and a node that leaves while its join waits never joins."""

    cap_s: float = JOIN_CAP_TIMEOUTS * PilotSettings.pending_timeout_s
    held: list[tuple[Event, int]] = field(default_factory=list)     # (join, its burst), in order
    since: dict[int, float] = field(default_factory=dict)           # burst -> its first held join (monotonic)

    def pass_on(self, events: Sequence[Event], now: float, starting: Collection[int],
                burst_of: Callable[[str], Optional[int]]) -> list[Event]:
        """What goes to the controller now of `events` and the joins held before. `starting`:
        the bursts with a pilot starting or about to be sent; `burst_of(node)`: the burst of the
        pilot that holds `node` (None: none known, e.g. an adopted pilot: it is not held)."""
        out: list[Event] = []
        for ev in events:
            if ev.kind is EventKind.NODE_JOIN:
                burst = burst_of(ev.node)
                if burst is not None:
                    self.held.append((ev, burst))
                    self.since.setdefault(burst, now)
                    continue
            elif ev.kind is EventKind.NODE_LEAVE:
                self.held = [(j, b) for j, b in self.held if j.node != ev.node]
            out.append(ev)
        done = {b for b, t in self.since.items() if b not in starting or now - t >= self.cap_s}
        if done:
            out = [j for j, b in self.held if b in done] + out
            self.held = [(j, b) for j, b in self.held if b not in done]
        waiting = {b for _, b in self.held}
        self.since = {b: t for b, t in self.since.items() if b in waiting}
        return out
