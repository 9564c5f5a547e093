"""A job's TCPStore served by a process of its own, inside bounds, so that whoever reaches the
port can at worst stop that one job's store, never the harvester.

TCPStore has no authentication and no limits: any client can open thousands of connections or
write gigabytes of keys, and a store served inside the harvester makes that the harvester's
descriptors and memory. Here each job's store runs in a child process (`python -m
core.runtime.storehost`) with a descriptor limit (RLIMIT_NOFILE) and a heap limit (RLIMIT_DATA),
and its janitor thread, every `sweep_s`:
- deletes keys outside the job's namespace and, inside it, values that are neither tagged by the
  job's secret (core/runtime/signing.py) nor a counter, or are larger than `max_value_bytes`;
- keeps at most `per_peer` connections per peer address (the oldest; newer ones are shut down, so
  the server's own loop closes them);
- leaves, saying why on its last line, when its memory stays over `max_rss_mb` for 2 s of sweeps
  (a burst of junk that the sweeps are still deleting is not enough).
The child ends when its stdin closes: the harvester that started it is gone. A warm spare (torch
imported) is kept ready so a job's start does not wait for the import.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import IO, Optional

from .signing import TAG_BYTES, namespace

__all__ = ["StoreHost", "StoreLimits", "StoreHostError"]

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0
OVER_FOR_S = 2.0          # memory over the limit this long, sweeps going on, ends the store


class StoreHostError(RuntimeError):
    """The job's store process could not be started (its port taken, its limits refused)."""


@dataclass(frozen=True)
class StoreLimits:
    """What one job's store may hold; the defaults are far above what a job of 64 nodes x 8 ranks
    uses (a few connections per rank, a few hundred keys of under 1 KiB)."""
    max_fds: int = 8192            # descriptors of the store process: its connections at once
    per_peer: int = 256            # connections kept per peer address
    max_value_bytes: int = 1 << 20
    max_rss_mb: int = 512          # the store process's memory after a sweep
    max_heap_mb: int = 1024        # RLIMIT_DATA above what the process had once torch was imported
    sweep_s: float = 0.2


@dataclass
class HostReport:
    """What the store process has done about abuse (read from its stdout)."""
    foreign_keys: int = 0          # keys deleted: outside the namespace, untagged, oversized
    shut_connections: int = 0      # connections shut over a peer's cap
    peers_over_cap: dict[str, int] = field(default_factory=dict)
    error: Optional[str] = None    # why the process ended, if it did


# ---------------------------------------------------------------------------------------------
# the parent's side

