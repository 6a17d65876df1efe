"""The real `toolauthz serve` (the installed console script) with `bundle_server:` against
a bundle server this test runs: it starts on the served revision, picks up a newly
signed one within its poll interval, refuses a tampered and an older one, and keeps
serving through an outage, with GetStatus saying so each time."""

from __future__ import annotations

import io
import json
import pathlib
import queue
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.bundle_server import BundleServer
from tests.certs import CertificateAuthority
from tests.conftest import ROOT, make_request
from tests.test_bundle_archive import signed
from tests.test_bundle_server import FORBID, publish_revision
from toolauthz.bundle.archive import build_archive
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc

TOOLAUTHZ = pathlib.Path(sys.executable).parent / "toolauthz"
LINE_TIMEOUT = 60  # a hung sidecar fails the test instead of hanging it
MEASURE = {"prototype": "A", "metric": "runtime", "unit": "hours"}


class Sidecar:
    def __init__(self, config: pathlib.Path):
        # One worker: each worker polls on its own, so with several a decision right after
        # one worker's "loaded" line may reach another that has not polled yet.
        self.proc = subprocess.Popen([str(TOOLAUTHZ), "serve", "--config", str(config), "--workers", "1"], cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")

    def await_line(self, text: str) -> str:
        """The first line holding `text`; a sidecar that never writes it fails the test
        within LINE_TIMEOUT even while it keeps writing other lines."""
        deadline = time.monotonic() + LINE_TIMEOUT
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line with `{text}` within {LINE_TIMEOUT}s; the last lines:\n"
                                     + "".join(self.seen[-20:])) from None
            self.seen.append(line)
            assert line, f"the sidecar ended (exit {self.proc.wait()}) before `{text}`:\n{''.join(self.seen)}"
            if text in line:
                return line

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=60)
        finally:
            self._reader.join(timeout=30)
            if self.proc.stdout is not None:
                self.proc.stdout.close()


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def bundle_server(tmp_path, bundle_dir, key) -> Iterator[tuple[BundleServer, CertificateAuthority]]:
    ca = CertificateAuthority()
    server = BundleServer(ca, tmp_path / "server").start()
    server.publish(build_archive(signed(bundle_dir, key, 1)))
    yield server, ca
    server.stop()


def config_for(tmp_path, server: BundleServer, ca: CertificateAuthority, key: Ed25519PrivateKey,
               **extra) -> pathlib.Path:
    public = tmp_path / "bundle-key.pem"
    public.write_bytes(key.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo))
    config = tmp_path / "toolauthz.yaml"
    config.write_text(json.dumps({
        "data_dir": str(tmp_path / "data"), "listen": "127.0.0.1:0", "generate_missing_keys": True,
        "bundle_verification": {"keys": [{"kid": "ci-1", "file": str(public)}]},
        "bundle_server": {"url": server.url, "ca_file": str(ca.write(tmp_path / "ca.pem")), "poll_seconds": 0.2,
                          "jitter": 0.0, "max_backoff_seconds": 0.5, "timeout_seconds": 5, **extra}}))
    return config


def measure(stub, call_id: str) -> int:
    request = make_request("measure_runtime", MEASURE, call_id=call_id, entities=[], request_id=call_id)
    return stub.Authorize(request, timeout=10).decision


def test_a_served_sidecar_follows_the_bundle_server_and_keeps_the_last_good_bundle(tmp_path, bundle_dir, key,
                                                                                    bundle_server):
    server, ca = bundle_server
    sidecar = Sidecar(config_for(tmp_path, server, ca, key))
    try:
        line = sidecar.await_line("toolauthz serving bundle")
        assert server.url in line
        port = int(line.split(" on ")[1].split(",")[0].rsplit(":", 1)[1])
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ToolAuthorizerStub(channel)
            status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
            assert status.bundle_dir == server.url and status.last_reload_error == ""
            assert measure(stub, "before") == pb.ALLOW

            # A newly signed revision: picked up by the poller, no signal, no restart.
            publish_revision(server, bundle_dir, key, 2)
            sidecar.await_line("bundle from the bundle server loaded")
            assert measure(stub, "after-2") == pb.DENY
            serving = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
            assert serving.reloads == 1 and serving.policy_version != status.policy_version

            # Revision 3 with a file changed after signing: refused.
            publish_revision(server, bundle_dir, key, 3, extra="")
            server.publish(_with_file(server.archive, "extra.cedar", b"permit (principal, action, resource);\n"))
            sidecar.await_line("bundle from the bundle server refused")
            status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
            assert "altered: `extra.cedar`" in status.last_reload_error
            assert status.policy_version == serving.policy_version
            assert measure(stub, "after-tamper") == pb.DENY

            # An older signed revision: a rollback, refused.
            (bundle_dir / "extra.cedar").unlink()
            server.publish(build_archive(signed(bundle_dir, key, 1)))
            sidecar.await_line("bundle from the bundle server refused")
            status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
            assert "revision 1 is below the floor, 2" in status.last_reload_error
            assert measure(stub, "after-rollback") == pb.DENY

            # An outage: the sidecar keeps deciding on revision 2 and says the server is down.
            server.stop()
            sidecar.await_line("the bundle server is unreachable")
            status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
            assert "unreachable" in status.last_reload_error
            assert status.policy_version == serving.policy_version
            assert measure(stub, "during-outage") == pb.DENY

            # The server is back with revision 4: loaded, the error gone.
            publish_revision(server, bundle_dir, key, 4, extra=FORBID.replace("no-measurements", "still-none"))
            server.start()
            sidecar.await_line("bundle from the bundle server loaded")
            status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
            assert status.last_reload_error == "" and status.reloads == 2
    finally:
        assert sidecar.stop() == 0


