"""Outside review, as an attacker, of the bundle snapshot and the revision floor: what a
person who can plant files in the bundle directory, or a second signed bundle, can do.

Run as an operator runs it: `toolauthz check BUNDLE` in a subprocess. A hang is the
failure a FIFO would cause, so each run has a generous timeout (a hang detector, not a
timing assertion)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

TOOLAUTHZ = pathlib.Path(sys.executable).parent / "toolauthz"


def check(bundle: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TOOLAUTHZ), "check", str(bundle)], capture_output=True, text=True, timeout=60)


def test_a_symlink_to_a_fifo_in_the_unsigned_tests_dir_is_refused_without_hanging(bundle_dir):
    """`tests/` is skipped by the walk, so a FIFO there is never refused by its own entry;
    a policy file linking to it must still be refused, not block the reader."""
    (bundle_dir / "tests").mkdir(exist_ok=True)
    os.mkfifo(bundle_dir / "tests" / "pipe")
    (bundle_dir / "zz_planted.cedar").symlink_to(bundle_dir / "tests" / "pipe")
    done = check(bundle_dir)
    assert done.returncode != 0
    assert "zz_planted.cedar" in done.stdout + done.stderr and "Traceback" not in done.stderr


def test_a_symlink_chain_that_ends_outside_the_bundle_is_refused(bundle_dir, tmp_path):
    outside = tmp_path / "outside.cedar"
    outside.write_text('permit (principal, action, resource);\n')
    (bundle_dir / "hop").mkdir()
    (bundle_dir / "hop" / "inner.cedar").symlink_to(outside)  # inside, but pointing out
    (bundle_dir / "zz_alias.cedar").symlink_to(bundle_dir / "hop" / "inner.cedar")
    done = check(bundle_dir)
    assert done.returncode != 0 and "symlink out of the bundle" in done.stdout + done.stderr


def test_a_symlink_to_the_bundle_itself_is_refused_not_walked(bundle_dir):
    (bundle_dir / "loop").symlink_to(bundle_dir)
    done = check(bundle_dir)
    assert done.returncode != 0 and "loop" in done.stdout + done.stderr and "Traceback" not in done.stderr


def test_the_floor_refuses_a_second_content_at_the_floors_revision(store):
    """A revision names one signed bundle: another digest at the floor's exact revision
    must not claim it, even raced from another process sharing the store."""
    floor = store.bundle_floor
    first = floor.lift(7, "a" * 64, 1.0)
    assert (first.revision, first.digest) == (7, "a" * 64)
    again = floor.lift(7, "b" * 64, 2.0)
    assert (again.revision, again.digest) == (7, "a" * 64)  # the activation compares and refuses


@pytest.mark.parametrize("revision", [-1, 2**63])
def test_a_revision_outside_the_columns_range_never_lowers_the_floor(store, revision):
    floor = store.bundle_floor
    floor.lift(7, "a" * 64, 1.0)
    with pytest.raises(Exception):  # noqa: B017 - any store error: the activation refuses (fail closed)
        floor.lift(revision, "c" * 64, 2.0)
    assert floor.current().revision == 7


def sign_unbounded(bundle: pathlib.Path, key, revision: int) -> None:
    """A manifest signed by the trusted key, as `toolauthz bundle sign` writes it but with a
    revision it refuses to sign (a hand-made or third-party signer): verification is what
    must bound it, since only the signature, not the tool, is checked at load."""
    import json

    from joserfc import jws
    from joserfc.jwk import OKPKey

    from toolauthz.bundle.signature import ALGORITHM, SIGNATURE_FILE, bundle_files

    payload = {"files": [{"name": name, "algorithm": "SHA-256", "hash": digest}
                         for name, digest in bundle_files(bundle).items()], "revision": revision, "keyid": "ci-1"}
    # rfc8785 itself refuses integers past 2^53; a signer with a plain JSON encoder does not.
    body = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    token = jws.serialize_compact({"alg": ALGORITHM, "kid": "ci-1"}, body, OKPKey.import_key(key),
                                  algorithms=[ALGORITHM])
    (bundle / SIGNATURE_FILE).write_bytes(json.dumps({"signatures": [token]}).encode())


# Finding R-4 (fixed): verification took any non-negative revision; one past the floor's
# column (2^63) raised OverflowError out of the reload, and the reloader stopped for good.


def test_a_signed_revision_past_the_floors_column_is_an_audited_refusal_and_reloads_go_on(settings, clock,
                                                                                            bundle_dir):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from test_bundle_floor import with_keys

    from toolauthz.server.build import build_sidecar

    key = Ed25519PrivateKey.generate()
    sign_unbounded(bundle_dir, key, 5)
    car = build_sidecar(with_keys(settings, bundle_dir, key, "review"), clock=clock)
    try:
        forbid = '@id("review-forbid")\nforbid (principal, action == Action::"tool:measure_runtime", resource);\n'
        (bundle_dir / "zz_review.cedar").write_text(forbid)
        sign_unbounded(bundle_dir, key, 2**63)
        refused = car.reloader.reload()  # must refuse cleanly, not raise
        assert refused is False and "revision" in car.reloader.last_error
    finally:
        car.close()
