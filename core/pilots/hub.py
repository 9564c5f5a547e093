"""The harvester's end of its pilots' connections: a TLS listener that each pilot job dials once
and keeps open. It authenticates pilots by the harvester's token (sent inside TLS, to a
certificate the pilot pins), tells the node source when a pilot holds a node (hello) and when
it lets go (`leaving` on SIGTERM, or its connection ends), and carries the transport's requests
to the pilot on a node and their replies.

Until its hello a connection waits in the lobby (core/pilots/lobby.py: one thread for all, a
deadline each, a cap on connections). A pilot is then read by the conduit (core/pilots/conduit.py:
one thread for all pilots, a whole machine's worth); callbacks run on that thread and must be
quick. A hello is refused unless its job id is a batch scheduler's job id and its node is held
by no other live pilot: a second pilot for a node never displaces the first.
"""
from __future__ import annotations

import hmac
import logging
import re
import resource
import socket
import threading
import time
from typing import Callable, Optional

from .base import batch_job_id
from .conduit import Conduit
from .link import PilotGone, PilotLink
from .lobby import Lobby
from .stats import PilotStats
from .tls import server_context
from .wire import HELLO, LEAVING, SEND_TIMEOUT_S, Wire

__all__ = ["PilotGone", "PilotHub", "PilotLink", "valid_worker"]
log = logging.getLogger(__name__)
HELLO_TIMEOUT_S = 10.0          # from accept to a complete hello: TLS handshake and hello line
MAX_CONNECTIONS = 4 * 64 + 64   # PilotSettings.hub_connection_cap for 64 pilots
#: connections the kernel queues for accept (clamped to net.core.somaxconn): a connect flood
#: that overflows the queue makes a pilot's SYN be dropped, ~1 s per retransmission (at 1024, a
#: flood of 2,000 sockets cost pilots 1-3 retransmissions; tests/test_slurm_hub_abuse.py)
BACKLOG = 4096
#: descriptors kept for everything else the harvester opens (store, web clients, commands)
SPARE_FDS = 256
#: a node name as a pilot may give it (SLURMD_NODENAME or the host name)
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


MAX_WORKERS = 1024               # workers a redialing pilot may list (one per GPU of its node)
WORKER_FIELDS = {"pid": int, "token": str, "log": str, "job": str, "key": str, "inc": int}


def valid_worker(w: object) -> bool:
    """One entry of a redialing pilot's `workers`: its process and whose worker it is."""
    return (isinstance(w, dict) and all(isinstance(w.get(k), t) and not isinstance(w.get(k), bool)
                                        for k, t in WORKER_FIELDS.items())
            and all(len(w[k]) <= 4096 for k in ("token", "log", "job", "key")))