def test_a_sidecar_does_not_start_without_a_verified_bundle_from_its_server(tmp_path, bundle_dir, key,
                                                                             bundle_server):
    server, ca = bundle_server
    server.publish(server.archive[:-20])  # truncated
    sidecar = Sidecar(config_for(tmp_path, server, ca, key))
    output = "".join(iter(lambda: sidecar.lines.get(timeout=LINE_TIMEOUT), ""))
    assert sidecar.stop() != 0
    assert "refused" in output and "Traceback" not in output
    assert "toolauthz serving bundle" not in output


def _with_file(archive: bytes, name: str, data: bytes) -> bytes:
    """The archive with one file's content replaced (its signature left as it was)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as good, \
            tarfile.open(fileobj=buffer, mode="w:gz") as bad:
        for member in good.getmembers():
            content = good.extractfile(member).read()  # type: ignore[union-attr]
            if member.name == name:
                content, member.size = data, len(data)
            bad.addfile(member, io.BytesIO(content))
    return buffer.getvalue()


@pytest.mark.parametrize("server_settings, message", [
    ({"url": "http://bundles.example.com/b.tar.gz"}, "must be an https:// url"),
    ({"url": "https://user:pw@bundles.example.com/b.tar.gz"}, "may hold no user, password or fragment"),
    ({"url": "https://bundles.example.com/b.tar.gz", "client_cert_file": "/x.pem"}, "go together"),
    ({"url": "https://bundles.example.com/b.tar.gz", "poll_seconds": 0}, "greater than 0"),
])
def test_bad_bundle_server_settings_are_refused_with_a_clear_error(tmp_path, key, server_settings, message):
    public = tmp_path / "bundle-key.pem"
    public.write_bytes(key.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo))
    config = tmp_path / "toolauthz.yaml"
    config.write_text(json.dumps({"data_dir": str(tmp_path / "data"), "bundle_server": server_settings,
                                  "bundle_verification": {"keys": [{"kid": "ci-1", "file": str(public)}]}}))
    done = subprocess.run([str(TOOLAUTHZ), "serve", "--config", str(config), "--workers", "1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert message in (done.stdout + done.stderr).lower() and "Traceback" not in done.stderr


def test_a_bundle_server_without_bundle_verification_is_refused(tmp_path):
    config = tmp_path / "toolauthz.yaml"
    config.write_text(json.dumps({"data_dir": str(tmp_path / "data"),
                                  "bundle_server": {"url": "https://bundles.example.com/b.tar.gz"}}))
    done = subprocess.run([str(TOOLAUTHZ), "serve", "--config", str(config), "--workers", "1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "a bundle from `bundle_server` must be signed: set `bundle_verification`" in done.stdout + done.stderr


def test_a_bundle_directory_and_a_bundle_server_together_are_refused(tmp_path, key, bundle_dir):
    public = tmp_path / "bundle-key.pem"
    public.write_bytes(key.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo))
    config = tmp_path / "toolauthz.yaml"
    config.write_text(json.dumps({"data_dir": str(tmp_path / "data"),
                                  "bundle_server": {"url": "https://bundles.example.com/b.tar.gz"},
                                  "bundle_verification": {"keys": [{"kid": "ci-1", "file": str(public)}]}}))
    done = subprocess.run([str(TOOLAUTHZ), "serve", "--config", str(config), "--bundle", str(bundle_dir),
                           "--workers", "1"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "`bundle` (a directory) and `bundle_server` exclude each other" in done.stdout + done.stderr


def test_a_sidecar_restarted_during_an_outage_serves_its_last_good_archive(tmp_path, bundle_dir, key,
                                                                           bundle_server):
    server, ca = bundle_server
    config = config_for(tmp_path, server, ca, key)
    publish_revision(server, bundle_dir, key, 2)
    first = Sidecar(config)
    try:
        first.await_line("toolauthz serving bundle")
    finally:
        assert first.stop() == 0
    server.stop()
    second = Sidecar(config)
    try:
        line = second.await_line("toolauthz serving bundle")
        port = int(line.split(" on ")[1].split(",")[0].rsplit(":", 1)[1])
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ToolAuthorizerStub(channel)
            status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
            assert "serving the cached revision 2" in status.last_reload_error
            assert measure(stub, "cached") == pb.DENY  # revision 2's forbid
            publish_revision(server, bundle_dir, key, 3, extra="")
            server.start()
            second.await_line("bundle from the bundle server loaded")
            assert measure(stub, "back") == pb.ALLOW
            assert stub.GetStatus(pb.GetStatusRequest(), timeout=10).last_reload_error == ""
    finally:
        code = second.stop()
        rest = "".join(iter(lambda: second.lines.get(timeout=5), ""))
        assert code == 0, "".join(second.seen) + rest
    # One `bundle` record per start, the kept archive's saying why it serves; none more
    # for the outage that was already on at the start.
    from tests.test_bundle_floor import bundle_records

    records = bundle_records(f"sqlite:///{tmp_path / 'data' / 'toolauthz.db'}")
    assert [(r.result, r.detail.get("revision"), r.detail.get("at"), r.detail.get("kept_archive"),
             r.detail.get("server_unreachable")) for r in records] == [
        ("loaded", 2, "start", None, None), ("loaded", 2, "start", True, True), ("loaded", 3, "poll", None, None)]
