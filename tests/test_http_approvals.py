"""The HTTP routes a runtime without gRPC needs to finish a call that waits for a person:
/v1/approval (GetApproval), /v1/approval/wait (WatchApproval as a long poll) and
/v1/call-story (QueryDecisions for one call), with the roles, tenants, ownership rules,
watch limits and refusal audit records of their gRPC twins. The callers are real mTLS
identities (tests/test_ownership_mtls.py)."""

from __future__ import annotations

import http.client
import json
import os
import ssl
import threading
from typing import Any

import pytest
import test_http_auth
from conftest import order_entity
from transports import Call, Context, _body, exchange

from toolauthz.approvals import APPROVE
from toolauthz.audit.store import AuditQuery
from toolauthz.model import Principal, TrustedContext
from toolauthz.server.build import build_sidecar, create_server

X, Y = "spiffe://acme.example/agent/support", "spiffe://acme.example/agent/billing"
GLOBEX = "spiffe://globex.example/agent/support"
CONSOLE = "spiffe://acme.example/console"
AUDITOR, GLOBEX_AUDITOR = "spiffe://acme.example/auditor", "spiffe://globex.example/auditor"
CALLERS = [
    {"id": X, "roles": ["runtime"], "tenants": ["acme"]},
    {"id": Y, "roles": ["runtime"], "tenants": ["acme"]},
    {"id": GLOBEX, "roles": ["runtime"], "tenants": ["globex"]},
    {"id": CONSOLE, "roles": ["approver"], "tenants": ["acme"]},
    {"id": AUDITOR, "roles": ["auditor"], "tenants": ["acme"]},
    {"id": GLOBEX_AUDITOR, "roles": ["auditor"], "tenants": ["globex"]},
]
ALICE = Context(entities=[order_entity("ord_1", "alice")])
BOB = TrustedContext("acme", Principal("User", "bob"), "")
pki = test_http_auth.pki  # the fixture: a CA, its file, and the server's certificate


@pytest.fixture
def api(settings, clock, pki):
    """A sidecar with CALLERS on an mTLS HTTP listener, one open wait per caller and two in
    all; ask(identity, path, body) -> (status, JSON)."""
    tls = {"cert": pki["cert"], "key": pki["key"], "client_ca": pki["ca_file"]}
    configured = type(settings).model_validate({
        **settings.model_dump(), "callers": CALLERS, "http_listeners": [{"address": "127.0.0.1:0", "tls": tls}],
        "approvals": {**settings.approvals.model_dump(), "max_watches_per_caller": 1, "max_watches": 2}})
    sidecar = build_sidecar(configured, clock=clock)
    server, _port = create_server(sidecar, "127.0.0.1:0")
    contexts: dict[str, ssl.SSLContext] = {}

    def connect(identity: str) -> http.client.HTTPSConnection:
        if identity not in contexts:
            context = ssl.create_default_context(cafile=pki["ca_file"])
            issued = pki["ca"].issue(uris=(identity,))
            context.load_cert_chain(*issued.write(pki["dir"], f"client-{len(os.listdir(pki['dir']))}"))
            contexts[identity] = context
        return http.client.HTTPSConnection("127.0.0.1", server.http_port, context=contexts[identity], timeout=60)

    def ask(identity: str, path: str, body: dict[str, Any] | bytes) -> tuple[int, Any]:
        sent = body if isinstance(body, bytes) else json.dumps(body).encode()
        return exchange(connect(identity), "POST", path, sent)

    yield sidecar, ask, connect
    server.stop(None).wait()
    sidecar.close()


def pending(ask, identity: str = X, call_id: str = "toolu_big") -> str:
    """A call of `identity` (as alice, run-1) that waits for approval; its approval id."""
    call = Call(call_id, "issue_refund", b'{"order_id": "ord_1", "amount_cents": 6000}')
    status, decided = ask(identity, "/v1/authorize", _body(ctx=ALICE, call=call))
    assert (status, decided["decision"]) == (200, "APPROVAL_REQUIRED"), decided
    return decided["approval_id"]


