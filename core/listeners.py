"""Where the harvester listens, worked out once and tried before anything is written (issue 56,
item 7): `python -m app` and `--print-config` refuse, with one line naming the options, settings
whose servers could not all listen.

The servers: the web tier (the dashboard, the API and the workers' progress reports) on
--host:--port and, in live mode with --advertise, also at the same port on the address the nodes
reach (--bind, default --advertise); each job's store and the start's node checks on that address
(a free port each); with Slurm or PBS, the pilot hub (--slurm-hub HOST[:PORT]).

A wildcard host (0.0.0.0 for IPv4; :: for IPv6, where waitress sets IPV6_V6ONLY) already listens
on every address of its family, so a specific address of that family is not bound beside it at
the same port: on Linux that second bind fails with EADDRINUSE. It did for `--host 0.0.0.0
--advertise HEAD` (docs/start/own-machines.md, step 3), which now makes one listener.

What remains is tried with real sockets, bound, listening and closed at once (nothing is
accepted): a name that does not resolve here, an address that is not this machine's
(EADDRNOTAVAIL), a port another program holds (EADDRINUSE), a port below 1024 without the right
to it (EACCES), two of the harvester's own servers on one port. A port held while the harvester
of the same store runs is left to the store's lock, which names that harvester's PID at a start
(and `--print-config` tests a file before a restart, which frees the port).
"""
from __future__ import annotations

import errno
import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from .errors import SettingsError
from .storelock import StoreLock

if TYPE_CHECKING:
    from .settings import HarvesterSettings, LiveSettings

#: what each kind of server is, in a message
ROLES = {"web": "the web server (dashboard, API, workers' reports)", "stores": "the jobs' stores",
         "hub": "the Slurm pilot hub"}


@dataclass(frozen=True)
class Listener:
    """One socket a server of the harvester listens on: `sockaddr` numeric, with its port (0: any
    free port); `field` is the setting that names its address (`host`, `live.advertise`, ...)."""
    role: str
    field: str
    host: str
    family: int
    sockaddr: tuple

    @property
    def address(self) -> str:
        return self.sockaddr[0]

    @property
    def port(self) -> int:
        return self.sockaddr[1]

    @property
    def wildcard(self) -> bool:
        return ipaddress.ip_address(self.address.split("%", 1)[0]).is_unspecified

    @property
    def shown(self) -> str:
        """`10.1.0.5:8050`, `[::1]:8050`: waitress's `listen` takes this too."""
        return f"[{self.address}]:{self.port}" if self.family == socket.AF_INET6 else f"{self.address}:{self.port}"

    def overlaps(self, other: "Listener") -> bool:
        """Both cannot listen at once: one port, one family, the same address or a wildcard."""
        return (self.port != 0 and self.port == other.port and self.family == other.family
                and (self.address == other.address or self.wildcard or other.wildcard))


