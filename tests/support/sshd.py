"""A real OpenSSH server on a free loopback port, for tests of the SSH transport and dispatcher.

`start_sshd(dir)` installs Debian's openssh-server when /usr/sbin/sshd is missing (root only),
makes a host key and a client key in `dir`, starts `sshd -D` as the current user's server on
127.0.0.1 and writes an ssh client config in which the Host aliases node0..node3 all reach it
(and `node-dead` reaches a closed port). `SshdServer.stop()` stops it by PID and kills whatever
its sessions left running (found by their SSH_CONNECTION, which names this server's port).

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
from typing import Iterator

import pytest

SSHD = "/usr/sbin/sshd"
PACKAGE = "openssh-server"
ALIASES = ("node0", "node1", "node2", "node3")
DEAD = "node-dead"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_sshd() -> None:
    """apt-get install openssh-server if sshd is missing (the package's own service is not
    started: policy-rc.d in containers, and we never use it)."""
    if os.path.exists(SSHD):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip(f"{SSHD} is missing and cannot be installed here (needs root and apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", PACKAGE]):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    if not os.path.exists(SSHD):
        raise RuntimeError(f"{PACKAGE} installed but {SSHD} is missing")


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "harvest-test", "-f", str(path)],
                   check=True, capture_output=True)


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
    _stopped: bool = field(default=False, repr=False)

    def ssh(self, alias: str, command: str, timeout: float = 20) -> subprocess.CompletedProcess:
        """One plain `ssh -F config alias command` (for checks in tests)."""
        return subprocess.run(["ssh", "-F", str(self.client_config), "-o", "BatchMode=yes", alias, command],
                              capture_output=True, text=True, timeout=timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def session_pids(self) -> list[int]:
        """Live processes started through this server (their SSH_CONNECTION ends in our port)."""
        needle = f" 127.0.0.1 {self.port}".encode()
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


def start_sshd(workdir: Path, timeout: float = 20) -> SshdServer:
    ensure_sshd()
    workdir.mkdir(parents=True, exist_ok=True)
    host_key, key = workdir / "ssh_host_ed25519_key", workdir / "id_ed25519"
    _keygen(host_key)
    _keygen(key)
    authorized = workdir / "authorized_keys"
    authorized.write_text(Path(f"{key}.pub").read_text())
    authorized.chmod(0o600)
    port, dead_port = free_port(), free_port()
    user = os.environ.get("USER") or subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    cfg = workdir / "sshd_config"
    cfg.write_text("\n".join([
        "ListenAddress 127.0.0.1",
        f"Port {port}",
        f"HostKey {host_key}",
        f"AuthorizedKeysFile {authorized}",
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
        "",
    ]))
    known = workdir / "known_hosts"
    host_pub = Path(f"{host_key}.pub").read_text().split()
    known.write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    client = workdir / "ssh_config"
    common = [f"  User {user}", f"  IdentityFile {key}", "  IdentitiesOnly yes",
              f"  UserKnownHostsFile {known}", "  StrictHostKeyChecking accept-new",
              "  LogLevel ERROR", ""]
    client.write_text("\n".join([
        f"Host {' '.join(ALIASES)}", "  HostName 127.0.0.1", f"  Port {port}", *common,
        f"Host {DEAD}", "  HostName 127.0.0.1", f"  Port {dead_port}", *common,
    ]))
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
    log = workdir / "sshd.log"
    proc = subprocess.Popen([SSHD, "-D", "-f", str(cfg), "-E", str(log)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    server = SshdServer(workdir, port, proc, client, key, log, user)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}:\n{server.output()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server
        except OSError:
            time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"sshd did not accept connections within {timeout} s:\n{server.output()}")


@pytest.fixture(scope="session")
def sshd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdServer]:
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    try:
        yield server
    finally:
        server.stop()
