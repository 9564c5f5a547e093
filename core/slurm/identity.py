"""What makes a restarted harvester the same hub to its pilots: the port it listens on, the
token pilots prove themselves with and the TLS certificate they pin. Kept beside the store
(`<db>.hub`, mode 0600, replaced whole), so pilots that lost the hub redial and are adopted
instead of cancelled (core/slurm/source.py)."""
from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from ..privatefiles import write_private
from .tls import new_identity

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
