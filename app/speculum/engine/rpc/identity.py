"""A secure worker's identity: its self-signed certificate, key and pairing token, kept in the
data folder and made on first start; clients pin the certificate's fingerprint, so no
certificate authority is involved."""

from __future__ import annotations

import base64
import datetime
import hashlib
import os
import secrets
import ssl
from dataclasses import dataclass
from pathlib import Path

from ...errors import SpeculumError
from .address import TOKEN_CHARS


def fingerprint_of(der: bytes) -> str:
    """A certificate's SHA-256 as the pairing string writes it (unpadded base64url, 43 characters)."""
    return base64.urlsafe_b64encode(hashlib.sha256(der).digest()).rstrip(b"=").decode()


@dataclass(frozen=True)
class Identity:
    cert_file: Path
    key_file: Path
    fingerprint: str
    token: str


def worker_identity(folder: Path, renew: bool = False) -> tuple[Identity, bool]:
    """The worker's certificate and token from ``folder``, made there when absent, unreadable or
    ``renew``; returns (identity, whether it was made now)."""
    cert_file, key_file, token_file = folder / "cert.pem", folder / "key.pem", folder / "token"
    if not renew:
        try:
            token = token_file.read_text(encoding="ascii").strip()
            der = ssl.PEM_cert_to_DER_cert(cert_file.read_text(encoding="ascii"))
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_file, key_file)
            if len(token) == TOKEN_CHARS:
                return Identity(cert_file, key_file, fingerprint_of(der), token), False
        except (OSError, ValueError, ssl.SSLError):
            pass  # made anew below: the old pairing strings stop working, which the worker says
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpeculumError(f"Cannot create {folder} for the worker's certificate: {exc.strerror or exc}.") from None
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "speculum rpc-worker")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=3650)).sign(key, hashes.SHA256()))
    token = base64.urlsafe_b64encode(secrets.token_bytes(16)).rstrip(b"=").decode()
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    try:
        for path, data in ((key_file, key_pem), (token_file, token.encode()),
                           (cert_file, cert.public_bytes(serialization.Encoding.PEM))):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the key and token are secrets
            if hasattr(os, "fchmod"):  # platform: not on Windows
                os.fchmod(fd, 0o600)  # (a file that was there keeps its mode through O_CREAT)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
    except OSError as exc:
        raise SpeculumError(f"Cannot write the worker's certificate to {folder}: {exc.strerror or exc}.") from None
    der = cert.public_bytes(serialization.Encoding.DER)
    return Identity(cert_file, key_file, fingerprint_of(der), token), True
