"""`toolauthz bundle sign|verify|build|allow-rollback`: sign a bundle in CI, verify it as
the sidecar would, pack it for a bundle server, let the fleet go back to an older revision.

    toolauthz bundle sign [BUNDLE] --signing-key FILE [--kid KID] [--revision N] [--force]
    toolauthz bundle verify [BUNDLE | ARCHIVE] (--public-key KID=PEM ... | --config FILE) [--min-revision N]
    toolauthz bundle build [BUNDLE] -o bundle.tar.gz
    toolauthz bundle allow-rollback --to N --reason TEXT [--store URL | --config FILE | --data-dir DIR]

`sign` writes `BUNDLE/.signatures.json` (toolauthz/bundle/signature.py) with an Ed25519
private key file (PKCS#8 PEM, mode 0600, as the other keys). The key id defaults to the
public key's RFC 7638 thumbprint; the revision to the current Unix time, so that each
signing in CI is newer than the last. `verify` runs the check `serve` and every reload
run before loading, offline: with the keys given, or those of the config's
`bundle_verification`. `sign` refuses a revision not above the one in the signature it
replaces (unless `--force`). `allow-rollback` lowers the store's revision floor
(store/bundle_floor.py) to N, with a `bundle` audit record (result `rollback_allowed`,
tenant `_system`) naming the reason and the operator, in the same transaction.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import pathlib
import sys
import time
from collections.abc import Mapping

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from toolauthz.bundle.signature import (
    SIGNATURE_FILE,
    SignatureError,
    SignedManifest,
    key_id,
    load_public_key_file,
    sign_bundle,
    verify_bundle,
)
from toolauthz.cli.output import add_output_option, renamed_option, wants_json
from toolauthz.display.escape import shown
from toolauthz.errors import ToolAuthzError


def cmd_sign(args: argparse.Namespace) -> int:
    from toolauthz.tokens.keys import load_ed25519_private_key

    key = load_ed25519_private_key(args.signing_key)
    kid = args.kid or key_id(key.public_key())
    revision = args.revision if args.revision is not None else int(time.time())
    root = pathlib.Path(args.bundle)
    replaced = _replaced_revision(root)
    if replaced is not None and revision <= replaced and not args.force:
        raise ToolAuthzError(f"revision {revision} is not above {replaced}, the revision of the signature it "
                             "replaces: sidecars would refuse it as a rollback (give a higher --revision, or "
                             "--force)")
    data = sign_bundle(root, key, kid, revision)
    target = root / SIGNATURE_FILE
    temporary = root / f"{SIGNATURE_FILE}.tmp"
    temporary.write_bytes(data)
    os.replace(temporary, target)  # a watcher never reads half a signature
    if wants_json(args):
        print(json.dumps({"bundle": str(root), "kid": kid, "revision": revision}))
    else:
        print(f"signed {root} with key {kid}, revision {revision}")
    return 0


def _replaced_revision(root: pathlib.Path) -> int | None:
    """The revision the bundle's present signature names (None: not signed). Read, not
    verified: it only guards the signer against a mistake; a signature that cannot be read
    refuses, as `--force` overrides."""
    from joserfc import jws
    from joserfc.errors import JoseError

    from toolauthz.bundle.signature import read_signature

    try:
        data = read_signature(root)
    except SignatureError as exc:
        if "not signed" in str(exc):
            return None
        raise ToolAuthzError(f"cannot read the signature it replaces: {exc} (--force signs anyway)") from None
    try:
        token = json.loads(data)["signatures"][0]
        revision = json.loads(jws.extract_compact(token.encode("ascii")).payload)["revision"]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, UnicodeError, JoseError):
        revision = None
    if not isinstance(revision, int) or isinstance(revision, bool):
        raise ToolAuthzError(f"cannot read the revision of the `{SIGNATURE_FILE}` it replaces (--force signs anyway)")
    return revision


def cmd_allow_rollback(args: argparse.Namespace) -> int:
    from toolauthz.audit.records import SYSTEM_TENANT, AuditEvent
    from toolauthz.server.activation import ROLLBACK_ALLOWED
    from toolauthz.server.config import load_settings
    from toolauthz.store.open import open_store

    if isinstance(args.to, bool) or not 0 <= args.to < 2 ** 53:
        raise ToolAuthzError("--to must be a revision from 0 to 2^53 - 1")
    reason = args.reason.strip()
    if not 0 < len(reason) <= MAX_REASON_CHARS or not reason.isprintable():
        raise ToolAuthzError(f"--reason must be 1 to {MAX_REASON_CHARS} printable characters on one line")
    settings = load_settings(args.config, data_dir=args.data_dir, store=args.store)
    store = open_store(settings.store_url, pool_size=1, chains=settings.audit_chains)
    try:
        floor = store.bundle_floor.current()
        if floor is None or args.to >= floor.revision:
            shown_floor = "none yet" if floor is None else str(floor.revision)
            raise ToolAuthzError(f"nothing to allow: revision {args.to} is not below the floor ({shown_floor})")
        now = time.time()
        operator = _operator()
        store.bundle_floor.lower(args.to, now, AuditEvent(
            kind="bundle", time=now, tenant=SYSTEM_TENANT, result=ROLLBACK_ALLOWED,
            detail={"from_revision": floor.revision, "to_revision": args.to, "reason": reason,
                    "operator": operator}))
    finally:
        store.close()
    print(f"the revision floor is now {args.to} (was {floor.revision}): the next start or reload may activate "
          f"revision {args.to} or later; recorded for {shown(operator)}")
    return 0


MAX_REASON_CHARS = 500


def _operator() -> str:
    try:
        return getpass.getuser()[:128]
    except (KeyError, OSError):  # no user name for this uid (a container)
        return f"uid:{os.getuid()}"


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
    if wants_json(args):
        print(json.dumps({"ok": True, "files": len(manifest.files), "kid": manifest.kid,
                          "revision": manifest.revision}))
    else:
        print(f"ok: {len(manifest.files)} files signed with key {manifest.kid}, revision {manifest.revision}")
    return 0


def _verify_archive(path: str, keys: Mapping[str, Ed25519PublicKey], min_revision: int | None) -> SignedManifest:
    """The archive read as the poller reads it (bounded, into a snapshot), then verified."""
    from toolauthz.bundle.archive import DEFAULT_LIMITS, ArchiveError, archive_snapshot
    from toolauthz.files.bounded import FileRefused, read_bounded

    try:
        data = read_bounded(path, DEFAULT_LIMITS.max_compressed_bytes)
        return verify_bundle(archive_snapshot(data, path), keys, min_revision)
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
    if args.public_key:
        keys = {}
        for item in args.public_key:
            kid, sep, path = item.partition("=")
            if not sep or not kid or not path:
                raise ToolAuthzError(f"--key takes KID=PEM_FILE, not `{shown(item)}`")
            keys[kid] = load_public_key_file(path)
        return keys
    from toolauthz.server.config import load_settings

    settings = load_settings(args.config)
    if settings.bundle_verification is None:
        raise ToolAuthzError("no keys: give --public-key KID=PEM_FILE, or --config with `bundle_verification`")
    return settings.bundle_verification.public_keys()


def add_bundle_command(subparsers) -> None:
    bundle = subparsers.add_parser("bundle", help="sign a bundle, verify its signature, or pack it for a bundle server")
    sub = bundle.add_subparsers(dest="bundle_command", required=True)
    sign = sub.add_parser("sign", help=f"write BUNDLE/{SIGNATURE_FILE}")
    sign.add_argument("bundle", nargs="?", default="policies")
    renamed_option(sign, "--signing-key", "--key", dest="signing_key", required=True,
                   help="the Ed25519 private key file (PKCS#8 PEM or k4.secret)")
    sign.add_argument("--kid", help="the key id the sidecar's bundle_verification names (default: thumbprint)")
    sign.add_argument("--revision", type=int, help="a number above the last signed one (default: Unix time)")
    sign.add_argument("--force", action="store_true",
                      help="sign even when the revision is not above the one of the signature it replaces")
    add_output_option(sign)
    sign.set_defaults(func=cmd_sign)
    verify = sub.add_parser("verify", help="check a bundle (a directory or an archive of `bundle build`) against "
                                           "its signature, as serve, reload and the bundle server's poller do")
    verify.add_argument("bundle", nargs="?", default="policies")
    renamed_option(verify, "--public-key", "--key", dest="public_key", action="append", metavar="KID=PEM_FILE",
                   help="a public key (repeat for several)")
    verify.add_argument("--config", help="take the keys from this config's bundle_verification")
    verify.add_argument("--min-revision", type=int, help="refuse a revision below this one (the one serving)")
    add_output_option(verify)
    verify.set_defaults(func=cmd_verify)
    build = sub.add_parser("build", help="write the signed bundle as a deterministic tar.gz for a bundle server")
    build.add_argument("bundle", nargs="?", default="policies")
    build.add_argument("-o", "--out", dest="output", required=True, help="the archive to write, e.g. bundle.tar.gz")
    build.set_defaults(func=cmd_build)
    rollback = sub.add_parser("allow-rollback", help="lower the fleet's revision floor to N (audited), so that "
                                                     "an older signed revision may serve again")
    rollback.add_argument("--to", type=int, required=True, help="the lowest revision that may activate from now on")
    rollback.add_argument("--reason", required=True, help="why (kept in the audit record)")
    rollback.add_argument("--store", help="sqlite:///path or postgresql://...; default: $TOOLAUTHZ_STORE, else the "
                                          "config's, else <data-dir>/toolauthz.db")
    rollback.add_argument("--data-dir")
    rollback.add_argument("--config")
    rollback.set_defaults(func=cmd_allow_rollback)
