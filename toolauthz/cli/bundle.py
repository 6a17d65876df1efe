"""`toolauthz bundle sign|verify|build`: sign a bundle in CI, verify it as the sidecar
would, and pack it for a bundle server.

    toolauthz bundle sign [BUNDLE] --key FILE [--kid KID] [--revision N]
    toolauthz bundle verify [BUNDLE | ARCHIVE] (--key KID=PEM ... | --config FILE) [--min-revision N]
    toolauthz bundle build [BUNDLE] -o bundle.tar.gz

`sign` writes `BUNDLE/.signatures.json` (toolauthz/bundle/signature.py) with an Ed25519
private key file (PKCS#8 PEM, mode 0600, as the other keys). The key id defaults to the
public key's RFC 7638 thumbprint; the revision to the current Unix time, so that each
signing in CI is newer than the last. `verify` runs the check `serve` and every reload
run before loading, offline: with the keys given, or those of the config's
`bundle_verification`.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

from toolauthz.bundle.signature import (
    SIGNATURE_FILE,
    SignatureError,
    key_id,
    load_public_key_file,
    sign_bundle,
    verify_bundle,
)
from toolauthz.display.escape import shown
from toolauthz.errors import ToolAuthzError


def cmd_sign(args: argparse.Namespace) -> int:
    from toolauthz.tokens.keys import load_ed25519_private_key

    key = load_ed25519_private_key(args.key)
    kid = args.kid or key_id(key.public_key())
    revision = args.revision if args.revision is not None else int(time.time())
    root = pathlib.Path(args.bundle)
    data = sign_bundle(root, key, kid, revision)
    target = root / SIGNATURE_FILE
    temporary = root / f"{SIGNATURE_FILE}.tmp"
    temporary.write_bytes(data)
    os.replace(temporary, target)  # a watcher never reads half a signature
    print(f"signed {root} with key {kid}, revision {revision}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from toolauthz.server.reload import bundle_snapshot

    keys = _keys(args)
    try:
        if os.path.isfile(args.bundle):  # an archive of `bundle build`: read as a sidecar reads it
            manifest = _verify_archive(args.bundle, keys, args.min_revision)
        else:
            manifest = verify_bundle(bundle_snapshot(args.bundle), keys, args.min_revision)
    except SignatureError as exc:
        print(f"{shown(args.bundle)}: refused: {exc}", file=sys.stderr)
        return 1
    print(f"ok: {len(manifest.files)} files signed with key {manifest.kid}, revision {manifest.revision}")
    return 0


def _verify_archive(path: str, keys: dict, min_revision: int | None):
    from toolauthz.bundle.archive import DEFAULT_LIMITS, ArchiveError, read_archive
    from toolauthz.bundle.from_files import verify_files
    from toolauthz.files.bounded import FileRefused, read_bounded

    try:
        data = read_bounded(path, DEFAULT_LIMITS.max_compressed_bytes)
        return verify_files(read_archive(data), keys, min_revision)
    except FileRefused:
        raise SignatureError(f"the archive is larger than {DEFAULT_LIMITS.max_compressed_bytes} bytes") from None
    except OSError as exc:
        raise SignatureError(f"cannot read the archive: {exc.strerror}") from None
    except ArchiveError as exc:
        raise SignatureError(str(exc)) from None


def cmd_build(args: argparse.Namespace) -> int:
    import hashlib

    from toolauthz.bundle.archive import build_archive

    try:
        data = build_archive(args.bundle)
    except SignatureError as exc:
        print(f"{shown(args.bundle)}: refused: {exc}", file=sys.stderr)
        return 1
    target = pathlib.Path(args.output)
    temporary = target.with_name(f".{target.name}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, target)  # an uploader never reads half an archive
    print(f"wrote {target}: {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}")
    return 0


def _keys(args: argparse.Namespace) -> dict:
    if args.key:
        keys = {}
        for item in args.key:
            kid, sep, path = item.partition("=")
            if not sep or not kid or not path:
                raise ToolAuthzError(f"--key takes KID=PEM_FILE, not `{shown(item)}`")
            keys[kid] = load_public_key_file(path)
        return keys
    from toolauthz.server.config import load_settings

    settings = load_settings(args.config)
    if settings.bundle_verification is None:
        raise ToolAuthzError("no keys: give --key KID=PEM_FILE, or --config with `bundle_verification`")
    return settings.bundle_verification.public_keys()


def add_bundle_command(subparsers) -> None:
    bundle = subparsers.add_parser("bundle", help="sign a bundle, verify its signature, or pack it for a bundle server")
    sub = bundle.add_subparsers(dest="bundle_command", required=True)
    sign = sub.add_parser("sign", help=f"write BUNDLE/{SIGNATURE_FILE}")
    sign.add_argument("bundle", nargs="?", default="policies")
    sign.add_argument("--key", required=True, help="the Ed25519 private key file (PKCS#8 PEM or k4.secret)")
    sign.add_argument("--kid", help="the key id the sidecar's bundle_verification names (default: thumbprint)")
    sign.add_argument("--revision", type=int, help="a number above the last signed one (default: Unix time)")
    sign.set_defaults(func=cmd_sign)
    verify = sub.add_parser("verify", help="check a bundle (a directory or an archive of `bundle build`) against "
                                           "its signature, as serve, reload and the bundle server's poller do")
    verify.add_argument("bundle", nargs="?", default="policies")
    verify.add_argument("--key", action="append", metavar="KID=PEM_FILE", help="a public key (repeat for several)")
    verify.add_argument("--config", help="take the keys from this config's bundle_verification")
    verify.add_argument("--min-revision", type=int, help="refuse a revision below this one (the one serving)")
    verify.set_defaults(func=cmd_verify)
    build = sub.add_parser("build", help="write the signed bundle as a deterministic tar.gz for a bundle server")
    build.add_argument("bundle", nargs="?", default="policies")
    build.add_argument("-o", "--output", required=True, help="the archive to write, e.g. bundle.tar.gz")
    build.set_defaults(func=cmd_build)
