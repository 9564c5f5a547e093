"""What a pilot job and the harvester say to each other, shared by both ends: one JSON object
per line over one TCP connection that the pilot opens to the harvester's hub and keeps for its
whole life (so either end sees the other vanish at once, as EOF).

Pilot -> hub:  hello {token, job, node, pid} first; then leaving {reason, at} (SIGTERM: the batch
               scheduler wants the node back), exited {pid, status} (a worker ended), and
               replies {re: id, ...}.
Hub -> pilot:  requests {op, id, ...}: start {argv, env, workdir, log}, alive {handles},
               stop {handles, grace}, kill {handle}, tail {handle, lines}.

The pilot is started by Slurm with the hub's address and the harvester's token in its
environment (never on a command line).
"""
from __future__ import annotations

import json
import socket
import threading
from typing import Optional

ENV_HUB = "HARVEST_PILOT_HUB"           # host:port of the harvester's hub
ENV_TOKEN = "HARVEST_PILOT_TOKEN"       # proves a pilot was started by this harvester
ENV_GRACE = "HARVEST_PILOT_GRACE"       # seconds a worker gets between SIGTERM and SIGKILL
MAX_LINE = 1 << 20                      # one message; an argv + env fits many times over

HELLO, LEAVING, EXITED = "hello", "leaving", "exited"
START, ALIVE, STOP, KILL, TAIL = "start", "alive", "stop", "kill", "tail"


class Wire:
    """Line-delimited JSON on a connected socket: `send` from any thread, `recv` from one."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._file = sock.makefile("rb")
        self._send_lock = threading.Lock()

    def send(self, msg: dict) -> bool:
        """False once the connection is gone (the caller learns it from recv too)."""
        data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        try:
            with self._send_lock:
                self.sock.sendall(data)
            return True
        except OSError:
            return False

    def recv(self) -> Optional[dict]:
        """The next message; None at EOF, on a broken connection or on garbage."""
        try:
            line = self._file.readline(MAX_LINE + 1)
        except (OSError, ValueError):
            return None
        if not line or len(line) > MAX_LINE:
            return None
        try:
            msg = json.loads(line)
        except ValueError:
            return None
        return msg if isinstance(msg, dict) else None

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._file.close()
        except OSError:
            pass
        self.sock.close()


def tune(sock: socket.socket, idle_s: int = 10, interval_s: int = 5, count: int = 3) -> None:
    """No Nagle delay on these small messages; keepalives notice a peer whose machine died
    without closing the connection (~25 s)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, val in (("TCP_KEEPIDLE", idle_s), ("TCP_KEEPINTVL", interval_s), ("TCP_KEEPCNT", count)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), val)
