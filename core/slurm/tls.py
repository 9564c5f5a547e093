"""The hub's TLS identity: a self-signed certificate and key made at start, for this run only.
Pilots pin it by its SHA-256 fingerprint (given in their environment), so no CA is involved and
nothing has to be installed on the nodes. The key never rests on disk in clear: `ssl` loads keys
from files only, so it passes through a private temporary file, encrypted with a one-time
password, which is removed at once."""
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


def server_context() -> tuple[ssl.SSLContext, str]:
    """A TLS server context with a fresh certificate, and that certificate's fingerprint."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, COMMON_NAME)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .sign(key, hashes.SHA256()))
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
        ctx.load_cert_chain(path, password=password)
    finally:
        os.unlink(path)
    return ctx, fingerprint(cert.public_bytes(serialization.Encoding.DER))