def own_run(context: Context = ALICE) -> dict[str, Any]:
    return {name: value for name, value in context.as_json().items() if name != "entities"}


def refusals(sidecar) -> list:
    return [r.event for r in sidecar.audit_log.query(AuditQuery(error_code="not_call_owner"), limit=100)]


# -- reading an approval -------------------------------------------------------------------

def test_the_owner_gets_the_token_with_its_run_and_no_one_else_ever_does(api):
    sidecar, ask, _connect = api
    approval_id = pending(ask)
    status, before = ask(X, "/v1/approval", {"approval_id": approval_id, "context": own_run()})
    assert (status, before["status"], before["token"], before["tool"]) == (200, "pending", None, "issue_refund")
    sidecar.approvals.decide(approval_id, BOB, APPROVE, "fine", caller=CONSOLE)

    status, mine = ask(X, "/v1/approval", {"approval_id": approval_id, "context": own_run()})
    assert (status, mine["status"], mine["approver"]) == (200, "approved", {"type": "User", "id": "bob"})
    assert mine["token"] and mine["token_expires_at"]
    status, no_context = ask(X, "/v1/approval", {"approval_id": approval_id})
    assert (status, no_context["status"], no_context["token"]) == (200, "approved", None)
    status, approver = ask(CONSOLE, "/v1/approval", {"approval_id": approval_id})
    assert (status, approver["token"]) == (200, None)
    # Another runtime of the tenant, the owner in another run, a runtime of another tenant.
    for identity, body in ((Y, {"approval_id": approval_id, "context": own_run()}),
                           (Y, {"approval_id": approval_id}),
                           (X, {"approval_id": approval_id, "context": own_run(Context(request_id="run-2"))})):
        status, refused = ask(identity, "/v1/approval", body)
        assert (status, refused["error"]["code"]) == (403, "PERMISSION_DENIED"), (identity, body)
    assert [(e.kind, e.caller, e.detail["rpc"]) for e in refusals(sidecar)] == [
        ("approval", Y, "GetApproval"), ("approval", Y, "GetApproval"), ("approval", X, "GetApproval")]
    status, refused = ask(GLOBEX, "/v1/approval", {"approval_id": approval_id})
    assert (status, refused["error"]["code"]) == (403, "PERMISSION_DENIED")
    status, refused = ask(GLOBEX, "/v1/approval", {"approval_id": approval_id,
                                                   "context": own_run(Context(tenant="globex"))})
    assert (status, refused["error"]["code"]) == (403, "PERMISSION_DENIED")


def test_a_caller_without_the_role_is_refused_before_its_body_is_read(api):
    sidecar, ask, connect = api
    status, answer, connection = send_head(connect(AUDITOR), "/v1/approval", 16000)  # no byte of it is sent
    assert (status, answer["error"]["code"], connection) == (403, "PERMISSION_DENIED", "close")
    [refusal] = sidecar.audit_log.query(AuditQuery(result="refused"), limit=5)
    assert (refusal.event.caller, refusal.event.detail.get("rpc")) == (AUDITOR, "GetApproval")


@pytest.mark.parametrize("approval_id", ["x" * 129, "01J`rm -rf`", "a\u0000b", "a\nb\u202e", "", "\ud7ff" * 50])
def test_a_hostile_approval_id_is_a_bounded_one_line_400_that_never_echoes_it(api, approval_id):
    _sidecar, ask, _connect = api
    for path in ("/v1/approval", "/v1/approval/wait"):
        status, refused = ask(X, path, {"approval_id": approval_id})
        assert (status, refused["error"]["code"]) == (400, "INVALID_ARGUMENT")
        message = refused["error"]["message"]
        assert message.startswith("approval_id must match `") and "\n" not in message
        assert len(approval_id) < 2 or approval_id[1:] not in message


def send_head(connection: http.client.HTTPSConnection, path: str, length: int) -> tuple[int, Any, str | None]:
    """A request's head declaring a `length`-byte JSON body, none of which is sent."""
    connection.putrequest("POST", path)
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(length))
    connection.endheaders()
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    return response.status, answer, response.getheader("Connection")


