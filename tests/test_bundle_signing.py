"""Signed bundles: `bundle sign` writes a JWS over every file; with `bundle_verification`
the sidecar loads only what verifies, at start and on every reload, and keeps serving
the last good bundle otherwise."""

from __future__ import annotations

import json
import os

import pytest
import rfc8785
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from joserfc import jws
from joserfc.jwk import OKPKey

from toolauthz.audit.store import AuditQuery
from toolauthz.bundle.signature import (
    MAX_SIGNATURE_BYTES,
    SIGNATURE_FILE,
    SignatureError,
    bundle_files,
    sign_bundle,
    verify_bundle,
)
from toolauthz.cli.main import main as cli
from toolauthz.errors import BundleError
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.server.reload import load_bundle_snapshot
from toolauthz.telemetry import metrics

FORBID = '@id("no-measurements")\nforbid (principal, action == Action::"tool:measure_runtime", resource);\n'


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def sign(bundle, key, revision: int, kid: str = "ci-1") -> None:
    (bundle / SIGNATURE_FILE).write_bytes(sign_bundle(bundle, key, kid, revision))


def forged(bundle, key, payload: dict, kid: str = "ci-1") -> None:
    """A signature file over any payload, validly signed: what a signer's bug or a stolen
    key could produce. The verifier must still refuse what it cannot mean."""
    token = jws.serialize_compact({"alg": "Ed25519", "kid": kid}, rfc8785.dumps(payload), OKPKey.import_key(key),
                                  algorithms=["Ed25519"])
    (bundle / SIGNATURE_FILE).write_text(json.dumps({"signatures": [token]}))


def refusal(bundle, keys, min_revision=None) -> str:
    with pytest.raises(SignatureError) as caught:
        verify_bundle(bundle, keys, min_revision)
    return str(caught.value)


def test_a_signed_bundle_verifies_and_names_every_file_but_tests(bundle_dir, key):
    sign(bundle_dir, key, 7)
    manifest = verify_bundle(bundle_dir, {"ci-1": key.public_key()})
    assert manifest.revision == 7 and manifest.kid == "ci-1"
    assert "refunds.cedar" in manifest.files and "tools/issue_refund.yaml" in manifest.files
    assert not any(name.startswith("tests/") or name == SIGNATURE_FILE for name in manifest.files)
    (bundle_dir / "tests" / "more.yaml").write_text("cases: []\n")  # tests are never loaded: still verifies
    verify_bundle(bundle_dir, {"ci-1": key.public_key()})


@pytest.mark.parametrize("change, what", [
    (lambda b: (b / "refunds.cedar").write_text((b / "refunds.cedar").read_text() + "\n"), "altered: `refunds.cedar`"),
    (lambda b: (b / "orders.cedar").unlink(), "missing: `orders.cedar`"),
    (lambda b: (b / "extra.cedar").write_text(FORBID), "not signed: `extra.cedar`"),
    (lambda b: (b / ".hidden.cedar").write_text(FORBID), "not signed: `.hidden.cedar`"),
    (lambda b: (b / "tools" / "x.yaml").write_text("name: x\n"), "not signed: `tools/x.yaml`"),
])
def test_a_missing_altered_or_added_file_is_refused(bundle_dir, key, change, what):
    sign(bundle_dir, key, 1)
    change(bundle_dir)
    assert what in refusal(bundle_dir, {"ci-1": key.public_key()})


def test_an_unknown_key_a_bad_signature_and_a_rollback_are_refused(bundle_dir, key):
    sign(bundle_dir, key, 5)
    assert "key `ci-1` is not one of the configured" in refusal(bundle_dir, {"ci-2": key.public_key()})
    other = Ed25519PrivateKey.generate()
    assert "does not verify with key `ci-1`" in refusal(bundle_dir, {"ci-1": other.public_key()})
    # rotation: either configured key verifies what it signed
    verify_bundle(bundle_dir, {"ci-0": other.public_key(), "ci-1": key.public_key()})
    assert "revision 5 is below the floor, 6: a rollback" in refusal(bundle_dir, {"ci-1": key.public_key()}, 6)
    assert verify_bundle(bundle_dir, {"ci-1": key.public_key()}, 5).revision == 5
    signature = json.loads((bundle_dir / SIGNATURE_FILE).read_text())["signatures"][0]
    head, body, _sig = signature.split(".")
    tampered = f"{head}.{body}.{'A' * 86}"
    (bundle_dir / SIGNATURE_FILE).write_text(json.dumps({"signatures": [tampered]}))
    assert "does not verify" in refusal(bundle_dir, {"ci-1": key.public_key()})
    (bundle_dir / SIGNATURE_FILE).unlink()
    assert "not signed" in refusal(bundle_dir, {"ci-1": key.public_key()})


