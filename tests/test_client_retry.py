"""The client waits out a 429 it can (issue 57: registrations are rate-limited, and a study that
registers trials in a burst should go on at the server's pace) and raises one it cannot. The
server here is a loopback HTTP server of the test's own that answers 429 a set number of times:
what is under test is the client's handling of the answer, not the limit (tests/
test_registration_limits.py checks the server's 429 and Retry-After)."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from app.client import ApiError, Client


class Limited(ThreadingHTTPServer):
    def __init__(self, refusals: int, retry_after: str) -> None:
        self.refusals, self.retry_after, self.posts = refusals, retry_after, []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                server: Limited = self.server     # type: ignore[assignment]
                server.posts.append(time.monotonic())
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if len(server.posts) <= server.refusals:
                    body, status = {"error": "too many registrations this minute"}, 429
                else:
                    body, status = {"id": "J1", "state": "queued"}, 201
                data = json.dumps(body).encode()
                self.send_response(status)
                if status == 429:
                    self.send_header("Retry-After", server.retry_after)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.fixture
def limited(request) -> Iterator[Limited]:
    refusals, retry_after = request.param
    server = Limited(refusals, retry_after)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def url(server: Limited) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


@pytest.mark.parametrize("limited", [(2, "1")], indirect=True)
def test_a_429_within_patience_is_sent_again_after_its_retry_after(limited):
    job = Client(url(limited), token="t", patience=10).submit(name="x", min_nodes=1, max_nodes=1, total_samples=1)
    assert job["id"] == "J1" and len(limited.posts) == 3
    assert all(b - a >= 0.9 for a, b in zip(limited.posts, limited.posts[1:]))     # waited as told


@pytest.mark.parametrize("limited", [(1, "3600")], indirect=True)
def test_a_wait_longer_than_patience_raises_at_once_with_retry_after(limited):
    t0 = time.monotonic()
    with pytest.raises(ApiError) as e:
        Client(url(limited), token="t", patience=10).submit(name="x", min_nodes=1, max_nodes=1, total_samples=1)
    assert e.value.status == 429 and e.value.retry_after == 3600.0 and len(limited.posts) == 1
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("limited", [(1, "1")], indirect=True)
def test_no_patience_raises_the_first_429(limited):
    with pytest.raises(ApiError) as e:
        Client(url(limited), token="t", patience=0).submit(name="x", min_nodes=1, max_nodes=1, total_samples=1)
    assert e.value.retry_after == 1.0 and len(limited.posts) == 1
