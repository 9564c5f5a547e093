"""The pilot: the batch script of every pilot job. It holds one node for the harvester and is the
only way the harvester uses that node, so whatever Slurm does to the pilot happens to the work.

  1. It connects to the harvester's hub (address, certificate fingerprint and token from its
     environment), checks the hub's TLS certificate against the fingerprint (any other: it says
     nothing and exits) and says hello: the harvester now counts the node as harvested.
  2. It starts, watches and stops the training job's worker processes on request (a local
     transport inside the pilot: the workers are the pilot's children, part of the Slurm job),
     one per rank of its node, each with the job's SLURM_* and the GPUs Slurm bound to the
     pilot (CUDA_VISIBLE_DEVICES and the like: DEVICE_ENV).
     Each worker is SIGKILLed by the kernel if the pilot dies first (PR_SET_PDEATHSIG), so Slurm,
     which tracks a job's processes by parentage, can never lose one.
  3. On SIGTERM (Slurm preempts the pilot, or its time limit is up) it tells the hub `leaving`
     before anything else, stops its workers (SIGTERM, SIGKILL after the grace) and exits, which
     gives the node back. If the hub goes away it does the same without the message.

It imports only the standard library and the local transport: it starts in tens of milliseconds.
Its signals are blocked until the hello is out, so that a `leaving` always follows the hello.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from typing import Optional

from ..transports.base import DEVICE_ENV, Handle, NodeSpec, StartError
from ..transports.local import LocalTransport
from .wire import (ALIVE, ENV_GRACE, ENV_HUB, ENV_HUB_SHA256, ENV_TOKEN, HELLO, KILL, LEAVING, START,
                   STOP, TAIL, Wire, WrongCertificate, dial)

CONNECT_TRIES_S = 10.0
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} pilot: {msg}", flush=True)


class Pilot:
    def __init__(self, wire: Wire, node: str, job: str, grace_s: float) -> None:
        self.wire = wire
        self.node = NodeSpec(node)
        self.job = job
        self.grace_s = grace_s
        self.transport = LocalTransport(die_with_parent=True, inherit_prefixes=("SLURM_",), inherit=DEVICE_ENV)
        self.handles: dict[tuple[int, str], Handle] = {}
        self.lock = threading.Lock()
        self.leaving = threading.Event()
        self.done = threading.Event()

    # ---- requests from the hub (the reader thread; it also starts every worker, so that the
    # workers' parent-death signal fires when the pilot's connection, and the pilot, are gone)
    def serve(self) -> None:
        try:
            while True:
                msg = self.wire.recv()
                if msg is None:
                    if not self.leaving.is_set():
                        log("the harvester went away")
                    return
                op, rid = msg.get("op"), msg.get("id")
                if op in (STOP, KILL):
                    threading.Thread(target=self._reply, args=(op, rid, msg), daemon=True).start()
                else:
                    self._reply(op, rid, msg)
        finally:
            self.done.set()

    def _reply(self, op: Optional[str], rid, msg: dict) -> None:
        try:
            body = self._handle(op, msg)
        except StartError as e:
            body = {"ok": False, "error": "start", "message": e.message}
        except (ValueError, TypeError, KeyError) as e:
            body = {"ok": False, "error": "value", "message": str(e)}
        self.wire.send({"re": rid, **body})

    def _handle(self, op: Optional[str], msg: dict) -> dict:
        if op == START:
            if self.leaving.is_set():
                return {"ok": False, "error": "leaving", "message": f"{self.node.name} is being given back"}
            h = self.transport.start(self.node, msg["argv"], msg["env"], msg.get("workdir", ""), msg["log"])
            with self.lock:
                self.handles[(h.pid, h.token)] = h
            return {"ok": True, "pid": h.pid, "token": h.token}
        handles = [self._handle_of(d) for d in msg.get("handles", [msg.get("handle")]) if d]
        if op == ALIVE:
            alive = self.transport.alive_many(handles)
            return {"ok": True, "alive": [bool(alive.get(h)) for h in handles]}
        if op == STOP:
            res = self.transport.stop_many(handles, float(msg.get("grace", self.grace_s)))
            self._forget(handles)
            return {"ok": True, "results": [res.get(h, "gone") for h in handles]}
        if op == KILL:
            for h in handles:
                self.transport.kill(h)
            self._forget(handles)
            return {"ok": True}
        if op == TAIL:
            return {"ok": True, "lines": self.transport.tail(handles[0], int(msg.get("lines", 20)))}
        raise ValueError(f"unknown request {op!r}")

    def _handle_of(self, d: dict) -> Handle:
        key = (int(d["pid"]), str(d["token"]))
        with self.lock:
            h = self.handles.get(key)
        return h or Handle(self.node, key[0], key[1], str(d.get("log", "")), 0.0)

    def _forget(self, handles: list[Handle]) -> None:
        with self.lock:
            for h in handles:
                self.handles.pop((h.pid, h.token), None)

    # ---- the end ------------------------------------------------------------------------------
    def on_signal(self, signum: int, _frame) -> None:
        """First thing on SIGTERM: tell the harvester (its leave goes before anything else)."""
        if not self.leaving.is_set():
            self.leaving.set()
            self.wire.send({"op": LEAVING, "reason": signal.Signals(signum).name, "at": time.time()})
        self.done.set()

    def finish(self) -> None:
        t0 = time.monotonic()
        with self.lock:
            handles = list(self.handles.values())
        if handles:
            res = self.transport.stop_many(handles, self.grace_s)
            log(f"stopped {len(handles)} worker(s) in {time.monotonic() - t0:.2f} s: "
                f"{sorted(set(res.values()))}")
        self.wire.close()


def connect(hub: str, sha256: str, timeout_s: float = CONNECT_TRIES_S) -> Wire:
    """The hub's connection, TLS done and its certificate checked; tried again for `timeout_s`
    while the hub cannot be reached (WrongCertificate at once: never retried)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return dial(hub, sha256, max(1.0, min(5.0, deadline - time.monotonic())))
        except WrongCertificate:
            raise
        except OSError:                 # ssl.SSLError included: a handshake cut short
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main() -> int:
    hub, sha256, token = (os.environ.get(k, "") for k in (ENV_HUB, ENV_HUB_SHA256, ENV_TOKEN))
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    job = os.environ.get("SLURM_JOB_ID", "")
    if not hub or not sha256 or not token:
        log(f"{ENV_HUB}, {ENV_HUB_SHA256} and {ENV_TOKEN} must be set (the harvester submits pilots with them)")
        return 2
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        grace = float(os.environ.get(ENV_GRACE, "0"))
        wire = connect(hub, sha256)
    except WrongCertificate as e:
        log(f"refusing to talk to {hub}: {e}")
        return 1
    except (OSError, ValueError) as e:
        log(f"cannot reach the harvester at {hub}: {e}")
        return 1
    pilot = Pilot(wire, node, job, grace)
    for sig in SIGNALS:
        signal.signal(sig, pilot.on_signal)
    sent = wire.send({"op": HELLO, "token": token, "job": job, "node": node, "pid": os.getpid()})
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)     # a signal that came meanwhile: now
    if not sent:
        log("the harvester closed the connection")
        return 1
    log(f"job {job} holds {node} for the harvester at {hub}")
    reader = threading.Thread(target=pilot.serve, name="pilot-serve", daemon=True)
    reader.start()
    while not pilot.done.wait(1.0):
        pass
    pilot.finish()
    log("leaving: " + ("SIGTERM" if pilot.leaving.is_set() else "the harvester is gone"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
