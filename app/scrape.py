"""How `/metrics` is served, apart from what it says (app/metrics.py): one text rebuilt at most
every `interval_s`, so that however many clients scrape, the process builds it at most that
often (six clients at 37 scrapes/s kept a core busy when each scrape built its own); and the
bearer token an operator may ask scrapers for (--metrics-token-file)."""
from __future__ import annotations

import hmac
import math
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from core.errors import InputError

#: the longest token file read (a token is a line; anything longer is not one)
MAX_TOKEN_BYTES = 4096


class CachedText:
    """The last text built and when its build began. A caller finding it older than
    `interval_s` rebuilds it, one at a time: the others meanwhile get the previous text (only
    the very first callers wait, there being none). `rebuilds` counts the builds made."""

    def __init__(self, build: Callable[[], bytes], interval_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._build = build
        self.interval_s = interval_s
        self._clock = clock
        self._text: Optional[bytes] = None
        self._at = -math.inf
        self._rebuilding = threading.Lock()
        self.rebuilds = 0
        self.last_build_s = 0.0

    def _fresh(self) -> Optional[bytes]:
        text = self._text
        return text if text is not None and self._clock() - self._at < self.interval_s else None

    def get(self) -> bytes:
        text = self._fresh()
        if text is not None:
            return text
        previous = self._text
        if not self._rebuilding.acquire(blocking=previous is None):
            return previous          # another thread is rebuilding: the text it replaces
        try:
            text = self._fresh()
            if text is not None:     # built meanwhile by the thread this one waited for
                return text
            started = self._clock()
            self.rebuilds += 1
            text = self._build()
            self.last_build_s = self._clock() - started
            self._text, self._at = text, started
            return text
        finally:
            self._rebuilding.release()


def read_token(path: Path) -> str:
    """The bearer token in `path` (its first line, stripped); InputError for a file that cannot
    be read or holds none, so a bad --metrics-token-file stops the start, not the first scrape."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TOKEN_BYTES + 1)
    except OSError as e:
        raise InputError(str(path), None, f"cannot read the metrics token file ({e.strerror or e})") from None
    if len(raw) > MAX_TOKEN_BYTES:
        raise InputError(str(path), None, f"a metrics token file holds one token, not over {MAX_TOKEN_BYTES} bytes")
    try:
        lines = raw.decode().strip().splitlines()
    except UnicodeDecodeError:
        raise InputError(str(path), None, "the metrics token file is not UTF-8 text") from None
    token = lines[0].strip() if lines else ""
    if len(token) < 16 or any(c.isspace() for c in token):
        raise InputError(str(path), None, "give a token of at least 16 characters, without spaces, on the "
                                          "file's first line (e.g. python -c 'import secrets; "
                                          "print(secrets.token_urlsafe(32))')")
    return token


def authorized(header: Optional[str], token: Optional[str]) -> bool:
    """The request's Authorization header carries the token (compared in constant time); any
    request does when no token is set."""
    if token is None:
        return True
    scheme, _, given = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())