def descriptors_for(connections: int) -> int:
    """Raise this process's open-file limit towards `connections` plus a spare (up to the hard
    limit) and return how many connections fit in it: a whole machine's pilots need more
    descriptors than a login shell's default 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = connections + SPARE_FDS
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= want:
        return connections
    fit = max(1, soft - SPARE_FDS)
    log.warning("the pilot hub can keep %d connection(s) open, not %d: this process may open %d files "
                "(raise the hard limit, e.g. LimitNOFILE=%d in its systemd unit)", fit, connections, soft, want)
    return fit


class PilotHub:
    """Listens on `host:port` (0: any free port) with TLS; pilots pin `fingerprint`. `on_hello(link)`,
    `on_leave(link, why)` are called on the hub's one reader thread (quick: no command, no
    waiting); on_leave once per link, on `leaving` or at the end of the connection, whichever
    comes first. At most `max_connections` connections at once (fewer if this process cannot
    open that many files), pilots and connections still in their hello together."""

    def __init__(self, token: str, on_hello: Callable[[PilotLink], None],
                 on_leave: Callable[[PilotLink, str], None], host: str = "127.0.0.1", port: int = 0,
                 max_connections: int = MAX_CONNECTIONS, hello_timeout_s: float = HELLO_TIMEOUT_S,
                 send_timeout_s: float = SEND_TIMEOUT_S,
                 identity: Optional[tuple[str, str]] = None, stats: Optional[PilotStats] = None) -> None:
        """`identity`: the certificate and key (PEM) to show pilots; a fresh one if None.
        `stats`: where connections and vacate times are counted (a private one if None)."""
        self.stats = stats if stats is not None else PilotStats()
        self.token = token
        self.on_hello = on_hello
        self.on_leave = on_leave
        ctx, self.fingerprint = server_context(identity)
        self.max_connections = descriptors_for(max_connections)
        self._server = socket.create_server((host, port), backlog=BACKLOG)
        self._server.setblocking(False)
        self.address = self._server.getsockname()[:2]
        self._links: dict[str, PilotLink] = {}        # node -> its current pilot
        self._by_job: dict[str, PilotLink] = {}
        self._lock = threading.Lock()
        self._closing = False
        self._serving = 0                              # admitted connections still open
        self._conduit = Conduit(self._started, self._message, self._ended)
        self._lobby = Lobby(self._server, ctx, self._admit, lambda: self._serving, self.max_connections,
                            hello_timeout_s, send_timeout_s)

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
    def _admit(self, wire: Wire, hello: Optional[dict]) -> None:
        """A hello came (on the lobby's thread): register the pilot and hand it to the conduit,
        or close the connection."""
        why = self._refusal(hello)
        link = None
        if why is None:
            assert hello is not None
            link = PilotLink(hello["job"], hello["node"], hello.get("pid") or 0, wire, time.time(),
                             workers=list(hello.get("workers") or []))
            why = self._register(link)
        if why is not None or link is None:
            if link is None and why in ("no hello", "a wrong token"):
                self._lobby.closed[why] += 1       # the lobby sums these up: no log flood
            else:
                log.warning("refused a pilot connection: %s", why)
            wire.close()
            return
        self._conduit.add(link)

    def _refusal(self, hello: Optional[dict]) -> Optional[str]:
        """Why this hello is refused (None: it is not). The token first: nothing else is said
        to a connection without it."""
        if not isinstance(hello, dict) or hello.get("op") != HELLO or not isinstance(hello.get("token"), str):
            return "no hello"
        if not hmac.compare_digest(hello["token"].encode(), self.token.encode()):
            return "a wrong token"
        if not batch_job_id(hello.get("job")):
            return f"job id {str(hello.get('job'))[:40]!r} is not a batch job id"
        node = hello.get("node")
        if not isinstance(node, str) or not NODE_NAME.fullmatch(node):
            return f"{str(node)[:40]!r} is not a node name"
        pid = hello.get("pid", 0)
        if isinstance(pid, bool) or not isinstance(pid, int) or pid < 0:
            return f"pid {str(pid)[:20]!r} is not a process id"
        workers = hello.get("workers", [])
        if not isinstance(workers, list) or len(workers) > MAX_WORKERS or not all(map(valid_worker, workers)):
            return "its list of running workers is malformed"
        return None

    def _register(self, link: PilotLink) -> Optional[str]:
        """Make `link` the node's pilot, unless another open connection holds the node or the
        job id (then nothing changes: the holder stays)."""
        with self._lock:
            if self._closing:
                return "the hub is closing"
            for holder in (self._links.get(link.node), self._by_job.get(link.job)):
                if holder is not None and not holder.closed.is_set():
                    return (f"pilot {link.job} on {link.node}: {holder.node} is held by the live "
                            f"pilot {holder.job}")
            self._links[link.node] = link
            self._by_job[link.job] = link
            self._serving += 1
        self.stats.connected(+1)
        return None

    def _unregister(self, link: PilotLink) -> None:
        with self._lock:
            if self._links.get(link.node) is link:
                del self._links[link.node]
            if self._by_job.get(link.job) is link:
                del self._by_job[link.job]
            self._serving -= 1
        self.stats.connected(-1)

    # ---- on the conduit's thread -----------------------------------------------------------------
    def _started(self, link: PilotLink) -> None:
        self.on_hello(link)

    def _message(self, link: PilotLink, msg: dict) -> None:
        if msg.get("op") == LEAVING and not link.leaving:
            at = msg.get("at")
            link.signalled_at = float(at) if isinstance(at, (int, float)) else None
            link.leaving = True
            self.on_leave(link, f"pilot {link.job} preempted ({msg.get('reason') or 'SIGTERM'})")
        elif "re" in msg:
            link.answer(msg)

    def _ended(self, link: PilotLink) -> None:
        self._unregister(link)
        if link.leaving and link.signalled_at is not None:
            self.stats.vacated(time.time() - link.signalled_at)
        if not link.leaving:
            self.on_leave(link, f"pilot {link.job} lost its connection")

    def close(self) -> None:
        """Stop listening and close every connection (pilots then stop their workers and exit)."""
        with self._lock:
            self._closing = True
        self._lobby.close()
        self._server.close()
        self._conduit.close()