def resolve(host: str, port: int, field: str, role: str) -> list[Listener]:
    """Every address `host` names here, as waitress resolves its `listen` (passive, TCP)."""
    name = host.strip()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if not name:
        raise SettingsError(field, "give an address of this machine or a host name, not an empty one")
    try:
        found = socket.getaddrinfo(None if name == "*" else name, port, socket.AF_UNSPEC, socket.SOCK_STREAM,
                                   socket.IPPROTO_TCP, socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        why = getattr(e, "strerror", None) or str(e)
        raise SettingsError(field, f"{literal(host)} does not resolve on this machine ({why}), so {ROLES[role]} "
                                   f"cannot listen there: give one of its addresses{hint(field)}") from None
    out: list[Listener] = []
    for family, _, _, _, sockaddr in found:
        if family in (socket.AF_INET, socket.AF_INET6):
            listener = Listener(role, field, host, family, tuple(sockaddr))
            if all((listener.family, listener.address) != (o.family, o.address) for o in out):
                out.append(listener)
    if not out:
        raise SettingsError(field, f"{literal(host)} names no IPv4 or IPv6 address here")
    return out


def hint(field: str) -> str:
    """What else to give when the address `field` names cannot be listened on."""
    return {"host": ", or 0.0.0.0 for all of them",
            "live.advertise": "; or keep {live.advertise} for the address the nodes dial (a NAT's, a name this "
                              "machine does not know) and give {live.bind} one of this machine's addresses "
                              "(or 0.0.0.0)"}.get(field, "")


def literal(text: str) -> str:
    """Text inside a SettingsError message, its braces kept as written."""
    return text.replace("{", "{{").replace("}", "}}")


def collapse(listeners: Sequence[Listener]) -> list[Listener]:
    """One port's listeners less those a wildcard of their family already covers, and repeats."""
    wild = {it.family for it in listeners if it.wildcard}
    out: list[Listener] = []
    for it in listeners:
        covered = it.family in wild and not it.wildcard
        if covered or any((it.family, it.address) == (o.family, o.address) for o in out):
            continue
        out.append(it)
    return out


def bind_field(live: "LiveSettings") -> str:
    """The setting that names where the servers for the nodes listen."""
    return "live.bind" if live.bind else "live.advertise"


def plan(host: str, port: int, live: Optional["LiveSettings"]) -> list[Listener]:
    """Every socket the harvester will listen on: the web tier's first (what waitress binds),
    then the jobs' stores and the pilot hub; SettingsError for a name that does not resolve or
    a web port the nodes cannot be told."""
    web = resolve(host, port, "host", "web")
    if live is not None and live.advertise:
        web += resolve(live.bind_host, port, bind_field(live), "web")
    out = collapse(web)
    if live is None:
        return out
    if live.real_workers:
        if port == 0:
            raise SettingsError("port", "0 (any free port) cannot be told to the nodes, whose workers report "
                                        "their progress to it: give a port number")
        out.append(resolve(live.bind_host, 0, bind_field(live), "stores")[0])
    if live.uses_pilots and not live.slurm.dry_run:
        field = bind_field(live) if live.hub_on_bind else "live.slurm.hub_host"
        out.append(resolve(live.hub_host, live.slurm.hub_port, field, "hub")[0])
    return out


def web_listen(listeners: Sequence[Listener]) -> str:
    """waitress's `listen`: the web tier's sockets, numeric (a name is not resolved twice)."""
    return " ".join(it.shown for it in listeners if it.role == "web")


def check(listeners: Sequence[Listener], store: Optional[Path] = None) -> None:
    """Bind and listen on each socket, holding the earlier ones (so that two of the harvester's
    own servers on one port meet as they would), then close them all; SettingsError for the
    first that fails. A port in use while the harvester of `store` runs is not refused here."""
    held: list[tuple[Listener, socket.socket]] = []
    try:
        for it in listeners:
            sock = socket.socket(it.family, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)     # as waitress and the hub
                if it.family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(it.sockaddr)
                sock.listen(1)
            except OSError as e:
                sock.close()
                ours = next((o for o, _ in held if o.overlaps(it)), None)
                if e.errno == errno.EADDRINUSE and ours is None and store is not None and StoreLock(store).holder():
                    continue      # most likely that harvester's own port: its store's lock speaks at a start
                raise refusal(it, e, ours) from None
            held.append((it, sock))
    finally:
        for _, sock in held:
            sock.close()


def refusal(it: Listener, e: OSError, ours: Optional[Listener]) -> SettingsError:
    """What a failed bind means, as one line naming the options that set it."""
    what = ROLES[it.role]
    port_field = {"web": "port", "hub": "live.slurm.hub_host"}.get(it.role, it.field)   # who chose the port
    if ours is not None:
        by = f"{{{ours.field}}} and {{port}}" if ours.role == "web" else f"{{{ours.field}}}"
        return SettingsError(port_field, f"{what} would listen on {it.shown}, where {ROLES[ours.role]} listens by "
                                         f"{by}: one port cannot take both; give one of them another port")
    if e.errno == errno.EADDRINUSE:
        return SettingsError(port_field, f"port {it.port} is in use on {it.address} ({{{it.field}}}): another program "
                                         f"listens there, so {what} cannot; stop it or choose another port")
    if e.errno == errno.EADDRNOTAVAIL:
        return SettingsError(it.field, f"{literal(it.host)} is not an address of this machine, so {what} cannot "
                                       f"listen there: give one of its addresses{hint(it.field)}")
    if e.errno == errno.EACCES and 0 < it.port < 1024:
        return SettingsError(port_field, f"port {it.port} is below 1024, which only root (or a program with "
                                         f"CAP_NET_BIND_SERVICE) may listen on: choose a port from 1024")
    return SettingsError(it.field, f"{what} cannot listen on {it.shown}: {e.strerror or e}")


def check_listeners(host: str, port: int, settings: "HarvesterSettings") -> list[Listener]:
    """`plan` and `check` in one: the sockets to listen on, each tried; SettingsError naming
    the option for the first that cannot be had."""
    listeners = plan(host, port, settings.live)
    check(listeners, settings.db)
    return listeners
