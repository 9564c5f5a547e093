"""What a pilot job and the harvester say to each other, shared by both ends: one JSON object
per line, inside TLS, over one TCP connection that the pilot opens to the harvester's hub and
keeps for its whole life (so either end sees the other vanish at once, as EOF).

Pilot -> hub:  hello {token, job, node, pid, workers} first (workers: those still running when a
               pilot redials a restarted harvester: pid, token, log, job, key, inc); then leaving {reason, at} (SIGTERM: the batch
               scheduler wants the node back), exited {pid, status} (a worker ended), and
               replies {re: id, ...}.
Hub -> pilot:  welcome {} (the hello was accepted), then requests {op, id, ...}: start {argv, env, workdir, log,
               run_as?} (run_as {user, launcher}: the job runs as its owner's account, core/pilots/runas.py),
               alive {handles}, stop {handles, grace}, kill {handle}, tail {handle, lines},
               give {path, user} (make a job's checkpoint directory its account's, before its first worker).

The pilot is started by Slurm with the hub's address, the SHA-256 fingerprint of the hub's
certificate (a self-signed one the harvester makes at start) and the harvester's token in its
environment (never on a command line). It finishes the TLS handshake, refuses to say anything
to a hub whose certificate has another fingerprint, and only then sends the token.

TLS runs on memory BIOs, not on an `ssl.SSLSocket`: each end reads in one thread while others
send, and OpenSSL forbids using one SSL object from two threads at once. Here the SSL object is
only touched under a lock, and the socket is read and written outside it. Only the standard
library: the pilot imports this.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import select
import socket
import ssl
import threading
import time
from typing import Optional

ENV_HUB = "HARVEST_PILOT_HUB"           # host:port of the harvester's hub
ENV_HUB_SHA256 = "HARVEST_PILOT_HUB_SHA256"  # the fingerprint of the hub's TLS certificate
ENV_TOKEN = "HARVEST_PILOT_TOKEN"       # proves a pilot was started by this harvester
ENV_GRACE = "HARVEST_PILOT_GRACE"       # seconds a worker gets between SIGTERM and SIGKILL
ENV_ORPHAN = "HARVEST_PILOT_ORPHAN_S"   # seconds a pilot that lost the hub keeps its node, redialing
ENV_NODE = "HARVEST_PILOT_NODE"         # the node it holds, where the scheduler does not say (a PBS vnode)
#: the scheduler's own variables a pilot and its workers keep: its job, its node, what it bound
SCHEDULER_PREFIXES = ("SLURM_", "PBS_")
MAX_LINE = 1 << 20                      # one message; an argv + env fits many times over
SEND_TIMEOUT_S = 5.0                    # a peer that takes no bytes for this long is gone
CHUNK = 1 << 16

HELLO, LEAVING, EXITED, WELCOME = "hello", "leaving", "exited", "welcome"
START, ALIVE, STOP, KILL, TAIL, GIVE = "start", "alive", "stop", "kill", "tail", "give"


class WrongCertificate(ssl.SSLError):
    """The hub presented a certificate other than the pinned one: nothing was sent to it."""


def fingerprint(der: bytes) -> str:
    """A certificate's SHA-256 fingerprint, as 64 lower-case hex digits."""
    return hashlib.sha256(der).hexdigest()


