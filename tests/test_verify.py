"""Verify, single use, GetKeys and ReportOutcome over gRPC."""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import sqlite3

import grpc
import pytest
from conftest import make_request, order_entity, verify_request

from toolauthz.audit.store import AuditQuery
from toolauthz.errors import StoreUnavailable
from toolauthz.model import Principal, ProposedCall, TrustedContext
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.tokens import CallClaims, verify_offline


def allowed(stub, **kwargs):
    request = make_request(**kwargs)
    response = stub.Authorize(request)
    assert response.decision == pb.ALLOW
    return request, response


@pytest.mark.both_stores
def test_verify_once_then_already_used(stub, sidecar):
    request, response = allowed(stub)
    first = stub.Verify(verify_request(request, response.token))
    assert (first.valid, first.code, first.decision_id) == (True, "ok", response.decision_id)
    second = stub.Verify(verify_request(request, response.token))
    assert (second.valid, second.code) == (False, "already_used")
    kinds = [(r.event.kind, r.event.result) for r in sidecar.audit_log.query(AuditQuery(call_id="toolu_1"), limit=9)]
    assert kinds == [("authorize", "ALLOW"), ("verify", "ok"), ("verify", "already_used")]


@pytest.mark.parametrize("swap", ["tool", "input", "principal", "tenant", "call_id", "principal_type"])
def test_any_change_to_the_call_fails_verification(stub, swap):
    request, response = allowed(stub)
    presented = verify_request(request, response.token)
    if swap == "tool":
        presented.call.name = "lookup_order"
    elif swap == "input":
        presented.call.input_json = json.dumps({"order_id": "ord_1", "amount_cents": 1501}).encode()
    elif swap == "principal":
        presented.context.principal.id = "mallory"
    elif swap == "principal_type":
        presented.context.principal.type = "Service"
    elif swap == "tenant":
        presented.context.tenant = "globex"
    else:
        presented.call.call_id = "toolu_other"
    answer = stub.Verify(presented)
    assert not answer.valid and answer.code == "bad_signature"
    # The untouched call still verifies: the failed attempts consumed nothing.
    assert stub.Verify(verify_request(request, response.token)).valid


def test_equivalent_json_spelling_verifies(stub):
    """The digest is over the canonical form: whitespace, key order and 1500.0 don't matter."""
    request, response = allowed(stub)
    presented = verify_request(request, response.token)
    presented.call.input_json = b'{ "amount_cents": 1500.0,\n "order_id": "ord_1" }'
    assert stub.Verify(presented).valid


@pytest.mark.parametrize("token", ["", "garbage", "v4.local.AAAA", "eyJhbGciOiJub25lIn0.eyJ4IjoxfQ.",
                                   "v4.public." + "A" * 100])
def test_malformed_tokens_are_an_answer_not_an_error(stub, token):
    request, _ = allowed(stub)
    answer = stub.Verify(verify_request(request, token))
    assert not answer.valid and answer.code == "malformed"


def test_expired_token(stub, clock):
    request, response = allowed(stub)
    clock.advance(60 + 5 + 1)
    answer = stub.Verify(verify_request(request, response.token))
    assert (answer.valid, answer.code) == (False, "expired")


def test_token_of_another_sidecar_is_unknown_key(stub, tmp_path, bundle_dir, clock):
    from toolauthz.server.build import build_sidecar
    from toolauthz.server.config import Settings

    other = build_sidecar(Settings(bundle=bundle_dir, data_dir=tmp_path / "other"), clock=clock)
    try:
        from toolauthz.model import Principal, ProposedCall, TrustedContext
        request = make_request()
        ctx = TrustedContext("acme", Principal("User", "alice"), "run-1", request.context.entities_json)
        foreign = other.authorizer.authorize(ctx, ProposedCall("toolu_1", "issue_refund", request.call.input_json))
        assert foreign.token is not None
        answer = stub.Verify(verify_request(request, foreign.token.token))
        assert (answer.valid, answer.code) == (False, "unknown_key")
    finally:
        other.close()


