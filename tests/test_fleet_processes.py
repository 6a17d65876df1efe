"""A fleet: three `toolauthz serve` processes on one PostgreSQL database and one keys
directory, each on a port of its own (port 0), answering as one sidecar would."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import psycopg
import pytest
from conftest import EXAMPLE_BUNDLE, ROOT, make_request, verify_request

from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import audit_pb2 as aupb
from toolauthz.proto.toolauthz.v1 import audit_pb2_grpc as aupb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.store.postgres import migrate

START_TIMEOUT = 60
WAIT = 30
LARGE = {"order_id": "ord_1", "amount_cents": 6000}


class Replica:
    """`toolauthz serve` in a subprocess; `port` is read from its serving line."""

    def __init__(self, store: str, data_dir: str):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TOOLAUTHZ_STORE": store}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "toolauthz.cli.main", "serve", "--bundle", str(EXAMPLE_BUNDLE), "--listen",
             "127.0.0.1:0", "--data-dir", data_dir, "--workers", "1"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.err: list[str] = []
        self._port: list[int] = []
        self._ready = threading.Event()
        self._readers = [threading.Thread(target=self._read_out, daemon=True),
                         threading.Thread(target=self._read_err, daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read_out(self) -> None:
        for line in self.proc.stdout:
            found = re.search(r" on 127\.0\.0\.1:(\d+)", line)
            if found and not self._port:
                self._port.append(int(found.group(1)))
                self._ready.set()
        self._ready.set()

    def _read_err(self) -> None:
        for line in self.proc.stderr:
            self.err.append(line.rstrip("\n"))

    def wait_serving(self) -> int:
        assert self._ready.wait(START_TIMEOUT) and self._port, "did not start:\n" + "\n".join(self.err)
        return self._port[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for reader in self._readers:
            reader.join(WAIT)
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture(scope="module")
def fleet_store(postgres_database):
    schema = f"fleet_{secrets.token_hex(4)}"
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    url = f"{postgres_database}?options=-csearch_path%3D{schema}"
    migrate(url)
    return url


@pytest.fixture(scope="module")
def fleet(fleet_store, tmp_path_factory):
    """Three replicas; the first creates the development keys the others then load."""
    data = str(tmp_path_factory.mktemp("fleet") / "data")
    replicas = [Replica(fleet_store, data)]
    try:
        ports = [replicas[0].wait_serving()]
        replicas += [Replica(fleet_store, data) for _ in range(2)]
        ports += [r.wait_serving() for r in replicas[1:]]
        channels = [grpc.insecure_channel(f"127.0.0.1:{port}") for port in ports]
        yield channels, data, fleet_store
        for channel in channels:
            channel.close()
    finally:
        for replica in replicas:
            replica.stop()


def authorizers(fleet):
    return [pb_grpc.ToolAuthorizerStub(ch) for ch in fleet[0]]


def test_one_token_verifies_once_across_the_fleet(fleet):
    stubs = authorizers(fleet)
    request = make_request(call_id="v1", request_id="run-v")
    token = stubs[0].Authorize(request, timeout=WAIT).token
    with ThreadPoolExecutor(20) as pool:
        codes = list(pool.map(lambda i: stubs[i % 3].Verify(verify_request(request, token), timeout=WAIT).code,
                              range(20)))
    assert sorted(codes) == ["already_used"] * 19 + ["ok"]


def test_one_call_id_with_other_arguments_on_two_replicas_is_allowed_at_most_once(fleet):
    stubs = authorizers(fleet)
    requests = [make_request(call_id="same", request_id="run-s", args={"order_id": "ord_1", "amount_cents": c})
                for c in (1500, 1400)]
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda i: stubs[i].Authorize(requests[i], timeout=WAIT), range(2)))
    assert [a.decision for a in answers].count(pb.ALLOW) <= 1
    assert sum(bool(a.token) for a in answers) <= 1


def test_a_run_limit_is_counted_across_the_fleet(fleet):
    stubs = authorizers(fleet)  # the example bundle: five refunds per run
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(
            lambda i: stubs[i % 3].Authorize(make_request(call_id=f"r{i}", request_id="run-limit"), timeout=WAIT),
            range(12)))
    assert [a.decision for a in answers].count(pb.ALLOW) == 5
    assert all(a.errors[0].code == "limit_exceeded" for a in answers if a.decision != pb.ALLOW)


def test_approved_on_one_replica_fetched_on_another_and_a_watch_on_a_third_woken(fleet):
    channels = fleet[0]
    stubs = authorizers(fleet)
    approvals = [apb_grpc.ApprovalsStub(ch) for ch in channels]
    request = make_request(call_id="a1", request_id="run-a", args=LARGE)
    asked = stubs[0].Authorize(request, timeout=WAIT)
    assert asked.decision == pb.APPROVAL_REQUIRED
    watch = approvals[0].WatchApproval(apb.GetApprovalRequest(approval_id=asked.approval_id,
                                                             context=request.context), timeout=WAIT)
    assert next(watch).status == apb.PENDING
    approver = pb.TrustedContext(tenant="acme", principal=pb.Principal(type="User", id="bob"))
    decided = approvals[1].DecideApproval(apb.DecideApprovalRequest(
        approval_id=asked.approval_id, approver=approver, verdict=apb.APPROVE, reason="ok"), timeout=WAIT)
    assert decided.status == apb.APPROVED
    assert next(watch).status == apb.APPROVED
    token = approvals[2].GetApproval(apb.GetApprovalRequest(approval_id=asked.approval_id,
                                                            context=request.context), timeout=WAIT).token
    assert stubs[2].Verify(verify_request(request, token), timeout=WAIT).valid


def test_every_replica_sees_every_decision_and_the_trail_verifies_until_edited(fleet, capsys):
    from toolauthz.cli.main import main

    channels, data, store = fleet
    stubs = authorizers(fleet)
    for i in range(3):
        stubs[i].Authorize(make_request(call_id=f"q{i}", request_id="run-q"), timeout=WAIT)
    seen = [sorted(r.call_id for r in aupb_grpc.AuditStub(ch).QueryDecisions(
        aupb.QueryDecisionsRequest(request_id="run-q"), timeout=WAIT)) for ch in channels]
    assert seen == [["q0", "q1", "q2"]] * 3

    assert main(["audit", "verify", "--store", store, "--data-dir", data]) == 0
    assert capsys.readouterr().out.startswith("ok: ")
    with psycopg.connect(store, autocommit=True) as owner:  # the owner role can edit; the chain shows it
        owner.execute("ALTER TABLE audit_record DISABLE TRIGGER USER")
        owner.execute("UPDATE audit_record SET result = 'DENY' WHERE call_id = 'q1' AND kind = 'authorize'")
        place = owner.execute("SELECT chain, chain_seq FROM audit_record WHERE call_id = 'q1' AND kind = 'authorize'"
                              ).fetchone()
        owner.execute("ALTER TABLE audit_record ENABLE TRIGGER USER")
    assert main(["audit", "verify", "--store", store, "--data-dir", data]) == 1
    assert f"chain {place[0]} seq {place[1]}: edited" in capsys.readouterr().out
