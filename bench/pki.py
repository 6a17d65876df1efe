"""Certificates for the mTLS run: a CA, the sidecar's certificate for 127.0.0.1 and a
client certificate with a SPIFFE URI SAN, written as PEM files (made per run, never kept)."""

from __future__ import annotations

import datetime
import ipaddress
import pathlib

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CLIENT_ID = "spiffe://bench.example/agent"


def _write_key(key: ec.EllipticCurvePrivateKey, path: pathlib.Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def make_pki(directory: pathlib.Path) -> dict[str, str]:
    """Writes ca.pem, server.pem/.key and client.pem/.key; returns their paths by role:
    ca, server_cert, server_key, client_cert, client_key."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "toolauthz bench CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True).sign(ca_key, hashes.SHA256()))
    paths = {"ca": directory / "ca.pem"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for role, names in (("server", [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                        ("client", [x509.UniformResourceIdentifier(CLIENT_ID)])):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(x509.Name([])).issuer_name(ca_name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName(names), critical=True).sign(ca_key, hashes.SHA256()))
        paths[f"{role}_cert"], paths[f"{role}_key"] = directory / f"{role}.pem", directory / f"{role}.key"
        paths[f"{role}_cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, paths[f"{role}_key"])
    return {role: str(path) for role, path in paths.items()}
