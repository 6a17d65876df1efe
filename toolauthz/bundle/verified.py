"""One snapshot from signature to decision: verify a `BundleSnapshot`, then load that same
snapshot. The one way a serving process turns bytes into a Bundle, whichever source the
bytes came from (a directory, an archive a bundle server serves)."""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from toolauthz.bundle.loader import Bundle, load_bundle
from toolauthz.bundle.signature import SIGNATURE_FILE, SignatureError, verify_bundle
from toolauthz.bundle.snapshot import BundleSnapshot
from toolauthz.errors import BundleError, Problem


def load_verified(snapshot: BundleSnapshot, keys: Mapping[str, Ed25519PublicKey] | None = None,
                  min_revision: int | None = None, *, name: str | os.PathLike[str] | None = None) -> Bundle:
    """The bundle of `snapshot`, parsed from the bytes the signature was checked over.
    With `keys` (bundle_verification) the snapshot must verify with one of them and its
    revision must not be below `min_revision` (the floor); a refusal is a BundleError on
    `.signatures.json`. `name`: what the bundle is called (the configured source)."""
    revision: int | None = None
    signer: str | None = None
    if keys is not None:
        try:
            manifest = verify_bundle(snapshot, keys, min_revision)
        except SignatureError as exc:
            raise BundleError([Problem(SIGNATURE_FILE, f"refused: {exc}")]) from None
        revision, signer = manifest.revision, manifest.kid
    bundle = load_bundle(snapshot)
    return dataclasses.replace(bundle, directory=pathlib.Path(name if name is not None else snapshot.source),
                               revision=revision, signer=signer)