def client_context() -> ssl.SSLContext:
    """The pilot's TLS: no CA and no host name (the hub's certificate is self-signed); the
    certificate is pinned by its fingerprint after the handshake instead (`dial`). The handshake
    still proves that the hub holds the key of the certificate it shows."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


class Wire:
    """JSON lines inside TLS on one connected socket: `send` from any thread, `recv` from one.
    Every send has a deadline: a peer that stops reading makes it fail (False) after
    `send_timeout_s`, and the connection is then shut down (a half-sent TLS record cannot be
    taken back)."""

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext, server_side: bool,
                 send_timeout_s: float = SEND_TIMEOUT_S) -> None:
        self.sock = sock
        self.send_timeout_s = send_timeout_s
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self._in, self._out, server_side=server_side)
        self._buf = bytearray()              # plaintext received, not yet returned as lines
        self._tls_lock = threading.Lock()    # the SSL object and its BIOs
        self._send_lock = threading.Lock()   # bytes go to the socket in the order TLS made them
        self._eof = False
        self.sent = 0                        # bytes the socket took (the hub's lobby: was it answered?)

    # ---- sending -----------------------------------------------------------------------------
    def send(self, msg: dict) -> bool:
        """False once the connection is gone (the caller learns it from recv too)."""
        data = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        try:
            with self._send_lock:
                with self._tls_lock:
                    self.tls.write(data)
                    out = self._out.read()
                self._send_raw(out, time.monotonic() + self.send_timeout_s)
            return True
        except (OSError, ValueError):
            return False

    def flush(self, deadline: float) -> None:
        """Send what TLS has queued (handshake messages, alerts). OSError if the socket does not
        take it all by `deadline` (a deadline in the past: only what it takes at once)."""
        with self._send_lock:
            with self._tls_lock:
                out = self._out.read()
            self._send_raw(out, deadline)

    def _send_raw(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        try:
            while view:
                try:
                    view = view[self.sock.send(view, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL):]
                    continue
                except BlockingIOError:
                    pass
                if not _ready(self.sock, select.POLLOUT, deadline):
                    raise TimeoutError("the peer did not take the data in time")
            self.sent += len(data)
        except OSError:
            self.shutdown()
            raise

    # ---- receiving ---------------------------------------------------------------------------
    def recv(self) -> Optional[dict]:
        """The next message; None at EOF, on a broken connection or on garbage."""
        try:
            while (line := self.take_line(MAX_LINE)) is None:
                if self._eof or not self.feed(self._recv_raw(None)):
                    return None
            msg = json.loads(line)
        except (OSError, ValueError):       # ssl.SSLError is an OSError: a broken stream
            return None
        return msg if isinstance(msg, dict) else None

    def take_line(self, limit: int) -> Optional[bytes]:
        """The next complete line of plaintext received so far, if there is one. ValueError if
        `limit` bytes came without a newline, ssl.SSLError on a broken TLS stream."""
        with self._tls_lock:
            while True:
                try:
                    data = self.tls.read(CHUNK)
                except ssl.SSLWantReadError:
                    break
                except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                    self._eof = True
                    break
                if not data:
                    self._eof = True
                    break
                self._buf += data
            queued = self._out.pending
        if queued:                      # an alert or a key update of the peer's to answer
            self.flush(time.monotonic() + self.send_timeout_s)
        end = self._buf.find(b"\n", 0, limit + 1)
        if end < 0:
            if len(self._buf) > limit:
                raise ValueError(f"a line longer than {limit} bytes")
            return None
        line = bytes(self._buf[:end])
        del self._buf[:end + 1]
        return line

    def feed(self, raw: Optional[bytes]) -> bool:
        """Bytes read from the socket (b'': its EOF) into TLS; False if there were none."""
        if not raw:
            with self._tls_lock:
                self._in.write_eof()
            self._eof = True
            return False
        with self._tls_lock:
            self._in.write(raw)
        return True

    def _recv_raw(self, deadline: Optional[float]) -> bytes:
        """What the socket has (waiting for it until `deadline`, None: for ever); b'' at its
        end, when it breaks, or when the deadline passes."""
        try:
            if deadline is not None and not _ready(self.sock, select.POLLIN, deadline):
                return b""
            return self.sock.recv(CHUNK)
        except OSError:
            return b""

    def handshake_step(self) -> bool:
        """One step of the TLS handshake with what was fed so far: True once it is done.
        Queued handshake bytes are sent at once (OSError if the socket does not take them)."""
        with self._tls_lock:
            try:
                self.tls.do_handshake()
                done = True
            except ssl.SSLWantReadError:
                done = False
        self.flush(time.monotonic())
        return done

    def handshake(self, deadline: float) -> None:
        """The whole TLS handshake, blocking until `deadline` (the pilot's side)."""
        while not self.handshake_step():
            if not self.feed(self._recv_raw(deadline)):
                raise ConnectionError("the connection ended (or timed out) during the TLS handshake")

    @property
    def eof(self) -> bool:
        """The peer's end of the stream was seen (EOF or TLS close_notify)."""
        return self._eof

    # ---- the end -----------------------------------------------------------------------------
    def shutdown(self) -> None:
        """End the connection for both ends without closing the socket (a reader in another
        thread sees EOF at once)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.shutdown()
        self.sock.close()


def dial(hub: str, sha256: str, timeout_s: float = 10.0) -> Wire:
    """Connect to the hub at `host:port` and finish the TLS handshake; WrongCertificate (nothing
    sent) unless the hub's certificate has the fingerprint `sha256`."""
    host, _, port = hub.rpartition(":")
    deadline = time.monotonic() + timeout_s
    sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
    try:
        sock.settimeout(None)
        tune(sock)
        wire = Wire(sock, client_context(), server_side=False)
        wire.handshake(deadline)
        got = fingerprint(wire.tls.getpeercert(binary_form=True) or b"")
        want = sha256.replace(":", "").strip().lower()
        if not hmac.compare_digest(got.encode(), want.encode()):
            raise WrongCertificate(f"the hub's certificate has SHA-256 {got}, not the expected {want}")
        return wire
    except BaseException:
        sock.close()
        raise


def _ready(sock: socket.socket, event: int, deadline: float) -> bool:
    """Whether `sock` is ready for `event` (or in error) before `deadline`."""
    poller = select.poll()
    poller.register(sock, event)
    return bool(poller.poll(max(0.0, deadline - time.monotonic()) * 1000))


def tune(sock: socket.socket, idle_s: int = 10, interval_s: int = 5, count: int = 3) -> None:
    """No Nagle delay on these small messages; keepalives notice a peer whose machine died
    without closing the connection (~25 s)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, val in (("TCP_KEEPIDLE", idle_s), ("TCP_KEEPINTVL", interval_s), ("TCP_KEEPCNT", count)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), val)
