"""waitress, hardened against clients that hold connections without finishing a request (issue
47, row 3): a cap on the connections one client address holds, and a deadline for a request's
headers. waitress's own channel_timeout only closes idle connections, so a client trickling a
header line every few seconds kept each of its connections open for good; 500 of them took
every slot of --connection-limit and the dashboard stopped answering."""
from __future__ import annotations

import logging
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import MultiSocketServer, TcpWSGIServer
from waitress.task import ThreadedTaskDispatcher

from .webconfig import WebConfig

log = logging.getLogger(__name__)

#: how often the header deadlines are checked: a late request is closed within this of its deadline
#: (plus one turn of waitress's loop, which wakes at least once a second)
CHECK_INTERVAL_S = 0.5
#: at most one log line of each kind this often; a burst is summed up in one line once it stops
REPORT_INTERVAL_S = 10.0


@dataclass
class Tally:
    """Connections refused (or closed) by address, not yet logged: one line sums up a burst once a
    check finds no more, and a steady stream every REPORT_INTERVAL_S, never more often."""
    counts: Counter = field(default_factory=Counter)
    checked: int = 0                      # the total at the previous check
    since: float = 0.0                    # when the oldest count not yet logged came
    logged: float = -REPORT_INTERVAL_S

    def add(self, host: str, now: float) -> None:
        if not self.counts:
            self.since = now
        self.counts[host] += 1

    def due(self, now: float) -> Optional[Counter]:
        """The counts to log now (and forget), or None."""
        total = self.counts.total()
        quiet, self.checked = total == self.checked, total
        if not total or now < self.logged + REPORT_INTERVAL_S:
            return None
        if not quiet and now < self.since + REPORT_INTERVAL_S:
            return None
        counts, self.counts, self.checked, self.logged = self.counts, Counter(), 0, now
        return counts


def top(counts: Counter, n: int = 3) -> str:
    """`127.0.0.2: 436, ...`: the few addresses with the most, for a log line of bounded length."""
    shown = ", ".join(f"{host}: {k}" for host, k in counts.most_common(n))
    return shown + (f" and {len(counts) - n} more" if len(counts) > n else "")


@dataclass
class ConnectionGuard:
    """The open connections of each client address, and the refusals and closings not yet
    logged; shared by every listening socket of one server, so the cap holds across them."""
    per_address: int                      # 0: no cap
    header_timeout_s: float
    open: Counter = field(default_factory=Counter)
    refused: Tally = field(default_factory=Tally)
    expired: Tally = field(default_factory=Tally)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def admit(self, host: str) -> bool:
        """Whether a new connection from `host` may open; a refusal is counted for the log."""
        with self.lock:
            if self.per_address and self.open[host] >= self.per_address:
                self.refused.add(host, time.monotonic())
                return False
            self.open[host] += 1
            return True

    def release(self, host: str) -> None:
        with self.lock:
            self.open[host] -= 1
            if self.open[host] <= 0:
                del self.open[host]

    def expire(self, channels: Iterable[GuardedChannel], now: float) -> None:
        """Close every channel whose request's headers are still incomplete past the deadline.
        A channel the server does not read from (its earlier requests in service, their answers
        still being sent) is not the client's delay: its clock restarts then."""
        for ch in channels:
            if ch.headers_since is None or ch.will_close:
                continue
            if not ch.readable():
                ch.headers_since = now
            elif now - ch.headers_since > self.header_timeout_s:
                ch.will_close = True          # the loop closes it on its next turn (writable() says so)
                ch.headers_since = None
                with self.lock:
                    self.expired.add(ch.addr[0], now)

    def report(self, now: float) -> None:
        """Log the refusals and the closings that are due, one line of each kind."""
        with self.lock:
            refused, expired = self.refused.due(now), self.expired.due(now)
        if refused:
            log.warning("refused %d new connection(s) from address(es) already holding %d (the per-address "
                        "limit): %s", refused.total(), self.per_address, top(refused))
        if expired:
            log.warning("closed %d connection(s) whose request headers were not complete within %g s: %s",
                        expired.total(), self.header_timeout_s, top(expired))


class GuardedChannel(HTTPChannel):
    """waitress's channel, counted against its address and timing each request's headers from
    the first byte read of that request: trickled bytes do not reset this clock."""
    headers_since: Optional[float] = None
    timed_request: Any = None
    counted: bool = False

    def __init__(self, server: GuardedServer, sock: socket.socket, addr: Any, adj: Adjustments,
                 map: Optional[dict] = None):
        super().__init__(server, sock, addr, adj, map=map)
        self.counted = True                   # the server admitted (and counted) this address

    def received(self, data: bytes) -> bool:
        done = super().received(data)
        req = self.request
        if req is None or req.headers_finished:
            self.headers_since = self.timed_request = None
        elif req is not self.timed_request:
            self.timed_request, self.headers_since = req, time.monotonic()
        return done

    def del_channel(self, map: Optional[dict] = None) -> None:
        super().del_channel(map)
        if self.counted:
            self.counted = False
            self.server.guard.release(self.addr[0])


class GuardedServer(TcpWSGIServer):
    """waitress's TCP server that refuses, at once, a connection from an address already holding
    its cap, and closes the channels past their header deadline."""
    channel_class = GuardedChannel
    next_check = 0.0

    def __init__(self, application: Any, guard: ConnectionGuard, **kw: Any):
        self.guard = guard
        super().__init__(application, **kw)

    def readable(self) -> bool:
        now = time.monotonic()
        if now >= self.next_check:
            self.next_check = now + CHECK_INTERVAL_S
            self.guard.expire(list(self.active_channels.values()), now)
            self.guard.report(now)
        return super().readable()

    def handle_accept(self) -> None:
        try:
            accepted = self.accept()
            if accepted is None:
                return
            conn, addr = accepted
            self.set_socket_options(conn)
        except OSError:                       # as waitress: a peer gone before accept() ends nothing
            if self.adj.log_socket_errors:
                self.logger.warning("server accept() threw an exception", exc_info=True)
            return
        addr = self.fix_addr(addr)
        if not self.guard.admit(addr[0]):
            conn.close()
            return
        try:
            self.channel_class(self, conn, addr, self.adj, map=self._map)
        except BaseException:                 # not counted: the channel never opened
            self.guard.release(addr[0])
            raise


def create_server(application: Any, config: WebConfig, **kw: Any) -> GuardedServer | MultiSocketServer:
    """waitress.create_server for TCP listening addresses, with GuardedServer for each and one
    ConnectionGuard among them; `kw` are waitress's adjustments (listen, ident, ...)."""
    adj = Adjustments(**{**config.waitress(), **kw})
    sock_map: dict = {}
    dispatcher = ThreadedTaskDispatcher()
    dispatcher.set_thread_count(adj.threads)
    guard = ConnectionGuard(config.per_address_limit, config.header_timeout_s)
    servers = [GuardedServer(application, guard, map=sock_map, dispatcher=dispatcher, adj=adj, sockinfo=info)
               for info in adj.listen]
    if len(servers) == 1:
        return servers[0]
    return MultiSocketServer(sock_map, adj, [(s.effective_host, s.effective_port) for s in servers],
                             dispatcher, servers[-1].log_info)


def serve(application: Any, config: WebConfig, **kw: Any) -> None:
    """waitress.serve with create_server above: runs until interrupted."""
    server = create_server(application, config, **kw)
    server.print_listen("Serving on http://{}:{}")
    server.run()

