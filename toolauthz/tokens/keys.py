"""Ed25519 signing keys for PASETO v4.public tokens: loading, generating, publishing.

The key ring and its directory are in toolauthz/tokens/keyring.py. The kid is the PASERK id
(`k4.pid.…`) of the public key; it is only ever a dict key.
"""

from __future__ import annotations

import base64
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pyseto import Key, KeyInterface

from toolauthz.errors import KeyFileError
from toolauthz.files.bounded import FileRefused, read_bounded

_MAX_KEY_FILE_BYTES = 16 * 1024  # an RSA-8192 PEM is ~6 KiB; anything bigger is not a key
KEY_FILE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")  # a plain name, never a path


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode_strict(text: str) -> bytes | None:
    """Decode unpadded base64url, or None unless `text` is the one canonical encoding.

    The stdlib decoder skips characters outside the alphabet and ignores the unused
    trailing bits, so two different strings could decode to the same bytes.
    """
    if not re.fullmatch(r"[A-Za-z0-9_-]*", text) or len(text) % 4 == 1:
        return None
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    return data if b64url(data) == text else None


@dataclass(frozen=True)
class SigningKey:
    """A private key ready to sign: the pyseto key, its public half, and its kid."""

    key: KeyInterface = field(repr=False)  # pyseto v4.public key holding the private key
    public_key: KeyInterface  # pyseto v4.public key holding only the public key
    kid: str
    public_bytes: bytes  # raw 32-byte Ed25519 public key

    @classmethod
    def from_private(cls, private: Ed25519PrivateKey) -> SigningKey:
        raw = private.private_bytes(ser.Encoding.Raw, ser.PrivateFormat.Raw, ser.NoEncryption())
        pub = private.public_key().public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)
        public_key = Key.from_asymmetric_key_params(4, x=pub)
        return cls(Key.from_asymmetric_key_params(4, d=raw), public_key, public_key.to_paserk_id(), pub)

    @classmethod
    def generate(cls) -> SigningKey:
        return cls.from_private(Ed25519PrivateKey.generate())


@dataclass(frozen=True)
class KeyInfo:
    """What the CLI lists and GetKeys publishes about one key (never the private part)."""

    kid: str
    state: str
    created_at: float
    retired_at: float | None
    paserk: str  # k4.public.…
    jwk: dict[str, str] = field(compare=False)
    verifies_until: float | None = None  # None: no end (active or published)
    verifies: bool = True
    file: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The GetKeys entry; `verify_offline` accepts exactly this."""
        return {
            "kid": self.kid, "paserk": self.paserk, "jwk": dict(self.jwk), "state": self.state,
            "created_at": self.created_at, "retired_at": self.retired_at,
            "verifies_until": self.verifies_until,
        }


def public_jwk(public_bytes: bytes, kid: str) -> dict[str, str]:
    """RFC 8037 OKP JWK of an Ed25519 public key."""
    return {"kty": "OKP", "crv": "Ed25519", "x": b64url(public_bytes), "kid": kid, "use": "sig", "alg": "EdDSA"}


# ---------------------------------------------------------------- key files

def _parse_paserk_secret(text: str, path: str) -> Ed25519PrivateKey:
    # k4.secret is base64url(seed || public key); pyseto ignores the public half,
    # so check that it belongs to the seed rather than trust a mismatched file.
    parts = text.split(".")
    raw = b64url_decode_strict(parts[2]) if len(parts) == 3 else None
    if raw is None or len(raw) != 64:
        raise KeyFileError(f"key file `{path}` holds a malformed `k4.secret` PASERK")
    private = Ed25519PrivateKey.from_private_bytes(raw[:32])
    if private.public_key().public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw) != raw[32:]:
        raise KeyFileError(f"key file `{path}` holds a `k4.secret` whose public half does not match its secret half")
    return private


def _parse_pem(data: bytes, path: str) -> Ed25519PrivateKey:
    if b"-----BEGIN PUBLIC KEY-----" in data or b"-----BEGIN CERTIFICATE-----" in data:
        raise KeyFileError(f"key file `{path}` holds a public key, not an Ed25519 private key")
    try:
        key = ser.load_pem_private_key(data, password=None)
    except TypeError:
        raise KeyFileError(f"key file `{path}` is encrypted; store it unencrypted with mode 0600") from None
    except Exception:  # noqa: BLE001 - whatever cryptography raises, the file is not a usable key
        raise KeyFileError(f"key file `{path}` is not a PKCS#8 PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        kind = type(key).__name__.removesuffix("PrivateKey")  # RSA, EC, X25519, Ed448, DSA, ...
        raise KeyFileError(f"key file `{path}` holds a `{kind}` key, not an Ed25519 private key")
    return key


def load_private_key_file(path: str | os.PathLike[str]) -> SigningKey:
    """Load an Ed25519 private key (PKCS#8 PEM or PASERK `k4.secret`), refusing open modes."""
    return SigningKey.from_private(load_ed25519_private_key(path))


def load_ed25519_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """The Ed25519 private key of a key file, as `load_private_key_file` reads it."""
    p = os.fspath(path)

    def private_mode(st: os.stat_result) -> None:
        if st.st_mode & 0o077:
            raise KeyFileError(
                f"key file `{p}` has mode {stat.S_IMODE(st.st_mode):04o}; it must not be "
                "accessible by group or others (chmod 600)")

    try:
        data = read_bounded(p, _MAX_KEY_FILE_BYTES, private_mode)
    except FileNotFoundError:
        raise KeyFileError(f"key file `{p}` does not exist") from None
    except OSError as err:
        raise KeyFileError(f"cannot open key file `{p}`: {err.strerror}") from None
    except FileRefused as refused:
        problem = "is not a regular file" if refused.reason == "not_regular" else "is too large to be a key"
        raise KeyFileError(f"key file `{p}` {problem}") from None
    text = data.strip()
    if text.startswith(b"k4.secret."):
        private = _parse_paserk_secret(text.decode("ascii", "replace"), p)
    elif text.startswith(b"-----BEGIN "):
        private = _parse_pem(data, p)
    else:
        raise KeyFileError(f"key file `{p}` is not an Ed25519 private key (PKCS#8 PEM or `k4.secret` PASERK)")
    return private


def create_private_file(path: str, data: bytes) -> None:
    # O_EXCL with mode 0600: the file never exists with wider permissions, and an
    # existing file (or a planted symlink) is never overwritten.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask may have removed bits we need to read it back
        os.write(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)


def generate_key_file(path: str | os.PathLike[str]) -> str:
    """Write a new Ed25519 PKCS#8 PEM private key with mode 0600; return its kid."""
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    try:
        create_private_file(os.fspath(path), pem)
    except FileExistsError:
        raise KeyFileError(f"key file `{os.fspath(path)}` already exists") from None
    return SigningKey.from_private(private).kid
