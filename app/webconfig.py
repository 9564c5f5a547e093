"""How the web tier is sized and hardened: one place for the settings `python -m app` passes to
Flask (cookies, sessions), to waitress (threads, connections, body size, timeouts) and to the
guard against slow clients (app.slowclients: connections per address, header deadline)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from core.settings import WebSettings

from .scrape import read_token

_D = WebSettings()              # the defaults and the checks of the options (--threads, ...)
MAX_BODY_BYTES = 1 << 20      # the largest request body: a job spec or a worker report is far smaller


@dataclass(frozen=True)
class WebConfig:
    secure_cookies: bool = _D.secure_cookies   # the session cookie only over HTTPS (a site behind TLS)
    session_idle_s: float = _D.session_idle    # a browser session unused this long is logged out
    session_max_s: float = _D.session_max      # a browser session this old is logged out, however used
    threads: int = _D.threads                  # waitress worker threads
    connection_limit: int = _D.connection_limit  # open connections at once, idle keep-alives included (bench.load: 200 viewers + pollers)
    channel_timeout_s: int = _D.channel_timeout  # an idle connection is closed after this long
    max_body_bytes: int = MAX_BODY_BYTES
    # one address holds at most this many (0: no cap): above what one legitimate address holds (bench.load's
    # 220 from loopback, a TLS proxy's pool), below --connection-limit so one address never takes every slot
    per_address_limit: int = _D.per_address_limit
    header_timeout_s: float = _D.header_timeout  # a request's headers must be complete this long after its first byte
    metrics_interval_s: float = _D.metrics_interval  # /metrics is rebuilt at most this often (0: every scrape)
    metrics_token: Optional[str] = field(default=None, repr=False)  # /metrics wants it as a bearer token

    @classmethod
    def of(cls, w: WebSettings) -> "WebConfig":
        """The web tier from its checked options."""
        return cls(secure_cookies=w.secure_cookies, session_idle_s=w.session_idle,
                   session_max_s=w.session_max, threads=w.threads,
                   connection_limit=w.connection_limit, channel_timeout_s=w.channel_timeout,
                   per_address_limit=w.per_address_limit, header_timeout_s=w.header_timeout,
                   metrics_interval_s=w.metrics_interval,
                   metrics_token=read_token(w.metrics_token_file) if w.metrics_token_file else None)

    def waitress(self) -> dict:
        """waitress's adjustments (app.slowclients builds its server from them). A body over the
        limit is refused (413) from its Content-Length, before any of it is read or spooled to
        disk. poll(), not select(): the process's descriptors pass 1023 when a job's store is
        flooded, and select() then fails on every new connection, which ends the server."""
        return {"threads": self.threads, "connection_limit": self.connection_limit, "asyncore_use_poll": True,
                "channel_timeout": self.channel_timeout_s,
                "max_request_body_size": self.max_body_bytes + 1,      # waitress refuses from its limit on
                "max_request_header_size": 64 * 1024, "cleanup_interval": min(30, self.channel_timeout_s)}
