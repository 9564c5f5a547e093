"""The simulated pilot fleet of bench.scale: thousands of pilots in one process, one asyncio task
each, every one with its own TCP connection to the harvester's real hub, speaking the real
protocol (core/pilots/wire.py's Wire: JSON lines inside TLS on memory BIOs) as
core/pilots/pilot_job.py does, without its worker processes:

  dial the hub from HARVEST_PILOT_HUB (the environment the harvester gave sbatch), finish TLS and
  pin the certificate by HARVEST_PILOT_HUB_SHA256 (any other: hang up, say nothing), say hello
  {op, token, job, node, pid, workers: []}, take the welcome, answer every request with a reply
  {re: id, ...} shaped as the real pilot's (no worker runs: start hands back a made-up handle);
  when Slurm preempts or cancels it, send leaving {reason, at: time.time()} and hang up.

Each pilot keeps when it said hello, was welcomed and said leaving (wall clock, the harvester's
store uses the same), which bench.scale matches against the allocations the harvester recorded."""
from __future__ import annotations

import asyncio
import hmac
import json
import socket
import time
from dataclasses import dataclass
from typing import Callable, Optional

from core.pilots.wire import (ALIVE, CHUNK, GIVE, HELLO, KILL, LEAVING, MAX_LINE, START, STOP, TAIL, WELCOME,
                              Wire, client_context, fingerprint, tune)

from .scale_feed import PilotJob

#: a pid for the hello: the fleet's own (all pilots run in it)
FAKE_PID_BASE = 100_000


@dataclass
class PilotRecord:
    """One pilot's life, wall clock (time.time())."""
    job: str
    node: str
    started: float                      # the simulated Slurm started it
    hello_at: Optional[float] = None    # its hello was sent
    welcome_at: Optional[float] = None  # the hub's welcome came
    leave_at: Optional[float] = None    # it said leaving (preempted or cancelled)
    ended_at: Optional[float] = None
    how: str = ""                       # preempted, cancelled, closed by the hub, error: ...


@dataclass(eq=False)
class _Pilot:
    rec: PilotRecord
    env: dict[str, str]
    wire: Optional[Wire] = None
    stop_why: str = ""
    counted: bool = False


def reply(msg: dict) -> dict:
    """What core/pilots/pilot_job.py answers, with no worker process behind it."""
    op, rid = msg.get("op"), msg.get("id")
    handles = [h for h in msg.get("handles", [msg.get("handle")]) if h]
    if op == START:
        body: dict = {"ok": True, "pid": FAKE_PID_BASE + (rid or 0), "token": f"sim-{rid}"}
    elif op == ALIVE:
        body = {"ok": True, "alive": [True] * len(handles)}
    elif op == STOP:
        body = {"ok": True, "results": ["stopped"] * len(handles)}
    elif op in (KILL, GIVE):
        body = {"ok": True}
    elif op == TAIL:
        body = {"ok": True, "lines": []}
    else:
        body = {"ok": False, "error": "value", "message": f"unknown request {op!r}"}
    return {"re": rid, **body}


class Fleet:
    """Starts and stops simulated pilots on the running event loop; `on_end(job id)` is told when a
    pilot ended by itself (the hub hung up, or it could not connect)."""

    def __init__(self, on_end: Callable[[str], None]) -> None:
        self.on_end = on_end
        self.ctx = client_context()
        self.records: list[PilotRecord] = []
        self.connected = 0               # welcomed and not yet ended
        self.peak = 0
        self._live: dict[str, _Pilot] = {}
        self._tasks: set[asyncio.Task] = set()

    def start(self, job: PilotJob) -> None:
        rec = PilotRecord(job.id, job.node, time.time())
        self.records.append(rec)
        p = _Pilot(rec, job.env)
        self._live[job.id] = p
        task = asyncio.get_running_loop().create_task(self._run(p))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def stop(self, job: str, why: str) -> None:
        """Slurm signalled the pilot: it says leaving (once connected) and hangs up."""
        p = self._live.get(job)
        if p is None or p.stop_why:
            return
        p.stop_why = why
        if p.wire is not None:
            self._leave(p)

    def _leave(self, p: _Pilot) -> None:
        assert p.wire is not None
        p.rec.leave_at = time.time()
        p.wire.send({"op": LEAVING, "reason": "SIGTERM", "at": p.rec.leave_at})
        p.wire.shutdown()

    async def _run(self, p: _Pilot) -> None:
        loop = asyncio.get_running_loop()
        host, _, port = p.env["HARVEST_PILOT_HUB"].rpartition(":")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, (host.strip("[]"), int(port)))
            tune(sock)
            wire = Wire(sock, self.ctx, server_side=False)
            while not wire.handshake_step():
                if not wire.feed(await loop.sock_recv(sock, CHUNK)):
                    raise ConnectionError("the hub hung up during the TLS handshake")
            got = fingerprint(wire.tls.getpeercert(binary_form=True) or b"")
            want = p.env["HARVEST_PILOT_HUB_SHA256"].replace(":", "").strip().lower()
            if not hmac.compare_digest(got.encode(), want.encode()):
                raise ConnectionError(f"the hub's certificate has SHA-256 {got}, not {want}")
            p.rec.hello_at = time.time()
            wire.send({"op": HELLO, "token": p.env["HARVEST_PILOT_TOKEN"], "job": p.rec.job,
                       "node": p.rec.node, "pid": FAKE_PID_BASE + int(p.rec.job), "workers": []})
            p.wire = wire
            if p.stop_why:                  # signalled while it connected: leaving follows the hello
                self._leave(p)
            while (msg := await self._next(wire, sock)) is not None:
                if msg.get("op") == WELCOME:
                    p.rec.welcome_at = time.time()
                    p.counted = True
                    self.connected += 1
                    self.peak = max(self.peak, self.connected)
                elif "id" in msg:
                    wire.send(reply(msg))
            p.rec.how = p.stop_why or "closed by the hub"
        except (OSError, ValueError) as e:
            p.rec.how = p.stop_why or f"error: {e}"
        finally:
            p.rec.ended_at = time.time()
            if p.counted:
                self.connected -= 1
            sock.close()
            self._live.pop(p.rec.job, None)
            if not p.stop_why:
                self.on_end(p.rec.job)

    @staticmethod
    async def _next(wire: Wire, sock: socket.socket) -> Optional[dict]:
        loop = asyncio.get_running_loop()
        while True:
            line = wire.take_line(MAX_LINE)
            if line is not None:
                msg = json.loads(line)
                return msg if isinstance(msg, dict) else None
            data = await loop.sock_recv(sock, CHUNK)
            if not data:
                return None
            wire.feed(data)

    def stop_all(self) -> None:
        for job in list(self._live):
            self.stop(job, "the bench ended")

    @property
    def live(self) -> int:
        return len(self._live)
