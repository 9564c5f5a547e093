"""The harvester's end of its pilots' connections: a TCP listener that each pilot job dials once
and keeps open. It authenticates pilots by the harvester's token, tells the node source when a
pilot holds a node (hello) and when it lets go (`leaving` on SIGTERM, or its connection ends),
and carries the transport's requests to the pilot on a node and their replies.

One thread per connection (a few hundred pilots at most); callbacks run on those threads and
must be quick.
"""
from __future__ import annotations

import hmac
import itertools
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from .wire import HELLO, LEAVING, Wire, tune

log = logging.getLogger(__name__)
HELLO_TIMEOUT_S = 10.0


class PilotGone(RuntimeError):
    """The pilot ended (or is ending) before it answered."""


@dataclass
class PilotLink:
    """One connected pilot: the Slurm job that holds `node` for us."""
    job: str
    node: str
    pid: int
    wire: Wire
    since: float                                   # wall clock of its hello
    leaving: bool = False                          # it said SIGTERM; it is stopping its workers
    signalled_at: Optional[float] = None           # the pilot's wall clock when the signal came
    closed: threading.Event = field(default_factory=threading.Event)
    _waiting: dict = field(default_factory=dict)   # request id -> [Event, reply]
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: "itertools.count" = field(default_factory=itertools.count)

    @property
    def gone(self) -> bool:
        return self.leaving or self.closed.is_set()

    def request(self, op: str, timeout: float, **fields) -> dict:
        """Send a request and wait for its reply. PilotGone if the pilot ends first, TimeoutError
        if it does not answer in time."""
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

    def _answer(self, msg: dict) -> None:
        with self._lock:
            slot = self._waiting.get(msg.get("re"))
        if slot is not None:
            slot[1] = msg
            slot[0].set()


class PilotHub:
    """Listens on `host:port` (0: any free port). `on_hello(link)`, `on_leave(link, why)` are
    called from connection threads; on_leave once per link, on `leaving` or at the end of the
    connection, whichever comes first."""

    def __init__(self, token: str, on_hello: Callable[[PilotLink], None],
                 on_leave: Callable[[PilotLink, str], None], host: str = "127.0.0.1", port: int = 0) -> None:
        self.token = token
        self.on_hello = on_hello
        self.on_leave = on_leave
        self._server = socket.create_server((host, port), backlog=256)
        self.address = self._server.getsockname()[:2]
        self._links: dict[str, PilotLink] = {}        # node -> its current pilot
        self._by_job: dict[str, PilotLink] = {}
        self._lock = threading.Lock()
        self._closing = False
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._accept_loop, name="pilot-hub", daemon=True)
        self._accept.start()

    # ---- reading -----------------------------------------------------------------------------
    def link(self, node: str) -> Optional[PilotLink]:
        """The pilot that holds `node` now (None if none does, or it is leaving)."""
        with self._lock:
            link = self._links.get(node)
        return link if link is not None and not link.gone else None

    def link_of_job(self, job: str) -> Optional[PilotLink]:
        with self._lock:
            return self._by_job.get(job)

    def links(self) -> list[PilotLink]:
        with self._lock:
            return [l for l in self._links.values() if not l.gone]

    # ---- connections -------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while True:
            try:
                sock, _ = self._server.accept()
            except OSError:
                return           # closed
            if self._closing:
                sock.close()
                return
            t = threading.Thread(target=self._serve, args=(sock,), name="pilot-link", daemon=True)
            with self._lock:
                self._threads = [x for x in self._threads if x.is_alive()] + [t]
            t.start()

    def _serve(self, sock: socket.socket) -> None:
        tune(sock)
        sock.settimeout(HELLO_TIMEOUT_S)
        wire = Wire(sock)
        hello = wire.recv()
        if not self._valid(hello):
            log.warning("refused a pilot connection without a valid hello")
            wire.close()
            return
        sock.settimeout(None)
        link = PilotLink(str(hello["job"]), str(hello["node"]), int(hello.get("pid") or 0), wire, time.time())
        with self._lock:
            if self._closing:
                wire.close()
                return
            self._links[link.node] = link
            self._by_job[link.job] = link
        self.on_hello(link)
        while True:
            msg = wire.recv()
            if msg is None:
                break
            if msg.get("op") == LEAVING and not link.leaving:
                at = msg.get("at")
                link.signalled_at = float(at) if isinstance(at, (int, float)) else None
                link.leaving = True
                self.on_leave(link, f"pilot {link.job} preempted ({msg.get('reason') or 'SIGTERM'})")
            elif "re" in msg:
                link._answer(msg)
        said_leaving = link.leaving
        link.closed.set()
        wire.close()
        with self._lock:
            if self._links.get(link.node) is link:
                del self._links[link.node]
            self._by_job.pop(link.job, None)
        if not said_leaving:
            self.on_leave(link, f"pilot {link.job} lost its connection")

    def _valid(self, hello: Optional[dict]) -> bool:
        return (isinstance(hello, dict) and hello.get("op") == HELLO and isinstance(hello.get("token"), str)
                and hmac.compare_digest(hello["token"].encode(), self.token.encode())
                and bool(hello.get("node")) and bool(hello.get("job")))

    def close(self) -> None:
        """Stop listening and close every connection (pilots then stop their workers and exit)."""
        with self._lock:
            self._closing = True
            links = list(self._by_job.values())
            threads = list(self._threads)
        try:
            self._server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._server.close()
        for link in links:
            link.wire.close()
        self._accept.join(5)
        for t in threads:
            t.join(5)
