"""Nodes checked before they are trusted: over the node's own transport, that its working
folder and a job's interpreter exist there, what its own name resolves to, which interface
reaches the head, and that the head answers on a port from there.

A node with a problem is not offered to jobs (the cluster page and `/api/cluster` say why);
a node whose name resolves to loopback is fine, its interface towards the head is what its
ranks bind (GLOO_SOCKET_IFNAME), so no user has to set it. `python -m app check` runs the same.
"""
from __future__ import annotations

import json
import logging
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Optional, Sequence

from .transports.base import NodeSpec, Transport, TransportError

log = logging.getLogger(__name__)
MARK = "HVCHECK "
#: runs on the node with its python3 (standard library only): argv = workdir, interpreter, head, port
PROBE = r'''
import fcntl, json, os, shutil, socket, struct, sys
workdir, interp, head, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
out = {"name": socket.gethostname(), "address": None, "interface": None, "problems": []}
if workdir and not os.path.isdir(workdir):
    out["problems"].append("no working directory %r" % workdir)
if interp:
    base = workdir if workdir and os.path.isdir(workdir) else os.path.expanduser("~")
    path = shutil.which(interp) if os.sep not in interp else os.path.join(base, interp)
    if not path or not os.path.isfile(path):
        out["problems"].append("command not found: %r (looked %s)" % (interp, "on PATH" if os.sep not in interp else "in " + base))
    elif not os.access(path, os.X_OK):
        out["problems"].append("not executable: %r" % path)
try:
    out["address"] = socket.gethostbyname(out["name"])
except OSError:
    pass
if head:
    try:
        with socket.create_connection((head, port), 5) as s:
            mine = s.getsockname()[0]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as q:
            for _, name in socket.if_nameindex():
                try:
                    raw = fcntl.ioctl(q.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
                except OSError:
                    continue
                if socket.inet_ntoa(raw[20:24]) == mine:
                    out["interface"] = name
    except OSError as e:
        out["problems"].append("cannot reach the head at %s:%d from here: %s" % (head, port, e.strerror or e))
print("HVCHECK " + json.dumps(out))
'''


@dataclass
class NodeCheck:
    node: str
    problems: list[str] = field(default_factory=list)   # any: the node is not used
    name: str = ""                # the node's own host name
    address: Optional[str] = None  # what that name resolves to there
    interface: Optional[str] = None  # the interface that reaches the head (its ranks bind it)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def loopback_name(self) -> bool:
        return bool(self.address) and (self.address.startswith("127.") or self.address == "::1")

    def line(self) -> str:
        if self.problems:
            return "; ".join(self.problems)
        where = f"{self.name} is {self.address}" if self.address else f"{self.name} does not resolve"
        return f"ok ({where}" + (f"; ranks bind {self.interface}" if self.interface else "") + ")"


def check_nodes(transport: Transport, nodes: Sequence[NodeSpec], workdir: str = "", interpreter: str = "",
                head: str = "", listen: str = "", timeout_s: float = 20.0) -> dict[str, NodeCheck]:
    """Every node's check, in parallel. `head`: the address nodes dial (`--advertise`); a port
    is opened on `listen` (where the harvester binds) for the length of the check."""
    server = None
    port = 0
    stop = threading.Event()
    if head:
        try:
            server = socket.create_server((listen or head, 0))
        except OSError as e:        # not an address of this host (a NAT in front): no way back to test
            log.warning("cannot listen on %s to check the nodes' way back (%s): not checked", listen or head, e)
            head = ""
        else:
            port = server.getsockname()[1]
            threading.Thread(target=_accept, args=(server, stop), daemon=True, name="nodecheck").start()
    try:
        with ThreadPoolExecutor(max_workers=min(16, max(1, len(nodes)))) as pool:
            done = pool.map(lambda n: _check(transport, n, workdir, interpreter, head, port, timeout_s), nodes)
            return {c.node: c for c in done}
    finally:
        if server is not None:
            stop.set()
            server.close()


def _accept(server: socket.socket, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            conn, _ = server.accept()
        except OSError:
            return
        conn.close()


def _check(transport: Transport, node: NodeSpec, workdir: str, interpreter: str, head: str, port: int,
           timeout_s: float) -> NodeCheck:
    argv = ["python3", "-c", PROBE, workdir, interpreter, head, str(port)]
    try:
        rc, out, err = transport.run(node, argv, timeout_s)
    except TransportError as e:
        return NodeCheck(node.name, [f"cannot reach the node: {e.message}"])
    found = [line[len(MARK):] for line in out.splitlines() if line.startswith(MARK)]
    if not found:
        why = (err.strip().splitlines() or [f"exit status {rc}"])[-1]
        if rc == 127:
            why = "python3 is not on the node's PATH (the check and the jobs' scripts need a Python)"
        return NodeCheck(node.name, [f"the check did not run: {why}"])
    got = json.loads(found[-1])
    return NodeCheck(node.name, list(got.get("problems") or []), str(got.get("name") or ""), got.get("address"),
                     got.get("interface"))
