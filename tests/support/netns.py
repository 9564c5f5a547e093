"""A cluster of real hosts on this machine for tests: one Linux network namespace per node, so
that traffic between the harvester and its nodes crosses a network instead of one loopback.

    with NetnsCluster(3, workdir) as cluster:
        cluster.head                    # 10.231.X.1, the bridge's address: the head node (this namespace)
        cluster.nodes                   # {"node1": "10.231.X.11", ...}
        cluster.ssh_config              # `ssh -F` / SshTransport(config=...): Host node1..nodeN
        cluster.run("node1", ["ip", "-4", "addr"])     # inside node1's namespace
        cluster.write_inventory(path)   # "node1 node1" per line, for the harvester
        cluster.peers("node1")          # TCP peers seen in node1 (None: in this namespace)
        cluster.write_entry(path, program, "SLURMD_NODENAME")   # runs program in the node $VAR names

Layout: a bridge `hv<pid><k>-br` in the root namespace holds the head address; node i is the
namespace `hv<pid><k>-n<i>`, joined to the bridge by the veth pair `hv<pid><k>-h<i>` (root side) /
`eth0` (node side), with its own `lo` (so its 127.0.0.1 is its own) and its own sshd on
<address>:22 only. `<k>` is a letter per cluster of this process; the subnet 10.231.X.0/24 is
one no interface or route of this machine uses yet. Nodes get no default route: they reach the
bridge's subnet and nothing else.

Tear-down (also after a failed test) stops the sshds and the processes `popen` started, kills
by PID whatever else still runs in a node (`ip netns pids`), then removes every link, the bridge
and the namespaces, and checks that none is left. Every start first removes the leftovers of
an earlier run that crashed: names with this prefix whose PID is no longer alive.

Missing capabilities (no `ip`, not root, no network namespaces, a bridge or veth refused) fail
the test with the reason; they never skip. Only the standard library and iproute2's `ip`.

In a test module:  `from tests.support.netns import netns_cluster`  (tests/conftest.py does)
makes the module-scoped 3-node fixture available there.
"""
from __future__ import annotations

import ipaddress
import itertools
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator, Optional, Sequence

import pytest

from tests.support.sshd import DEAD, SshdServer, current_user, make_keys, start_node_sshd, write_client_config

PREFIX = "hv"
#: a name this module made: prefix, the PID of the test process, the cluster's letter, "-"
OURS = re.compile(rf"^{PREFIX}(\d+)[a-z]-")
SUBNETS = "10.231.{}.0/24"
HEAD_HOST, FIRST_NODE_HOST = 1, 11
IFNAMSIZ = 15  # the kernel's limit on interface names (16 with the NUL)
SSH_PORT = 22
DEAD_PORT = 9  # discard: nothing listens there on a node, so "node-dead" is refused at once
MAX_NODES = 99
NETNS_RUN_DIR = "/run/netns"  # where `ip netns add` binds each namespace (nsenter --net=<there>/NAME)
_clusters = itertools.count()


def _ip_binary() -> str:
    found = shutil.which("ip") or ("/usr/sbin/ip" if os.access("/usr/sbin/ip", os.X_OK) else None)
    if not found:
        pytest.fail("iproute2's `ip` is missing (apt-get install iproute2; `make test` installs it)",
                    pytrace=False)
    return found