def test_a_huge_signature_file_is_refused_by_its_size_before_a_byte_is_read(bundle_dir, key, monkeypatch):
    with open(bundle_dir / SIGNATURE_FILE, "wb") as f:
        f.truncate(100 * 1024 * 1024)  # 100 MB, sparse
    read = []
    real_read = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: read.append(n) or real_read(fd, n))
    assert f"larger than {MAX_SIGNATURE_BYTES} bytes" in refusal(bundle_dir, {"ci-1": key.public_key()})
    assert read == []


@pytest.mark.parametrize("name", ["../outside.cedar", "/etc/passwd", "a/../../b", "./refunds.cedar", "a//b",
                                  "tests/x.yaml", SIGNATURE_FILE, "a\\..\\b", ""])
def test_a_manifest_naming_a_path_outside_the_bundle_is_refused(bundle_dir, key, name):
    forged(bundle_dir, key, {"files": [{"name": name, "algorithm": "SHA-256", "hash": "0" * 64}],
                             "revision": 1, "keyid": "ci-1"})
    assert "outside the bundle or not as a plain path" in refusal(bundle_dir, {"ci-1": key.public_key()})


def test_a_manifest_naming_a_file_twice_is_refused(bundle_dir, key):
    files = [{"name": n, "algorithm": "SHA-256", "hash": h} for n, h in bundle_files(bundle_dir).items()]
    forged(bundle_dir, key, {"files": files + files[:1], "revision": 1, "keyid": "ci-1"})
    assert f"names `{files[0]['name']}` twice" in refusal(bundle_dir, {"ci-1": key.public_key()})


@pytest.mark.parametrize("payload, message", [
    ({"files": [], "revision": 1, "keyid": "ci-2"}, "does not name the key that signed it"),
    ({"files": [], "revision": -1, "keyid": "ci-1"}, "no valid `revision`"),
    ({"files": [], "revision": True, "keyid": "ci-1"}, "no valid `revision`"),
    ({"files": {}, "revision": 1, "keyid": "ci-1"}, "no `files` list"),
    ({"files": [{"name": "a.cedar", "algorithm": "MD5", "hash": "0" * 64}], "revision": 1, "keyid": "ci-1"},
     "needs a SHA-256 `hash`"),
])
def test_a_malformed_manifest_is_refused(bundle_dir, key, payload, message):
    forged(bundle_dir, key, payload)
    assert message in refusal(bundle_dir, {"ci-1": key.public_key()})


def test_a_symlink_out_of_the_bundle_is_refused_and_one_inside_is_signed(bundle_dir, key, tmp_path):
    (bundle_dir / "alias.cedar").symlink_to(bundle_dir / "orders.cedar")  # inside: a file like any other
    sign(bundle_dir, key, 1)
    assert "alias.cedar" in verify_bundle(bundle_dir, {"ci-1": key.public_key()}).files
    outside = tmp_path / "outside.cedar"
    outside.write_text(FORBID)
    (bundle_dir / "evil.cedar").symlink_to(outside)
    assert "`evil.cedar` is a symlink out of the bundle" in refusal(bundle_dir, {"ci-1": key.public_key()})
    (bundle_dir / "evil.cedar").unlink()
    (bundle_dir / "tools" / "more").symlink_to(tmp_path)
    assert "`tools/more` is a symlink out of the bundle" in refusal(bundle_dir, {"ci-1": key.public_key()})
    with pytest.raises(SignatureError):
        sign(bundle_dir, key, 2)  # nor will it be signed


def test_the_cli_signs_and_verifies_and_check_warns_without_verification(bundle_dir, tmp_path, capsys, key):
    private, public = tmp_path / "bundle-key.pem", tmp_path / "bundle-key.pub"
    private.write_bytes(key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption()))
    private.chmod(0o600)
    public.write_bytes(key.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo))
    assert cli(["bundle", "sign", str(bundle_dir), "--key", str(private), "--kid", "ci-1", "--revision", "3"]) == 0
    assert cli(["bundle", "verify", str(bundle_dir), "--key", f"ci-1={public}"]) == 0
    assert "ok: " in capsys.readouterr().out
    assert cli(["bundle", "verify", str(bundle_dir), "--key", f"ci-1={public}", "--min-revision", "4"]) == 1
    assert "a rollback is refused" in capsys.readouterr().err
    assert cli(["check", str(bundle_dir)]) == 0
    assert "warning: `bundle_verification` is not configured" in capsys.readouterr().err
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"bundle_verification": {"keys": [{"kid": "ci-1", "file": str(public)}]}}))
    assert cli(["check", str(bundle_dir), "--config", str(config)]) == 0
    captured = capsys.readouterr()
    assert "signed revision 3" in captured.out and "warning" not in captured.err
    (bundle_dir / "extra.cedar").write_text(FORBID)
    assert cli(["check", str(bundle_dir), "--config", str(config)]) == 1
    assert f"{SIGNATURE_FILE}: refused: the bundle does not match its signature" in capsys.readouterr().err


def with_verification(settings, public):
    return type(settings).model_validate({**settings.model_dump(),
                                          "bundle_verification": {"keys": [{"kid": "ci-1", "file": public}]}})


