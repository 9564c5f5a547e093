"""The pilot: the program of every pilot job, on Slurm and PBS alike (told here as on Slurm; PBS's
job is PBS_JOBID, its node comes in HARVEST_PILOT_NODE). It holds one node for the harvester and
is the only way the harvester uses that node, so whatever Slurm does to the pilot happens to the work.

  1. It connects to the harvester's hub (address, certificate fingerprint and token from its
     environment), checks the hub's TLS certificate against the fingerprint (any other: it says
     nothing and exits) and says hello: the harvester now counts the node as harvested.
  2. It starts, watches and stops the training job's worker processes on request (a local
     transport inside the pilot: the workers are the pilot's children, part of the Slurm job),
     one per rank of its node, each with the job's SLURM_* and the GPUs Slurm bound to the
     pilot (CUDA_VISIBLE_DEVICES and the like: DEVICE_ENV). A job that runs as its owner's
     account (`--run-as`) is started behind the site's launcher (sudo), with those variables
     named in its `{env}` (core/pilots/runas.py): sudo stays the pilot's child and its command
     in the pilot's cgroup, so the binding holds; the job's mark (HARVEST_WORKER, kept by the
     launcher) lets a stop find the command, which the launcher runs in a session of its own.
     Starting as another account, signalling its processes and giving it its checkpoint
     directory need a pilot that runs as root. The kernel's parent-death signal does not reach
     past sudo (a setuid exec clears it): a pilot killed outright leaves sudo to Slurm, whose
     end of the job signals it (reparented to slurmstepd), and sudo hands that to the worker
     (measured on 22.05 with proctrack/linuxproc: gone 0.23 s after the pilot's SIGKILL).
     Each worker is SIGKILLed by the kernel if the pilot dies first (PR_SET_PDEATHSIG), so Slurm,
     which tracks a job's processes by parentage, can never lose one. What a worker daemonises
     (setsid, a double fork) is found by its mark (HARVEST_WORKER, core/transports/cleanup.py)
     and ended with it: never a cgroup of ours, which would take it out of Slurm's. Slurm's own
     cleanup at the pilot's end does not find it under proctrack/linuxproc (measured on 22.05
     and 24.11: an orphan is reparented out of the job's tree, and nothing is killed once the
     batch script has exited); proctrack/cgroup would (not measured here).
  3. On SIGTERM (Slurm preempts the pilot, or its time limit is up) it tells the hub `leaving`
     before anything else, stops its workers (SIGTERM, SIGKILL after the grace) and exits, which
     gives the node back.
  4. If the hub goes away (the harvester crashed or is being restarted) it keeps its node and its
     workers, which train on, and redials with backoff for the orphan timeout; its new hello
     lists the workers still running, and the restarted harvester adopts them. No hub within
     the timeout: it stops its workers and exits as on SIGTERM, without the message.

It imports only the standard library and the local transport: it starts in tens of milliseconds.
Its signals are blocked until the hello is out, so that a `leaving` always follows the hello.
"""
from __future__ import annotations

import os
import random
import signal
import socket
import sys
import threading
import time
from typing import Optional

from ..transports.base import DEVICE_ENV, Handle, NodeSpec, StartError
from ..transports.cleanup import ENVIRON
from ..transports.local import LocalTransport
from .runas import launch_argv
from .wire import (ALIVE, ENV_GRACE, ENV_HUB, ENV_HUB_SHA256, ENV_NODE, ENV_ORPHAN, ENV_TOKEN, GIVE, HELLO, KILL, LEAVING,
                   SCHEDULER_PREFIXES,
                   START, STOP, TAIL, WELCOME, Wire, WrongCertificate, dial)

CONNECT_TRIES_S = 10.0
REDIAL_MAX_S = 2.0              # the longest wait between two redials of a lost hub
#: what a redialing pilot tells about each worker: whose it is (from the env it was started with)
WORKER_ENV = {"job": "HARVEST_JOB", "key": "HARVEST_NODE", "inc": "HARVEST_INCARNATION"}
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} pilot: {msg}", flush=True)


