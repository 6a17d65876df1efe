"""The decision tests, run on both transports: gRPC and the HTTP/JSON API must give the
same decisions, errors, digests and audit records for the same calls."""

from __future__ import annotations

import json

import pytest
from conftest import order_entity
from transports import (
    Call,
    Context,
    GrpcTransport,
    HttpTransport,
    OpenApiSchemas,
    Refused,
    openapi,
)

from toolauthz.audit.store import AuditQuery


@pytest.fixture
def settings(settings):
    return settings.model_copy(update={"http_listen": "127.0.0.1:0"})


@pytest.fixture(scope="module")
def schemas() -> OpenApiSchemas:
    return OpenApiSchemas(openapi())


@pytest.fixture(params=["grpc", "http"])
def transport(request, server, channel, schemas):
    srv, _port = server
    if request.param == "grpc":
        return GrpcTransport(channel)
    return HttpTransport(srv.http_port, schemas)


ALICE = Context(entities=[order_entity("ord_1", "alice")])


def refund(call_id: str = "toolu_1", raw: bytes = b'{"order_id": "ord_1", "amount_cents": 1500}') -> Call:
    return Call(call_id, "issue_refund", raw)


def test_allow_carries_a_token_and_is_audited(transport, sidecar):
    result = transport.authorize(ALICE, refund())
    assert result.decision == "ALLOW" and result.reasons == ["refund-own-order-small"]
    assert result.token.startswith("v4.public.") and result.expires_at == "2027-01-15T08:01:00Z"
    assert result.policy_version == sidecar.bundles.current.version and len(result.digest) == 64
    assert result.approval_id is None and result.replayed is False
    [record] = sidecar.audit_log.query(AuditQuery(call_id="toolu_1"), limit=10)
    assert (record.event.kind, record.event.result, record.event.decision_id) == (
        "authorize", "ALLOW", result.decision_id)
    assert record.event.fields == {"/order_id": "ord_1", "/amount_cents": 1500}


def test_deny_names_the_forbid(transport):
    result = transport.authorize(ALICE, refund(raw=b'{"order_id": "ord_1", "amount_cents": 20000}'))
    assert result.decision == "DENY" and result.reasons == ["refund-never-above-refundable"]
    assert result.token is None and result.expires_at is None


def test_schema_error_is_a_deny_naming_pointer_and_keyword(transport):
    result = transport.authorize(ALICE, refund(raw=b'{"order_id": "ord_1", "amount_cents": "1500"}'))
    assert result.decision == "DENY"
    assert result.errors == [("invalid_input", "input at `/amount_cents` fails `type`")]


STRICT_JSON_ERRORS = {
    "duplicate key": (b'{"order_id":"ord_1","amount_cents":1,"amount_cents":1000000}',
                      "duplicate key `amount_cents` in object at `/`"),
    "minus zero": (b'{"order_id":"ord_1","amount_cents":-0}',
                   "negative zero at `/amount_cents` is not allowed; send 0"),
    "2^53": (b'{"order_id":"ord_1","amount_cents":9007199254740993}',
             "integer at `/amount_cents` is outside ±(2^53-1); send it as a string"),
    "lone surrogate": (b'{"order_id":"ord_1\\ud800","amount_cents":1}',
                       "string at `/order_id` contains a lone surrogate"),
    "deep nesting": (b'{"order_id":' + b"[" * 70 + b"]" * 70 + b"}", "input nests deeper than 64 levels"),
}


@pytest.mark.parametrize("raw, message", STRICT_JSON_ERRORS.values(), ids=STRICT_JSON_ERRORS.keys())
def test_arguments_that_break_the_strict_rules_are_a_deny_with_the_same_message(transport, sidecar, raw, message):
    result = transport.authorize(ALICE, refund(raw=raw))
    assert (result.decision, result.errors, result.token) == ("DENY", [("invalid_input", message)], None)
    [record] = sidecar.audit_log.query(AuditQuery(call_id="toolu_1"), limit=10)
    assert record.event.result == "DENY"


def test_unknown_tool_is_denied(transport):
    result = transport.authorize(ALICE, Call("toolu_1", "drop_database", b"{}"))
    assert result.decision == "DENY" and result.error_codes == ["unknown_tool"]


def test_the_same_call_replays_and_another_call_under_its_id_is_refused(transport):
    first = transport.authorize(ALICE, refund())
    again = transport.authorize(ALICE, refund())
    assert (again.decision, again.replayed, again.decision_id, again.digest) == (
        "ALLOW", True, first.decision_id, first.digest)
    other = transport.authorize(ALICE, refund(raw=b'{"order_id": "ord_1", "amount_cents": 1400}'))
    assert other.decision == "DENY" and other.error_codes == ["call_id_reused"]


