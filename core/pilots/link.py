"""One connected pilot as the harvester sees it: the batch job that holds a node for us, and
the requests the transport sends it. Replies are read by the hub's one reader thread
(core/pilots/conduit.py) and handed to the request that waits for them."""
from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from .wire import Wire


class PilotGone(RuntimeError):
    """The pilot ended (or is ending) before it answered."""


@dataclass(eq=False)
class PilotLink:
    """One connected pilot: the batch job that holds `node` for us."""
    job: str
    node: str
    pid: int
    wire: Wire
    since: float                                   # wall clock of its hello
    leaving: bool = False                          # it said SIGTERM; it is stopping its workers
    signalled_at: Optional[float] = None           # the pilot's wall clock when the signal came
    closed: threading.Event = field(default_factory=threading.Event)
    workers: list[dict] = field(default_factory=list)   # a redialing pilot's workers (`adoptable`)
    _waiting: dict = field(default_factory=dict)   # request id -> [Event, reply]
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: "itertools.count" = field(default_factory=itertools.count)

    @property
    def gone(self) -> bool:
        return self.leaving or self.closed.is_set()

    def hang_up(self) -> None:
        """End the connection from any thread; the hub's reader sees its end and reports the
        leave (only that thread closes the socket: a descriptor closed under a selector could be
        reused by the next connection while still registered)."""
        self.wire.shutdown()

    def request(self, op: str, timeout: float, **fields) -> dict:
        """Send a request and wait for its reply. PilotGone if the pilot ends first (or does not
        take the request within the wire's send timeout: it is then cut off, as gone),
        TimeoutError if it does not answer in time."""
        slot: list = [threading.Event(), None]
        with self._lock:
            rid = next(self._ids)
            self._waiting[rid] = slot
        try:
            if self.closed.is_set() or not self.wire.send({"op": op, "id": rid, **fields}):
                raise PilotGone(f"the pilot on {self.node} has ended")
            deadline = time.monotonic() + timeout
            while not slot[0].wait(0.05):
                if self.closed.is_set():
                    raise PilotGone(f"the pilot on {self.node} has ended")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the pilot on {self.node} did not answer {op} within {timeout:g} s")
            return slot[1]
        finally:
            with self._lock:
                self._waiting.pop(rid, None)

    def answer(self, msg: dict) -> None:
        """A reply came (on the reader thread): wake the request that waits for it."""
        with self._lock:
            slot = self._waiting.get(msg.get("re"))
        if slot is not None:
            slot[1] = msg
            slot[0].set()
