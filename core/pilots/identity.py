"""What makes a restarted harvester the same hub to its pilots: the port it listens on, the
token pilots prove themselves with and the TLS certificate they pin. Kept beside the store
(`<db>.hub`, mode 0600, replaced whole), so pilots that lost the hub redial and are adopted
instead of cancelled (core/pilots/source.py)."""
from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import logging
from typing import Callable

from ..privatefiles import write_private
from .hub import PilotHub
from .link import PilotLink
from .stats import PilotStats
from .settings import PilotSettings
from .tls import new_identity

log = logging.getLogger(__name__)
MIN_TOKEN_CHARS = 32


class IdentityError(ValueError):
    """The identity file is damaged: one line naming it and what to do."""


@dataclass(frozen=True)
class HubIdentity:
    token: str
    cert_pem: str
    key_pem: str
    port: int = 0                   # 0: not bound yet

    @classmethod
    def new(cls) -> "HubIdentity":
        cert, key = new_identity()
        return cls(secrets.token_urlsafe(32), cert, key)

    def with_port(self, port: int) -> "HubIdentity":
        return HubIdentity(self.token, self.cert_pem, self.key_pem, int(port))


def beside(db: Path) -> Path:
    """Where the identity of the harvester on store `db` is kept."""
    return Path(str(db) + ".hub")


def load(path: Path) -> Optional[HubIdentity]:
    """The identity kept at `path`, None if there is none; IdentityError if it is damaged."""
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise IdentityError(f"{path}: cannot read the pilot hub's identity ({e.strerror})") from None
    try:
        d = json.loads(raw)
        ident = HubIdentity(str(d["token"]), str(d["cert_pem"]), str(d["key_pem"]), int(d["port"]))
    except (ValueError, KeyError, TypeError):
        ident = None
    if ident is None or len(ident.token) < MIN_TOKEN_CHARS or not 0 <= ident.port <= 65535:
        raise IdentityError(f"{path}: the pilot hub's identity is damaged; delete it (running pilots "
                            "then cannot be adopted and are cancelled) and start again")
    return ident


def save(path: Path, ident: HubIdentity) -> None:
    write_private(path, json.dumps(asdict(ident)))


def kept(s: PilotSettings) -> tuple[HubIdentity, bool]:
    """The hub's port, token and certificate: those kept at `s.state_file` if an earlier run
    left them (True: pilots of that run may be alive and redial), else new ones."""
    ident = load(Path(s.state_file)) if s.state_file else None
    return (ident, True) if ident is not None else (HubIdentity.new(), False)


def open_hub(s: PilotSettings, ident: HubIdentity, on_hello: Callable[[PilotLink], None],
             on_leave: Callable[[PilotLink, str], None], stats: Optional[PilotStats] = None) -> PilotHub:
    """The hub, on the kept port unless the settings name one (then the earlier run's pilots
    cannot redial and are given back after `pending_timeout_s`); its port is kept too."""
    port = s.hub_port or ident.port

    def hub(port: int) -> PilotHub:
        return PilotHub(ident.token, on_hello, on_leave, s.hub_host, port,
                        max_connections=s.hub_connection_cap, identity=(ident.cert_pem, ident.key_pem),
                        stats=stats)
    try:
        h = hub(port)
    except OSError as e:
        if s.hub_port or not port:
            raise
        log.warning("cannot listen on port %d again (%s): pilots of the earlier run cannot redial", port, e)
        h = hub(0)
    if s.state_file:
        save(Path(s.state_file), ident.with_port(h.address[1]))
    return h
