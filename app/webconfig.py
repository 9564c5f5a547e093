"""How the web tier is sized and hardened: one place for the settings `python -m app` passes to
Flask (cookies, sessions), to waitress (threads, connections, body size, timeouts) and to the
guard against slow clients (app.slowclients: connections per address, header deadline)."""
from __future__ import annotations

from dataclasses import dataclass

MAX_BODY_BYTES = 1 << 20      # the largest request body: a job spec or a worker report is far smaller


@dataclass(frozen=True)
class WebConfig:
    secure_cookies: bool = False          # the session cookie only over HTTPS (a site behind TLS)
    session_idle_s: float = 8 * 3600      # a browser session unused this long is logged out
    threads: int = 8                      # waitress worker threads
    connection_limit: int = 500           # open connections at once, idle keep-alives included (bench.load: 200 viewers + pollers)
    channel_timeout_s: int = 30           # an idle connection is closed after this long
    max_body_bytes: int = MAX_BODY_BYTES
    # one address holds at most this many (0: no cap): above what one legitimate address holds (bench.load's
    # 220 from loopback, a TLS proxy's pool), below --connection-limit so one address never takes every slot
    per_address_limit: int = 256
    header_timeout_s: float = 10.0        # a request's headers must be complete this long after its first byte

    def waitress(self) -> dict:
        """waitress's adjustments (app.slowclients builds its server from them). A body over the
        limit is refused (413) from its Content-Length, before any of it is read or spooled to
        disk. poll(), not select(): the process's descriptors pass 1023 when a job's store is
        flooded, and select() then fails on every new connection, which ends the server."""
        return {"threads": self.threads, "connection_limit": self.connection_limit, "asyncore_use_poll": True,
                "channel_timeout": self.channel_timeout_s,
                "max_request_body_size": self.max_body_bytes + 1,      # waitress refuses from its limit on
                "max_request_header_size": 64 * 1024, "cleanup_interval": min(30, self.channel_timeout_s)}
