"""Free TCP ports for the daemons the tests start (slurmctld and the slurmds, sshd, the app).

A port is chosen, released, and bound again later by the daemon. Chosen by the kernel
(`bind(port 0)`) it lies in the ephemeral range, which every outgoing connection and every other
`bind(0)` in the suite draws from too, so another process can take it in between: a CI run lost a
slurmd that way ("Unable to bind listen port ...: Address already in use"). Ports below that range
are handed out only on request, so a port chosen here stays free unless a test names it itself.
"""
from __future__ import annotations

import random
import socket
from pathlib import Path

RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10000     # clear of the well-known and registered ports daemons commonly sit on
MIN_POOL = 2000    # below this many candidates, let the kernel choose instead


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(x) for x in RANGE_FILE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999      # Linux's default


def _pool() -> range:
    low, high = ephemeral_range()
    below, above = range(LOWEST, low), range(high + 1, 65536)
    return max(below, above, key=len)


def _bind(port: int) -> socket.socket | None:
    """A socket bound to `port` on every address (as the daemons bind), or None where it is taken."""
    s = socket.socket()
    try:
        s.bind(("", port))
        return s
    except OSError:
        s.close()
        return None


def free_ports(n: int) -> list[int]:
    """n distinct ports free now, outside the ephemeral range where it leaves room (held together
    while chosen, so they differ)."""
    pool = _pool()
    held: list[socket.socket] = []
    try:
        if len(pool) >= MIN_POOL:
            for port in random.sample(pool, min(len(pool), 50 * n)):
                s = _bind(port)
                if s is not None:
                    held.append(s)
                    if len(held) == n:
                        break
        while len(held) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            held.append(s)
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]
