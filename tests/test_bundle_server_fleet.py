"""Bundle-server sidecars share the store's revision floor with the rest of the fleet
(issue 37): the real `toolauthz serve` polling a bundle server on PostgreSQL refuses an
archive below the floor another replica raised, decides nothing on a bundle below it,
a new replica refuses to start below it, and each start is one `bundle` audit record
in the tenant `_system`."""

from __future__ import annotations

import json
import shutil

import grpc
import pytest

from tests.test_bundle_archive import signed
from tests.test_bundle_floor import FORBID, bundle_records, with_keys
from tests.test_bundle_server_serve import Sidecar, bundle_server, config_for, key, measure  # noqa: F401 (fixtures)
from toolauthz.audit.records import SYSTEM_TENANT
from toolauthz.bundle.archive import build_archive
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc


def on_store(config, store_url: str, data_dir) -> None:
    """The config with the shared store and a data directory of its own (no kept archive)."""
    values = json.loads(config.read_text())
    values.update({"store": store_url, "store_migrate": True, "data_dir": str(data_dir)})
    config.write_text(json.dumps(values))


def port_of(line: str) -> int:
    return int(line.split(" on ")[1].split(",")[0].rsplit(":", 1)[1])


def test_a_bundle_server_sidecar_on_postgresql_never_serves_below_the_floor_another_replica_raised(
        tmp_path, bundle_dir, key, bundle_server, settings, clock, postgres_url):  # noqa: F811 (fixtures)
    from toolauthz.server.build import build_sidecar
    from toolauthz.store.postgres import migrate

    server, ca = bundle_server  # serves revision 1
    migrate(postgres_url)
    config = config_for(tmp_path, server, ca, key)
    on_store(config, postgres_url, tmp_path / "a-data")
    polling = Sidecar(config)
    other = None
    try:
        port = port_of(polling.await_line("toolauthz serving bundle"))
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ToolAuthorizerStub(channel)
            assert measure(stub, "on-1") == pb.ALLOW

            # Another replica, reading a directory, activates revision 3 (a forbid): the
            # fleet's floor is 3, and the polling sidecar's revision 1 decides nothing.
            shutil.copytree(bundle_dir, tmp_path / "b")
            (tmp_path / "b" / "zz.cedar").write_text(FORBID)
            signed(tmp_path / "b", key, 3)
            shared = settings.model_copy(update={"store": postgres_url, "data_dir": tmp_path / "b-data"})
            other = build_sidecar(with_keys(shared, tmp_path / "b", key, "b"), clock=clock)
            assert other.store.bundle_floor.current().revision == 3
            polling.await_line("below the fleet's floor 3")
            with pytest.raises(grpc.RpcError) as refused:
                measure(stub, "held-back")
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "bundle_below_floor" in refused.value.details()

            # The bundle server publishes revision 2: newer than what the sidecar serves,
            # signed and intact, but below the floor: refused, never served.
            signed(bundle_dir, key, 2)
            server.publish(build_archive(bundle_dir))
            polling.await_line("bundle from the bundle server refused")
            status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
            assert "revision 2 is below the floor, 3" in status.last_reload_error
            assert status.bundle_revision == 1 and any("floor, 3" in notice for notice in status.notices)

            # A new replica polling the same server refuses to start on revision 2.
            late = tmp_path / "late"
            late.mkdir()
            late_config = config_for(late, server, ca, key)
            on_store(late_config, postgres_url, late / "data")
            starting = Sidecar(late_config)
            output = "".join(iter(lambda: starting.lines.get(timeout=60), ""))
            assert starting.stop() != 0, output
            assert "below the floor, 3" in output and "toolauthz serving bundle" not in output
            assert "Traceback" not in output

            # The server publishes the floor's bundle (the bytes the other replica
            # activated): the polling sidecar loads it and decides again, on it.
            server.publish(build_archive(tmp_path / "b"))
            polling.await_line("bundle from the bundle server loaded")
            assert measure(stub, "on-3") == pb.DENY
            status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
            assert status.bundle_revision == 3 and status.last_reload_error == "" and not status.notices
    finally:
        if other is not None:
            other.close()
        assert polling.stop() == 0

    records = bundle_records(postgres_url)
    assert {record.tenant for record in records} == {SYSTEM_TENANT}
    from_server = [(r.result, r.detail.get("revision"), r.detail.get("at")) for r in records
                   if r.detail.get("source") == server.url]
    # One record per start (the polling sidecar's and the refused replica's), one per poll outcome.
    assert from_server == [("loaded", 1, "start"), ("refused", 1, None), ("refused", 2, "start"),
                           ("loaded", 3, "poll")]
