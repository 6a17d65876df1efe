"""Authorize over gRPC, end to end: every decision and every bad input of the decision path."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import threading

import grpc
import pytest
from conftest import make_request, order_entity

from toolauthz.audit.store import AuditQuery
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.store.ledger import Standing


def error_codes(response) -> list[str]:
    return [e.code for e in response.errors]


@pytest.mark.both_stores
def test_small_refund_of_own_order_is_allowed_with_a_token(stub, sidecar):
    response = stub.Authorize(make_request())
    assert response.decision == pb.ALLOW
    assert list(response.reasons) == ["refund-own-order-small"]
    assert response.token.startswith("v4.public.")
    assert response.expires_at.seconds == 1_800_000_000 + 60
    assert len(response.digest) == 64 and len(response.decision_id) == 26
    assert response.policy_version == sidecar.bundles.current.version
    [record] = sidecar.audit_log.query(AuditQuery(call_id="toolu_1"), limit=10)
    event = record.event
    assert (event.kind, event.result, event.decision_id) == ("authorize", "ALLOW", response.decision_id)
    assert record.event.fields == {"/order_id": "ord_1", "/amount_cents": 1500}


def test_large_refund_requires_approval_and_gets_no_token(stub):
    response = stub.Authorize(make_request(args={"order_id": "ord_1", "amount_cents": 6000}))
    assert response.decision == pb.APPROVAL_REQUIRED
    assert list(response.reasons) == ["refund-own-order-large-needs-finance"]
    assert response.token == ""


def test_refund_above_refundable_is_forbidden_by_name(stub):
    response = stub.Authorize(make_request(args={"order_id": "ord_1", "amount_cents": 20_000}))
    assert response.decision == pb.DENY
    assert list(response.reasons) == ["refund-never-above-refundable"]
    assert response.token == ""


def test_another_customers_order_is_denied(stub):
    request = make_request(tool="lookup_order", args={"order_id": "ord_1"},
                           entities=[order_entity("ord_1", "bob")])
    response = stub.Authorize(request)
    assert response.decision == pb.DENY and error_codes(response) == ["policy_denied"]
    own = stub.Authorize(make_request(tool="lookup_order", args={"order_id": "ord_1"}, call_id="toolu_2"))
    assert own.decision == pb.ALLOW and list(own.reasons) == ["lookup-own-order"]


def test_order_the_runtime_did_not_vouch_for_is_denied_with_the_policy_error(stub):
    response = stub.Authorize(make_request(entities=[]))
    assert response.decision == pb.DENY
    assert "policy_error" in error_codes(response) and "policy_denied" in error_codes(response)


def test_measure_runtime_schema_is_enforced(stub):
    good = {"prototype": "A", "metric": "runtime", "unit": "hours"}
    assert stub.Authorize(make_request("measure_runtime", good, entities=[])).decision == pb.ALLOW
    for i, bad in enumerate([{**good, "prototype": "C"}, {**good, "unit": "days"}, {**good, "extra": 1},
                             {"prototype": "A", "metric": "runtime"}]):
        response = stub.Authorize(make_request("measure_runtime", bad, call_id=f"m{i}", entities=[]))
        assert response.decision == pb.DENY and error_codes(response) == ["invalid_input"], bad
        assert response.token == ""


def test_schema_error_names_pointer_and_keyword(stub):
    response = stub.Authorize(make_request(args={"order_id": "ord_1", "amount_cents": "1500"}))
    assert response.decision == pb.DENY
    assert response.errors[0].message == "input at `/amount_cents` fails `type`"


def test_unknown_tool_is_denied(stub):
    response = stub.Authorize(make_request(tool="drop_database"))
    assert response.decision == pb.DENY and error_codes(response) == ["unknown_tool"]
    weird = stub.Authorize(make_request(tool="Issue Refund\u202e", call_id="toolu_9"))
    assert weird.decision == pb.DENY and error_codes(weird) == ["unknown_tool"]


BAD_INPUTS = {
    "duplicate key": b'{"order_id":"ord_1","amount_cents":1,"amount_cents":1000000}',
    "NaN": b'{"order_id":"ord_1","amount_cents":NaN}',
    "Infinity": b'{"order_id":"ord_1","amount_cents":-Infinity}',
    "minus zero": b'{"order_id":"ord_1","amount_cents":-0}',
    "2^53": b'{"order_id":"ord_1","amount_cents":9007199254740993}',
    "lone surrogate": b'{"order_id":"ord_1\\ud800","amount_cents":1}',
    "invalid utf-8": b'{"order_id":"ord_\xff","amount_cents":1}',
    "deep nesting": b'{"order_id":' + b"[" * 10_000 + b"]" * 10_000 + b"}",
    "over the tool's size limit": b'{"order_id":"ord_1","amount_cents":1,"reason":"' + b"x" * 5000 + b'"}',
    "not an object": b'[1, 2]',
    "not json": b'order ord_1 please',
    "empty": b"",
    "extra property": b'{"order_id":"ord_1","amount_cents":1,"customer_id":"cus_1"}',
}


@pytest.mark.parametrize("raw", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_is_a_clear_deny_and_the_server_keeps_serving(stub, raw):
    response = stub.Authorize(make_request(args=raw))
    assert response.decision == pb.DENY
    assert error_codes(response) == ["invalid_input"]
    assert response.token == "" and response.errors[0].message
    assert stub.Authorize(make_request(call_id="after")).decision == pb.ALLOW


def test_message_above_the_grpc_limit_is_refused(settings, clock):
    from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
    from toolauthz.server.build import build_sidecar, create_server

    car = build_sidecar(settings.model_copy(update={"max_message_bytes": 64 * 1024}), clock=clock)
    srv, port = create_server(car, "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.ToolAuthorizerStub(ch)
            big = make_request(args={"order_id": "ord_1", "amount_cents": 1, "reason": "x" * 100_000})
            with pytest.raises(grpc.RpcError) as info:
                stub.Authorize(big)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert stub.Authorize(make_request()).decision == pb.ALLOW
    finally:
        srv.stop(None)
        car.close()


@pytest.mark.parametrize("field, value", [
    ("tenant", ""), ("principal.id", ""), ("principal.type", ""), ("call_id", ""), ("name", ""),
    ("request_id", ""), ("tenant", "acme\u0435"), ("tenant", "../other"), ("principal.type", "Admin"),
    ("principal.id", "alice\nbob"), ("call_id", "x" * 300),
])
def test_missing_or_malformed_envelope_is_invalid_argument(stub, sidecar, field, value):
    request = make_request()
    if field in ("call_id", "name"):
        setattr(request.call, field, value)
    elif field.startswith("principal."):
        setattr(request.context.principal, field.split(".")[1], value)
    else:
        setattr(request.context, field, value)
    with pytest.raises(grpc.RpcError) as info:
        stub.Authorize(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details()


@pytest.mark.parametrize("entities", [
    [order_entity("ord_1", "alice", tenant="globex")],
    [{"uid": {"type": "Tenant", "id": "acme"}, "attrs": {}, "parents": []}],
    [{"uid": {"type": "Group", "id": "finance"}, "attrs": {}, "parents": []}],
    [{"uid": {"type": "Order", "id": "ord_1"}, "attrs": {"owner": "alice", "refundable_cents": "lots"}, "parents": []}],
    {"not": "a list"},
])
def test_trusted_entities_cannot_reach_another_tenant_or_break_the_schema(stub, entities):
    request = make_request()
    request.context.entities_json = json.dumps(entities).encode()
    with pytest.raises(grpc.RpcError) as info:
        stub.Authorize(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_resource_is_always_inside_the_callers_tenant(bundle_dir, settings, clock):
    """A policy that requires the resource to be in the principal's tenant holds even when
    the argument names an order the runtime did not supply."""
    from toolauthz.server.build import build_sidecar

    (bundle_dir / "orders.cedar").write_text(
        '@id("same-tenant") permit (principal, action == Action::"tool:lookup_order", resource)\n'
        'when { resource in Tenant::"acme" && principal in Tenant::"acme" };\n')
    car = build_sidecar(settings, clock=clock)
    try:
        from toolauthz.model import Principal, ProposedCall, TrustedContext

        acme = TrustedContext("acme", Principal("User", "alice"), "r")
        globex = TrustedContext("globex", Principal("User", "alice"), "r")
        call = ProposedCall("c1", "lookup_order", b'{"order_id":"ord_77"}')
        assert car.authorizer.authorize(acme, call).decision.value == "ALLOW"
        assert car.authorizer.authorize(globex, call).decision.value == "DENY"
    finally:
        car.close()


@pytest.mark.both_stores
def test_same_call_id_and_digest_replays_the_original_decision(stub):
    first = stub.Authorize(make_request())
    again = stub.Authorize(make_request())
    assert again.replayed and not first.replayed
    assert again.decision_id == first.decision_id and again.decision == pb.ALLOW
    assert again.token and again.token != first.token  # not yet executed: a fresh token
    from conftest import verify_request
    assert stub.Verify(verify_request(make_request(), again.token)).valid
    third = stub.Authorize(make_request())
    assert third.replayed and third.token == ""  # executed once: never another token
    assert not stub.Verify(verify_request(make_request(), first.token)).valid


@pytest.mark.both_stores
def test_call_id_reused_with_other_arguments_is_denied(stub):
    assert stub.Authorize(make_request()).decision == pb.ALLOW
    reused = stub.Authorize(make_request(args={"order_id": "ord_1", "amount_cents": 1600}))
    assert reused.decision == pb.DENY and error_codes(reused) == ["call_id_reused"] and reused.token == ""
    with pytest.raises(grpc.RpcError) as other_principal:  # another's call id: not theirs to replay
        stub.Authorize(make_request(principal="mallory"))
    assert other_principal.value.code() == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.both_stores
def test_per_run_limit(stub):
    for i in range(5):
        assert stub.Authorize(make_request(call_id=f"c{i}")).decision == pb.ALLOW
    sixth = stub.Authorize(make_request(call_id="c5"))
    assert sixth.decision == pb.DENY and error_codes(sixth) == ["limit_exceeded"]
    other_run = stub.Authorize(make_request(call_id="c6", request_id="run-2"))
    assert other_run.decision == pb.ALLOW


@pytest.mark.both_stores
def test_per_run_limit_holds_under_concurrent_calls(stub, sidecar):
    """Calls of one run decided concurrently (and so batched together) are counted one
    after the other: exactly the limit is allowed, whatever the interleaving."""
    barrier = threading.Barrier(16)

    def call(i):
        barrier.wait(30)
        return stub.Authorize(make_request(call_id=f"c{i}"))

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(call, range(16)))
    allowed = [r for r in responses if r.decision == pb.ALLOW]
    assert len(allowed) == 5 and all(r.token for r in allowed)
    assert sorted(error_codes(r) for r in responses if r.decision != pb.ALLOW) == [["limit_exceeded"]] * 11
    records = sidecar.audit_log.query(AuditQuery(request_id="run-1"), limit=100)
    assert sorted(r.event.decision_id for r in records) == sorted(r.decision_id for r in responses)


def test_policies_see_run_counters(bundle_dir, settings, clock):
    from toolauthz.model import Principal, ProposedCall, TrustedContext
    from toolauthz.server.build import build_sidecar

    (bundle_dir / "loops.cedar").write_text(
        '@id("two-measurements-per-run") forbid (principal, action == Action::"tool:measure_runtime", resource)\n'
        "when { context.run.tool_calls >= 2 };\n")
    car = build_sidecar(settings, clock=clock)
    try:
        ctx = TrustedContext("acme", Principal("User", "alice"), "run-9")
        args = b'{"prototype":"A","metric":"runtime","unit":"hours"}'
        decisions = [car.authorizer.authorize(ctx, ProposedCall(f"m{i}", "measure_runtime", args)) for i in range(3)]
        assert [d.decision.value for d in decisions] == ["ALLOW", "ALLOW", "DENY"]
        assert decisions[2].reasons == ("two-measurements-per-run",)
    finally:
        car.close()


def test_a_forbid_that_errors_never_lets_a_permit_through(bundle_dir, settings, clock):
    from toolauthz.model import Principal, ProposedCall, TrustedContext
    from toolauthz.server.build import build_sidecar

    (bundle_dir / "overflow.cedar").write_text(
        '@id("overflowing-forbid") forbid (principal, action == Action::"tool:issue_refund", resource)\n'
        "when { context.input.amount_cents * 100000000000000 > 0 };\n")
    car = build_sidecar(settings, clock=clock)
    try:
        ctx = TrustedContext("acme", Principal("User", "alice"), "r",
                             json.dumps([order_entity("ord_1", "alice")]).encode())
        call = ProposedCall("c", "issue_refund", b'{"order_id":"ord_1","amount_cents":100000}')
        result = car.authorizer.authorize(ctx, call)
        assert result.decision.value == "DENY" and result.token is None
        assert ("policy_error", "policy `overflowing-forbid` could not be evaluated") in \
            [(e.code, e.message) for e in result.errors]
        [record] = car.audit_log.query(AuditQuery(call_id="c"), limit=5)
        assert "overflow" in json.dumps(record.event.detail)
    finally:
        car.close()


def test_health_and_reflection_are_served(channel):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    [answer] = list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
    names = {s.name for s in answer.list_services_response.service}
    assert "toolauthz.v1.ToolAuthorizer" in names and "grpc.health.v1.Health" in names


def test_secret_arguments_never_reach_the_stores_or_the_logs(stub, sidecar, settings, caplog):
    secret = "sk_live_TOPSECRET_4242"
    caplog.set_level("DEBUG")
    allowed = stub.Authorize(make_request(args={"order_id": "ord_1", "amount_cents": 1500, "reason": secret}))
    payload = allowed.token.split(".")[2]
    claims = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))[:-64]  # drop the signature
    assert b'"dig"' in claims and secret.encode() not in claims
    stub.Authorize(make_request(args={"order_id": "ord_1", "amount_cents": 1500, "reason": secret, "x": 1},
                                call_id="toolu_bad"))
    stub.Authorize(make_request(args=b'{"order_id":"ord_1","amount_cents":1,"reason":"' + secret.encode() + b'",}',
                                call_id="toolu_worse"))
    sidecar.audit_writer.close()
    for path in settings.data_dir.iterdir():
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert secret not in caplog.text


@pytest.mark.both_stores
def test_an_old_decision_is_not_re_tokenized(stub, clock):
    first = stub.Authorize(make_request())
    clock.advance(301)
    late = stub.Authorize(make_request())
    assert late.replayed and late.decision_id == first.decision_id and late.token == ""
    assert error_codes(late) == ["reissue_refused"]


def test_a_decision_under_replaced_policies_is_not_re_tokenized(stub, sidecar, bundle_dir):
    from toolauthz.bundle import load_bundle

    stub.Authorize(make_request())
    (bundle_dir / "orders.cedar").write_text((bundle_dir / "orders.cedar").read_text() + "\n// edited\n")
    sidecar.bundles.swap(load_bundle(bundle_dir))
    again = stub.Authorize(make_request())
    assert again.replayed and again.token == "" and error_codes(again) == ["reissue_refused"]


def test_integer_resource_ids_are_canonical(bundle_dir, settings, clock):
    from toolauthz.model import Principal, ProposedCall, TrustedContext
    from toolauthz.server.build import build_sidecar

    (bundle_dir / "schema.cedarschema").write_text((bundle_dir / "schema.cedarschema").read_text()
                                                   + "\nentity Ticket in [Tenant];\n")
    (bundle_dir / "tools" / "read_ticket.yaml").write_text(
        "name: read_ticket\nside_effect: read\nresource: {type: Ticket, id: /ticket}\n"
        "input_schema: {$schema: 'https://json-schema.org/draft/2020-12/schema', type: object,\n"
        "  properties: {ticket: {type: integer}}, required: [ticket], additionalProperties: false}\n")
    (bundle_dir / "tickets.cedar").write_text(
        'permit (principal, action == Action::"tool:read_ticket", resource == Ticket::"7");\n')
    car = build_sidecar(settings, clock=clock)
    try:
        ctx = TrustedContext("acme", Principal("User", "alice"), "r")

        def decide(cid: str, raw: bytes) -> str:
            return car.authorizer.authorize(ctx, ProposedCall(cid, "read_ticket", raw)).decision.value

        assert decide("a", b'{"ticket": 7.0}') == "ALLOW"
        assert decide("b", b'{"ticket": 7}') == "ALLOW"
        assert decide("c", b'{"ticket": 8}') == "DENY"
    finally:
        car.close()


@pytest.mark.both_stores
def test_a_decision_drafted_on_stale_run_counts_is_made_again(stub, sidecar, monkeypatch):
    """Cedar runs before the ledger's transaction, on the run's counts as read then; a
    call of the same run recorded in between must not let the stale draft through."""
    for i in range(5):
        assert stub.Authorize(make_request(call_id=f"c{i}")).decision == pb.ALLOW

    def counts(entries):  # outside the transaction: as if read before the five were recorded
        return [Standing(0, 0, tuple(0 for _ in entry.charges)) for entry in entries]

    monkeypatch.setattr(sidecar.ledger, "standing", counts)
    sixth = stub.Authorize(make_request(call_id="c5"))
    assert sixth.decision == pb.DENY and error_codes(sixth) == ["limit_exceeded"] and sixth.token == ""
    [record] = sidecar.audit_log.query(AuditQuery(call_id="c5"), limit=5)
    assert (record.event.result, record.event.jti, record.event.error_codes) == ("DENY", "", ("limit_exceeded",))
    assert sidecar.ledger.get("acme", "c5").decision == "DENY"


def test_cedar_and_the_signature_run_outside_the_write_lock(stub, sidecar, monkeypatch):
    """Every process sharing the database queues on its write lock: the expensive steps
    of a decision must not hold it."""
    import toolauthz.authorizer.deciding as authorizer_module

    lock = sidecar.store.unit._write_lock
    seen = []
    real_evaluate, real_issue = authorizer_module.evaluate, sidecar.authorizer.issuer.issue

    def evaluate(*args, **kwargs):
        seen.append(("evaluate", lock._threads.locked()))
        return real_evaluate(*args, **kwargs)

    def issue(*args, **kwargs):
        seen.append(("issue", lock._threads.locked()))
        return real_issue(*args, **kwargs)

    monkeypatch.setattr(authorizer_module, "evaluate", evaluate)
    monkeypatch.setattr(sidecar.authorizer.issuer, "issue", issue)
    assert stub.Authorize(make_request()).token
    assert seen == [("evaluate", False), ("issue", False)]


def test_a_decision_and_its_audit_event_are_made_once_when_the_draft_holds(stub, sidecar, monkeypatch):
    """The decision is made before the ledger's transaction; when the run's counts have
    not moved, it is recorded as made, event included (each event canonicalizes its
    fields: work a call should pay for once)."""
    made = []
    real_event = sidecar.authorizer.event

    def event(*args, **kwargs):
        made.append(real_event(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(sidecar.authorizer, "event", event)
    response = stub.Authorize(make_request())
    assert response.decision == pb.ALLOW
    [record] = sidecar.audit_log.query(AuditQuery(call_id="toolu_1"), limit=5)
    assert len(made) == 1 and record.event == made[0]


def _limit_refunds_to(bundle_dir, sidecar, limit: int) -> None:
    from toolauthz.bundle import load_bundle

    path = bundle_dir / "tools" / "issue_refund.yaml"
    path.write_text(path.read_text().replace("max_calls_per_run: 5", f"max_calls_per_run: {limit}"))
    sidecar.bundles.swap(load_bundle(bundle_dir))
    assert sidecar.bundles.current.tools["issue_refund"].tool.max_calls_per_run == limit


SMALL, FORBIDDEN, LARGE = ({"order_id": "ord_1", "amount_cents": 1500}, {"order_id": "ord_1", "amount_cents": 20_000},
                           {"order_id": "ord_1", "amount_cents": 6000})


@pytest.mark.both_stores
def test_the_run_limit_counts_allowed_and_open_approvals_only(stub, sidecar, bundle_dir, channel):
    """A denial leaves the budget as it was; a pending approval holds a share until it is
    rejected (or expires), then gives it back."""
    from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
    from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc

    _limit_refunds_to(bundle_dir, sidecar, 3)
    responses = [stub.Authorize(make_request(args=args, call_id=f"c{i}"))
                 for i, args in enumerate([SMALL, FORBIDDEN, LARGE, SMALL])]
    assert [r.decision for r in responses] == [pb.ALLOW, pb.DENY, pb.APPROVAL_REQUIRED, pb.ALLOW]
    over = stub.Authorize(make_request(args=SMALL, call_id="c4"))
    assert over.decision == pb.DENY and error_codes(over) == ["limit_exceeded"]
    bob = pb.TrustedContext(tenant="acme", principal=pb.Principal(type="User", id="bob"), request_id="ui")
    apb_grpc.ApprovalsStub(channel).DecideApproval(apb.DecideApprovalRequest(
        approval_id=responses[2].approval_id, approver=bob, verdict=apb.REJECT, reason="no"))
    assert stub.Authorize(make_request(args=SMALL, call_id="c5")).decision == pb.ALLOW  # the share came back
    over = stub.Authorize(make_request(args=SMALL, call_id="c6"))
    assert over.decision == pb.DENY and error_codes(over) == ["limit_exceeded"]


@pytest.mark.both_stores
def test_a_run_cannot_open_more_approvals_than_its_limit(stub, sidecar, bundle_dir):
    """Approvals opened while under the limit could otherwise all be approved later."""
    _limit_refunds_to(bundle_dir, sidecar, 3)
    decisions = [stub.Authorize(make_request(args=LARGE, call_id=f"c{i}")) for i in range(4)]
    assert [r.decision for r in decisions[:3]] == [pb.APPROVAL_REQUIRED] * 3
    assert decisions[3].decision == pb.DENY and error_codes(decisions[3]) == ["limit_exceeded"]


@pytest.mark.both_stores
def test_an_approved_call_counts_toward_the_run_limit_from_its_approval(stub, sidecar, bundle_dir, channel):
    from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
    from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc

    _limit_refunds_to(bundle_dir, sidecar, 3)
    assert stub.Authorize(make_request(args=SMALL, call_id="c0")).decision == pb.ALLOW
    gated = stub.Authorize(make_request(args=LARGE, call_id="c1"))
    assert gated.decision == pb.APPROVAL_REQUIRED
    bob = pb.TrustedContext(tenant="acme", principal=pb.Principal(type="User", id="bob"), request_id="ui")
    decided = apb_grpc.ApprovalsStub(channel).DecideApproval(apb.DecideApprovalRequest(
        approval_id=gated.approval_id, approver=bob, verdict=apb.APPROVE, reason="ok"))
    assert decided.status == apb.APPROVED
    assert stub.Authorize(make_request(args=SMALL, call_id="c2")).decision == pb.ALLOW
    over = stub.Authorize(make_request(args=SMALL, call_id="c3"))
    assert over.decision == pb.DENY and error_codes(over) == ["limit_exceeded"]


@pytest.mark.both_stores
def test_the_run_limit_holds_when_denials_and_allowed_calls_race(stub, sidecar, bundle_dir):
    """Batched together, denials do not take the place of allowed calls in the count,
    nor does any interleaving let more than the limit through."""
    _limit_refunds_to(bundle_dir, sidecar, 3)
    barrier = threading.Barrier(12)

    def call(i):
        barrier.wait(30)
        return i, stub.Authorize(make_request(args=FORBIDDEN if i % 2 else SMALL, call_id=f"c{i}"))

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        responses = dict(pool.map(call, range(12)))
    small = [responses[i] for i in range(0, 12, 2)]
    assert sum(r.decision == pb.ALLOW for r in small) == 3
    assert all(error_codes(r) == ["limit_exceeded"] for r in small if r.decision != pb.ALLOW)
    assert all(responses[i].decision == pb.DENY for i in range(1, 12, 2))


@pytest.mark.both_stores
def test_a_resource_id_with_a_nul_is_invalid_input_on_every_store(stub, sidecar, bundle_dir):
    # A tool whose schema lets any order id through: PostgreSQL text holds no NUL, and the
    # store's refusal answered UNAVAILABLE ("store unavailable") where SQLite allowed.
    tool = bundle_dir / "tools" / "issue_refund.yaml"
    tool.write_text(tool.read_text().replace('pattern: "^ord_[A-Za-z0-9]{1,32}$"', 'pattern: "^ord_"'))
    assert sidecar.reloader.reload()
    order = "ord_\x00x"
    response = stub.Authorize(make_request(args={"order_id": order, "amount_cents": 100},
                                           entities=[order_entity(order, "alice")]))
    assert response.decision == pb.DENY
    assert [e.code for e in response.errors] == ["invalid_input"]
