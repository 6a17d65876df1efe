"""A bundle is bytes, read once (toolauthz/bundle/snapshot.py): what the signature is
checked over is what is parsed and enforced, and the disk is never read again. The
attack of issue 37 (a `.cedar` file swapped between the check and the parse) is driven
deterministically against the real `serve`: an audit hook in the served process swaps
the file right after the reader has read it, and records every open of a bundle file."""

from __future__ import annotations

import os
import pathlib
import signal
from collections.abc import Iterator

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.bundle_support import public_key_file, served_processes, sign, write_config
from tests.conftest import make_request
from toolauthz.bundle.signature import SIGNATURE_FILE, verify_bundle
from toolauthz.bundle.snapshot import DEFAULT_LIMITS, BundleSnapshot, SnapshotLimits, read_snapshot
from toolauthz.bundle.verified import load_verified
from toolauthz.errors import BundleError
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc

FORBID = '@id("no-measurements")\nforbid (principal, action == Action::"tool:measure_runtime", resource);\n'
FORGED = '@id("no-measurements")\npermit (principal, action == Action::"tool:measure_runtime", resource);\n'

# Put on PYTHONPATH of the served process: an audit hook on every `open` (os.open raises
# it too) that logs each open of a file of the bundle, and once the reader has opened
# `a_forbid.cedar` (the first policy file in name order), swaps that file on disk at the
# next open of a bundle file: after its read, before the parse and the decisions.
SITECUSTOMIZE = '''
import os, sys
BUNDLE = os.environ["SWAP_BUNDLE"]
LOG = os.open(os.environ["SWAP_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
FORGED = os.environ["SWAP_FORGED"].encode()
state = {"armed": False, "done": False, "busy": False}

def hook(event, args):
    if event != "open" or state["busy"] or not isinstance(args[0], str):
        return
    path = os.path.realpath(args[0]) if args[0].startswith(BUNDLE) else args[0]
    if not path.startswith(BUNDLE + "/"):
        return
    state["busy"] = True
    try:
        rel = path[len(BUNDLE) + 1:]
        os.write(LOG, (rel + "\\n").encode())
        if state["armed"] and not state["done"]:
            with open(os.path.join(BUNDLE, "a_forbid.cedar"), "wb") as f:
                f.write(FORGED)
            state["done"] = True
            os.write(LOG, b"SWAPPED\\n")
        if rel == "a_forbid.cedar":
            state["armed"] = True
    finally:
        state["busy"] = False

sys.addaudithook(hook)
'''


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def serve() -> Iterator:
    yield from served_processes()


def measure_decision(port: int, call_id: str) -> int:
    request = make_request("measure_runtime", {"prototype": "A", "metric": "runtime", "unit": "hours"},
                           call_id=call_id, entities=[], request_id=call_id)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return pb_grpc.ToolAuthorizerStub(channel).Authorize(request, timeout=10).decision


def test_a_cedar_file_swapped_after_the_read_is_never_served_and_never_read_again(tmp_path, bundle_dir, key,
                                                                                  serve):
    (bundle_dir / "a_forbid.cedar").write_text(FORBID)
    sign(bundle_dir, key, 10)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = tmp_path / "opens.log"
    served = serve(write_config(tmp_path, bundle_dir, public_key_file(tmp_path, key)),
                   {"PYTHONPATH": str(hooks), "SWAP_BUNDLE": os.path.realpath(bundle_dir), "SWAP_LOG": str(log),
                    "SWAP_FORGED": FORGED})
    port = served.port()
    opened = log.read_text().splitlines()
    # The forged policy was on disk before the parse and before the first decision...
    assert "SWAPPED" in opened and (bundle_dir / "a_forbid.cedar").read_text() == FORGED
    # ...yet the signed one decides: the bytes parsed are the bytes verified.
    assert measure_decision(port, "after-the-swap") == pb.DENY
    # Every file of the bundle was opened once: nothing read the disk after the check.
    files = [line for line in opened if line != "SWAPPED"]
    assert len(files) == len(set(files))
    assert {"a_forbid.cedar", SIGNATURE_FILE, "tools/issue_refund.yaml"} <= set(files)
    # A reload reads the forged file, which no longer matches the signature: refused,
    # the last good bundle serving.
    served.proc.send_signal(signal.SIGHUP)
    served.await_line("bundle reload refused")
    assert measure_decision(port, "after-the-reload") == pb.DENY