def test_ledger_failure_means_no_token_and_no_valid(stub, sidecar):
    request, response = allowed(stub)

    class BrokenLedger:
        def __getattr__(self, name):
            def fail(*args, **kwargs):
                raise StoreUnavailable("disk on fire")
            return fail

    real = sidecar.authorizer.ledger
    sidecar.authorizer.ledger = BrokenLedger()
    try:
        with pytest.raises(grpc.RpcError) as info:
            stub.Verify(verify_request(request, response.token))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.RpcError) as info:
            stub.Authorize(make_request(call_id="toolu_2"))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "disk on fire" not in info.value.details()
    finally:
        sidecar.authorizer.ledger = real
    assert stub.Verify(verify_request(request, response.token)).valid


@pytest.mark.both_stores
def test_a_failed_ledger_batch_leaves_nothing_behind(stub, sidecar):
    """Concurrent decisions share a ledger transaction; when its commit fails, every
    caller in it is refused, none of their rows stays, and a retry decides afresh."""
    ledger = sidecar.ledger

    def commit_fails(writes):
        with ledger.transaction() as db:
            for write in writes:
                write(db)  # decided and inserted, then the commit fails: all rolled back
            raise StoreUnavailable("disk full at commit")

    real = ledger._writes._run_batch
    ledger._writes._run_batch = commit_fails
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            outcomes = list(pool.map(lambda i: _code_of(stub, make_request(call_id=f"b{i}")), range(8)))
    finally:
        ledger._writes._run_batch = real
    assert outcomes == [grpc.StatusCode.UNAVAILABLE] * 8
    assert all(ledger.get("acme", f"b{i}") is None for i in range(8))
    assert sidecar.audit_log.query(AuditQuery(call_id="b0"), limit=5) == []
    retry = stub.Authorize(make_request(call_id="b0"))
    assert retry.decision == pb.ALLOW and retry.token and not retry.replayed


def _code_of(stub, request):
    try:
        stub.Authorize(request)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def _break_audit_inserts(monkeypatch, sidecar):
    """Every append to the audit trail fails as a full disk would, inside whatever
    transaction makes it."""
    from toolauthz.store.sqlite.transaction import SqliteTransaction

    def disk_full(tx, events):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(SqliteTransaction, "append_audit", disk_full)


def test_audit_failure_means_no_token_and_no_decision(stub, sidecar, monkeypatch):
    _break_audit_inserts(monkeypatch, sidecar)
    with pytest.raises(grpc.RpcError) as info:
        stub.Authorize(make_request())
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    # The decision and its record are one transaction: neither was kept, so the call id
    # is not poisoned and a retry once the disk has room is decided afresh.
    # record 1: the bundle loaded at start-up
    assert sidecar.ledger.get("acme", "toolu_1") is None and sidecar.audit_log.head()[0] == 1
    monkeypatch.undo()
    retry = stub.Authorize(make_request())
    assert retry.decision == pb.ALLOW and retry.token and not retry.replayed


def test_audit_failure_of_a_verification_leaves_the_token_unspent(stub, sidecar, monkeypatch):
    request, response = allowed(stub)
    _break_audit_inserts(monkeypatch, sidecar)
    with pytest.raises(grpc.RpcError) as info:
        stub.Verify(verify_request(request, response.token))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert sidecar.ledger.get("acme", "toolu_1").verified_jti == ""  # consumed only with its record
    monkeypatch.undo()
    assert stub.Verify(verify_request(request, response.token)).code == "ok"
    assert stub.Verify(verify_request(request, response.token)).code == "already_used"


def test_a_decision_and_its_record_commit_as_one_durable_transaction(sidecar, monkeypatch):
    """Authorize and Verify each make one commit, holding the ledger write and its audit
    record, and fsync the database's log once the write lock is released, before they
    answer."""
    def call(call_id):
        return (TrustedContext("acme", Principal("User", "alice"), "run-1",
                               json.dumps([order_entity("ord_1", "alice")]).encode()),
                ProposedCall(call_id, "issue_refund", b'{"order_id": "ord_1", "amount_cents": 1500}'))

    authorizer = sidecar.authorizer
    assert authorizer.authorize(*call("warm")).decision.value == "ALLOW"  # opens this thread's connections
    events = []
    lock = sidecar.store.unit._write_lock
    for _, conn in sidecar.store.unit._connections:
        conn.set_trace_callback(lambda sql: events.append(sql) if sql in ("BEGIN IMMEDIATE", "COMMIT") else None)
    real_fsync = os.fdatasync

    def fsync(fd):
        events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}")), lock._threads.locked()))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fdatasync", fsync)
    synced = ("fsync", "toolauthz.db-wal", False)
    ctx, proposed = call("toolu_9")
    result = authorizer.authorize(ctx, proposed)
    assert result.token is not None and events == ["BEGIN IMMEDIATE", "COMMIT", synced]
    assert sidecar.ledger.get("acme", "toolu_9").decision == "ALLOW"
    [record] = sidecar.audit_log.query(AuditQuery(call_id="toolu_9"), limit=5)
    assert record.event.jti == result.token.jti
    events.clear()
    assert authorizer.verify(result.token.token, ctx, proposed).code == "ok"
    assert events == ["BEGIN IMMEDIATE", "COMMIT", synced]


