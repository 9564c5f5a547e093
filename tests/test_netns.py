"""The test hosts in network namespaces (tests/support/netns.py) behave as separate machines on
one network: each node is reached over ssh at its own address, has a loopback of its own, reaches
the head node's address and the other nodes', and leaves nothing behind when torn down (also
after a failure, and after a crashed run). Real namespaces, sshd and sockets, no mocks."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from core.inventory import load_inventory
from core.transports import SshTransport
from tests.support.netns import (NetnsCluster, alive, cleanup_leftovers, kill_pids, links, namespaces,
                                 netns_pids)
from tests.support.waiting import wait

#: connect to argv[1]:argv[2], send argv[3]; prints "connected <our address>" or "failed <error>"
PROBE = r"""
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as s:
        s.sendall(sys.argv[3].encode())
        print("connected", s.getsockname()[0])
except OSError as e:
    print("failed", type(e).__name__, e)
"""

#: listen on argv[1]:argv[2] (0: any port), print "port N", then for argv[3] connections print
#: "<peer address> <data>"
SERVER = r"""
import socket, sys
with socket.create_server((sys.argv[1], int(sys.argv[2]))) as srv:
    print("port", srv.getsockname()[1], flush=True)
    srv.settimeout(30)
    for _ in range(int(sys.argv[3])):
        conn, peer = srv.accept()
        with conn:
            print(peer[0], conn.recv(100).decode(), flush=True)