def test_an_enormous_approval_id_is_refused_at_the_routes_cap_unread(api):
    _sidecar, _ask, connect = api
    for path in ("/v1/approval", "/v1/approval/wait", "/v1/call-story"):
        status, refused, connection = send_head(connect(X if path != "/v1/call-story" else AUDITOR), path, 4_000_000)
        assert (status, refused["error"]["code"], connection) == (413, "RESOURCE_EXHAUSTED", "close")


def test_an_unknown_approval_is_404_and_a_reader_context_is_checked(api):
    _sidecar, ask, _connect = api
    status, refused = ask(X, "/v1/approval", {"approval_id": "01JNOSUCHAPPROVAL000000000"})
    assert (status, refused["error"]["code"]) == (404, "NOT_FOUND")
    bad = {**own_run(), "principal": {"type": "User", "id": "al\u0000ice"}}
    status, refused = ask(X, "/v1/approval", {"approval_id": "01JNOSUCHAPPROVAL000000000", "context": bad})
    assert (status, refused["error"]["code"]) == (400, "INVALID_ARGUMENT")
    status, refused = ask(X, "/v1/approval", {"approval_id": "01JNOSUCHAPPROVAL000000000",
                                              "context": {**own_run(), "entities": []}})
    assert (status, refused["error"]["code"]) == (400, "INVALID_ARGUMENT")


# -- waiting for an approval ---------------------------------------------------------------

def test_a_wait_answers_the_decision_and_a_wait_that_ends_answers_pending(api):
    sidecar, ask, _connect = api
    approval_id = pending(ask)
    status, still = ask(X, "/v1/approval/wait", {"approval_id": approval_id, "context": own_run(), "wait_seconds": 0})
    assert (status, still["status"], still["token"]) == (200, "pending", None)
    sidecar.approvals.decide(approval_id, BOB, APPROVE, caller=CONSOLE)
    status, decided = ask(X, "/v1/approval/wait", {"approval_id": approval_id, "context": own_run(),
                                                   "wait_seconds": 55})
    assert (status, decided["status"]) == (200, "approved") and decided["token"]
    assert sidecar.watches.open_watches() == 0


@pytest.mark.parametrize("wait_seconds", [-1, 56, 1e9, True, "30", None])
def test_a_wait_past_its_bound_is_refused(api, wait_seconds):
    _sidecar, ask, _connect = api
    status, refused = ask(X, "/v1/approval/wait", {"approval_id": "01JNOSUCHAPPROVAL000000000",
                                                   "wait_seconds": wait_seconds})
    assert (status, refused["error"]["code"]) == (400, "INVALID_ARGUMENT")


def test_a_wait_for_another_callers_call_is_refused_audited_and_holds_no_place(api):
    sidecar, ask, _connect = api
    approval_id = pending(ask)
    status, refused = ask(Y, "/v1/approval/wait", {"approval_id": approval_id, "wait_seconds": 55})
    assert (status, refused["error"]["code"]) == (403, "PERMISSION_DENIED")
    assert [(e.caller, e.detail["rpc"]) for e in refusals(sidecar)] == [(Y, "WatchApproval")]
    assert sidecar.watches.open_watches() == 0


