"""The HTTP side of progress reports: workers' rank 0 POSTs JSON progress with the job's token.

Apart from the coordinator because it serves every job of a controller (the web app feeds its own
route into one ReportBook), while a JobCoordinator is one job's store.
"""
from __future__ import annotations

import hmac
import json
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

__all__ = ["ReportBook", "ReportServer"]


#: reports kept per running job (the newest), and the largest report body taken
KEEP_REPORTS = 100
MAX_REPORT_BYTES = 64 * 1024


def _not_json(name: str):
    """NaN and Infinity are not JSON: a report holding them is refused (it would reach the API)."""
    raise ValueError(f"{name} is not a JSON number")


class ReportBook:
    """Progress reports of running jobs, as the HTTP endpoint receives them. Thread-safe.

    The web app registers each job's token (`JobCoordinator.token`) and passes every POST to
    `accept()`; only a report with the job's token (compared in constant time) is kept. Memory
    is bounded: the last `keep` reports per job, bodies up to MAX_REPORT_BYTES, and a job's
    reports are dropped with its token when it ends (`revoke`)."""

    def __init__(self, keep: int = KEEP_REPORTS) -> None:
        self._tokens: dict[str, bytes] = {}
        self._reports: dict[str, deque] = {}
        self._keep = keep
        self._lock = threading.Lock()
        self.refused = 0

    def register(self, job_id: str, token: str) -> None:
        with self._lock:
            self._tokens[job_id] = token.encode()
            self._reports.setdefault(job_id, deque(maxlen=self._keep))

    def revoke(self, job_id: str) -> None:
        with self._lock:
            self._tokens.pop(job_id, None)
            self._reports.pop(job_id, None)

    def accept(self, job_id: str, token: str, payload: dict) -> bool:
        with self._lock:
            expected = self._tokens.get(job_id)
            # compare even for an unknown job, so timing tells nothing about which jobs exist
            ok = hmac.compare_digest(expected or b"\0" * 32, (token or "").encode())
            if not ok or expected is None or not isinstance(payload, dict):
                self.refused += 1
                return False
            self._reports.setdefault(job_id, deque(maxlen=self._keep)).append({**payload, "received": time.time()})
            return True

    def accept_http(self, job_id: str, authorization: Optional[str], body: bytes) -> int:
        """HTTP status for a raw POST: 204 kept, 401 bad token, 400 bad body (NaN and Infinity
        included), 413 too large."""
        if body and len(body) > MAX_REPORT_BYTES:
            return 413
        token = ""
        if authorization and authorization.startswith("Bearer "):
            token = authorization[len("Bearer "):].strip()
        try:
            payload = json.loads(body or b"null", parse_constant=_not_json)
        except (ValueError, RecursionError):
            return 400
        if not isinstance(payload, dict):
            return 400
        return 204 if self.accept(job_id, token, payload) else 401

    def reports(self, job_id: str) -> list[dict]:
        with self._lock:
            return list(self._reports.get(job_id, ()))

    def latest(self, job_id: str) -> Optional[dict]:
        with self._lock:
            r = self._reports.get(job_id)
            return r[-1] if r else None


class ReportServer:
    """A stdlib HTTP endpoint for progress reports: POST /report/<job_id> (headless controller,
    tests). The web app can serve the same with its own route and a ReportBook."""

    def __init__(self, book: ReportBook, host: str = "127.0.0.1", port: int = 0) -> None:
        self.book = book

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                parts = self.path.strip("/").split("/")
                if len(parts) != 2 or parts[0] != "report":
                    self.send_error(404)
                    return
                n = int(self.headers.get("Content-Length") or 0)
                if n > 1 << 20:
                    self.send_error(413)
                    return
                code = book.accept_http(parts[1], self.headers.get("Authorization"), self.rfile.read(n))
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.address = self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, name="report-server",
                                        daemon=True)
        self._thread.start()

    def url_for(self, job_id: str) -> str:
        return f"http://{self.address[0]}:{self.address[1]}/report/{job_id}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
