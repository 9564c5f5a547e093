"""The hub's TLS identity: a self-signed certificate and its key. Pilots pin it by its SHA-256
fingerprint (given in their environment), so no CA is involved and nothing has to be installed
on the nodes. The identity is kept with the store (`core/pilots/identity.py`, a file only this
user reads) so that a restarted harvester is the same hub its pilots dial. `ssl` loads keys from
files only: the key passes through a private temporary file, encrypted with a one-time password,
removed at once."""
from __future__ import annotations

import datetime
import os
import secrets
import ssl
import tempfile

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from .wire import fingerprint

COMMON_NAME = "harvest-pilot-hub"
VALID_DAYS = 3650            # the pin is what counts; the pilots check no dates


def new_identity() -> tuple[str, str]:
    """A fresh certificate and key, as PEM text (the key unencrypted: keep it private)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, COMMON_NAME)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM).decode(),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()).decode())


def server_context(identity: tuple[str, str] | None = None) -> tuple[ssl.SSLContext, str]:
    """A TLS server context for `identity` (cert PEM, key PEM; a fresh one if None), and the
    certificate's fingerprint. ValueError if the PEM text is not a certificate and its key."""
    cert_pem, key_pem = identity or new_identity()
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
        key = serialization.load_pem_private_key(key_pem.encode(), None)
    except (ValueError, TypeError) as e:
        raise ValueError(f"not a certificate and its key: {e}") from None
    password = secrets.token_bytes(32)
    pem = cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(password))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.num_tickets = 0                 # no resumption: one connection per pilot, for its life
    fd, path = tempfile.mkstemp(prefix="pilot-hub-", suffix=".pem")     # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        try:
            ctx.load_cert_chain(path, password=password)
        except ssl.SSLError as e:
            raise ValueError(f"the key does not match the certificate: {e}") from None
    finally:
        os.unlink(path)
    return ctx, fingerprint(cert.public_bytes(serialization.Encoding.DER))