def test_a_flood_of_waits_is_refused_at_once_decisions_go_on_and_a_disconnect_frees_its_place(api):
    sidecar, ask, connect = api
    mine, theirs = pending(ask, X, "toolu_x"), pending(ask, Y, "toolu_y")
    admitted: list[str] = []
    both_open = threading.Event()
    admit = sidecar.watches.admit

    def counting(caller_id: str):
        slot = admit(caller_id)  # raises past a limit: then nothing is counted
        admitted.append(caller_id)
        if len(admitted) == 2:
            both_open.set()
        return slot

    sidecar.watches.admit = counting
    held = []
    for identity, approval_id in ((X, mine), (Y, theirs)):
        connection = connect(identity)
        connection.request("POST", "/v1/approval/wait", body=json.dumps({"approval_id": approval_id,
                                                                         "wait_seconds": 55}).encode(),
                           headers={"Content-Type": "application/json"})
        held.append(connection)
    assert both_open.wait(timeout=30)
    assert sidecar.watches.open_watches() == 2
    status, refused = ask(X, "/v1/approval/wait", {"approval_id": mine, "wait_seconds": 55})
    assert (status, refused["error"]["code"]) == (429, "RESOURCE_EXHAUSTED")
    assert "(approvals.max_watches_per_caller)" in refused["error"]["message"]
    status, refused = ask(CONSOLE, "/v1/approval/wait", {"approval_id": mine, "wait_seconds": 55})
    assert (status, refused["error"]["code"]) == (429, "RESOURCE_EXHAUSTED")
    assert "(approvals.max_watches)" in refused["error"]["message"]
    assert admitted == [X, Y]  # the refused waits never held a place
    status, decided = ask(X, "/v1/authorize", _body(ctx=ALICE, call=Call(
        "toolu_small", "issue_refund", b'{"order_id": "ord_1", "amount_cents": 100}')))
    assert (status, decided["decision"]) == (200, "ALLOW")
    for connection in held:  # the clients go away without reading an answer
        connection.close()
    assert sidecar.watches.wait_until_at_most(0, timeout=30)
    status, again = ask(X, "/v1/approval/wait", {"approval_id": mine, "wait_seconds": 0})
    assert (status, again["status"]) == (200, "pending")


# -- one call's audit story ----------------------------------------------------------------

def test_an_auditor_reads_a_calls_story_from_decision_to_approval(api):
    sidecar, ask, _connect = api
    approval_id = pending(ask)
    sidecar.approvals.decide(approval_id, BOB, APPROVE, "within policy", caller=CONSOLE)
    status, story = ask(AUDITOR, "/v1/call-story", {"tenant": "acme", "call_id": "toolu_big"})
    assert status == 200 and story["complete"] is True
    summary = story["summary"]
    assert (summary["decision"], summary["approval_id"], summary["tool"]) == (
        "APPROVAL_REQUIRED", approval_id, "issue_refund")
    assert summary["approval"]["verdict"] == "APPROVE" and summary["approval"]["approver"] == 'User::"bob"'
    assert summary["approval"]["reason"] == "within policy"
    assert [step["stage"] for step in story["steps"]][:2] == ["decision", "approval"]
    status, empty = ask(AUDITOR, "/v1/call-story", {"tenant": "acme", "call_id": "toolu_never"})
    assert (status, empty["steps"], empty["summary"]["decision"]) == (200, [], "")


def test_a_story_is_the_auditors_of_its_tenant_alone(api):
    sidecar, ask, _connect = api
    pending(ask)
    for identity in (X, CONSOLE, GLOBEX_AUDITOR):
        status, refused = ask(identity, "/v1/call-story", {"tenant": "acme", "call_id": "toolu_big"})
        assert (status, refused["error"]["code"]) == (403, "PERMISSION_DENIED"), identity
    callers = {r.event.caller for r in sidecar.audit_log.query(AuditQuery(result="refused"), limit=10)}
    assert callers == {X, CONSOLE, GLOBEX_AUDITOR}


@pytest.mark.parametrize("body", [
    {"tenant": "acme"}, {"call_id": "toolu_big"}, {"tenant": "acme", "call_id": ""},
    {"tenant": "acme", "call_id": "x`\n\u202e" * 40}, {"tenant": "../acme", "call_id": "x"},
    {"tenant": "acme", "call_id": "x", "limit": 5}])
def test_a_malformed_story_request_is_a_one_line_400(api, body):
    _sidecar, ask, _connect = api
    status, refused = ask(AUDITOR, "/v1/call-story", body)
    assert (status, refused["error"]["code"]) == (400, "INVALID_ARGUMENT")
    assert "\n" not in refused["error"]["message"] and "\u202e" not in refused["error"]["message"]
