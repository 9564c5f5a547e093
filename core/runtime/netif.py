"""Which network interface a rank's process group uses: the one that reaches the job's store.

Gloo (and NCCL's bootstrap) pick an interface from the host's own name; where that name
resolves to loopback (Debian's `127.0.1.1 <hostname>`) or to an address other nodes cannot
reach, every rank advertises an address its peers cannot dial. The route the kernel takes to
the store's host is the one that reaches the head, so it reaches the other nodes as well.
"""
from __future__ import annotations

import fcntl
import logging
import os
import socket
import struct
from typing import Optional

log = logging.getLogger(__name__)
SIOCGIFADDR = 0x8915           # Linux: an interface's IPv4 address
IFNAME = "GLOO_SOCKET_IFNAME"


def address_towards(host: str, port: int) -> Optional[str]:
    """This host's IPv4 address on the route to `host` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return s.getsockname()[0]
    except OSError:
        return None


def interface_of(address: str) -> Optional[str]:
    """The name of the interface that holds IPv4 `address`, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue          # down, or no IPv4 address
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return None


def bind_towards(host: str, port: int, env: "os._Environ[str] | dict[str, str]" = os.environ) -> Optional[str]:
    """Set GLOO_SOCKET_IFNAME to the interface that reaches `host` where the site or the user
    has not set it; returns the interface chosen (None: left as it was). NCCL's own choice is
    left alone: its data goes over InfiniBand or what NCCL_SOCKET_IFNAME says."""
    if env.get(IFNAME):
        return None
    address = address_towards(host, port)
    name = interface_of(address) if address else None
    if name is None:
        log.info("no interface found towards %s: gloo picks one from the host name", host)
        return None
    env[IFNAME] = name
    return name
