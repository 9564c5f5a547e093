"""Workers inside the pilot jobs (Slurm, PBS) that hold their nodes: `start` asks the pilot on the
node (over its connection to the harvester's hub) to start the worker as its own child, so the
worker is part of the pilot's batch job and ends with it. Nothing runs on a node without a
pilot.

A handle's token is `<pilot job id>/<process start time>`: a request for a worker whose pilot
has ended is answered here ("gone": Slurm ended the job's processes, and the pilot stops its
workers before it exits), never sent to the next pilot on the same node.

A job that runs as its owner's account (`--run-as`, `start_as`) sends the account and the
launcher to the pilot, which runs the worker behind it (core/pilots/runas.py), and `give_dir`
asks the pilot to make the job's checkpoint directory the account's.
"""
from __future__ import annotations

import time
from typing import Mapping, Optional, Sequence

from .hub import PilotHub
from .link import PilotGone, PilotLink
from .wire import ALIVE, GIVE, KILL, START, STOP, TAIL
from ..transports.base import STOP_GONE, Handle, NodeSpec, StartError, Transport, TransportError, check_start_args
from ..transports.local import tail_file
from ..transports.runas import UNIX_NAME, RunAs


class PilotTransport(Transport):
    name = "pilot"

    def __init__(self, hub: PilotHub, timeout_s: float = 15.0) -> None:
        self.hub = hub
        self.timeout_s = timeout_s

    def start(self, node: NodeSpec, argv: Sequence[str], env: Mapping[str, str], workdir: str,
              log_path: str) -> Handle:
        return self._start(node, argv, env, workdir, log_path, {})

    def start_as(self, node: NodeSpec, launcher: RunAs, user: str, argv: Sequence[str], env: Mapping[str, str],
                 workdir: str, log_path: str) -> Handle:
        """The pilot applies the launcher: `{env}` must also name its Slurm binding (SLURM_*, the
        GPUs Slurm bound to it), which only it knows (core/pilots/runas.py)."""
        if not UNIX_NAME.match(user):
            raise ValueError(f"{user!r} is not a Unix account name")
        return self._start(node, argv, env, workdir, log_path, {"user": user, "launcher": list(launcher.words)})

    def _start(self, node: NodeSpec, argv: Sequence[str], env: Mapping[str, str], workdir: str, log_path: str,
               run_as: dict) -> Handle:
        argv, env = list(argv), dict(env)
        check_start_args(node, argv, env, workdir, log_path)
        extra = {"run_as": run_as} if run_as else {}
        reply = self._checked(node, START, argv=argv, env=env, workdir=workdir, log=log_path, **extra)
        return Handle(node, int(reply["pid"]), f"{reply['job']}/{reply['token']}", log_path, time.time())

    def give_dir(self, node: NodeSpec, path: str, user: str) -> None:
        """The pilot on `node` makes `path` (on the file system the nodes share with the
        harvester, like the workers' logs) `user`'s, mode 0700."""
        self._checked(node, GIVE, path=path, user=user)

    def _checked(self, node: NodeSpec, op: str, **fields) -> dict:
        """A request to the pilot holding `node`, its refusal raised (StartError: the job's
        problem; TransportError: the node's); the reply with the pilot's job id as `job`."""
        link = self.hub.link(node.name)
        if link is None:
            raise TransportError(node.name, "no pilot job holds this node")
        reply = self._ask(link, op, **fields)
        if not reply.get("ok"):
            message = str(reply.get("message", ""))
            if reply.get("error") == "start":
                raise StartError(node.name, message)
            if reply.get("error") == "value":
                raise ValueError(f"{node.name}: {message}")
            raise TransportError(node.name, message)
        return {**reply, "job": link.job}

    def adoptable(self, node: NodeSpec, job: str, key: str, inc: int) -> Optional[Handle]:
        """A worker its pilot listed when it redialed this (restarted) harvester."""
        link = self.hub.link(node.name)
        if link is None:
            return None
        for w in link.workers:
            if (w["job"], w["key"], w["inc"]) == (job, key, inc):
                return Handle(node, w["pid"], f"{link.job}/{w['token']}", w["log"], link.since)
        return None

    def taken_back(self, node: str, handle: Optional[Handle] = None) -> bool:
        if handle is not None:
            link = self._link(handle)
            return link is None or link.gone
        return self.hub.link(node) is None

    # ---- per node ----------------------------------------------------------------------------
    def _alive_node(self, handles: list[Handle]) -> dict[Handle, bool]:
        out = {}
        for link, hs in self._by_pilot(handles):
            if link is None:
                out.update({h: False for h in hs})
                continue
            try:
                reply = self._ask(link, ALIVE, handles=[self._wire(h) for h in hs])
                if not reply.get("ok"):
                    raise TransportError(link.node, str(reply.get("message", "alive refused")))
                out.update(zip(hs, (bool(a) for a in reply["alive"])))
            except PilotGone:
                out.update({h: False for h in hs})
        return out

    def _stop_node(self, handles: list[Handle], grace_s: float) -> dict[Handle, str]:
        out = {}
        for link, hs in self._by_pilot(handles):
            if link is None:
                out.update({h: STOP_GONE for h in hs})
                continue
            try:
                reply = self._ask(link, STOP, timeout=grace_s + self.timeout_s,
                                  handles=[self._wire(h) for h in hs], grace=grace_s)
                if not reply.get("ok"):
                    raise TransportError(link.node, str(reply.get("message", "stop refused")))
                out.update(zip(hs, (str(r) for r in reply["results"])))
            except PilotGone:
                out.update({h: STOP_GONE for h in hs})
        return out

    def kill(self, handle: Handle) -> None:
        link = self._link(handle)
        if link is None:
            return
        try:
            self._ask(link, KILL, handles=[self._wire(handle)])
        except PilotGone:
            pass

    def tail(self, handle: Handle, lines: int = 20) -> list[str]:
        link = self._link(handle)
        if link is not None:
            try:
                return list(self._ask(link, TAIL, handle=self._wire(handle), lines=lines).get("lines", []))
            except (PilotGone, TransportError):
                pass
        return tail_file(handle.log_path, lines)     # the log on a shared file system, or here

    # ---- mechanism ---------------------------------------------------------------------------
    def _ask(self, link: PilotLink, op: str, timeout: Optional[float] = None, **fields) -> dict:
        try:
            return link.request(op, timeout or self.timeout_s, **fields)
        except TimeoutError as e:
            raise TransportError(link.node, str(e)) from e

    def _link(self, handle: Handle) -> Optional[PilotLink]:
        link = self.hub.link_of_job(handle.token.partition("/")[0])
        return None if link is None or link.closed.is_set() else link

    def _by_pilot(self, handles: list[Handle]) -> list[tuple[Optional[PilotLink], list[Handle]]]:
        groups: dict[str, list[Handle]] = {}
        for h in handles:
            groups.setdefault(h.token.partition("/")[0], []).append(h)
        return [(self._link(hs[0]), hs) for hs in groups.values()]

    @staticmethod
    def _wire(h: Handle) -> dict:
        return {"pid": h.pid, "token": h.token.partition("/")[2], "log": h.log_path}