class Pilot:
    def __init__(self, wire: Wire, node: str, job: str, grace_s: float, *, hub: str = "",
                 sha256: str = "", token: str = "", orphan_s: float = 0.0) -> None:
        self.wire = wire
        self.node = NodeSpec(node)
        self.job = job
        self.grace_s = grace_s
        self.hub, self.sha256, self.token, self.orphan_s = hub, sha256, token, orphan_s
        self.transport = LocalTransport(die_with_parent=True, inherit_prefixes=SCHEDULER_PREFIXES, inherit=DEVICE_ENV,
                                        cleanup=ENVIRON)
        self.handles: dict[tuple[int, str], Handle] = {}
        self.owners: dict[tuple[int, str], dict] = {}    # whose worker each is (WORKER_ENV)
        self.welcomed = False         # the hub accepted the current connection's hello
        self.lost_at = time.monotonic()
        self.lock = threading.Lock()
        self.leaving = threading.Event()
        self.done = threading.Event()

    # ---- requests from the hub (the reader thread, for the pilot's whole life: it also starts
    # every worker, and a worker's parent-death signal fires when the thread that started it ends)
    def serve(self) -> None:
        try:
            while True:
                self._read()
                if self.leaving.is_set() or not self._redial():
                    return
        finally:
            self.done.set()

    def _read(self) -> None:
        """Answer the hub's requests until its connection ends."""
        wire = self.wire
        while (msg := wire.recv()) is not None:
            op, rid = msg.get("op"), msg.get("id")
            if op == WELCOME:
                self.welcomed = True
            elif op in (STOP, KILL):
                threading.Thread(target=self._reply, args=(op, rid, msg), daemon=True).start()
            else:
                self._reply(op, rid, msg)

    def hello(self) -> dict:
        return {"op": HELLO, "token": self.token, "job": self.job, "node": self.node.name,
                "pid": os.getpid(), "workers": self.running()}

    def running(self) -> list[dict]:
        """The workers still alive, with whose they are: what a restarted harvester adopts."""
        with self.lock:
            items = list(self.handles.items())
        alive = self.transport.alive_many([h for _, h in items]) if items else {}
        out = []
        for key, h in items:
            owner = self.owners.get(key)
            if alive.get(h) and owner is not None:
                out.append({"pid": h.pid, "token": h.token, "log": h.log_path, **owner})
        return out

    def _redial(self) -> bool:
        """The hub is gone: keep the node and the workers and dial it again with backoff until
        `orphan_s` has passed (True: connected, hello sent)."""
        if self.orphan_s <= 0:
            log("the harvester went away")
            return False
        if self.welcomed:
            self.lost_at = time.monotonic()           # else: refused, the clock runs on
        self.welcomed = False
        deadline = self.lost_at + self.orphan_s
        log(f"the harvester went away; keeping {len(self.handles)} worker(s) and redialing it for "
            f"{max(0.0, deadline - time.monotonic()):.0f} s")
        delay = 0.2
        while not self.leaving.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                log(f"no harvester within {self.orphan_s:g} s")
                return False
            try:
                wire = dial(self.hub, self.sha256, max(1.0, min(5.0, left)))
            except WrongCertificate as e:
                log(f"refusing to talk to {self.hub}: {e}")
                return False
            except OSError:
                wire = None
            if wire is not None and wire.send(self.hello()):
                break
            if wire is not None:
                wire.close()
            self.leaving.wait(min(delay * (0.75 + random.random() / 2), max(0.0, left)))
            delay = min(REDIAL_MAX_S, delay * 2)
        else:
            return False
        self.wire = wire
        if self.leaving.is_set():                 # SIGTERM came while redialing
            wire.send({"op": LEAVING, "reason": "SIGTERM", "at": time.time()})
        log(f"redialed the harvester at {self.hub}")
        return True

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
            env, argv = msg["env"], msg["argv"]
            if msg.get("run_as"):
                self._check_root(msg["run_as"])
                argv = launch_argv(msg["run_as"], argv, env)
            h = self.transport.start(self.node, argv, env, msg.get("workdir", ""), msg["log"])
            with self.lock:
                self.handles[(h.pid, h.token)] = h
                if all(v in env for v in WORKER_ENV.values()) and env[WORKER_ENV["inc"]].isdigit():
                    self.owners[(h.pid, h.token)] = {k: str(env[v]) if k != "inc" else int(env[v])
                                                     for k, v in WORKER_ENV.items()}
            return {"ok": True, "pid": h.pid, "token": h.token}
        if op == GIVE:
            self._check_root({"user": msg["user"]})
            self.transport.give_dir(self.node, str(msg["path"]), str(msg["user"]))
            return {"ok": True}
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

    def _check_root(self, run_as: dict) -> None:
        """A job run as another account needs a pilot that can give it its checkpoint directory
        and signal (and find, by its mark in /proc/PID/environ) every process it starts."""
        if os.geteuid() != 0:
            raise StartError(self.node.name, f"the job runs as {run_as.get('user')!r}, and this pilot runs as uid "
                                             f"{os.geteuid()}, not root: it could not stop that account's processes "
                                             "(submit the pilots as root to run jobs as their owners)")

    def _handle_of(self, d: dict) -> Handle:
        key = (int(d["pid"]), str(d["token"]))
        with self.lock:
            h = self.handles.get(key)
        return h or Handle(self.node, key[0], key[1], str(d.get("log", "")), 0.0)

    def _forget(self, handles: list[Handle]) -> None:
        with self.lock:
            for h in handles:
                self.handles.pop((h.pid, h.token), None)
                self.owners.pop((h.pid, h.token), None)

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
    node = os.environ.get(ENV_NODE) or os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    job = os.environ.get("SLURM_JOB_ID") or os.environ.get("PBS_JOBID", "")
    if not hub or not sha256 or not token:
        log(f"{ENV_HUB}, {ENV_HUB_SHA256} and {ENV_TOKEN} must be set (the harvester submits pilots with them)")
        return 2
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        grace = float(os.environ.get(ENV_GRACE, "0"))
        orphan = float(os.environ.get(ENV_ORPHAN, "0"))
        wire = connect(hub, sha256)
    except WrongCertificate as e:
        log(f"refusing to talk to {hub}: {e}")
        return 1
    except (OSError, ValueError) as e:
        log(f"cannot reach the harvester at {hub}: {e}")
        return 1
    pilot = Pilot(wire, node, job, grace, hub=hub, sha256=sha256, token=token, orphan_s=orphan)
    for sig in SIGNALS:
        signal.signal(sig, pilot.on_signal)
    sent = wire.send(pilot.hello())
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
    if pilot.leaving.is_set():
        leave_now()
    return 0


def leave_now() -> None:
    """Preempted, workers gone: exit without the interpreter's teardown (tens of milliseconds of
    finalizing threads, TLS and modules), since a main job waits for this process to end."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
