"""The job's store as only its members can write it: a namespace and an HMAC on every value.

A TCPStore has no authentication, and any client can list its keys (`list_keys`), so a key
prefix alone hides nothing. Every key a coordinator and its workers use therefore lives under a
namespace derived from the per-job secret (a non-member who writes the usual key names writes keys
nobody reads), and every value carries an HMAC-SHA256 of (key, value) under the secret: a value a
non-member wrote, or copied from another key, reads as absent. This covers the process group's
rendezvous too (`SignedStore` is a `dist.Store`, so gloo/nccl rendezvous through it). Counters
(`add`) cannot carry a tag; values are readable by anyone who reaches the port (integrity, not
confidentiality), and a non-member can still delete or overwrite keys (denial of service).
"""
from __future__ import annotations

import hashlib
import hmac
import time
from datetime import timedelta
from typing import Optional

import torch.distributed as dist

__all__ = ["TAG_BYTES", "SignedStore", "namespace", "signed"]

TAG_BYTES = 32
_RETRY_S = 0.01


def namespace(secret: str) -> str:
    """The job's key prefix: derived from the secret, which itself never goes over the wire."""
    return "job-" + hmac.new(secret.encode(), b"namespace", hashlib.sha256).hexdigest()[:24]


def signed(store: dist.Store, secret: str, timeout_s: float = 30.0) -> "SignedStore":
    """`store` (a TCPStore, server or client) as the job's members see it."""
    return SignedStore(dist.PrefixStore(namespace(secret), store), secret, timeout_s)


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class SignedStore(dist.Store):
    """A store whose values are tagged with HMAC(secret, key, value); see the module docstring.

    `get` waits (up to `timeout_s`) until the key holds a value with a valid tag, as TCPStore's
    `get` waits for a missing key; `read` is one non-blocking attempt (None if absent or forged).
    `rejected` counts the forged values seen. Thread-safe as the wrapped store is."""

    def __init__(self, inner: dist.Store, secret: str, timeout_s: float = 30.0) -> None:
        super().__init__()
        self._inner = inner
        self._key = secret.encode()
        self._timeout_s = float(timeout_s)
        self.rejected = 0

    # ------------------------------------------------------------------ tags
    def _tag(self, key: str, value: bytes) -> bytes:
        return hmac.new(self._key, key.encode() + b"\0" + value, hashlib.sha256).digest()

    def _seal(self, key: str, value: bytes | str) -> bytes:
        raw = _bytes(value)
        return raw + self._tag(key, raw)

    def _open(self, key: str, raw: bytes) -> Optional[bytes]:
        value, tag = raw[:-TAG_BYTES], raw[-TAG_BYTES:]
        if len(raw) >= TAG_BYTES and hmac.compare_digest(tag, self._tag(key, value)):
            return value
        self.rejected += 1
        return None

    # ------------------------------------------------------------------ values
    def set(self, key: str, value: bytes | str) -> None:
        self._inner.set(key, self._seal(key, value))

    def read(self, key: str) -> Optional[bytes]:
        """The key's value if present and genuine, else None (never blocks on a missing key)."""
        if not self._inner.check([key]):
            return None
        return self._open(key, self._inner.get(key))

    def get(self, key: str) -> bytes:
        deadline = time.monotonic() + self._timeout_s
        while True:
            value = self._open(key, self._inner.get(key))
            if value is not None:
                return value
            if time.monotonic() > deadline:
                raise RuntimeError(f"timeout: no genuine value for store key {key!r}")
            time.sleep(_RETRY_S)        # a forged value: the genuine writer overwrites it

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.get(k) for k in keys]

    def multi_set(self, keys: list[str], values: list[bytes | str]) -> None:
        self._inner.multi_set(keys, [self._seal(k, v) for k, v in zip(keys, values)])

    def compare_set(self, key: str, expected_value: bytes | str,
                    desired_value: bytes | str) -> bytes:
        """Set `desired_value` if the key is absent (`expected_value` empty) or holds exactly
        `expected_value`, genuine; returns the genuine value now there (b"" if forged)."""
        expected = _bytes(expected_value)
        sealed = self._seal(key, expected) if expected else b""
        now = self._inner.compare_set(key, sealed, self._seal(key, desired_value))
        return self._open(key, now) or b""

    # ------------------------------------------------------------------ untagged operations
    def add(self, key: str, value: int) -> int:
        return self._inner.add(key, value)

    def check(self, keys: list[str]) -> bool:
        return self._inner.check(keys)

    def wait(self, keys: list[str], timeout: Optional[timedelta] = None) -> None:
        if timeout is None:
            self._inner.wait(keys)
        else:
            self._inner.wait(keys, timeout)

    def delete_key(self, key: str) -> bool:
        return self._inner.delete_key(key)

    def num_keys(self) -> int:
        return self._inner.num_keys()
