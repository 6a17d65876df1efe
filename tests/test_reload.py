"""Hot reload, SIGHUP, GetStatus, and shadow policies."""

from __future__ import annotations

import json
import pathlib
import queue
import shutil
import signal
import subprocess
import sys
import threading

import grpc
from conftest import ROOT, make_request

from toolauthz.audit.store import AuditQuery
from toolauthz.bundle import load_bundle
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc

MEASURE = {"prototype": "A", "metric": "runtime", "unit": "hours"}
FORBID_MEASURE = ('@id("no-measurements-today")\n'
                  'forbid (principal, action == Action::"tool:measure_runtime", resource);\n')


def measure(call_id: str) -> pb.AuthorizeRequest:
    return make_request("measure_runtime", MEASURE, call_id=call_id, entities=[], request_id=call_id)


def version_of(directory: pathlib.Path, tmp_path: pathlib.Path, name: str) -> str:
    copy = tmp_path / name
    shutil.copytree(directory, copy)
    return load_bundle(copy).version


def test_reload_under_load_loses_nothing_and_mixes_no_versions(bundle_dir, tmp_path, sidecar, stub):
    version_a = sidecar.bundles.current.version
    forbid_file = bundle_dir / "zz_forbid.cedar"
    forbid_file.write_text(FORBID_MEASURE)
    version_b = version_of(bundle_dir, tmp_path, "b")
    forbid_file.unlink()

    stop = threading.Event()
    seen, failures = [], []
    progress = threading.Condition()

    def client(n: int) -> None:
        i = 0
        while not stop.is_set():
            try:
                r = stub.Authorize(measure(f"w{n}-{i}"))
                seen.append((r.policy_version, r.decision, tuple(r.reasons)))
            except grpc.RpcError as exc:  # any error is a lost request
                failures.append(exc.code())
            with progress:
                progress.notify_all()
            i += 1

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    try:
        for round_ in range(6):
            before = len(seen)
            if round_ % 2 == 0:
                forbid_file.write_text(FORBID_MEASURE)
            else:
                forbid_file.unlink()
            assert sidecar.reloader.reload()
            with progress:  # let the clients run against this version
                assert progress.wait_for(lambda before=before: len(seen) >= before + 20 or failures, timeout=60)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not failures
    versions = {v for v, _, _ in seen}
    assert versions == {version_a, version_b}
    for version, decision, reasons in seen:
        if version == version_a:
            assert (decision, reasons) == (pb.ALLOW, ("measure-any-user",))
        else:
            assert (decision, reasons) == (pb.DENY, ("no-measurements-today",))


def test_invalid_edit_keeps_the_old_version_and_reports_the_error(bundle_dir, sidecar, stub):
    good = sidecar.bundles.current.version
    (bundle_dir / "orders.cedar").write_text("permit (principal, action, resource) when { context.nope };\n")
    assert not sidecar.reloader.reload()
    status = stub.GetStatus(pb.GetStatusRequest())
    assert status.policy_version == good and "orders.cedar:1:" in status.last_reload_error
    assert stub.Authorize(measure("m1")).policy_version == good
    shutil.copy(ROOT / "policies" / "orders.cedar", bundle_dir / "orders.cedar")
    (bundle_dir / "extra.cedar").write_text("// a comment changes the version\n" + FORBID_MEASURE)
    assert sidecar.reloader.reload()
    status = stub.GetStatus(pb.GetStatusRequest())
    assert status.policy_version != good and status.last_reload_error == "" and status.reloads == 1
    assert stub.Authorize(measure("m2")).policy_version == status.policy_version


def test_watcher_picks_up_a_change_without_a_restart(settings, clock, bundle_dir):
    from toolauthz.server.build import build_sidecar

    car = build_sidecar(settings.model_copy(update={"reload_poll_seconds": 0.02}), clock=clock)
    try:
        old = car.bundles.current.version
        attempts = car.reloader.attempts
        (bundle_dir / "extra.cedar").write_text(FORBID_MEASURE)
        assert car.reloader.wait_for_attempt(attempts, timeout=30)
        assert car.bundles.current.version != old
    finally:
        car.close()


def test_sighup_reloads_a_running_server(tmp_path, bundle_dir):
    config = tmp_path / "toolauthz.yaml"
    config.write_text(json.dumps({"bundle": str(bundle_dir), "data_dir": str(tmp_path / "data"),
                                  "listen": "127.0.0.1:0", "generate_missing_keys": True,
                                  "reload_poll_seconds": 0}))
    proc = subprocess.Popen([sys.executable, "-m", "toolauthz.cli", "serve", "--config", str(config), "--workers", "1"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True)
    reader.start()

    def await_line(text: str) -> str:
        while True:
            line = lines.get(timeout=60)  # a hung server fails the test instead of hanging it
            if text in line:
                return line

    try:
        line = await_line("serving")
        port = int(line.split(" on ")[1].split(",")[0].rsplit(":", 1)[1])
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.ToolAuthorizerStub(ch)
            old = stub.GetStatus(pb.GetStatusRequest(), timeout=10).policy_version
            (bundle_dir / "extra.cedar").write_text(FORBID_MEASURE)
            proc.send_signal(signal.SIGHUP)
            await_line("bundle reloaded")
            status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
            assert status.policy_version != old and status.reloads == 1
            assert stub.Authorize(measure("after-hup"), timeout=10).decision == pb.DENY
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        reader.join(timeout=30)
        proc.stdout.close()
    assert proc.returncode == 0


def test_shadow_policy_is_recorded_but_never_changes_a_decision(bundle_dir, settings, clock):
    from toolauthz.server.build import build_sidecar

    (bundle_dir / "shadow.cedar").write_text('@id("shadow-no-measure-b")\n@shadow\n'
                                             'forbid (principal, action == Action::"tool:measure_runtime", resource)\n'
                                             'when { context.input.prototype == "B" };\n')
    car = build_sidecar(settings, clock=clock)
    try:
        from toolauthz.model import Principal, ProposedCall, TrustedContext
        ctx = TrustedContext("acme", Principal("User", "alice"), "r")
        a = car.authorizer.authorize(ctx, ProposedCall("a", "measure_runtime", json.dumps(MEASURE).encode()))
        b = car.authorizer.authorize(ctx, ProposedCall("b", "measure_runtime",
                                                       json.dumps({**MEASURE, "prototype": "B"}).encode()))
        assert a.decision.value == b.decision.value == "ALLOW" and b.token is not None
        [record_b] = car.audit_log.query(AuditQuery(call_id="b"), limit=2)
        assert record_b.event.detail["shadow"] == {"decision": "DENY", "reasons": ["shadow-no-measure-b"]}
        [record_a] = car.audit_log.query(AuditQuery(call_id="a"), limit=2)
        assert "shadow" not in record_a.event.detail
        assert car.status().policy.shadow_effects == {"shadow-no-measure-b": 1}
    finally:
        car.close()