def _ip(*args: str, what: str = "", check: bool = True) -> subprocess.CompletedProcess:
    """`ip ARGS`; with `check`, a failure fails the test with `what` and ip's own message."""
    r = subprocess.run([_ip_binary(), *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        pytest.fail(f"{what or 'ip failed'}: `ip {' '.join(args)}` exited with {r.returncode}: "
                    f"{r.stderr.strip() or r.stdout.strip()}", pytrace=False)
    return r


def require_netns() -> None:
    """Fail (never skip) with the reason when this machine cannot make the test hosts."""
    _ip_binary()
    if os.geteuid() != 0:
        pytest.fail(f"network namespaces, veths and bridges need root; running as uid {os.geteuid()}",
                    pytrace=False)
    if not os.path.exists("/proc/self/ns/net"):
        pytest.fail("this kernel has no network namespaces (/proc/self/ns/net is missing)", pytrace=False)


def namespaces() -> list[str]:
    """Names of this machine's named network namespaces (`ip netns list`)."""
    out = _ip("netns", "list", what="cannot list network namespaces").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def links() -> list[str]:
    """Names of the root namespace's network interfaces (a veth's `@peer` cut off)."""
    out = _ip("-o", "link", "show", what="cannot list links").stdout
    return [line.split(":", 2)[1].strip().split("@", 1)[0] for line in out.splitlines() if ":" in line]


def netns_pids(netns: str) -> list[int]:
    """PIDs of the processes whose network namespace is `netns` (`ip netns pids`)."""
    r = _ip("netns", "pids", netns, check=False)
    return [int(p) for p in r.stdout.split() if p.isdigit()] if r.returncode == 0 else []


def alive(pid: int) -> bool:
    """A process with this PID exists and is no zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def kill_pids(pids: Sequence[int], timeout: float = 5.0) -> None:
    """SIGKILL each PID and wait (up to `timeout`) until none is alive."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


def _remove(names_ns: Sequence[str], names_link: Sequence[str]) -> list[int]:
    """Kill every process in the namespaces, delete the links (a veth takes its peer along),
    then the namespaces. Returns the PIDs that had to be killed."""
    killed = [pid for ns in names_ns for pid in netns_pids(ns)]
    kill_pids(killed)
    present = set(links())
    for name in names_link:
        if name in present:
            _ip("link", "del", name, check=False)
    for ns in names_ns:
        _ip("netns", "del", ns, check=False)
    return killed


def cleanup_leftovers() -> list[str]:
    """Remove the namespaces and links an earlier run left when it crashed: names of this module
    whose PID is no longer alive (a live PID may be a parallel run: left alone). Processes in
    those namespaces are killed first. Returns the names removed."""
    def dead(name: str) -> bool:
        m = OURS.match(name)
        return bool(m) and int(m.group(1)) != os.getpid() and not os.path.exists(f"/proc/{m.group(1)}")
    stale_ns = [ns for ns in namespaces() if dead(ns)]
    stale_links = [link for link in links() if dead(link)]
    # host-side veths before their bridge, so the bridge goes last
    stale_links.sort(key=lambda name: name.endswith("-br"))
    _remove(stale_ns, stale_links)
    return stale_ns + stale_links


def _used_networks() -> list[ipaddress.IPv4Network]:
    out = _ip("-4", "-o", "addr", "show", what="cannot list addresses").stdout.split()
    out += _ip("-4", "route", "show", "table", "all", what="cannot list routes").stdout.split()
    nets = []
    for word in out:
        try:
            nets.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            continue
    return [n for n in nets if n.version == 4 and n.prefixlen > 0]


def free_subnet(seed: int) -> ipaddress.IPv4Network:
    """The first 10.231.X.0/24, X from `seed` on, that overlaps no address or route here."""
    used = _used_networks()
    for i in range(254):
        net = ipaddress.ip_network(SUBNETS.format((seed + i) % 254 + 1))
        if not any(net.overlaps(u) for u in used):
            return net
    pytest.fail("no free 10.231.X.0/24 for the test hosts: every one overlaps an address or route",
                pytrace=False)


class NetnsCluster:
    """`n` test hosts (node1..nodeN) in their own network namespaces on one bridge, each with its
    own sshd; the head node is this (root) namespace. A context manager: leaving it tears all
    of it down."""

    def __init__(self, n: int, workdir: Path, sshd: bool = True, ssh_timeout: float = 20) -> None:
        if not 1 <= n <= MAX_NODES:
            raise ValueError(f"need 1 to {MAX_NODES} nodes, not {n}")
        self.tag = f"{PREFIX}{os.getpid()}{chr(ord('a') + next(_clusters) % 26)}"
        self.bridge = f"{self.tag}-br"
        if len(f"{self.tag}-h{n}") > IFNAMSIZ:
            raise ValueError(f"interface names like {self.tag}-h{n} exceed {IFNAMSIZ} characters")
        self.workdir = workdir
        self.with_sshd = sshd
        self.ssh_timeout = ssh_timeout
        self.names = [f"node{i}" for i in range(1, n + 1)]
        #: node name -> its network namespace / its root-side veth
        self.namespaces = {name: f"{self.tag}-n{i}" for i, name in enumerate(self.names, start=1)}
        self.veths = {name: f"{self.tag}-h{i}" for i, name in enumerate(self.names, start=1)}
        self.subnet: Optional[ipaddress.IPv4Network] = None
        self.head = ""
        #: node name -> its address
        self.nodes: dict[str, str] = {}
        self.ssh_config = workdir / "ssh_config"
        self.dead_alias = DEAD
        self.sshd: dict[str, SshdServer] = {}
        self.killed: list[int] = []
        self._procs: list[subprocess.Popen] = []
        self._made_ns: list[str] = []
        self._made_links: list[str] = []
        self._closed = False

    # --- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> "NetnsCluster":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        require_netns()
        cleanup_leftovers()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.subnet = free_subnet(os.getpid() * 26 + ord(self.tag[-1]))
        hosts = list(self.subnet.hosts())
        self.head = str(hosts[HEAD_HOST - 1])
        self.nodes = {name: str(hosts[FIRST_NODE_HOST - 2 + i]) for i, name in enumerate(self.names, start=1)}
        plen = self.subnet.prefixlen

        _ip("link", "add", self.bridge, "type", "bridge", what="the kernel refused to create a bridge")
        self._made_links.append(self.bridge)
        _ip("addr", "add", f"{self.head}/{plen}", "dev", self.bridge, what="cannot address the bridge")
        _ip("link", "set", self.bridge, "up", what="cannot bring the bridge up")
        for name in self.names:
            ns, veth, addr = self.namespaces[name], self.veths[name], self.nodes[name]
            _ip("netns", "add", ns, what="cannot create a network namespace")
            self._made_ns.append(ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns,
                what="the kernel refused to create a veth pair")
            self._made_links.append(veth)
            _ip("link", "set", veth, "master", self.bridge, what="cannot join a veth to the bridge")
            _ip("link", "set", veth, "up", what="cannot bring a veth up")
            _ip("-n", ns, "addr", "add", f"{addr}/{plen}", "dev", "eth0", what=f"cannot address {name}")
            _ip("-n", ns, "link", "set", "eth0", "up", what=f"cannot bring {name}'s eth0 up")
            _ip("-n", ns, "link", "set", "lo", "up", what=f"cannot bring {name}'s lo up")

        keys = self.keys = make_keys(self.workdir / "keys")
        write_client_config(
            self.ssh_config,
            [*(((name,), addr, SSH_PORT) for name, addr in self.nodes.items()),
             ((self.dead_alias,), self.nodes[self.names[0]], DEAD_PORT)],
            current_user(), keys.key)
        if self.with_sshd:
            for name in self.names:
                self.sshd[name] = start_node_sshd(
                    self.workdir / name, keys, self.namespaces[name], self.nodes[name], self.ssh_config,
                    (name,), SSH_PORT, self.dead_alias, self.ssh_timeout)

    def close(self) -> list[int]:
        """Tear everything down (idempotent). Returns the PIDs still running in the nodes after
        the sshds and `popen`'s processes were stopped, which were killed here."""
        if self._closed:
            return self.killed
        self._closed = True
        if not (self._made_ns or self._made_links or self.sshd or self._procs):
            return self.killed
        for server in self.sshd.values():
            server.stop()
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        veths_first = sorted(self._made_links, key=lambda name: name == self.bridge)
        self.killed = _remove(self._made_ns, veths_first)
        left = self.leftovers()
        if left:
            raise RuntimeError(f"the test cluster {self.tag} could not be removed; still here: {left}")
        return self.killed

    def leftovers(self) -> list[str]:
        """This cluster's namespaces and links that exist now, and processes alive in them."""
        mine = [name for name in namespaces() + links() if name.startswith(f"{self.tag}-")]
        return mine + [f"pid {pid}" for ns in self._made_ns if ns in mine for pid in netns_pids(ns)]

    # --- failing and mending nodes ---------------------------------------------------------

    def take_down(self, node: str) -> list[int]:
        """The host dies: its link goes down, then its sshd and every process in it are killed
        (SIGKILL, no word to anyone). Returns the PIDs killed."""
        _ip("-n", self.namespaces[node], "link", "set", "eth0", "down", what=f"cannot take {node}'s link down")
        server = self.sshd.pop(node, None)
        if server is not None:
            server.stop()
        pids = self.pids(node)
        kill_pids(pids)
        return pids

    def bring_back(self, node: str) -> None:
        """The host recovers: its link up again and a fresh sshd on its address."""
        _ip("-n", self.namespaces[node], "link", "set", "eth0", "up", what=f"cannot bring {node}'s link up")
        if self.with_sshd and node not in self.sshd:
            self.sshd[node] = start_node_sshd(
                self.workdir / node, self.keys, self.namespaces[node], self.nodes[node], self.ssh_config,
                (node,), SSH_PORT, self.dead_alias, self.ssh_timeout)

    # --- using the nodes -------------------------------------------------------------------

    def exec_argv(self, node: str, argv: Sequence[str]) -> list[str]:
        """`argv` run inside `node`'s network namespace (the file system is this machine's)."""
        return [_ip_binary(), "netns", "exec", self.namespaces[node], *argv]

    def run(self, node: str, argv: Sequence[str], timeout: float = 30, **kwargs) -> subprocess.CompletedProcess:
        """Run `argv` to completion inside `node`, output captured as text."""
        return subprocess.run(self.exec_argv(node, argv), capture_output=True, text=True, timeout=timeout, **kwargs)

    def popen(self, node: str, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start `argv` inside `node`; it is stopped at tear-down, and gets SIGKILL if the thread
        that started it dies (so a crashed test run leaves it nowhere)."""
        proc = subprocess.Popen(["setpriv", "--pdeathsig", "KILL", "--", *self.exec_argv(node, argv)], **kwargs)
        self._procs.append(proc)
        return proc

    def ssh(self, node: str, command: str, timeout: float = 20) -> subprocess.CompletedProcess:
        """`ssh -F ssh_config node command` from the head node."""
        return subprocess.run(["ssh", "-F", str(self.ssh_config), node, command],
                              capture_output=True, text=True, timeout=timeout)

    def pids(self, node: str) -> list[int]:
        """Processes running in `node` now."""
        return netns_pids(self.namespaces[node])

    def netns_path(self, node: str) -> str:
        """The file that names `node`'s network namespace (`nsenter --net=PATH`)."""
        return f"{NETNS_RUN_DIR}/{self.namespaces[node]}"

    def write_entry(self, path: Path, program: str, node_var: str) -> Path:
        """An executable that runs `program "$@"` inside the namespace of the node named by the
        environment variable `node_var` (exits 97 for any other name). It `exec`s nsenter, which
        `exec`s the program: one PID throughout, so whoever started it can still signal it."""
        cases = "".join(f"  {name}) ns={self.netns_path(name)} ;;\n" for name in self.names)
        path.write_text(f"""#!/bin/sh
case "${node_var}" in
{cases}  *) echo "$0: no test host named '${node_var}'" >&2; exit 97 ;;
esac
exec nsenter --net="$ns" -- {shlex.quote(program)} "$@"
""")
        path.chmod(0o755)
        return path

    def peers(self, node: Optional[str], pid: Optional[int] = None,
              local: Optional[tuple[str, int]] = None) -> set[tuple[str, int]]:
        """(address, port) of the TCP peers seen in `node`'s namespace (None: this one, the head),
        in any state; only those of process `pid` (established connections carry their process)
        and of sockets bound to `local` when given."""
        argv = ["ss", "-tanpH"] if pid else ["ss", "-tanH"]
        if node is None:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
        else:
            out = self.run(node, argv).stdout
        found = set()
        for line in out.splitlines():
            if pid and f"pid={pid}," not in line:
                continue
            cols = line.split()
            if len(cols) < 5 or (local and _address(cols[3]) != local):
                continue
            peer = _address(cols[4])
            if peer:
                found.add(peer)
        return found

    def write_inventory(self, path: Path, slots: Optional[int] = None) -> Path:
        """The harvester's inventory (core/inventory.py): `name ssh-target [slots]` per node."""
        tail = f" {slots}" if slots else ""
        path.write_text("".join(f"{name} {name}{tail}\n" for name in self.names))
        return path


def _address(column: str) -> Optional[tuple[str, int]]:
    """`10.0.0.1:22`, `[::ffff:10.0.0.1]:22` (v4 over a v6 socket) -> ('10.0.0.1', 22); None for `*:*`."""
    host, _, port = column.rpartition(":")
    return (host.strip("[]").removeprefix("::ffff:"), int(port)) if port.isdigit() else None


@pytest.fixture(scope="module")
def netns_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsCluster]:
    """Three test hosts node1..node3 with their own sshd, torn down when the module is done."""
    with NetnsCluster(3, tmp_path_factory.mktemp("netns")) as cluster:
        yield cluster
