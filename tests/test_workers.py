"""`serve --workers N`: N processes on one port, one ledger and one audit chain."""

from __future__ import annotations

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time

import grpc
import pytest
from conftest import ROOT, make_request, verify_request

from toolauthz.audit import verify_chain
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.server.config import DATABASE_FILE, ListenerSettings, Settings
from toolauthz.store import SqliteAuditLog
from toolauthz.tokens.keys import load_private_key_file

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_REUSEPORT and /proc are Linux")

START_TIMEOUT = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Workers:
    """`python -m toolauthz.server.workers` in a subprocess, with its output collected."""

    def __init__(self, *args: str):
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-m", "toolauthz.server.workers", *args], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self._serving = threading.Event()
        self._lines = threading.Condition()  # a line read, or standard output ended
        self._out_ended = False
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self.out, True), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, self.err, False), daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, lines: list[str], watch: bool) -> None:
        for line in stream:
            with self._lines:
                lines.append(line.rstrip("\n"))
                self._lines.notify_all()
            if watch and "serving" in line:
                self._serving.set()
        if watch:
            with self._lines:
                self._out_ended = True
                self._lines.notify_all()
            self._serving.set()

    def await_line(self, text: str) -> str:
        """The first line of standard output that holds `text`, once it has been printed
        (lines after "serving" may still be on their way when it is seen)."""
        def printed() -> str | None:
            return next((x for x in self.out if text in x), None)
        with self._lines:
            self._lines.wait_for(lambda: printed() is not None or self._out_ended, START_TIMEOUT)
            line = printed()
        assert line is not None, f"no line with `{text}` in:\n" + "\n".join(self.out)
        return line

    def wait_serving(self) -> list[int]:
        assert self._serving.wait(START_TIMEOUT), "workers did not start"
        assert self.proc.poll() is None, "\n".join(self.err)
        line = next(x for x in self.out if "serving" in x)
        return [int(p) for p in re.search(r"pids ([\d, ]+)\)", line).group(1).split(", ")]

    def wait(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for reader in self._readers:
            reader.join(5)
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture
def workers_factory():
    started: list[Workers] = []

    def start(*args: str) -> Workers:
        w = Workers(*args)
        started.append(w)
        return w

    yield start
    for w in started:
        w.kill()


def pids_holding_connections(port: int, pids: list[int]) -> set[int]:
    """Which of `pids` own an accepted (server-side, ESTABLISHED) socket on `port`."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                if local_port == port and fields[3] == "01":
                    inodes.add(fields[9])
    holders = set()
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                holders.add(pid)
    return holders


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_workers_share_the_port_the_ledger_and_one_audit_chain(workers_factory, bundle_dir, tmp_path):
    port, data = free_port(), tmp_path / "data"
    workers = workers_factory("--bundle", str(bundle_dir), "--listen", f"127.0.0.1:{port}",
                              "--data-dir", str(data), "--workers", "2")
    pids = workers.wait_serving()
    assert len(set(pids)) == 2
    # One channel = one connection; the kernel spreads connections over the workers.
    channels = [grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(16)]
    try:
        stubs = [pb_grpc.ToolAuthorizerStub(ch) for ch in channels]
        allowed = []
        for i in range(64):
            request = make_request(call_id=f"toolu_{i}", request_id=f"run-{i}")
            response = stubs[i % len(stubs)].Authorize(request, timeout=10)
            assert response.decision == pb.ALLOW, response
            allowed.append((request, response.token))
        assert pids_holding_connections(port, pids) == set(pids)  # both workers served calls
        # A token issued by one connection is consumed through another, once: one ledger.
        for i, (request, token) in enumerate(allowed[:8]):
            first = stubs[(i + 1) % len(stubs)].Verify(verify_request(request, token), timeout=10)
            again = stubs[(i + 2) % len(stubs)].Verify(verify_request(request, token), timeout=10)
            assert (first.valid, again.code) == (True, "already_used")
    finally:
        for ch in channels:
            ch.close()

    workers.proc.send_signal(signal.SIGTERM)
    assert workers.wait() == 0, "\n".join(workers.err)
    assert not any(alive(pid) for pid in pids)
    with sqlite3.connect(data / DATABASE_FILE) as db:
        counts = dict(db.execute("SELECT kind, count(*) FROM audit_record GROUP BY kind"))
    # and one `bundle` record per process that loaded the bundle at start: the parent's
    # check and the two workers
    assert counts == {"authorize": 64, "verify": 16, "bundle": 3}
    log = SqliteAuditLog(str(data / DATABASE_FILE))
    try:  # two writers, one chain, and each worker's final checkpoint verifies
        audit_key = load_private_key_file(data / "audit-key.pem").public_key
        assert verify_chain(log.iter_records(), log.checkpoints(), audit_key) == []
        assert log.checkpoints()
    finally:
        log.close()


def test_a_bad_bundle_is_reported_once_and_no_worker_starts(workers_factory, bundle_dir, tmp_path):
    refunds = bundle_dir / "refunds.cedar"
    refunds.write_text(refunds.read_text().replace("context.input.amount_cents <= 5000",
                                                   "context.input.amout_cents <= 5000"))
    began = time.monotonic()
    workers = workers_factory("--bundle", str(bundle_dir), "--listen", f"127.0.0.1:{free_port()}",
                              "--data-dir", str(tmp_path / "data"), "--workers", "2")
    assert workers.wait() == 1
    assert time.monotonic() - began < 20
    problems = [line for line in workers.err if "amout_cents" in line]
    assert len(problems) == 1 and problems[0].startswith("refunds.cedar:"), workers.err
    assert not any("serving" in line for line in workers.out)


def test_an_address_in_use_is_refused_before_any_worker_starts(workers_factory, bundle_dir, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        workers = workers_factory("--bundle", str(bundle_dir), "--listen", f"127.0.0.1:{port}",
                                  "--data-dir", str(tmp_path / "data"), "--workers", "2")
        assert workers.wait() == 1
    assert [line for line in workers.err if "in use" in line] == [f"toolauthz: cannot listen on 127.0.0.1:{port}: "
                                                                  "the address is in use"]


def test_a_worker_that_fails_to_start_stops_the_group_with_one_report(bundle_dir, tmp_path, capsys):
    """The parent's check passed, then every worker fails (here: the bundle broke in
    between): one report, the other workers stopped, exit status 1."""
    from toolauthz.server.worker_group import WorkerGroup as _WorkerGroup

    (bundle_dir / "orders.cedar").write_text("permit (principal, action, resource")
    settings = Settings(bundle=bundle_dir, data_dir=tmp_path / "data", listen="127.0.0.1:0")
    group = _WorkerGroup(settings, 2)
    assert group.start((ListenerSettings(address=f"127.0.0.1:{free_port()}"),)) == 1
    reported = [line for line in capsys.readouterr().err.splitlines() if line.startswith("orders.cedar")]
    assert len(reported) == 1, reported
    assert not any(alive(pid) for pid in group.pids())


def test_a_worker_that_dies_while_serving_takes_the_group_down(workers_factory, bundle_dir, tmp_path):
    workers = workers_factory("--bundle", str(bundle_dir), "--listen", "127.0.0.1:0",
                              "--data-dir", str(tmp_path / "data"), "--workers", "2")
    pids = workers.wait_serving()
    os.kill(pids[0], signal.SIGKILL)
    assert workers.wait() == 1
    assert not alive(pids[1])
    assert any("exited with code -9" in line for line in workers.err)


def test_one_worker_serves_in_this_process_like_serve(workers_factory, bundle_dir, tmp_path):
    port = free_port()
    workers = workers_factory("--bundle", str(bundle_dir), "--listen", f"127.0.0.1:{port}",
                              "--data-dir", str(tmp_path / "data"), "--workers", "1")
    assert workers._serving.wait(START_TIMEOUT)
    assert any(f"on 127.0.0.1:{port}, data in" in line for line in workers.out), workers.out
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        response = pb_grpc.ToolAuthorizerStub(channel).Authorize(make_request(), timeout=10)
    assert response.decision == pb.ALLOW
    workers.proc.send_signal(signal.SIGTERM)
    assert workers.wait() == 0, "\n".join(workers.err)


def test_workers_must_be_positive(settings):
    from toolauthz.errors import ToolAuthzError
    from toolauthz.server.workers import serve_workers

    with pytest.raises(ToolAuthzError, match="at least 1"):
        serve_workers(settings, 0)


def test_listen_addresses_are_split_into_host_and_port():
    from toolauthz.errors import ToolAuthzError
    from toolauthz.server.workers import split_listen

    assert split_listen("127.0.0.1:50051") == ("127.0.0.1", 50051)
    assert split_listen("[::1]:0") == ("[::1]", 0)
    for bad in ("127.0.0.1", ":50051", "host:port", "host:70000"):
        with pytest.raises(ToolAuthzError):
            split_listen(bad)
