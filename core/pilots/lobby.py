"""Connections to the hub that have not yet shown they are pilots. One thread accepts them and
runs all their TLS handshakes and hello lines at once (a selector), each against one deadline
for the whole of it, so an idle or slow connection costs a socket and a few KB, never a thread.
Connections are capped; at the cap a new one takes the place of one still waiting for its hello,
or is closed at once if none is waiting. The one that gives way is one stuck at its stage of
the hello (nothing yet; its ClientHello answered; TLS done) for a second or more, the longest
stuck first; else the one that got least far, the longest there first. A pilot goes through the
stages in a round trip or two, so a flood of bare connects, however fast, only displaces its
own kind, and connections that finish TLS and then sit there are displaced once stuck: under
plain FIFO, any pilot whose handshake took longer than the flood needed to cycle the cap was cut
off on every try. To displace a pilot now, an attacker has to get as far as it did, again and
again: about a TLS handshake per connection of the cap every second. The listener outlives a
lack of file descriptors (EMFILE, ENFILE) or memory: it pauses briefly and goes on."""
from __future__ import annotations

import errno
import json
import logging
import selectors
import socket
import ssl
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional

from .wire import CHUNK, Wire, tune

log = logging.getLogger(__name__)
MAX_HELLO = 4096                # bytes of the hello line (a token, a job id, a node name)
PAUSE_S = (0.05, 1.0)           # after a failed accept: first and longest pause
REPORT_S = 10.0                 # at most one summary of closed connections this often
#: accept() failures that say "not now" (no descriptor, no memory) rather than "closed"
SCARCE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: how far a connection got towards its hello; at the cap the lowest stage gives way first
NOTHING, ANSWERED, SHAKEN = 0, 1, 2     # no ClientHello yet; the hub answered it; TLS done
STUCK_S = 1.0                   # ... unless one has been at its stage this long (a pilot: a round trip)


@dataclass(eq=False)
class _Guest:
    sock: socket.socket
    wire: Wire
    deadline: float               # time.monotonic() by which its hello must be in
    since: float                  # time.monotonic() when it reached its stage
    stage: int = NOTHING


