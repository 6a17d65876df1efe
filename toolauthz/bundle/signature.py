"""Signed bundles: a JWS over a manifest of every file, checked before a bundle loads.

`BUNDLE/.signatures.json` holds `{"signatures": ["<JWS>"]}`, as OPA's bundles do: one
JWS in compact form, algorithm `Ed25519` (RFC 9864's name for EdDSA over Ed25519), its
protected header naming the key (`kid`). The payload is RFC 8785 canonical JSON:

    {"files": [{"name": "refunds.cedar", "algorithm": "SHA-256", "hash": "<hex>"}, ...],
     "revision": 1764633600, "keyid": "<kid>"}

`files` names every file the sidecar could read: all of the bundle but `tests/` (never
loaded) and the signature file itself. A bundle verifies when the JWS verifies with a
configured key of its `kid`, the files of its snapshot (bundle/snapshot.py: the bytes
read once, which the loader then parses) are exactly those named, each with its hash,
and the revision is not below the floor (a rollback). Every file name is a plain
relative path: no `..`, no absolute path, no backslash, none twice; a symlink
must point to a regular file inside the bundle.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Union

import rfc8785
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from toolauthz.bundle.snapshot import SIGNATURE_FILE as SIGNATURE_FILE
from toolauthz.bundle.snapshot import UNSIGNED_DIRS, BundleSnapshot, read_snapshot
from toolauthz.errors import BundleError, ToolAuthzError

ALGORITHM = "Ed25519"
MAX_SIGNATURE_BYTES = 4 << 20  # a manifest of 20,000 files; anything larger is refused unread
MAX_PUBLIC_KEY_BYTES = 16 * 1024
_HEX64 = re.compile(r"[0-9a-f]{64}")
_KID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_UNSIGNED_DIRS = UNSIGNED_DIRS


class SignatureError(ToolAuthzError):
    """The bundle's signature is missing, malformed, or does not match the bundle."""


@dataclass(frozen=True)
class SignedManifest:
    files: Mapping[str, str]  # relative path -> SHA-256 hex
    revision: int
    kid: str


def bundle_files(source: BundleSource) -> dict[str, str]:
    """Relative path -> SHA-256 hex of every file of the bundle that is signed: all of the
    snapshot but the signature file. A directory is read into a snapshot first; what a
    snapshot refuses (a symlink out of the bundle or to a directory, a file that is
    neither regular nor a symlink to one, a bundle over its bounds) is a SignatureError."""
    snapshot = as_snapshot(source)
    return {name: hashlib.sha256(data).hexdigest() for name, data in snapshot.items() if name != SIGNATURE_FILE}


BundleSource = Union[str, "os.PathLike[str]", BundleSnapshot]


def as_snapshot(source: BundleSource) -> BundleSnapshot:
    """`source` itself when it is a snapshot, else the directory read into one."""
    if isinstance(source, BundleSnapshot):
        return source
    try:
        return read_snapshot(source)
    except BundleError as exc:
        first = exc.problems[0]
        raise SignatureError(f"`{first.file}` {first.message}" if first.file != str(source) else first.message) \
            from None


def key_id(key: Ed25519PublicKey) -> str:
    """The default key id of a key: its RFC 7638 JWK thumbprint."""
    from joserfc.jwk import OKPKey

    return OKPKey.import_key(key).thumbprint()


def sign_bundle(root: BundleSource, key: Ed25519PrivateKey, kid: str, revision: int) -> bytes:
    """The signature file's content for the bundle in `root` (a snapshot, or a directory as
    it is now)."""
    if not _KID.fullmatch(kid):
        raise SignatureError("a key id is 1 to 128 letters, digits, `.`, `_`, `:` or `-`")
    if isinstance(revision, bool) or not 0 <= revision < 2 ** 53:
        raise SignatureError("the revision must be an integer from 0 to 2^53 - 1")
    payload: dict[str, Any] = {"files": [{"name": name, "algorithm": "SHA-256", "hash": digest}
                         for name, digest in bundle_files(root).items()],
               "revision": revision, "keyid": kid}
    from joserfc import jws
    from joserfc.jwk import OKPKey

    token = jws.serialize_compact({"alg": ALGORITHM, "kid": kid}, rfc8785.dumps(payload), OKPKey.import_key(key),
                                  algorithms=[ALGORITHM])
    return json.dumps({"signatures": [token]}, indent=2).encode() + b"\n"


def read_signature(source: BundleSource) -> bytes:
    """The signature file of the bundle, refused by its size before a byte of it is parsed."""
    data = as_snapshot(source).get(SIGNATURE_FILE)
    if data is None:
        raise SignatureError(f"the bundle is not signed: no `{SIGNATURE_FILE}`")
    if len(data) > MAX_SIGNATURE_BYTES:
        raise SignatureError(f"`{SIGNATURE_FILE}` is larger than {MAX_SIGNATURE_BYTES} bytes")
    return data


