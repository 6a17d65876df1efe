"""Certificates made in the tests (nothing checked in): a CA, and server and client
certificates it signs, as PEM bytes or files.

    ca = CertificateAuthority()
    server = ca.issue(dns=("localhost",), ips=("127.0.0.1",))         # a server certificate
    alice = ca.issue(uris=("spiffe://acme.example/agent/support",))   # a client certificate
    cert_file, key_file = alice.write(tmp_path, "alice")
    ca_file = ca.write(tmp_path / "ca.pem")
"""

from __future__ import annotations

import datetime
import ipaddress
import pathlib
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_NOW = datetime.datetime.now(datetime.UTC)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, PEM."""

    certificate_pem: bytes
    key_pem: bytes

    def write(self, directory: pathlib.Path, stem: str) -> tuple[pathlib.Path, pathlib.Path]:
        """Writes `stem.pem` and `stem.key` in `directory`; returns (cert file, key file)."""
        directory.mkdir(parents=True, exist_ok=True)
        cert, key = directory / f"{stem}.pem", directory / f"{stem}.key"
        cert.write_bytes(self.certificate_pem)
        key.write_bytes(self.key_pem)
        key.chmod(0o600)
        return cert, key


class CertificateAuthority:
    def __init__(self, name: str = "toolauthz test CA"):
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.certificate = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(_NOW - datetime.timedelta(days=1)).not_valid_after(_NOW + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .sign(self.key, hashes.SHA256()))

    @property
    def pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def write(self, path: pathlib.Path) -> pathlib.Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.pem)
        return path

    def issue(self, *, common_name: str = "", uris: tuple[str, ...] = (), dns: tuple[str, ...] = (),
              ips: tuple[str, ...] = (), not_before: datetime.datetime | None = None,
              not_after: datetime.datetime | None = None) -> Issued:
        """A leaf certificate for both server and client authentication. Validity: from a
        day ago to 30 days from now unless given (an expired one: `not_after` in the past)."""
        key = ec.generate_private_key(ec.SECP256R1())
        names = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)] if common_name else []
        builder = (
            x509.CertificateBuilder().subject_name(x509.Name(names)).issuer_name(self.certificate.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(not_before or _NOW - datetime.timedelta(days=1))
            .not_valid_after(not_after or _NOW + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False))
        alt_names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(u) for u in uris]
        alt_names += [x509.DNSName(d) for d in dns]
        alt_names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if alt_names:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=not names)
        certificate = builder.sign(self.key, hashes.SHA256())
        return Issued(certificate.public_bytes(serialization.Encoding.PEM), _pem_key(key))

    def server(self) -> Issued:
        """A server certificate for 127.0.0.1 and localhost."""
        return self.issue(common_name="toolauthz sidecar", dns=("localhost",), ips=("127.0.0.1",))
