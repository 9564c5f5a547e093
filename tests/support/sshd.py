"""A real OpenSSH server on a free loopback port, for tests of the SSH transport and dispatcher.

`start_sshd(dir)` installs Debian's openssh-server when /usr/sbin/sshd is missing (root only),
makes a host key and a client key in `dir`, starts `sshd -D` as the current user's server on
127.0.0.1 and writes an ssh client config in which the Host aliases node0..node3 all reach it
(and `node-dead` reaches a closed port). `SshdServer.stop()` stops it by PID and kills whatever
its sessions left running (found by their SSH_CONNECTION, which names this server's address and
port).

`start_node_sshd(...)` starts the same sshd inside a network namespace, bound to that node's
address only (tests/support/netns.py starts one per node); `make_keys` and
`write_client_config` are the parts both share.

In a test module:  `from tests.support.sshd import sshd_server`  makes the session-scoped fixture
available there (pytest collects fixtures from module globals).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence

import pytest

from tests.support import apt
from tests.support.ports import free_port

SSHD = "/usr/sbin/sshd"
PACKAGE = "openssh-server"
ALIASES = ("node0", "node1", "node2", "node3")
DEAD = "node-dead"


def ensure_sshd(strict: bool = False) -> None:
    """apt-get install openssh-server if sshd is missing (the package's own service is not
    started: policy-rc.d in containers, and we never use it). Where it cannot be installed the
    loopback tests skip, and with `strict` (the namespaced nodes) the test fails."""
    if os.path.exists(SSHD):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        reason = f"{SSHD} is missing and cannot be installed here (needs root and apt-get)"
        if strict:
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    apt.install([PACKAGE], timeout=600)
    if not os.path.exists(SSHD):
        raise RuntimeError(f"{PACKAGE} installed but {SSHD} is missing")


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "harvest-test", "-f", str(path)],
                   check=True, capture_output=True)


@dataclass(frozen=True)
class SshKeys:
    """One host key for the server(s), one client key, and the authorized_keys that admits it."""
    host_key: Path
    key: Path
    authorized: Path


def make_keys(workdir: Path) -> SshKeys:
    workdir.mkdir(parents=True, exist_ok=True)
    host_key, key = workdir / "ssh_host_ed25519_key", workdir / "id_ed25519"
    _keygen(host_key)
    _keygen(key)
    authorized = workdir / "authorized_keys"
    authorized.write_text(Path(f"{key}.pub").read_text())
    authorized.chmod(0o600)
    return SshKeys(host_key, key, authorized)


def current_user() -> str:
    return os.environ.get("USER") or subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()


def write_sshd_config(workdir: Path, keys: SshKeys, address: str, port: int) -> Path:
    """sshd_config for a server listening on `address`:`port` only, keys and pid file in `workdir`.

    Sessions get a HOME of their own (`workdir`/home), as a compute node's clean account would:
    the developer's shell start-up files never run in them (a pyenv rehash lock left by a killed
    shell made every session wait 60 s and failed the ssh tests of a whole run)."""
    cfg = workdir / "sshd_config"
    home = workdir / "home"
    home.mkdir(exist_ok=True)
    cfg.write_text("\n".join([
        f"ListenAddress {address}",
        f"Port {port}",
        f"HostKey {keys.host_key}",
        f"AuthorizedKeysFile {keys.authorized}",
        f"PidFile {workdir / 'sshd.pid'}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "StrictModes no",
        "UsePAM no",
        "PrintMotd no",
        "X11Forwarding no",
        "AllowTcpForwarding no",
        "MaxStartups 64",
        "LogLevel VERBOSE",
        f"SetEnv HOME={home}",
        "",
    ]))
    return cfg


def write_client_config(path: Path, hosts: Sequence[tuple[Sequence[str], str, int]], user: str, key: Path,
                        known_hosts: Optional[Path] = None) -> Path:
    """An ssh client config with one `Host` block per (aliases, address, port). With `known_hosts`
    the server's key is checked against that file; without, host keys are not checked at all
    (StrictHostKeyChecking no, UserKnownHostsFile /dev/null) and the client never prompts."""
    if known_hosts is not None:
        checking = [f"  UserKnownHostsFile {known_hosts}", "  StrictHostKeyChecking accept-new"]
    else:
        checking = ["  UserKnownHostsFile /dev/null", "  StrictHostKeyChecking no", "  BatchMode yes"]
    common = [f"  User {user}", f"  IdentityFile {key}", "  IdentitiesOnly yes", *checking, "  LogLevel ERROR", ""]
    lines: list[str] = []
    for aliases, address, port in hosts:
        lines += [f"Host {' '.join(aliases)}", f"  HostName {address}", f"  Port {port}", *common]
    path.write_text("\n".join(lines))
    return path


@dataclass
class SshdServer:
    dir: Path
    port: int
    proc: subprocess.Popen
    client_config: Path  # pass as SshTransport(config=...) / `ssh -F`
    key: Path
    log: Path
    user: str
    aliases: tuple[str, ...] = ALIASES
    dead_alias: str = DEAD
    address: str = "127.0.0.1"
    netns: Optional[str] = None  # the network namespace it runs in; None: this one
    _stopped: bool = field(default=False, repr=False)

    def ssh(self, alias: str, command: str, timeout: float = 20) -> subprocess.CompletedProcess:
        """One plain `ssh -F config alias command` (for checks in tests)."""
        return subprocess.run(["ssh", "-F", str(self.client_config), "-o", "BatchMode=yes", alias, command],
                              capture_output=True, text=True, timeout=timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def session_pids(self) -> list[int]:
        """Live processes started through this server (their SSH_CONNECTION ends in our address
        and port)."""
        needle = f" {self.address} {self.port}".encode()
        out = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    env = f.read().split(b"\0")
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
            except OSError:
                continue
            if state != b"Z" and any(e.startswith(b"SSH_CONNECTION=") and e.endswith(needle) for e in env):
                out.append(int(entry.name))
        return out

    def _descendants(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    with open(f"/proc/{entry.name}/stat", "rb") as f:
                        ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                children.setdefault(ppid, []).append(int(entry.name))
        out, todo = [], [self.proc.pid]
        while todo:
            for c in children.get(todo.pop(), []):
                out.append(c)
                todo.append(c)
        return out

    def stop(self) -> list[int]:
        """Stop sshd and its per-connection processes, then kill what sessions left behind.
        Returns the PIDs of session leftovers that had to be killed."""
        if self._stopped:
            return []
        self._stopped = True
        conns = self._descendants()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for pid in conns:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        left = self.session_pids()
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return left


def _launch(argv: Sequence[str], server_args: Mapping, timeout: float) -> SshdServer:
    """Start `argv` (ending in `sshd -D -f ... -E log`), return once its address accepts TCP."""
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    server = SshdServer(proc=proc, **server_args)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}:\n{server.output()}")
        try:
            with socket.create_connection((server.address, server.port), timeout=1):
                return server
        except OSError:
            time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"sshd did not accept connections within {timeout} s:\n{server.output()}")


def start_sshd(workdir: Path, timeout: float = 20) -> SshdServer:
    ensure_sshd()
    keys = make_keys(workdir)
    port, dead_port = free_port(), free_port()
    user = current_user()
    cfg = write_sshd_config(workdir, keys, "127.0.0.1", port)
    known = workdir / "known_hosts"
    host_pub = Path(f"{keys.host_key}.pub").read_text().split()
    known.write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    client = write_client_config(workdir / "ssh_config",
                                 [(ALIASES, "127.0.0.1", port), ((DEAD,), "127.0.0.1", dead_port)],
                                 user, keys.key, known_hosts=known)
    log = workdir / "sshd.log"
    return _launch([SSHD, "-D", "-f", str(cfg), "-E", str(log)],
                   dict(dir=workdir, port=port, client_config=client, key=keys.key, log=log, user=user),
                   timeout)


def start_node_sshd(workdir: Path, keys: SshKeys, netns: str, address: str, client_config: Path,
                    aliases: tuple[str, ...], port: int = 22, dead_alias: str = DEAD,
                    timeout: float = 20) -> SshdServer:
    """An sshd inside network namespace `netns`, listening on `address`:`port` only, admitting
    `keys.key`. It gets SIGKILL if the thread that started it dies (a crashed test run leaves no
    sshd; the namespace's cleanup kills what its sessions left)."""
    ensure_sshd(strict=True)
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = write_sshd_config(workdir, keys, address, port)
    log = workdir / "sshd.log"
    argv = ["setpriv", "--pdeathsig", "KILL", "--", "ip", "netns", "exec", netns,
            SSHD, "-D", "-f", str(cfg), "-E", str(log)]
    return _launch(argv, dict(dir=workdir, port=port, client_config=client_config, key=keys.key, log=log,
                              user=current_user(), aliases=aliases, dead_alias=dead_alias, address=address,
                              netns=netns), timeout)


@pytest.fixture(scope="session")
def sshd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdServer]:
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    try:
        yield server
    finally:
        server.stop()