"""


def probe(cluster: NetnsCluster, node: str, host: str, port: int, message: str = "hello") -> str:
    r = cluster.run(node, [sys.executable, "-c", PROBE, host, str(port), message])
    assert r.returncode == 0, f"probe in {node} failed: {r.stderr}"
    return r.stdout.strip()


def start_server(cluster: NetnsCluster, node: str, host: str, connections: int,
                 port: int = 0) -> tuple[subprocess.Popen, int]:
    """A SERVER inside `node`, and the port it listens on."""
    proc = cluster.popen(node, [sys.executable, "-c", SERVER, host, str(port), str(connections)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline().split()
    if first[:1] != ["port"]:
        proc.kill()
        pytest.fail(f"the server in {node} did not start: {first} {proc.communicate()[1]}")
    return proc, int(first[1])


def root_listener(host: str) -> socket.socket:
    srv = socket.create_server((host, 0))
    srv.settimeout(10)
    return srv


def names_of(tag: str) -> list[str]:
    return [name for name in namespaces() + links() if name.startswith(f"{tag}-")]


def test_ssh_to_each_node_reaches_that_node_at_its_own_address(netns_cluster: NetnsCluster):
    c = netns_cluster
    assert len(c.nodes) == 3 and len(set(c.nodes.values())) == 3 and c.head not in c.nodes.values()
    for name, addr in c.nodes.items():
        r = c.ssh(name, "hostname -I; echo; ip -4 -o addr show; echo; echo $SSH_CONNECTION")
        assert r.returncode == 0, f"ssh {name}: {r.stderr}"
        hostname_i, ip_addr, connection = r.stdout.split("\n\n")
        assert hostname_i.split() == [addr]
        assert {line.split()[3].split("/")[0] for line in ip_addr.splitlines()} == {"127.0.0.1", addr}
        client, _, server, port = connection.split()
        assert (client, server, port) == (c.head, addr, "22")


def test_each_nodes_sshd_listens_on_its_own_address_only(netns_cluster: NetnsCluster):
    c = netns_cluster
    for name, addr in c.nodes.items():
        r = c.run(name, ["ss", "-Htlnp"])
        assert r.returncode == 0, r.stderr
        sshd = [line.split()[3] for line in r.stdout.splitlines() if '"sshd"' in line]
        assert sshd == [f"{addr}:22"], r.stdout
        assert probe(c, name, "127.0.0.1", 22).startswith("failed ConnectionRefusedError")


def test_nodes_have_no_route_beyond_the_test_subnet(netns_cluster: NetnsCluster):
    for name, ns in netns_cluster.namespaces.items():
        r = subprocess.run(["ip", "-n", ns, "-4", "route", "show", "table", "all"], capture_output=True, text=True)
        routes = [line.split() for line in r.stdout.splitlines() if not line.startswith(("local ", "broadcast "))]
        assert routes == [f"{netns_cluster.subnet} dev eth0 proto kernel scope link src {netns_cluster.nodes[name]}"
                          .split()], r.stdout


def test_a_nodes_127_0_0_1_is_its_own(netns_cluster: NetnsCluster):
    c = netns_cluster
    with root_listener("127.0.0.1") as srv:
        port = srv.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # the listener works from here
        srv.accept()[0].close()
        for name in c.nodes:
            assert probe(c, name, "127.0.0.1", port).startswith("failed ConnectionRefusedError"), name
    with socket.socket() as held:  # bound, never listening: this port refuses here, whatever else runs
        held.bind(("127.0.0.1", 0))
        proc, port = start_server(c, "node1", "127.0.0.1", 1, held.getsockname()[1])
        assert probe(c, "node2", "127.0.0.1", port).startswith("failed ConnectionRefusedError")
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
    assert probe(c, "node1", "127.0.0.1", port, "from node1") == "connected 127.0.0.1"
    out, err = proc.communicate(timeout=10)
    assert out.split("\n")[0] == "127.0.0.1 from node1", err


def test_the_head_address_is_reached_from_every_node(netns_cluster: NetnsCluster):
    c = netns_cluster
    seen = {}
    with root_listener(c.head) as srv:
        port = srv.getsockname()[1]
        for name, addr in c.nodes.items():
            assert probe(c, name, c.head, port, name) == f"connected {addr}"
            conn, peer = srv.accept()
            with conn:
                seen[conn.recv(100).decode()] = peer[0]
    assert seen == c.nodes


def test_nodes_reach_each_other_on_their_addresses(netns_cluster: NetnsCluster):
    c = netns_cluster
    a = c.nodes["node2"]
    proc, port = start_server(c, "node2", a, 2)
    for name in ("node1", "node3"):
        assert probe(c, name, a, port, name) == f"connected {c.nodes[name]}"
    out, err = proc.communicate(timeout=10)
    assert sorted(out.split("\n")[:2]) == [f"{c.nodes['node1']} node1", f"{c.nodes['node3']} node3"], err
    r = c.run("node1", ["ssh", "-F", str(c.ssh_config), "node3", "echo $SSH_CONNECTION"])
    assert r.returncode == 0, r.stderr
    client, _, server, _ = r.stdout.split()
    assert (client, server) == (c.nodes["node1"], c.nodes["node3"])


def test_the_inventory_reaches_the_nodes_through_the_harvesters_ssh_transport(netns_cluster: NetnsCluster,
                                                                             tmp_path: Path):
    c = netns_cluster
    nodes = load_inventory(c.write_inventory(tmp_path / "nodes.txt", slots=2))
    assert [(n.name, n.target, n.slots) for n in nodes] == [(name, name, 2) for name in c.nodes]
    with SshTransport(config=str(c.ssh_config)) as t:
        for node in nodes:
            r = t.run_script(node, "hostname -I")
            assert r.returncode == 0, r.stderr
            assert r.stdout.decode().split() == [c.nodes[node.name]]


def net_namespace(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


def test_teardown_removes_namespaces_links_and_every_process(tmp_path: Path):
    started: dict[int, str] = {}  # pid -> its network namespace, so a reused pid is never killed
    try:
        with NetnsCluster(2, tmp_path) as c:
            sleeper = c.popen("node1", ["sleep", "300"])
            r = c.ssh("node2", "setsid sleep 301 </dev/null >/dev/null 2>&1 & echo $!")
            assert r.returncode == 0, r.stderr
            detached = int(r.stdout)
            r = c.run("node1", ["sh", "-c", "setsid sleep 302 </dev/null >/dev/null 2>&1 & echo $!"])
            assert r.returncode == 0, r.stderr
            started = {p: net_namespace(p) for name in c.nodes for p in c.pids(name)}
            sshds = [s.proc.pid for s in c.sshd.values()]
            assert {sleeper.pid, detached, int(r.stdout), *sshds} <= set(started), started
            tag, nss = c.tag, list(c.namespaces.values())
            assert len(names_of(tag)) == 2 + 1 + 2  # namespaces, bridge, root-side veths
            assert c.sshd["node2"].stop() == [detached]  # a node's sshd kills what its sessions left
            assert c.sshd["node1"].stop() == []
        assert names_of(tag) == []
        assert not set(nss) & set(namespaces())
        assert [p for p in started if alive(p)] == []
        assert sleeper.poll() is not None
        assert c.leftovers() == []
    finally:
        kill_pids([p for p, ns in started.items() if alive(p) and net_namespace(p) == ns])


def test_teardown_also_runs_when_the_test_body_fails(tmp_path: Path):
    with pytest.raises(ZeroDivisionError):
        with NetnsCluster(1, tmp_path, sshd=False) as c:
            tag = c.tag
            c.popen("node1", ["sleep", "300"])
            assert len(names_of(tag)) == 3
            1 / 0
    assert names_of(tag) == []


def test_leftovers_of_a_crashed_run_are_removed_and_a_live_runs_are_not(tmp_path: Path):
    dead_pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    crashed, live = f"hv{dead_pid}z", "hv1z"  # no process has pid_max + 1; pid 1 is always alive
    made, stray = [], None
    try:
        for tag in (crashed, live):
            made.append(tag)
            subprocess.run(["ip", "link", "add", f"{tag}-br", "type", "bridge"], check=True)
            subprocess.run(["ip", "netns", "add", f"{tag}-n1"], check=True)
            subprocess.run(["ip", "link", "add", f"{tag}-h1", "type", "veth", "peer", "name", "eth0",
                            "netns", f"{tag}-n1"], check=True)
            subprocess.run(["ip", "link", "set", f"{tag}-h1", "master", f"{tag}-br"], check=True)
        stray = subprocess.Popen(["ip", "netns", "exec", f"{crashed}-n1", "sleep", "300"])
        wait(lambda: netns_pids(f"{crashed}-n1"), 10, "the stray process to enter the crashed run's namespace")
        removed = cleanup_leftovers()
        assert sorted(removed) == sorted([f"{crashed}-n1", f"{crashed}-br", f"{crashed}-h1"])
        assert names_of(crashed) == []
        assert stray.wait(10) == -9
        assert sorted(names_of(live)) == sorted([f"{live}-n1", f"{live}-br", f"{live}-h1"])
    finally:
        if stray is not None and stray.poll() is None:
            stray.kill()
            stray.wait(10)
        for tag in made:
            subprocess.run(["ip", "link", "del", f"{tag}-h1"], capture_output=True)
            subprocess.run(["ip", "link", "del", f"{tag}-br"], capture_output=True)
            subprocess.run(["ip", "netns", "del", f"{tag}-n1"], capture_output=True)
    assert names_of(crashed) == names_of(live) == []