class Lobby:
    """Accepts on `server` (a listening socket) until `close`. A connection that sends a hello
    line within `hello_timeout_s` of its accept is handed to `admit(wire, hello)` (on this
    thread: it must be quick) with its socket blocking and sends timing out after
    `send_timeout_s`; `hello` is None if the line was not a JSON object. `established()` counts
    the connections admitted and still open."""

    def __init__(self, server: socket.socket, ctx: ssl.SSLContext, admit: Callable[[Wire, Optional[dict]], None],
                 established: Callable[[], int], max_connections: int, hello_timeout_s: float,
                 send_timeout_s: float) -> None:
        self.server, self.ctx, self.admit, self.established = server, ctx, admit, established
        self.max_connections = max_connections
        self.hello_timeout_s = hello_timeout_s
        self.send_timeout_s = send_timeout_s          # once admitted (before: only what fits at once)
        self.closed = Counter()                     # why connections were closed before a hello
        self._guests: dict[_Guest, None] = {}       # oldest first (their deadlines in order)
        #: the same guests by stage, each in the order they reached it: who gives way at the cap
        self._stages: tuple[dict[_Guest, None], ...] = ({}, {}, {})
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._sel.register(server, selectors.EVENT_READ)
        self._paused_until = 0.0
        self._pause_s = PAUSE_S[0]
        self._reported = time.monotonic()
        self._closing = False
        self.thread = threading.Thread(target=self._run, name="pilot-hub", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self._closing = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self.thread.join(5)

    # ---- the loop ----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._closing:
                for key, _ in self._sel.select(self._timeout()):
                    if key.fileobj is self.server:
                        self._accept()
                    elif key.data is not None:
                        self._advance_or_drop(key.data)
                self._expire()
        except Exception:           # a bug here would lock every pilot out: say so loudly
            log.exception("the pilot hub stopped accepting connections")
        finally:
            for guest in list(self._guests):
                self._drop(guest, "")
            self._sel.close()
            self._wake_r.close()
            self._wake_w.close()

    def _timeout(self) -> float:
        now = time.monotonic()
        until = [now + 1.0]
        if self._guests:
            until.append(next(iter(self._guests)).deadline)
        if self._paused_until:
            until.append(self._paused_until)
        return max(0.0, min(until) - now)

    def _expire(self) -> None:
        now = time.monotonic()
        if self._paused_until and now >= self._paused_until:
            self._paused_until = 0.0
            self._sel.register(self.server, selectors.EVENT_READ)
        while self._guests and next(iter(self._guests)).deadline <= now:
            self._drop(next(iter(self._guests)), "no hello in time")
        if self.closed and now - self._reported >= REPORT_S:
            log.warning("closed pilot hub connection(s) without a valid hello in the last %.0f s: %s",
                        now - self._reported, ", ".join(f"{n} {why}" for why, n in self.closed.items()))
            self.closed.clear()
            self._reported = now

    # ---- accepting ---------------------------------------------------------------------------
    def _accept(self) -> None:
        for _ in range(64):                       # then let the others have a turn
            try:
                sock, _ = self.server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if self._closing:
                    return
                if e.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                self._pause(e)
                return
            self._pause_s = PAUSE_S[0]
            self._greet(sock)

    def _pause(self, e: OSError) -> None:
        """Stop accepting for a moment (the listener stays readable: no busy loop)."""
        (log.warning if self._pause_s == PAUSE_S[0] else log.debug)(
            "cannot accept pilot connections (%s); trying again in %g s", e.strerror or e, self._pause_s)
        self._sel.unregister(self.server)
        self._paused_until = time.monotonic() + self._pause_s
        self._pause_s = min(self._pause_s * 2, PAUSE_S[1])

    def _greet(self, sock: socket.socket) -> None:
        if len(self._guests) + self.established() >= self.max_connections:
            if not self._guests:
                self.closed["refused at the cap"] += 1
                sock.close()
                return
            self._drop(self._evictee(), "evicted at the cap")
        try:
            sock.setblocking(False)
            tune(sock)
            now = time.monotonic()
            guest = _Guest(sock, Wire(sock, self.ctx, server_side=True, send_timeout_s=0.0),
                           now + self.hello_timeout_s, now)
            self._sel.register(sock, selectors.EVENT_READ, guest)
        except (OSError, ValueError) as e:
            log.warning("could not take a pilot connection: %s", e)
            sock.close()
            return
        self._guests[guest] = None
        self._stages[NOTHING][guest] = None
        self._advance_or_drop(guest)      # a pilot's ClientHello is usually there already

    def _evictee(self) -> _Guest:
        """Who gives way at the cap (there are guests): see the module's docstring."""
        firsts = [next(iter(s)) for s in self._stages if s]
        stuck = min(firsts, key=lambda g: g.since)
        return stuck if time.monotonic() - stuck.since >= STUCK_S else firsts[0]

    # ---- the hello ---------------------------------------------------------------------------
    def _advance_or_drop(self, guest: _Guest) -> None:
        try:
            self._advance(guest)
        except Exception:                       # that connection is lost, not the listener
            log.exception("a pilot hub connection failed")
            self._drop(guest, "failed")

    def _advance(self, guest: _Guest) -> None:
        try:
            data = guest.sock.recv(CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(guest, "closed by the peer")
            return
        try:
            guest.wire.feed(data)
            if guest.stage != SHAKEN:
                self._reach(guest, SHAKEN if guest.wire.handshake_step() else
                            ANSWERED if guest.wire.sent else NOTHING)
                if guest.stage != SHAKEN:
                    return
            line = guest.wire.take_line(MAX_HELLO)
        except (OSError, ValueError):           # a failed handshake, a hello too long, ...
            self._drop(guest, "bad TLS or hello")
            return
        if line is None:
            return
        self._sel.unregister(guest.sock)
        del self._guests[guest]
        del self._stages[guest.stage][guest]
        try:
            hello = json.loads(line)
        except ValueError:
            hello = None
        guest.sock.setblocking(True)
        guest.wire.send_timeout_s = self.send_timeout_s
        self.admit(guest.wire, hello if isinstance(hello, dict) else None)

    def _reach(self, guest: _Guest, stage: int) -> None:
        """`guest` got as far as `stage`: it now gives way after all who got less far."""
        if stage != guest.stage:
            del self._stages[guest.stage][guest]
            guest.stage, guest.since = stage, time.monotonic()
            self._stages[stage][guest] = None

    def _drop(self, guest: _Guest, why: str) -> None:
        try:
            self._sel.unregister(guest.sock)
        except (KeyError, ValueError):
            pass
        self._guests.pop(guest, None)
        self._stages[guest.stage].pop(guest, None)
        guest.wire.close()
        if why:
            self.closed[why] += 1