def _race_verify(port: int, request_bytes: bytes, barrier, results) -> None:
    from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb2
    from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = pb2_grpc.ToolAuthorizerStub(ch)
        grpc.channel_ready_future(ch).result(timeout=10)
        barrier.wait(timeout=10)
        results.put(stub.Verify(pb2.VerifyRequest.FromString(request_bytes)).code)


def test_same_token_raced_from_two_processes_verifies_once(stub, server):
    request, response = allowed(stub)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    payload = verify_request(request, response.token).SerializeToString()
    procs = [ctx.Process(target=_race_verify, args=(server[1], payload, barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    codes = sorted(results.get(timeout=30) for _ in procs)
    for p in procs:
        p.join(timeout=10)
    assert codes == ["already_used", "ok"]


def _race_consume(path: str, barrier, results) -> None:
    from toolauthz.store import SqliteStore

    store = SqliteStore(path)
    barrier.wait(timeout=10)
    results.put(store.ledger.consume("acme", "toolu_1", "jti-1", 1.0))


def test_two_sidecar_processes_sharing_a_ledger_consume_once(tmp_path):
    from toolauthz.store import CallEntry, SqliteStore

    path = str(tmp_path / "ledger.db")
    with SqliteStore(path) as store:
        store.ledger.reserve(CallEntry("acme", "toolu_1", "run", "issue_refund", "d" * 64, 'User::"a"', 0.0))
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_race_consume, args=(path, barrier, results)) for _ in range(3)]
    for p in procs:
        p.start()
    outcomes = sorted(results.get(timeout=30) for _ in procs)
    for p in procs:
        p.join(timeout=10)
    assert outcomes == ["already_used", "already_used", "ok"]


def test_get_keys_publishes_keys_that_verify_tokens_offline(stub):
    request, response = allowed(stub)
    keys = stub.GetKeys(pb.GetKeysRequest()).keys
    assert len(keys) == 1 and keys[0].paserk.startswith("k4.public.") and keys[0].state == "active"
    jwk = json.loads(keys[0].jwk_json)
    assert (jwk["kty"], jwk["crv"], jwk["kid"]) == ("OKP", "Ed25519", keys[0].kid)
    published = [{"kid": k.kid, "paserk": k.paserk} for k in keys]
    expected = CallClaims("acme", "User", "alice", "issue_refund", "toolu_1")
    checked = verify_offline(response.token, public_keys=published, digest=response.digest, expected=expected,
                             audience="toolauthz-runtime", issuer="toolauthz", now=1_800_000_001)
    assert checked.ok
    wrong = verify_offline(response.token, public_keys=published, digest="0" * 64, expected=expected,
                           audience="toolauthz-runtime", issuer="toolauthz", now=1_800_000_001)
    assert wrong.code == "bad_signature"


def outcome(request, status=pb.COMPLETED, call_id="toolu_1"):
    return pb.ReportOutcomeRequest(context=request.context, call_id=call_id, status=status, error_code="",
                                   output_digest="ab" * 32)


@pytest.mark.both_stores
def test_exactly_one_terminal_outcome(stub, sidecar):
    request, response = allowed(stub)
    assert stub.Verify(verify_request(request, response.token)).valid
    reply = stub.ReportOutcome(outcome(request))
    assert reply.decision_id == response.decision_id and not reply.unverified
    with pytest.raises(grpc.RpcError) as info:
        stub.ReportOutcome(outcome(request, pb.FAILED))
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    [record] = sidecar.audit_log.query(AuditQuery(call_id="toolu_1", kind="outcome"), limit=5)
    assert record.event.result == "completed" and record.event.detail["output_digest"] == "ab" * 32


@pytest.mark.both_stores
def test_outcome_for_an_unknown_call_or_from_another_tenant_is_not_found(stub):
    """Calls are kept per tenant: another tenant's call id names no call of its own."""
    request, _ = allowed(stub)
    with pytest.raises(grpc.RpcError) as info:
        stub.ReportOutcome(outcome(request, call_id="toolu_nope"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as info:
        stub.ReportOutcome(outcome(make_request(tenant="globex")))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("spoofed", [{"principal": "mallory"}, {"request_id": "run-2"},
                                     {"principal": "mallory", "request_id": "run-2"}])
@pytest.mark.both_stores
def test_a_spoofed_caller_of_the_same_tenant_cannot_close_the_call(stub, sidecar, spoofed):
    request, response = allowed(stub)
    with pytest.raises(grpc.RpcError) as info:
        stub.ReportOutcome(outcome(make_request(**spoofed), pb.CANCELLED))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "mallory" not in info.value.details() and "alice" not in info.value.details()
    [refusal] = sidecar.audit_log.query(AuditQuery(call_id="toolu_1", kind="outcome"), limit=5)
    event = refusal.event
    assert (event.result, event.error_codes, event.decision_id) == ("refused", ("not_call_owner",),
                                                                     response.decision_id)
    assert event.principal == f'User::"{spoofed.get("principal", "alice")}"'
    assert event.request_id == spoofed.get("request_id", "run-1")
    assert event.detail["mismatch"] == [name for name in ("principal", "request_id") if name in spoofed]
    assert sidecar.ledger.get("acme", "toolu_1").outcome == ""
    # The real runtime's call is untouched: its token still runs it, and it reports.
    assert stub.Verify(verify_request(request, response.token)).code == "ok"
    assert stub.ReportOutcome(outcome(request)).decision_id == response.decision_id


@pytest.mark.both_stores
def test_the_same_outcome_reported_again_is_answered_again_and_recorded_once(stub, sidecar):
    request, response = allowed(stub)
    assert stub.Verify(verify_request(request, response.token)).valid
    first = stub.ReportOutcome(outcome(request))
    again = stub.ReportOutcome(outcome(request))
    assert again == first and first.decision_id == response.decision_id
    for different in (outcome(request, pb.FAILED),
                      pb.ReportOutcomeRequest(context=request.context, call_id="toolu_1", status=pb.COMPLETED,
                                              output_digest="cd" * 32),
                      pb.ReportOutcomeRequest(context=request.context, call_id="toolu_1", status=pb.COMPLETED,
                                              error_code="E1", output_digest="ab" * 32)):
        with pytest.raises(grpc.RpcError) as info:
            stub.ReportOutcome(different)
        assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    records = sidecar.audit_log.query(AuditQuery(call_id="toolu_1", kind="outcome"), limit=5)
    assert [r.event.result for r in records] == ["completed"]
    assert sidecar.ledger.get("acme", "toolu_1").extra["output_digest"] == "ab" * 32


@pytest.mark.both_stores
def test_outcome_without_verification_is_recorded_and_flagged(stub, sidecar):
    request, _ = allowed(stub)
    assert stub.ReportOutcome(outcome(request, pb.OUTCOME_UNKNOWN)).unverified
    [record] = sidecar.audit_log.query(AuditQuery(call_id="toolu_1", kind="outcome"), limit=5)
    assert record.event.detail["flags"] == ["unverified_outcome"]


def test_outcome_status_must_be_set(stub):
    request, _ = allowed(stub)
    with pytest.raises(grpc.RpcError) as info:
        stub.ReportOutcome(outcome(request, pb.OUTCOME_STATUS_UNSPECIFIED))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_status_reports_the_loaded_version(stub, sidecar):
    status = stub.GetStatus(pb.GetStatusRequest())
    assert status.policy_version == sidecar.bundles.current.version and status.last_reload_error == ""


@pytest.mark.both_stores
def test_a_call_reported_as_ended_can_never_run(stub):
    """Cancelled before it ran: neither the old token nor a replay may execute it later."""
    request, response = allowed(stub)
    stub.ReportOutcome(outcome(request, pb.CANCELLED))
    assert stub.Verify(verify_request(request, response.token)).code == "call_closed"
    replay = stub.Authorize(request)
    assert replay.replayed and replay.token == ""


def test_audit_failure_of_an_outcome_records_neither(stub, sidecar, monkeypatch):
    """The outcome and its audit record are one transaction: a call never shows an
    outcome that the audit trail lacks, and a retry once the disk has room records it."""
    request, response = allowed(stub)
    assert stub.Verify(verify_request(request, response.token)).valid
    _break_audit_inserts(monkeypatch, sidecar)
    with pytest.raises(grpc.RpcError) as info:
        stub.ReportOutcome(outcome(request))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert sidecar.ledger.get("acme", "toolu_1").outcome == ""
    monkeypatch.undo()
    assert stub.ReportOutcome(outcome(request)).decision_id == response.decision_id
    [record] = sidecar.audit_log.query(AuditQuery(call_id="toolu_1", kind="outcome"), limit=5)
    assert record.event.result == "completed" and sidecar.ledger.get("acme", "toolu_1").outcome == "completed"


# -- Verify reads the call as Authorize does ------------------------------------------------

def _forge(sidecar, request, raw: bytes) -> str:
    """A token for `raw` as a lax parser (json.loads) reads it, signed by the sidecar's
    own key: what Verify would accept if it parsed input other than Authorize does."""
    from toolauthz.digest import call_digest

    ctx = request.context
    digest = call_digest(tool=request.call.name, input=json.loads(raw), principal_type=ctx.principal.type,
                         principal_id=ctx.principal.id, tenant=ctx.tenant, call_id=request.call.call_id)
    claims = CallClaims(ctx.tenant, ctx.principal.type, ctx.principal.id, request.call.name, request.call.call_id)
    return sidecar.authorizer.issuer.issue(claims, digest, decision_id="forged", policy_version="v0").token


REFUSED_INPUTS = {
    "above max_input_bytes": b'{"order_id": "ord_1", "amount_cents": 1500, "pad": "' + b"x" * 5000 + b'"}',
    "too deep": b'{"order_id": "ord_1", "amount_cents": 1500, "x": ' + b"[" * 70 + b"]" * 70 + b"}",
    "duplicate keys": b'{"order_id": "ord_1", "amount_cents": 1500, "reason": "a", "reason": "b"}',
    "negative zero": b'{"order_id": "ord_1", "amount_cents": 1500, "n": -0}',
}


@pytest.mark.parametrize("name", sorted(REFUSED_INPUTS))
def test_input_authorize_refuses_never_verifies(stub, sidecar, name):
    raw = REFUSED_INPUTS[name]
    request, response = allowed(stub)
    refused = make_request(args=raw, call_id="toolu_2")
    answer = stub.Authorize(refused)
    assert answer.decision == pb.DENY and [e.code for e in answer.errors] == ["invalid_input"]
    presented = verify_request(request, _forge(sidecar, request, raw))
    presented.call.input_json = raw
    assert stub.Verify(presented).code == "bad_signature"
    assert stub.Verify(verify_request(request, response.token)).code == "ok"  # the identical call


@pytest.mark.parametrize("raw", [b'{"order_id": "ord_1", "amount_cents": NaN}',
                                 b'{"order_id": "ord_1", "amount_cents": 1500, "amount_cents": 1500}',
                                 b" " * (2 << 20) + b'{"order_id": "ord_1", "amount_cents": 1500}'])
def test_a_real_token_with_unparseable_input_is_bad_signature(stub, raw):
    request, response = allowed(stub)
    presented = verify_request(request, response.token)
    presented.call.input_json = raw
    assert stub.Verify(presented).code == "bad_signature"
    assert stub.Verify(verify_request(request, response.token)).code == "ok"


def test_a_token_of_a_tool_the_bundle_no_longer_has_verifies_for_the_identical_call(stub, sidecar, bundle_dir):
    from toolauthz.bundle import load_bundle

    request, response = allowed(stub, tool="measure_runtime", entities=[],
                                args={"prototype": "A", "metric": "runtime", "unit": "hours"})
    for path in ("tools/measure_runtime.yaml", "measurements.cedar", "tests/measurements.yaml"):
        (bundle_dir / path).unlink()
    sidecar.bundles.swap(load_bundle(bundle_dir))
    assert "measure_runtime" not in sidecar.bundles.current.tools
    changed = verify_request(request, response.token)
    changed.call.input_json = b'{"prototype": "B", "metric": "runtime", "unit": "hours"}'
    assert stub.Verify(changed).code == "bad_signature"
    assert stub.Verify(verify_request(request, response.token)).code == "ok"
