"""The hub's reader: one thread and one selector for every connected pilot, however many (a
whole machine's worth: 10,624 pilots cost two threads, not ten thousand). It welcomes a pilot
the lobby let in, reads what each pilot says and hands every message to the hub on this one
thread, in order, so a pilot's hello is always reported before its leave. Sends stay with the
threads that make them (Wire.send has its own deadline); only this thread closes a pilot's
socket."""
from __future__ import annotations

import json
import logging
import selectors
import socket
import threading
from collections import deque
from typing import Callable

from .link import PilotLink
from .wire import CHUNK, MAX_LINE, WELCOME

log = logging.getLogger(__name__)


class Conduit:
    """Reads every link `add`ed until its connection ends. `started(link)` runs once a link is
    welcomed, `message(link, msg)` for each message, `ended(link)` once at its end (EOF, a
    broken stream, garbage, `hang_up`, or `close`): all on this thread, so they must be quick."""

    def __init__(self, started: Callable[[PilotLink], None], message: Callable[[PilotLink, dict], None],
                 ended: Callable[[PilotLink], None]) -> None:
        self.started, self.message, self.ended = started, message, ended
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._new: deque[PilotLink] = deque()
        self._closing = False
        self.thread = threading.Thread(target=self._run, name="pilot-links", daemon=True)
        self.thread.start()

    def add(self, link: PilotLink) -> None:
        """Take over `link` (from any thread); after `close`, it ends at once."""
        self._new.append(link)
        self._poke()

    def close(self) -> None:
        """End every link (each reported as `ended`) and stop the thread."""
        self._closing = True
        self._poke()
        self.thread.join(10)

    def _poke(self) -> None:
        try:
            self._wake_w.send(b"x", socket.MSG_DONTWAIT)
        except OSError:                      # full: a wake-up is pending anyway; closed: done
            pass

    # ---- the loop ----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._closing:
                for key, _ in self._sel.select(1.0):
                    if key.data is None:
                        self._drain_wake()
                    else:
                        self._guarded(self._read, key.data)
                while self._new and not self._closing:
                    self._guarded(self._start, self._new.popleft())
        except Exception:            # a bug here would deafen the hub to every pilot: say so
            log.exception("the pilot hub stopped reading its pilots")
        finally:
            links = [k.data for k in self._sel.get_map().values() if k.data is not None] + list(self._new)
            self._new.clear()
            for link in links:
                self._guarded(self._end, link)
            self._sel.close()
            self._wake_r.close()
            self._wake_w.close()

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _guarded(self, step: Callable[[PilotLink], None], link: PilotLink) -> None:
        try:
            step(link)
        except Exception:              # that pilot's connection is lost, not the others'
            log.exception("pilot %s on %s: its connection failed", link.job, link.node)
            self._end(link)

    def _start(self, link: PilotLink) -> None:
        welcomed = link.wire.send({"op": WELCOME})
        self._sel.register(link.wire.sock, selectors.EVENT_READ, link)
        self.started(link)                # a hello is reported before its leave, always
        if not welcomed:
            self._end(link)
            return
        self._lines(link)                 # what came with the hello, before any more is read

    def _read(self, link: PilotLink) -> None:
        try:
            data = link.wire.sock.recv(CHUNK, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        link.wire.feed(data)
        self._lines(link)

    def _lines(self, link: PilotLink) -> None:
        """Hand over every complete message received; end the link at its EOF or on garbage."""
        try:
            while (line := link.wire.take_line(MAX_LINE)) is not None:
                msg = json.loads(line)
                if not isinstance(msg, dict):
                    raise ValueError("not a JSON object")
                self.message(link, msg)
                if link.closed.is_set():
                    return
        except (OSError, ValueError):       # ssl.SSLError is an OSError: a broken stream
            self._end(link)
            return
        if link.wire.eof:
            self._end(link)

    def _end(self, link: PilotLink) -> None:
        if link.closed.is_set():
            return
        link.closed.set()
        try:
            self._sel.unregister(link.wire.sock)
        except (KeyError, ValueError):
            pass
        link.wire.close()
        self.ended(link)