def test_an_unsigned_bundle_does_not_start_a_verifying_sidecar(settings, key, clock):
    from toolauthz.server.build import build_sidecar

    public = settings.data_dir.parent / "bundle-key.pub"
    public.write_bytes(key.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(BundleError, match="not signed"):
        build_sidecar(with_verification(settings, public), clock=clock)


@pytest.fixture
def verifying(settings, bundle_dir, key, clock):
    """A sidecar serving a signed bundle (revision 10), with bundle_verification on."""
    from toolauthz.server.build import build_sidecar

    public = settings.data_dir.parent / "bundle-key.pub"
    public.write_bytes(key.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo))
    sign(bundle_dir, key, 10)
    car = build_sidecar(with_verification(settings, public), clock=clock)
    yield car
    car.close()


def test_through_the_reload_path_a_signed_bundle_loads_and_an_altered_one_is_refused(verifying, bundle_dir, key):
    from toolauthz.server.build import create_server

    car = verifying
    server, port = create_server(car, "127.0.0.1:0")
    try:
        import grpc

        from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc

        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ToolAuthorizerStub(channel)
            assert car.bundles.current.revision == 10
            # A new, signed revision hot-reloads.
            (bundle_dir / "zz.cedar").write_text(FORBID)
            sign(bundle_dir, key, 11)
            assert car.reloader.reload() is True
            good = car.bundles.current.version
            assert car.bundles.current.revision == 11 and "no-measurements" in car.bundles.current.policies
            # An altered one is refused; the last good one keeps serving.
            refused_before = metrics.BUNDLE_SIGNATURE_REFUSALS._value.get()
            (bundle_dir / "zz.cedar").unlink()
            assert car.reloader.reload() is False
            assert car.bundles.current.version == good
            status = stub.GetStatus(pb.GetStatusRequest())
            assert status.policy_version == good
            assert "missing: `zz.cedar`" in status.last_reload_error
            assert metrics.BUNDLE_SIGNATURE_REFUSALS._value.get() == refused_before + 1
            records = car.audit_log.query(AuditQuery(kind="bundle"), limit=10)
            assert [(r.event.result, r.event.error_codes, r.event.detail["at"] if "at" in r.event.detail else "")
                    for r in records] == [("loaded", (), "start"), ("loaded", (), "reload"),
                                          ("refused", ("bundle_signature",), "")]
            started = records[0].event
            assert {r.event.tenant for r in records} == {"_system"}
            assert (started.detail["revision"], started.detail["signer"]) == (10, "ci-1")
            assert len(started.detail["digest"]) == 64 and started.detail["digest"].startswith(started.policy_version)
            assert records[2].event.policy_version == good and "missing" in records[2].event.detail["reason"]
            # The earlier revision, signed and intact, is a rollback.
            sign(bundle_dir, key, 10)
            assert car.reloader.reload() is False and "a rollback is refused" in car.reloader.last_error
            # The same revision over other content is refused too.
            sign(bundle_dir, key, 11)
            assert car.reloader.reload() is False and "sign a new revision" in car.reloader.last_error
            sign(bundle_dir, key, 12)
            assert car.reloader.reload() is True and car.reloader.last_error == ""
            assert "no-measurements" not in car.bundles.current.policies
    finally:
        server.stop(None)


def test_load_bundle_snapshot_verifies_the_directory_a_kubernetes_link_points_to(bundle_dir, key, tmp_path):
    volume = tmp_path / "volume"
    volume.mkdir()
    (volume / "..2026_01").symlink_to(bundle_dir)
    (volume / "..data").symlink_to(volume / "..2026_01")
    sign(bundle_dir, key, 1)
    assert load_bundle_snapshot(volume, {"ci-1": key.public_key()}).revision == 1


def test_the_kubernetes_configmap_carries_the_signature_and_the_projection_verifies(bundle_dir, key, tmp_path):
    import shutil
    import subprocess
    import sys

    import yaml
    from conftest import ROOT

    kubernetes = tmp_path / "kubernetes"
    shutil.copytree(ROOT / "deploy" / "kubernetes", kubernetes)
    sign(bundle_dir, key, 4)
    subprocess.run([sys.executable, str(kubernetes / "bundle-configmap.py"), str(bundle_dir), str(kubernetes)],
                   check=True, timeout=60)
    configmap = yaml.safe_load((kubernetes / "base" / "policies.yaml").read_text())
    patch = yaml.safe_load((kubernetes / "base" / "policies-volume.yaml").read_text())
    items = patch["spec"]["template"]["spec"]["volumes"][0]["configMap"]["items"]
    assert {"key": SIGNATURE_FILE, "path": SIGNATURE_FILE} in items
    projected = tmp_path / "projected"
    for item in items:
        (projected / item["path"]).parent.mkdir(parents=True, exist_ok=True)
        (projected / item["path"]).write_text(configmap["data"][item["key"]], encoding="utf-8")
    assert verify_bundle(projected, {"ci-1": key.public_key()}).revision == 4
