"""A bundle from files held in memory (POSIX relative path -> bytes), as a bundle
archive gives them (archive.py): the signature checked over exactly those bytes, then
the bundle loaded from them.

`load_bundle_files` is the one function the bundle server's activation path calls. The
loader reads a directory today; a parallel change (branch h-bundle-snapshot) makes it
parse from such a mapping. Until that merges, `load_bundle_files` writes the verified
bytes to a private temporary directory and loads that, then checks what was loaded
against the signature once more.
TEMPORARY: at the merge, re-point `load_bundle_files` to the loader that takes the
mapping, and delete `_load_via_private_directory`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import tempfile
from collections.abc import Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from toolauthz.bundle.loader import Bundle, load_bundle
from toolauthz.bundle.signature import (
    MAX_SIGNATURE_BYTES,
    SIGNATURE_FILE,
    SignatureError,
    SignedManifest,
    bundle_files,
    verify_signature,
)
from toolauthz.errors import BundleError, Problem

_UNSIGNED_PREFIX = "tests/"  # never loaded, never signed (signature.py)


def verify_files(files: Mapping[str, bytes], keys: Mapping[str, Ed25519PublicKey],
                 min_revision: int | None = None) -> SignedManifest:
    """The manifest the files' `.signatures.json` signs, when the files (all but `tests/`)
    are exactly those it names with their hashes and the revision is not below
    `min_revision`; else SignatureError saying what is wrong."""
    signature = files.get(SIGNATURE_FILE)
    if signature is None:
        raise SignatureError(f"the bundle is not signed: no `{SIGNATURE_FILE}`")
    if len(signature) > MAX_SIGNATURE_BYTES:
        raise SignatureError(f"`{SIGNATURE_FILE}` is larger than {MAX_SIGNATURE_BYTES} bytes")
    manifest = verify_signature(signature, keys)
    actual = {name for name in files if name != SIGNATURE_FILE and not name.startswith(_UNSIGNED_PREFIX)}
    missing, added = sorted(set(manifest.files) - actual), sorted(actual - set(manifest.files))
    altered = sorted(name for name in actual & set(manifest.files)
                     if hashlib.sha256(files[name]).hexdigest() != manifest.files[name])
    for what, names in (("missing", missing), ("not signed", added), ("altered", altered)):
        if names:
            shown = ", ".join(f"`{name}`" for name in names[:5]) + (f" and {len(names) - 5} more"
                                                                     if len(names) > 5 else "")
            raise SignatureError(f"the bundle does not match its signature: {what}: {shown}")
    if min_revision is not None and manifest.revision < min_revision:
        raise SignatureError(f"the bundle's revision {manifest.revision} is older than the serving one, "
                             f"{min_revision}: a rollback is refused")
    return manifest


def load_bundle_files(files: Mapping[str, bytes], keys: Mapping[str, Ed25519PublicKey],
                      min_revision: int | None = None) -> Bundle:
    """The bundle the signed `files` hold, or BundleError (a signature refusal is a
    problem on `.signatures.json`, as a directory's is). Its `directory` names no
    directory that still exists: the bundle's place is its source (status shows the
    bundle server's URL)."""
    try:
        manifest = verify_files(files, keys, min_revision)
    except SignatureError as exc:
        raise BundleError([Problem(SIGNATURE_FILE, f"refused: {exc}")]) from None
    signed = {path: data for path, data in files.items() if not path.startswith(_UNSIGNED_PREFIX)}
    bundle = _load_via_private_directory(signed, manifest)
    return dataclasses.replace(bundle, revision=manifest.revision)


def _load_via_private_directory(files: Mapping[str, bytes], manifest: SignedManifest) -> Bundle:
    """TEMPORARY (see the module's docstring). The directory is created mode 0700 by this
    process and removed before returning; what was loaded from it is checked against the
    signed hashes after the load, so a file changed under it is refused, never served."""
    with tempfile.TemporaryDirectory(prefix="toolauthz-bundle-") as directory:
        root = pathlib.Path(directory)
        for path, data in files.items():
            target = root / path
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        bundle = load_bundle(root)
        try:
            after = bundle_files(root)
        except (SignatureError, OSError) as exc:
            raise BundleError([Problem(SIGNATURE_FILE, f"refused: {exc}")]) from None
        if after != manifest.files:
            raise BundleError([Problem(SIGNATURE_FILE, "refused: the bundle changed while it was loaded")])
        return bundle
