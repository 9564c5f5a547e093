"""A fixed list of nodes (a small lab's machines, or local processes): all idle unless their
owner takes one back. `reclaim`/`release` are how an operator, or a test, plays the main
scheduler; the controller treats them exactly like a batch scheduler's leave and join."""
from __future__ import annotations

import threading
from typing import Sequence

from ..model import LEFT_RECLAIMED, Event, EventKind
from .base import LiveNodeSource


class StaticSource(LiveNodeSource):
    name = "static"
    operated_by_hand = True

    def __init__(self, names: Sequence[str]) -> None:
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")
        self._names = list(names)
        self._idle = set(names)
        self._pending: list[Event] = []
        self._held_out: dict[str, str] = {}     # node -> why it is not used (a failed check)
        self._lock = threading.Lock()

    def node_names(self) -> list[str]:
        return list(self._names)

    def initial_idle(self) -> list[str]:
        return [n for n in self._names if n in self._idle]

    def _change(self, node: str, idle: bool, now: float) -> None:
        if node not in self._names:
            raise KeyError(node)
        with self._lock:
            if (node in self._idle) == idle:
                return
            (self._idle.add if idle else self._idle.discard)(node)
            self._pending.append(Event(now, EventKind.NODE_JOIN if idle else EventKind.NODE_LEAVE, node=node,
                                       cause="" if idle else LEFT_RECLAIMED))

    def hold_out(self, node: str, why: str) -> None:
        """Never offer `node` (it failed its check, `why`) until staff release it."""
        if node not in self._names:
            raise KeyError(node)
        with self._lock:
            self._held_out[node] = why
            self._idle.discard(node)

    def node_states(self) -> dict[str, str]:
        with self._lock:
            return {n: f"not used: {why}" for n, why in self._held_out.items()}

    def reclaim(self, node: str, now: float) -> None:
        """The owner wants `node` back: the harvester must get off it at once."""
        self._change(node, False, now)

    def release(self, node: str, now: float) -> None:
        """The owner gives `node` again (a node held out after a failed check: staff vouch for it)."""
        with self._lock:
            self._held_out.pop(node, None)
        self._change(node, True, now)

    def poll(self, now: float) -> list[Event]:
        with self._lock:
            out, self._pending = self._pending, []
        return out