def test_the_snapshot_is_what_the_signature_covers_and_the_loader_parses(bundle_dir, key):
    (bundle_dir / "a_forbid.cedar").write_text(FORBID)
    sign(bundle_dir, key, 3)
    snapshot = read_snapshot(bundle_dir)
    (bundle_dir / "a_forbid.cedar").write_text(FORGED)  # after the read: no reader sees it
    bundle = load_verified(snapshot, {"ci-1": key.public_key()})
    assert bundle.snapshot is snapshot and "no-measurements" in bundle.policies
    assert bundle.policies["no-measurements"].effect == "forbid"
    assert (bundle.revision, bundle.signer, bundle.digest) == (3, "ci-1", snapshot.digest)
    assert bundle.version == snapshot.digest[:16]
    # The same bytes from elsewhere (an unpacked archive) load the same way.
    unpacked = BundleSnapshot.of(dict(snapshot), "https://bundles.example/b.tar.gz")
    assert load_verified(unpacked, {"ci-1": key.public_key()}).digest == snapshot.digest
    # And forged bytes in a mapping are refused by the signature, as on disk.
    forged = BundleSnapshot.of({**snapshot, "a_forbid.cedar": FORGED.encode()}, "archive")
    with pytest.raises(BundleError, match="altered: `a_forbid.cedar`"):
        load_verified(forged, {"ci-1": key.public_key()})


def test_the_snapshot_is_immutable(bundle_dir):
    snapshot = read_snapshot(bundle_dir)
    with pytest.raises(TypeError):
        snapshot["a_forbid.cedar"] = b"permit (principal, action, resource);"  # type: ignore[index]
    assert "tests/cases.yaml" not in snapshot and not any(name.startswith("tests/") for name in snapshot)


def refused(directory: pathlib.Path, limits: SnapshotLimits = DEFAULT_LIMITS) -> str:
    with pytest.raises(BundleError) as caught:
        read_snapshot(directory, limits)
    return str(caught.value)


def test_a_fifo_is_refused_without_blocking(bundle_dir):
    os.mkfifo(bundle_dir / "a_forbid.cedar")
    assert "a_forbid.cedar: is not a regular file" in refused(bundle_dir)


def test_a_device_file_is_refused(bundle_dir):
    (bundle_dir / "a_forbid.cedar").symlink_to("/dev/zero")  # a device, through a link out of the bundle
    assert "symlink out of the bundle" in refused(bundle_dir)
    (bundle_dir / "a_forbid.cedar").unlink()
    if os.geteuid() == 0:
        # A character device (/dev/zero's numbers): never read, however it is named.
        os.mknod(bundle_dir / "a_forbid.cedar", 0o600 | 0o020000, os.makedev(1, 5))
        assert "not a regular file" in refused(bundle_dir)


def test_symlinks_only_to_regular_files_inside_the_bundle(bundle_dir, tmp_path):
    (bundle_dir / "alias.cedar").symlink_to(bundle_dir / "orders.cedar")
    assert read_snapshot(bundle_dir)["alias.cedar"] == (bundle_dir / "orders.cedar").read_bytes()
    outside = tmp_path / "outside.cedar"
    outside.write_text(FORGED)
    (bundle_dir / "a_forbid.cedar").symlink_to(outside)
    assert "symlink out of the bundle" in refused(bundle_dir)
    (bundle_dir / "a_forbid.cedar").unlink()
    (bundle_dir / "more").symlink_to(bundle_dir / "tools")  # a link to a directory
    assert "a symlink to something other than a file" in refused(bundle_dir)


def test_the_bounds_refuse_before_reading_it_all(bundle_dir):
    assert "more than 5 files" in refused(bundle_dir, SnapshotLimits(max_files=5))
    deep = bundle_dir / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (deep / "x.txt").write_text("x")
    assert "deeper than 2 directories" in refused(bundle_dir, SnapshotLimits(max_depth=2))
    (bundle_dir / "big.bin").write_bytes(b"\0" * 5000)
    assert "big.bin: is larger than 4096 bytes" in refused(bundle_dir, SnapshotLimits(max_file_bytes=4096))
    assert "over 6000 bytes" in refused(bundle_dir, SnapshotLimits(max_total_bytes=6000))


def test_empty_directories_count_against_the_bound_too(bundle_dir):
    for n in range(30):
        (bundle_dir / f"empty{n:02}").mkdir()
    assert "more than 20 files and directories" in refused(bundle_dir, SnapshotLimits(max_files=20))


def test_an_archive_mapping_is_held_to_the_same_names_and_bounds():
    with pytest.raises(BundleError, match="not a plain relative path"):
        BundleSnapshot.of({"../escape.cedar": b""}, "archive")
    with pytest.raises(BundleError, match="more than 2 files"):
        BundleSnapshot.of({f"f{n}.cedar": b"" for n in range(3)}, "archive", SnapshotLimits(max_files=2))
    with pytest.raises(BundleError, match="larger than 10 bytes"):
        BundleSnapshot.of({"a.cedar": b"x" * 11}, "archive", SnapshotLimits(max_file_bytes=10))


def test_verify_bundle_takes_the_snapshot_not_the_disk(bundle_dir, key):
    sign(bundle_dir, key, 1)
    snapshot = read_snapshot(bundle_dir)
    (bundle_dir / "orders.cedar").write_text("// edited after the read\n")
    assert verify_bundle(snapshot, {"ci-1": key.public_key()}).revision == 1