class StoreHost:
    """The store process of one job, seen from the coordinator: its port, what it reported, and
    whether it is still alive. `stop()` ends it (closing its stdin)."""

    def __init__(self, proc: subprocess.Popen, port: int) -> None:
        self.proc = proc
        self.port = port
        self.report = HostReport()
        self._stderr: deque[str] = deque(maxlen=20)
        self._lock = threading.Lock()
        threading.Thread(target=self._read_reports, name=f"storehost-{port}", daemon=True).start()
        threading.Thread(target=self._read_stderr, name=f"storehost-err-{port}", daemon=True).start()

    @classmethod
    def start(cls, host: str, port: int, bind_host: Optional[str], secret: str, timeout_s: float,
              limits: StoreLimits = StoreLimits()) -> "StoreHost":
        """A store process serving `host`:`port` (0: any free port), ready when this returns."""
        proc = _Spares.take()
        config = {"host": host, "port": int(port), "bind_host": bind_host, "secret": secret,
                  "timeout_s": float(timeout_s), "limits": asdict(limits)}
        try:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write((json.dumps(config) + "\n").encode())
            proc.stdin.flush()
            line = _readline(proc.stdout, START_TIMEOUT_S)
            answer = json.loads(line) if line else {}
        except (OSError, ValueError) as e:
            answer = {"error": str(e)}
        if "port" not in answer:
            proc.kill()
            err = answer.get("error") or _drain(proc.stderr) or f"exited with {proc.wait()}"
            raise StoreHostError(f"cannot serve the job's store on port {port}: {err}")
        return cls(proc, int(answer["port"]))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def failure(self) -> Optional[str]:
        """Why the process ended (its last word, else its exit status); None while it runs."""
        code = self.proc.poll()
        if code is None:
            return None
        with self._lock:
            said = self.report.error or (self._stderr[-1] if self._stderr else None)
        return said or (f"killed by signal {-code}" if code < 0 else f"exited with status {code}")

    def snapshot(self) -> dict:
        error = self.failure()
        with self._lock:
            r = self.report
            return {"foreign_keys": r.foreign_keys, "shut_connections": r.shut_connections,
                    "peers_over_cap": dict(r.peers_over_cap), "alive": error is None, "error": error}

    def stop(self, grace_s: float = 2.0) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _read_reports(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            with self._lock:
                r = self.report
                r.foreign_keys += int(msg.get("foreign_keys", 0))
                r.shut_connections += int(msg.get("shut_connections", 0))
                for peer, n in (msg.get("peers_over_cap") or {}).items():
                    r.peers_over_cap[peer] = r.peers_over_cap.get(peer, 0) + int(n)
                if msg.get("error"):
                    r.error = str(msg["error"])

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace").strip()
            if line and not line.startswith(("frame #", "<omitting", "Exception raised from")):
                with self._lock:
                    self._stderr.append(line)


class _Spares:
    """One store process started ahead, torch imported, waiting for its job's settings."""
    _lock = threading.Lock()
    _spare: Optional[subprocess.Popen] = None

    @classmethod
    def take(cls) -> subprocess.Popen:
        with cls._lock:
            proc, cls._spare = cls._spare, None
            if proc is None or proc.poll() is not None:
                proc = _spawn()
            cls._spare = _spawn()
        return proc


def _spawn() -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.Popen([sys.executable, "-m", "core.runtime.storehost"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=str(ROOT),
                            close_fds=True)


def _readline(stream: IO[bytes], timeout_s: float) -> bytes:
    """One line, or b"" if none came within `timeout_s` (the child failed to import, say)."""
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return out[0] if out else b""


def _drain(stream: Optional[IO[bytes]]) -> str:
    if stream is None:
        return ""
    try:
        lines = [ln.strip() for ln in stream.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


# ---------------------------------------------------------------------------------------------
# the store process

def _serve(host: str, port: int, bind_host: Optional[str], timeout: timedelta):
    """The TCPStore server: on every interface (bind_host None), else listening only on
    `bind_host`, through a socket bound here and handed to torch (`master_listen_fd`, which takes
    over a duplicate). A given port (a restart) is bound with SO_REUSEADDR."""
    import torch.distributed as dist
    if bind_host is None and not port:
        return dist.TCPStore(host, port, None, True, timeout=timeout, wait_for_workers=False)
    bind_host = bind_host or "0.0.0.0"
    family, kind, proto, _, addr = socket.getaddrinfo(bind_host, port, type=socket.SOCK_STREAM,
                                                      flags=socket.AI_PASSIVE)[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        bound_port = sock.getsockname()[1]
        dial = host if bind_host in ("0.0.0.0", "::", "") else bind_host
        return dist.TCPStore(dial, bound_port, None, True, timeout=timeout,
                             wait_for_workers=False, master_listen_fd=os.dup(sock.fileno()))


def _status_kb(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


class Janitor:
    """Keeps a job's store inside its limits (see the module docstring)."""

    def __init__(self, store, port: int, secret: str, limits: StoreLimits) -> None:
        self.store = store
        self.port = port
        self.limits = limits
        self.key = secret.encode()
        self.prefix = namespace(secret) + "/"
        self.seen_keys: set[str] = set()
        self.first_seen: dict[int, float] = {}       # socket inode -> when a sweep first saw it
        self.last_count = -1
        self.last_rss_kb = 0

    def genuine(self, key: str, raw: bytes) -> bool:
        """A value the job wrote: tagged under its secret (over the key inside the namespace), or
        a counter (`add` keeps plain decimal numbers)."""
        if len(raw) > self.limits.max_value_bytes:
            return False
        if len(raw) <= 20 and raw.lstrip(b"-").isdigit():
            return True
        value, tag = raw[:-TAG_BYTES], raw[-TAG_BYTES:]
        inner = key[len(self.prefix):].encode()
        return len(raw) >= TAG_BYTES and hmac.compare_digest(
            tag, hmac.new(self.key, inner + b"\0" + value, hashlib.sha256).digest())

    def sweep_keys(self) -> int:
        """Deletes what is not the job's; reads values only of keys new since the last sweep, or of
        all keys when the process's memory grew (an overwrite of a known key)."""
        count = self.store.num_keys()
        rss = _status_kb("VmRSS")
        grew = rss - self.last_rss_kb > 4 * 1024          # TCPStore takes values of up to 8 MiB
        if count == self.last_count and not grew:
            return 0
        deleted = 0
        keys = self.store.list_keys()
        for key in keys:
            if not key.startswith(self.prefix):
                deleted += bool(self.store.delete_key(key))
                continue
            if key in self.seen_keys and not grew:
                continue
            try:
                if not self.store.check([key]):
                    continue
                raw = bytes(self.store.get(key))
            except Exception:  # noqa: BLE001 - deleted between list and get (an event read)
                continue
            if self.genuine(key, raw):
                self.seen_keys.add(key)
            else:
                deleted += bool(self.store.delete_key(key))
                self.seen_keys.discard(key)
        self.seen_keys.intersection_update(keys)
        after = self.store.num_keys()
        self.last_count = after if after == len(keys) - deleted else -1   # keys came meanwhile: again
        self.last_rss_kb = min(rss, _status_kb("VmRSS"))
        return deleted

    def connections(self) -> dict[str, list[tuple[int, int]]]:
        """peer address -> [(socket inode, fd)] of the connections to the store's port."""
        ours: dict[int, int] = {}
        for name in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{name}")
            except OSError:
                continue
            if target.startswith("socket:["):
                ours[int(target[8:-1])] = int(name)
        peers: dict[str, list[tuple[int, int]]] = {}
        for table, v6 in (("/proc/self/net/tcp", False), ("/proc/self/net/tcp6", True)):
            try:
                lines = open(table).read().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                parts = line.split()
                inode = int(parts[9])
                if inode not in ours or parts[3] not in ("01", "08"):    # ESTABLISHED, CLOSE_WAIT
                    continue
                if int(parts[1].rsplit(":", 1)[1], 16) != self.port:
                    continue
                peers.setdefault(_peer_ip(parts[2].rsplit(":", 1)[0], v6), []).append((inode, ours[inode]))
        return peers

    def cap_peers(self, now: float) -> dict[str, int]:
        """Shuts down the newest connections of each peer over `per_peer` (the server sees them end
        and closes them itself); the oldest, the job's own, stay."""
        if len(os.listdir("/proc/self/fd")) <= self.limits.per_peer:
            self.first_seen.clear()
            return {}
        peers = self.connections()
        live = {inode for conns in peers.values() for inode, _ in conns}
        self.first_seen = {i: t for i, t in self.first_seen.items() if i in live}
        shut: dict[str, int] = {}
        for peer, conns in peers.items():
            for inode, _ in conns:
                self.first_seen.setdefault(inode, now)
            if len(conns) <= self.limits.per_peer:
                continue
            conns.sort(key=lambda c: (self.first_seen[c[0]], c[0]))
            for inode, fd in conns[self.limits.per_peer:]:
                if _shut(fd, inode):
                    shut[peer] = shut.get(peer, 0) + 1
        return shut


def _peer_ip(hexaddr: str, v6: bool) -> str:
    raw = bytes.fromhex(hexaddr)
    if not v6:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    if words[:12] == b"\0" * 10 + b"\xff\xff":
        return socket.inet_ntop(socket.AF_INET, words[12:])
    return socket.inet_ntop(socket.AF_INET6, words)


def _shut(fd: int, inode: int) -> bool:
    """shutdown() through a duplicate of `fd` if it is still that socket (never another one the
    number was reused for)."""
    try:
        dup = os.dup(fd)
    except OSError:
        return False
    try:
        if os.fstat(dup).st_ino != inode:
            return False
        with socket.socket(fileno=dup) as s:
            dup = -1
            s.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        if dup >= 0:
            os.close(dup)


_said = threading.Lock()


def _say(msg: dict) -> None:
    with _said:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()


def _watch_parent() -> None:
    """The harvester keeps our stdin open: when it ends (or lets go), so does this store."""
    while sys.stdin.buffer.read(65536):
        pass
    os._exit(0)


def main() -> int:
    line = sys.stdin.buffer.readline()
    if not line:
        return 0                                  # a spare nobody took: the harvester ended
    cfg = json.loads(line)
    limits = StoreLimits(**cfg["limits"])
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        cap = limits.max_fds if hard == resource.RLIM_INFINITY else min(limits.max_fds, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (cap, cap))
        store = _serve(cfg["host"], int(cfg["port"]), cfg.get("bind_host"),
                       timedelta(seconds=float(cfg["timeout_s"])))
        store.set_timeout(timedelta(seconds=1))    # the janitor's own reads: never a long wait
        heap = resource.getrlimit(resource.RLIMIT_DATA)[1]
        want = _status_kb("VmData") * 1024 + limits.max_heap_mb * (1 << 20)
        if heap == resource.RLIM_INFINITY or want < heap:
            resource.setrlimit(resource.RLIMIT_DATA, (want, want))
    except Exception as e:  # noqa: BLE001 - the parent names the job and the port
        _say({"error": f"{type(e).__name__}: {e}"})
        return 1
    _say({"port": int(store.port)})
    threading.Thread(target=_watch_parent, name="parent", daemon=True).start()
    janitor = Janitor(store, int(store.port), cfg["secret"], limits)
    threading.Thread(target=_cap_loop, args=(janitor,), name="peers", daemon=True).start()
    over_since: Optional[float] = None     # monotonic: since when memory is over the limit
    while True:                   # keys: store I/O, which a flood can slow down; peers go on apart
        time.sleep(limits.sweep_s)
        try:
            deleted = janitor.sweep_keys()
        except Exception as e:  # noqa: BLE001 - a sweep that failed is tried again next time
            print(f"store janitor: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            continue
        if deleted:
            _say({"foreign_keys": deleted})
            _give_back_memory()
        rss_mb = _status_kb("VmRSS") / 1024
        over_since = (over_since or time.monotonic()) if rss_mb > limits.max_rss_mb else None
        if over_since is not None and time.monotonic() - over_since >= OVER_FOR_S:
            _say({"error": f"the store held {rss_mb:.0f} MB for {OVER_FOR_S:g} s after removing what was "
                           f"not the job's (limit {limits.max_rss_mb} MB)"})
            os._exit(3)


def _give_back_memory() -> None:
    """Return the freed values' memory to the system (glibc's malloc_trim): glibc keeps freed 8 MiB
    values on its heap once its mmap threshold has grown, so after a flood the store's memory stayed
    at whatever the junk had reached before a sweep (332-558 MB in the test's 800 MB flood, by how
    loaded the machine was) and could keep it over `max_rss_mb`, ending the job's store."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):      # not glibc: its allocator gives memory back its own way
        pass


def _cap_loop(janitor: Janitor) -> None:
    """Connections per peer, from /proc alone: it never waits on the store's own loop, which a
    flood of connections that never speak keeps busy."""
    while True:
        time.sleep(janitor.limits.sweep_s)
        try:
            shut = janitor.cap_peers(time.monotonic())
        except Exception as e:  # noqa: BLE001 - tried again next time
            print(f"store janitor: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            continue
        if shut:
            _say({"shut_connections": sum(shut.values()), "peers_over_cap": shut})

if __name__ == "__main__":
    sys.exit(main())
