"""The revision floor survives restarts (issue 37, attack 3): the highest signed revision
activated is kept in the store (store/bundle_floor.py), a restart with an older one is
refused on both stores, `bundle allow-rollback` is the one audited way down, a fleet on
one PostgreSQL database never decides below the shared floor, and `bundle sign` refuses
a revision that is not above the one it replaces."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator

import pytest
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.bundle_support import TOOLAUTHZ, public_key_file, served_processes, sign, write_config
from tests.conftest import ROOT, make_request
from toolauthz.audit.store import AuditQuery
from toolauthz.bundle.signature import SIGNATURE_FILE
from toolauthz.errors import BundleError, PreconditionError
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.server.config import BundleVerificationSettings
from toolauthz.store.open import open_store

FORBID = '@id("no-measurements")\nforbid (principal, action == Action::"tool:measure_runtime", resource);\n'


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def serve() -> Iterator:
    yield from served_processes()


def bundle_records(store_url: str) -> list:
    store = open_store(store_url, pool_size=1)
    try:
        return [r.event for r in store.audit_log.query(AuditQuery(kind="bundle"), limit=50)]
    finally:
        store.close()


def toolauthz(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TOOLAUTHZ, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_restart_with_an_older_signed_revision_is_refused_until_an_audited_rollback(
        request, tmp_path, bundle_dir, key, serve, backend):
    store_url = f"sqlite:///{tmp_path / 'data' / 'toolauthz.db'}"
    extra: dict[str, object] = {}
    if backend == "postgresql":
        store_url = request.getfixturevalue("postgres_url")
        extra = {"store": store_url, "store_migrate": True}
    config = write_config(tmp_path, bundle_dir, public_key_file(tmp_path, key), **extra)
    # Revision 10 serves (its broader policy: no forbid), and raises the floor.
    sign(bundle_dir, key, 10)
    first = serve(config)
    first.port()
    first.stop()
    # The older revision 9, signed and intact, forbids less... and is refused at start.
    (bundle_dir / "zz.cedar").write_text(FORBID)
    sign(bundle_dir, key, 9)
    refused = serve(config)
    code, output = refused.output_until_exit()
    assert code != 0 and "revision 9 is below the floor, 10" in output and "allow-rollback" in output
    # The operator's way down: audited, with the reason and who did it.
    args = ["--store", store_url] if backend == "postgresql" else ["--data-dir", str(tmp_path / "data")]
    lowered = toolauthz("bundle", "allow-rollback", "--to", "9", "--reason", "revert the refund change", *args)
    assert lowered.returncode == 0, lowered.stderr
    assert "the revision floor is now 9 (was 10)" in lowered.stdout
    again = serve(config)
    again.port()
    again.stop()
    records = bundle_records(store_url)
    assert [(e.result, e.detail.get("revision"), e.detail.get("at", "")) for e in records] == [
        ("loaded", 10, "start"), ("refused", 9, "start"), ("rollback_allowed", None, ""), ("loaded", 9, "start")]
    assert {e.tenant for e in records} == {"_system"}
    rollback = records[2].detail
    assert (rollback["from_revision"], rollback["to_revision"], rollback["reason"]) == (10, 9,
                                                                                         "revert the refund change")
    assert rollback["operator"] and records[0].detail["digest"] != records[3].detail["digest"]
    # Going up again needs nothing; going below the lowered floor is refused again.
    nothing = toolauthz("bundle", "allow-rollback", "--to", "9", "--reason", "again", *args)
    assert nothing.returncode == 1 and "nothing to allow" in nothing.stderr


def test_allow_rollback_refuses_a_reason_that_is_not_one_printable_line(tmp_path):
    for reason in ("", "two\nlines", "\x1b[31mred", "x" * 501):
        refused = toolauthz("bundle", "allow-rollback", "--to", "1", "--reason", reason,
                            "--data-dir", str(tmp_path / "data"))
        assert refused.returncode == 1 and "--reason must be 1 to 500 printable characters" in refused.stderr
    below = toolauthz("bundle", "allow-rollback", "--to", "-1", "--reason", "r", "--data-dir", str(tmp_path / "data"))
    assert below.returncode == 1 and "--to must be a revision from 0 to 2^53 - 1" in below.stderr


def with_keys(settings, bundle, key: Ed25519PrivateKey, name: str):
    public = settings.data_dir.parent / f"{name}.pub"
    public.parent.mkdir(parents=True, exist_ok=True)
    public.write_bytes(key.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo))
    return settings.model_copy(update={"bundle": bundle, "bundle_verification": BundleVerificationSettings(
        keys=({"kid": "ci-1", "file": public},))})


def test_three_postgresql_replicas_never_decide_below_the_shared_floor(settings, clock, postgres_url, key,
                                                                        tmp_path, bundle_dir):
    import shutil

    from toolauthz.server.build import build_sidecar
    from toolauthz.store.postgres import migrate

    migrate(postgres_url)
    dirs = []
    for name in ("a", "b", "c"):
        shutil.copytree(bundle_dir, tmp_path / name)
        sign(tmp_path / name, key, 1)
        dirs.append(tmp_path / name)
    shared = settings.model_copy(update={"store": postgres_url})
    cars = [build_sidecar(with_keys(shared, d, key, n), clock=clock) for d, n in zip(dirs, "abc", strict=True)]
    try:
        a, b, c = cars
        # A activates revision 3 (a forbid): the fleet's floor is 3.
        (dirs[0] / "zz.cedar").write_text(FORBID)
        sign(dirs[0], key, 3)
        assert a.reloader.reload() is True and a.store.bundle_floor.current().revision == 3
        # B holds revision 2 on disk: below the floor, refused; it still serves 1, which is
        # below the floor too, so it decides nothing until a bundle at the floor loads.
        sign(dirs[1], key, 2)
        assert b.reloader.reload() is False and "below the floor, 3" in b.reloader.last_error
        with pytest.raises(PreconditionError, match="bundle_below_floor"):
            b.bundles.deciding  # noqa: B018 (the property refuses)
        assert "below the fleet's floor, 3" in b.status().policy.notices[0]
        # C has nothing new on disk: its next look at the floor holds it back too.
        c.reloader.check_floor()
        with pytest.raises(PreconditionError, match="bundle_below_floor"):
            c.bundles.deciding  # noqa: B018
        # A new replica started on revision 2 is refused outright.
        with pytest.raises(BundleError, match="below the floor, 3"):
            build_sidecar(with_keys(shared, dirs[1], key, "d"), clock=clock)
        # B gets revision 3 (the same bytes A activated): it decides again, on it.
        shutil.copyfile(dirs[0] / "zz.cedar", dirs[1] / "zz.cedar")
        shutil.copyfile(dirs[0] / SIGNATURE_FILE, dirs[1] / SIGNATURE_FILE)
        assert b.reloader.reload() is True and b.bundles.deciding.revision == 3
        assert b.bundles.deciding.digest == a.bundles.deciding.digest
        # Another content under revision 3 is refused fleet-wide: a revision names one bundle.
        (dirs[2] / "zz.cedar").write_text(FORBID.replace("no-measurements", "other-forbid"))
        sign(dirs[2], key, 3)
        assert c.reloader.reload() is False and "activated with other content" in c.reloader.last_error
        for car in cars:
            revision = car.bundles.current.revision
            assert car.bundles.held_back or revision >= car.store.bundle_floor.current().revision
    finally:
        for car in cars:
            car.close()


def test_a_fleet_decision_below_the_floor_is_refused_over_grpc(settings, clock, postgres_url, key, tmp_path,
                                                               bundle_dir):
    import shutil

    import grpc

    from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
    from toolauthz.server.build import build_sidecar, create_server
    from toolauthz.store.postgres import migrate

    migrate(postgres_url)
    shared = settings.model_copy(update={"store": postgres_url})
    shutil.copytree(bundle_dir, tmp_path / "old")
    sign(tmp_path / "old", key, 1)
    behind = build_sidecar(with_keys(shared, tmp_path / "old", key, "old"), clock=clock)
    server, port = create_server(behind, "127.0.0.1:0")
    try:
        behind.store.bundle_floor.lift(5, "f" * 64, clock.now())  # another replica activated revision 5
        behind.reloader.check_floor()
        request = make_request("measure_runtime", {"prototype": "A", "metric": "runtime", "unit": "hours"},
                               call_id="below", entities=[], request_id="below")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ToolAuthorizerStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Authorize(request, timeout=10)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "bundle_below_floor" in refused.value.details()
            status = stub.GetStatus(pb.GetStatusRequest())
            assert status.bundle_revision == 1 and any("floor, 5" in n for n in status.notices)
    finally:
        server.stop(None)
        behind.close()


def test_bundle_sign_refuses_a_revision_not_above_the_one_it_replaces(tmp_path, bundle_dir, key):
    from toolauthz.tokens.keys import generate_key_file

    private = tmp_path / "bundle-signing.pem"
    generate_key_file(private)
    sign_as_ci = ("bundle", "sign", str(bundle_dir), "--signing-key", str(private), "--kid", "ci-1")
    signed = toolauthz(*sign_as_ci, "--revision", "10")
    assert signed.returncode == 0, signed.stderr
    for revision in ("5", "10"):
        refused = toolauthz(*sign_as_ci, "--revision", revision)
        assert refused.returncode == 1 and f"revision {revision} is not above 10" in refused.stderr
    forced = toolauthz(*sign_as_ci, "--revision", "5", "--force")
    assert forced.returncode == 0, forced.stderr
    assert toolauthz(*sign_as_ci, "--revision", "6").returncode == 0
    # An unreadable signature it would replace is refused too (never silently dropped).
    (bundle_dir / SIGNATURE_FILE).write_text("not json")
    refused = toolauthz(*sign_as_ci, "--revision", "7")
    assert refused.returncode == 1 and "cannot read the revision" in refused.stderr
    assert "\n" not in refused.stderr.strip()


def test_a_reload_that_needs_a_restart_says_so_in_the_log_and_status(sidecar, bundle_dir, caplog):
    assert sidecar.authorizer.retainer is None  # no tool retained its inputs at start
    path = bundle_dir / "tools" / "issue_refund.yaml"
    path.write_text(path.read_text().replace("audit:\n", "audit:\n  retain_input: 30d\n"))
    # At WARNING on the package's logger whatever an earlier test left its level at.
    with caplog.at_level(logging.WARNING, logger="toolauthz"):
        assert sidecar.reloader.reload() is True
    [notice] = sidecar.status().policy.notices
    assert "restart needed" in notice and "`issue_refund`" in notice and "audit.retain_input" in notice
    assert any("restart needed" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")


def test_a_config_change_only_a_restart_applies_is_logged_and_in_status(tmp_path, bundle_dir, key, serve):
    import json
    import signal

    import grpc

    from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc

    sign(bundle_dir, key, 1)
    config = write_config(tmp_path, bundle_dir, public_key_file(tmp_path, key))
    served = serve(config)
    port = served.port()
    values = json.loads(config.read_text())
    config.write_text(json.dumps({**values, "listen": "127.0.0.1:1", "approvals_listen": "127.0.0.1:2"}))
    served.proc.send_signal(signal.SIGHUP)
    line = served.await_line("restart needed")
    assert "`approvals_listen`, `listen` changed in" in line and "a reload applies only the bundle" in line
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        status = pb_grpc.ToolAuthorizerStub(channel).GetStatus(pb.GetStatusRequest(), timeout=10)
    assert any("`approvals_listen`, `listen` changed" in notice for notice in status.notices)
    assert status.bundle_revision == 1 and status.bundle_signer == "ci-1" and len(status.bundle_digest) == 64


def test_the_floor_only_rises_and_comes_down_with_its_audit_record(store):
    from toolauthz.audit.records import SYSTEM_TENANT, AuditEvent

    floor = store.bundle_floor
    assert floor.current() is None
    assert floor.lift(5, "a" * 64, 10.0).revision == 5
    lower = floor.lift(3, "b" * 64, 11.0)  # another process activated 5 first: it answers 5
    assert (lower.revision, lower.digest) == (5, "a" * 64)
    assert floor.lift(5, "c" * 64, 12.0).digest == "a" * 64  # revision 5 names the first bundle
    record = AuditEvent(kind="bundle", time=13.0, tenant=SYSTEM_TENANT, result="rollback_allowed",
                        detail={"from_revision": 5, "to_revision": 2, "reason": "test", "operator": "me"})
    floor.lower(2, 13.0, record)
    assert (floor.current().revision, floor.current().digest) == (2, "")
    [written] = store.audit_log.query(AuditQuery(kind="bundle"), limit=5)
    assert written.event.result == "rollback_allowed" and written.event.detail["to_revision"] == 2
    assert floor.lift(2, "d" * 64, 14.0).digest == "d" * 64  # the bundle activated after a rollback