def test_verify_ok_then_already_used_and_a_changed_call_is_a_bad_signature(transport):
    decided = transport.authorize(ALICE, refund())
    changed = transport.verify(decided.token, ALICE, refund(raw=b'{"order_id": "ord_1", "amount_cents": 1499}'))
    assert (changed.valid, changed.code) == (False, "bad_signature")
    ok = transport.verify(decided.token, ALICE, refund())
    assert (ok.valid, ok.code, ok.decision_id) == (True, "ok", decided.decision_id)
    used = transport.verify(decided.token, ALICE, refund())
    assert (used.valid, used.code) == (False, "already_used")


def test_outcome_completed_once_then_already_exists_and_unknown_calls_are_not_found(transport):
    decided = transport.authorize(ALICE, refund())
    transport.verify(decided.token, ALICE, refund())
    done = transport.outcome(ALICE, "toolu_1", "completed")
    assert (done.decision_id, done.unverified) == (decided.decision_id, False)
    assert transport.outcome(ALICE, "toolu_1", "completed") == done
    with pytest.raises(Refused) as other:
        transport.outcome(ALICE, "toolu_1", "failed")
    assert other.value.status == "ALREADY_EXISTS"
    with pytest.raises(Refused) as unknown:
        transport.outcome(ALICE, "toolu_nope", "completed")
    assert unknown.value.status == "NOT_FOUND"


def test_an_outcome_from_another_principal_is_permission_denied(transport):
    transport.authorize(ALICE, refund())
    with pytest.raises(Refused) as refused:
        transport.outcome(Context(principal="mallory"), "toolu_1", "completed")
    assert refused.value.status == "PERMISSION_DENIED"


def test_approval_required_names_the_approval_and_its_replay_does_too(transport):
    large = refund(raw=b'{"order_id": "ord_1", "amount_cents": 6000}')
    result = transport.authorize(ALICE, large)
    assert result.decision == "APPROVAL_REQUIRED" and result.token is None
    assert result.approval_id and result.approval_expires_at == "2027-01-15T08:15:00Z"
    again = transport.authorize(ALICE, large)
    assert (again.replayed, again.approval_id) == (True, result.approval_id)


def test_a_malformed_request_is_invalid_argument(transport):
    with pytest.raises(Refused) as refused:
        transport.send_malformed()
    assert refused.value.status == "INVALID_ARGUMENT"


@pytest.mark.parametrize("context", [Context(tenant=""), Context(principal="bad id"), Context(request_id="")])
def test_a_malformed_envelope_is_invalid_argument(transport, context):
    with pytest.raises(Refused) as refused:
        transport.authorize(context, refund())
    assert refused.value.status == "INVALID_ARGUMENT"


def test_entities_from_another_tenant_are_invalid_argument(transport):
    context = Context(entities=[order_entity("ord_1", "alice", tenant="globex")])
    with pytest.raises(Refused) as refused:
        transport.authorize(context, refund())
    assert refused.value.status == "INVALID_ARGUMENT"


def test_keys_list_the_signing_key(transport, sidecar):
    assert transport.keys() == [k.kid for k in sidecar.keyring.public_keys(sidecar.authorizer.clock.now())]


def test_a_number_spelled_differently_is_the_same_call_on_both_transports(server, channel, schemas, sidecar):
    """`1e2` and `100.0` and key order reach the digest as sent, over HTTP as over gRPC:
    the same call id with an equal input replays, whichever transport asks first."""
    from toolauthz.digest import call_digest

    srv, _port = server
    grpc_side, http_side = GrpcTransport(channel), HttpTransport(srv.http_port, schemas)
    lookup = Context(entities=[order_entity("ord_1", "alice")])
    spellings = [b'{"order_id": "ord_1", "amount_cents": 15e2}', b'{"amount_cents":1500.0,"order_id":"ord_1"}',
                 b'{"amount_cents" : 1.5E+3 , "order_id" : "ord_\\u0031"}']
    expected = call_digest(tool="issue_refund", input={"order_id": "ord_1", "amount_cents": 1500},
                           principal_type="User", principal_id="alice", tenant="acme", call_id="toolu_7")
    first = http_side.authorize(lookup, Call("toolu_7", "issue_refund", spellings[0]))
    assert first.digest == expected
    for i, raw in enumerate(spellings):
        for side in (grpc_side, http_side):
            again = side.authorize(lookup, Call("toolu_7", "issue_refund", raw))
            assert (again.digest, again.replayed, again.decision_id) == (expected, True, first.decision_id), (i, side)
    # a different value is a different call, on either transport
    other = grpc_side.authorize(lookup, Call("toolu_7", "issue_refund", b'{"order_id": "ord_1", "amount_cents": 1501}'))
    assert other.error_codes == ["call_id_reused"]
    assert json.loads(spellings[2]) == {"amount_cents": 1500.0, "order_id": "ord_1"}