def verify_signature(data: bytes, keys: Mapping[str, Ed25519PublicKey]) -> SignedManifest:
    """The manifest the signature file `data` signs with one of `keys` (by kid)."""
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        raise SignatureError(f"`{SIGNATURE_FILE}` is not JSON") from None
    signatures = document.get("signatures") if isinstance(document, dict) else None
    if not isinstance(signatures, list) or len(signatures) != 1 or not isinstance(signatures[0], str):
        raise SignatureError(f"`{SIGNATURE_FILE}` must hold `signatures`: a list of one JWS")
    # Here, not at the top: a sidecar whose bundles are not signed never loads joserfc.
    from joserfc import jws
    from joserfc.errors import JoseError
    from joserfc.jwk import OKPKey

    try:
        header = jws.extract_compact(signatures[0].encode("ascii")).headers()
    except (JoseError, ValueError, UnicodeError):
        raise SignatureError("the signature is not a JWS in compact form") from None
    kid = header.get("kid")
    if header.get("alg") != ALGORITHM:
        raise SignatureError(f"the signature's algorithm must be `{ALGORITHM}`")
    if not isinstance(kid, str) or kid not in keys:
        shown = kid if isinstance(kid, str) and _KID.fullmatch(kid) else "?"
        raise SignatureError(f"the signature's key `{shown}` is not one of the configured bundle keys")
    try:
        payload = jws.deserialize_compact(signatures[0], OKPKey.import_key(keys[kid]),
                                          algorithms=[ALGORITHM]).payload
    except (JoseError, ValueError):
        raise SignatureError(f"the signature does not verify with key `{kid}`") from None
    return _manifest(payload, kid)


def _manifest(payload: bytes, kid: str) -> SignedManifest:
    try:
        body = json.loads(payload)
    except (ValueError, RecursionError):
        raise SignatureError("the signed manifest is not JSON") from None
    if not isinstance(body, dict) or body.get("keyid") != kid:
        raise SignatureError("the signed manifest does not name the key that signed it")
    revision, entries = body.get("revision"), body.get("files")
    # The range signing enforces (a JSON-safe integer): a larger one, even under a trusted
    # key, would overflow the store's floor and stop every later reload.
    if not isinstance(revision, int) or isinstance(revision, bool) or not 0 <= revision < 2 ** 53:
        raise SignatureError("the signed manifest has no valid `revision` (0 to 2^53-1)")
    if not isinstance(entries, list):
        raise SignatureError("the signed manifest has no `files` list")
    files: dict[str, str] = {}
    for entry in entries:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not _plain_path(name):
            raise SignatureError("the signed manifest names a file outside the bundle or not as a plain path")
        if name in files:
            raise SignatureError(f"the signed manifest names `{name}` twice")
        if entry.get("algorithm") != "SHA-256" or not _HEX64.fullmatch(str(entry.get("hash"))):
            raise SignatureError(f"the signed manifest's entry for `{name}` needs a SHA-256 `hash`")
        files[name] = entry["hash"]
    return SignedManifest(files, revision, kid)


def _plain_path(name: str) -> bool:
    parts = name.split("/")
    return (0 < len(name) <= 1024 and "\\" not in name and "\x00" not in name and not name.startswith("/")
            and all(part not in ("", ".", "..") for part in parts) and name != SIGNATURE_FILE
            and parts[0] not in _UNSIGNED_DIRS)


def verify_bundle(root: BundleSource, keys: Mapping[str, Ed25519PublicKey],
                  min_revision: int | None = None) -> SignedManifest:
    """The bundle `root` (a snapshot, or a directory read into one) checked against its
    signature, or SignatureError saying what is wrong: no signature, an unknown key, a bad
    signature, a file missing, added or altered, or a revision older than `min_revision`
    (the floor). The check covers exactly the snapshot's bytes: load the same snapshot."""
    snapshot = as_snapshot(root)
    manifest = verify_signature(read_signature(snapshot), keys)
    actual = bundle_files(snapshot)
    missing = sorted(set(manifest.files) - set(actual))
    added = sorted(set(actual) - set(manifest.files))
    altered = sorted(name for name in set(actual) & set(manifest.files) if actual[name] != manifest.files[name])
    for what, names in (("missing", missing), ("not signed", added), ("altered", altered)):
        if names:
            shown = ", ".join(f"`{name}`" for name in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5
                                                                     else "")
            raise SignatureError(f"the bundle does not match its signature: {what}: {shown}")
    if min_revision is not None and manifest.revision < min_revision:
        raise SignatureError(f"the bundle's revision {manifest.revision} is below the floor, {min_revision}: "
                             "a rollback is refused (toolauthz bundle allow-rollback)")
    return manifest


def load_public_key_file(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    """An Ed25519 public key from a PEM file (`SubjectPublicKeyInfo`)."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_PUBLIC_KEY_BYTES + 1)
    except OSError as exc:
        raise SignatureError(f"cannot read bundle key `{p}`: {exc.strerror}") from None
    try:
        key = ser.load_pem_public_key(data) if len(data) <= MAX_PUBLIC_KEY_BYTES else None
    except ValueError:
        key = None
    if not isinstance(key, Ed25519PublicKey):
        raise SignatureError(f"bundle key `{p}` is not an Ed25519 public key in PEM")
    return key
