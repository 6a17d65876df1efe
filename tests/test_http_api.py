"""What only the HTTP/JSON API has: its body rules, its listener, its OpenAPI document,
and a client in another language. The decisions themselves: tests/test_transports.py."""

from __future__ import annotations

import http.client as http_client
import json
import shutil
import socket
import subprocess

import grpc
import pytest
from conftest import ROOT, calls_audited, order_entity
from pydantic import ValidationError
from transports import Call, Context, HttpTransport, OpenApiSchemas, _body, openapi

from toolauthz.audit.store import AuditQuery
from toolauthz.digest import call_digest
from toolauthz.errors import RequestError, ToolAuthzError
from toolauthz.service.failures import Status, failure_of
from toolauthz.service.http_api import HttpApi
from toolauthz.service.http_api.json_body import ANY_ITEM, BodyShape, RawJson, parse_body

ALICE = Context(entities=[order_entity("ord_1", "alice")])
REFUND = Call("toolu_1", "issue_refund", b'{"order_id": "ord_1", "amount_cents": 1500}')


@pytest.fixture
def settings(settings):
    return settings.model_copy(update={"http_listen": "127.0.0.1:0", "max_message_bytes": 64 * 1024})


@pytest.fixture
def http(server) -> HttpTransport:
    srv, _port = server
    return HttpTransport(srv.http_port, OpenApiSchemas(openapi()))


# -- the OpenAPI document ------------------------------------------------------------------

def test_every_route_is_documented_and_every_documented_path_is_routed(sidecar):
    api = HttpApi(sidecar.authorizer, sidecar.pump, sidecar.keyring, gate=sidecar.gate, desk=sidecar.approvals,
                  watches=sidecar.watches, audit_log=sidecar.audit_log, max_body_bytes=1024, max_concurrent=1)
    routed = {(path, route.method.lower()) for path, route in api.routes.items()}
    routed_by_starlette = {(route.path, method.lower()) for route in api.app.routes
                           for method in route.methods - {"HEAD"}}
    document = openapi()
    documented = {(path, method) for path, operations in document["paths"].items() for method in operations}
    assert routed == routed_by_starlette == documented
    assert document["openapi"].startswith("3.1")


# -- the body ------------------------------------------------------------------------------

RAW = BodyShape(raw=frozenset({("call", "input")}))


def test_a_raw_member_is_the_exact_bytes_received():
    spelled = '{ "b" : 1.0,\n\t"a":1e2, "c": "é\\u00e9", "d": [ ] }'.encode()
    body = b'{"call": {"name": "x", "input": ' + spelled + b' }, "n": 1}'
    members = parse_body(body, RAW, max_depth=10)
    assert members == {"call": {"name": "x", "input": RawJson(spelled)}, "n": 1}


BAD_BODIES = {
    "not json": (b'{"context": {', "not valid JSON"),
    "NaN in the input": (b'{"call": {"input": {"a": NaN}}}', "`NaN` is not a JSON number"),
    "invalid utf-8": (b'{"call": {"input": "\xff"}}', "not valid UTF-8"),
    "byte order mark": (b'\xef\xbb\xbf{}', "byte order mark"),
    "duplicate envelope key": (b'{"call": {"name": "a", "name": "b", "input": 1}}', "duplicate key `name`"),
    "minus zero outside the input": (b'{"n": -0, "call": {"input": 1}}', "negative zero"),
    "data after the object": (b'{"call": {"input": 1}} {}', "extra data"),
    "an array": (b'[]', "must be a JSON object"),
    "too deep": (b'{"call": {"input": ' + b"[" * 200 + b"]" * 200 + b"}}", "nests deeper than 10 levels"),
}


@pytest.mark.parametrize("body, message", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_a_body_that_is_not_strict_json_is_refused(body, message):
    with pytest.raises(RequestError, match=message):
        parse_body(body, RAW, max_depth=10)


def test_bad_bodies_are_400_invalid_argument_and_nothing_is_decided(http, sidecar):
    envelope = _body(ctx=ALICE, call=REFUND)
    cases = [
        envelope.replace(b'"input": {', b'"input": {"x": NaN, '),
        envelope.replace(b'"tenant": "acme"', b'"tenant": "acme", "tenant": "globex"'),
        envelope.replace(b'"request_id"', b'"principle": "x", "request_id"'),
        envelope.replace(b', "input": {"order_id": "ord_1", "amount_cents": 1500}', b""),
        envelope.replace(b'"tenant": "acme"', b'"tenant": 7'),
        envelope.replace(b'"entities": [', b'"entities": [{"uid": 1, "uid": 2}, '),
        b"",
    ]
    for body in cases:
        status, answer = http.exchange("POST", "/v1/authorize", body)
        assert (status, answer["error"]["code"]) == (400, "INVALID_ARGUMENT"), (body, answer)
    assert calls_audited(sidecar) == []


def test_http_only_refusals(http):
    status, answer = http.exchange("POST", "/v1/authorize", _body(ctx=ALICE, call=REFUND),
                                   headers={"Content-Type": "text/plain"})
    assert (status, answer["error"]["code"]) == (415, "UNSUPPORTED_MEDIA_TYPE")
    large = _body(ctx=ALICE, call=Call("toolu_1", "issue_refund", b'"' + b"x" * 70_000 + b'"'))
    status, answer = http.exchange("POST", "/v1/authorize", large)
    assert (status, answer["error"]["code"]) == (413, "RESOURCE_EXHAUSTED")
    status, answer = http.exchange("POST", "/v1/authorize", _body(ctx=ALICE, call=REFUND),
                                   headers={"Host": "attacker.example:80"})
    assert (status, answer["error"]["code"]) == (403, "PERMISSION_DENIED")
    status, answer = http.exchange("GET", "/v1/nothing", None)
    assert (status, answer["error"]["code"]) == (404, "NOT_FOUND")
    status, answer = http.exchange("GET", "/v1/authorize", None)
    assert (status, answer["error"]["code"]) == (405, "METHOD_NOT_ALLOWED")
    assert http.exchange("GET", "/healthz", None) == (200, {"status": "SERVING"})
    assert http.exchange("GET", "/healthz", None, headers={"Host": "[::1]:9"})[0] == 200


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("GET", "/v1/authorize", "POST"), ("DELETE", "/v1/approval/wait", "POST"), ("POST", "/v1/keys", "GET, HEAD")])
def test_a_method_a_path_does_not_serve_is_405_naming_the_one_it_does(http, method, path, allowed):
    connection = http_client.HTTPConnection("127.0.0.1", http.port, timeout=30)
    connection.request(method, path)
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    assert (response.status, answer["error"]["code"]) == (405, "METHOD_NOT_ALLOWED")
    assert sorted(response.getheader("Allow", "").split(", ")) == sorted(allowed.split(", "))


def test_verify_without_a_token_is_refused_as_the_document_says(http, sidecar):
    status, answer = http.exchange("POST", "/v1/verify", _body(ctx=ALICE, call=REFUND))
    assert (status, answer["error"]["code"]) == (400, "INVALID_ARGUMENT")
    assert answer["error"]["message"] == "missing `token`"
    tokenless = json.loads(_body(ctx=ALICE, call=REFUND))
    assert not OpenApiSchemas(openapi()).request_is_valid("POST", "/v1/verify", tokenless)


# -- the listener --------------------------------------------------------------------------

@pytest.mark.parametrize("address", ["0.0.0.0:8080", "192.168.1.10:80", "example.com:80", "[::]:80"])
def test_a_non_loopback_http_listen_is_refused_at_load(settings, address):
    from toolauthz.server.config import load_settings

    with pytest.raises(ValidationError, match="not a loopback address"):
        settings.model_copy(update={"http_listen": ""}).model_validate(
            {**settings.model_dump(), "http_listen": address})
    with pytest.raises(ToolAuthzError, match="loopback only"):
        load_settings(None, http_listen=address)


def test_the_http_listener_stops_with_the_grpc_server(sidecar):
    from toolauthz.server.build import create_server

    srv, _port = create_server(sidecar, "127.0.0.1:0")
    http_port = srv.http_port
    with socket.create_connection(("127.0.0.1", http_port), timeout=5):
        pass
    srv.stop(None).wait()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", http_port), timeout=5)


def test_without_http_listen_there_is_no_http_listener(sidecar, settings):
    from toolauthz.server.build import create_server

    sidecar.settings = settings.model_copy(update={"http_listen": ""})
    srv, port = create_server(sidecar, "127.0.0.1:0")
    try:
        assert srv.http_port is None
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=10)
    finally:
        srv.stop(None)


# -- one error table -----------------------------------------------------------------------

def test_every_status_is_a_grpc_status_code_and_errors_map_through_one_table():
    from toolauthz.errors import ConflictError, InputError, NotFoundError, StoreUnavailable
    from toolauthz.service.common import grpc_status

    for status in Status:
        assert grpc.StatusCode[status.name].name == status.name
    assert failure_of(InputError("invalid_input", "bad"), "test").status is Status.INVALID_ARGUMENT
    assert failure_of(NotFoundError("x"), "test").status.http_status == 404
    assert failure_of(ConflictError("x"), "test").status.http_status == 409
    assert failure_of(StoreUnavailable("disk"), "test").message == "the sidecar's store is unavailable; no " \
                                                                     "decision was made"
    internal = failure_of(KeyError("secret detail"), "test")
    assert (internal.status.http_status, internal.message) == (500, "internal error")
    assert grpc_status(internal) == (grpc.StatusCode.INTERNAL, "internal error")


# -- a client in another language ----------------------------------------------------------

@pytest.mark.skipif(shutil.which("node") is None, reason="node is not on PATH")
def test_a_node_fetch_client_authorizes_and_verifies(http):
    raw = '{"amount_cents": 15e2, "order_id": "ord_1"}'
    script = ROOT / "tests" / "node" / "http_client.mjs"
    done = subprocess.run(["node", str(script), f"http://127.0.0.1:{http.port}", "toolu_node", raw],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    answers = json.loads(done.stdout)
    authorize, verify = answers["authorize"], answers["verify"]
    assert authorize["decision"] == "ALLOW" and authorize["token"].startswith("v4.public.")
    assert authorize["digest"] == call_digest(tool="issue_refund", input={"order_id": "ord_1", "amount_cents": 1500},
                                              principal_type="User", principal_id="alice", tenant="acme",
                                              call_id="toolu_node")
    assert verify == {"valid": True, "code": "ok", "decision_id": authorize["decision_id"]}


def test_every_worker_serves_http_on_one_port_chosen_by_the_parent(bundle_dir, tmp_path, monkeypatch):
    """`--workers 2` with `http_listen` on port 0: the parent picks one port, both workers
    bind it with SO_REUSEPORT, and the line that says the sidecar serves names it."""
    import re
    import signal

    from test_workers import Workers

    monkeypatch.setenv("TOOLAUTHZ_HTTP_LISTEN", "127.0.0.1:0")
    workers = Workers("--bundle", str(bundle_dir), "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "d"),
                      "--workers", "2")
    try:
        assert len(workers.wait_serving()) == 2
        line = next(x for x in workers.out if "serving" in x)
        port = int(re.search(r"HTTP on 127\.0\.0\.1:(\d+),", line).group(1))
        assert port != 0
        http = HttpTransport(port, OpenApiSchemas(openapi()))
        for _ in range(4):  # fresh connections, spread over the workers by the kernel
            assert http.exchange("GET", "/healthz", None) == (200, {"status": "SERVING"})
        workers.proc.send_signal(signal.SIGTERM)
        assert workers.wait() == 0
    finally:
        workers.kill()


def test_with_callers_configured_the_unauthenticated_http_api_may_fetch_keys_alone(settings, clock):
    """Plaintext `http_listen` proves no caller: it must not be a way around the roles that a
    production config sets for gRPC."""
    from toolauthz.server.build import build_sidecar, create_server

    configured = type(settings).model_validate({**settings.model_dump(), "callers": [
        {"id": "spiffe://acme.example/agent/support", "roles": ["runtime"], "tenants": ["acme"]}]})
    sidecar = build_sidecar(configured, clock=clock)
    server, _port = create_server(sidecar, "127.0.0.1:0")
    try:
        api = HttpTransport(server.http_port, OpenApiSchemas(openapi()))
        status, answer = api.exchange("POST", "/v1/authorize", _body(ctx=ALICE, call=REFUND))
        assert (status, answer["error"]["code"]) == (403, "PERMISSION_DENIED")
        assert api.exchange("GET", "/v1/keys", None)[0] == 200
        refused = calls_audited(sidecar)
        assert [(r.event.result, r.event.caller) for r in refused] == [("refused", "unauthenticated")]
    finally:
        server.stop(None).wait()
        sidecar.close()


# -- AuthorizeBatch ------------------------------------------------------------------------

def _batch_body(ctx: Context, *members: tuple[Call, list | None]) -> bytes:
    """A batch body with each call's input spliced in as the bytes the model wrote."""
    calls = []
    for call, entities in members:
        head = json.dumps({"call_id": call.call_id, "name": call.name})[:-1]
        item = f'{{"call": {head}, "input": '.encode() + call.input + b"}"
        if entities is not None:
            item += b', "entities": ' + json.dumps(entities).encode()
        calls.append(item + b"}")
    context = json.dumps({"context": {k: v for k, v in ctx.as_json().items() if k != "entities"}})[:-1]
    return context.encode() + b', "calls": [' + b", ".join(calls) + b"]}"


def test_a_flood_of_calls_over_http_is_refused_before_any_call_is_read(http, sidecar, monkeypatch):
    import toolauthz.service.http_api.envelope as envelope

    def never(*_args):
        raise AssertionError("a call of a refused batch was converted")

    monkeypatch.setattr(envelope, "proposed_call", never)
    context = json.dumps(Context().as_json())
    body = f'{{"context": {context}, "calls": [{", ".join(["{}"] * 1000)}]}}'.encode()
    status, answer = http.exchange("POST", "/v1/authorize-batch", body)
    assert (status, answer["error"]) == (400, {"code": "INVALID_ARGUMENT",
                                               "message": "a batch holds at most 64 calls"})
    assert sidecar.pump.answered == 0


def test_a_raw_member_inside_an_array_is_the_exact_bytes_received():
    spelled = b'{ "b" : 1.0,\n "a":1e2 }'
    body = b'{"calls": [{"call": {"input": ' + spelled + b'}}, {"call": {"input": [1e2]}}], "n": [1.0]}'
    members = parse_body(body, BodyShape(raw=frozenset({("calls", ANY_ITEM, "call", "input")})), max_depth=10)
    assert members == {"calls": [{"call": {"input": RawJson(spelled)}}, {"call": {"input": RawJson(b"[1e2]")}}],
                       "n": [1.0]}
    with pytest.raises(RequestError, match="duplicate key `x` in the request body at `/calls/1/call`"):
        parse_body(b'{"calls": [{}, {"call": {"x": 1, "x": 2}}]}',
                   BodyShape(raw=frozenset({("calls", ANY_ITEM, "call", "input")})), max_depth=10)


def test_a_batch_over_http_answers_each_call_as_authorize_does(http, sidecar):
    spelled = b'{ "amount_cents":1500, "order_id" : "ord_1"}'
    refund, large = Call("b1", "issue_refund", spelled), Call("b3", "issue_refund", b'{"order_id": "ord_1", '
                                                                                       b'"amount_cents": 6000}')
    own = [order_entity("ord_1", "alice")]
    body = _batch_body(Context(), (refund, own), (Call("bad id", "issue_refund", spelled), own), (large, own))
    assert http._schemas.request_is_valid("POST", "/v1/authorize-batch",
                                          json.loads(_batch_body(Context(), (refund, own), (large, own))))
    status, answer = http.exchange("POST", "/v1/authorize-batch", body)
    http._schemas.check_response("POST", "/v1/authorize-batch", status, answer)
    allowed, bad, pending = answer["answers"]
    assert (allowed["response"]["decision"], pending["response"]["decision"]) == ("ALLOW", "APPROVAL_REQUIRED")
    assert bad == {"error": {"code": "INVALID_ARGUMENT",
                             "message": "call_id must match `^[A-Za-z0-9][A-Za-z0-9._:-]{0,255}\\Z`"}}
    # The arguments' bytes reached the digest as sent: Verify with the same bytes accepts the token.
    assert http.verify(allowed["response"]["token"], ALICE, refund).valid
    [record] = sidecar.audit_log.query(AuditQuery(call_id="b1", kind="authorize"), limit=10)
    assert record.event.decision_id == allowed["response"]["decision_id"]


def test_a_refused_batch_over_http_is_400_and_decides_nothing(http, sidecar):
    own = [order_entity("ord_1", "alice")]
    cases = [
        _batch_body(Context(), (REFUND, own), (REFUND, own)),  # a call id twice
        _batch_body(Context()),  # no calls
        _batch_body(Context(), (REFUND, own)).replace(b'"calls": [', b'"context2": 1, "calls": ['),
        _batch_body(Context(), (REFUND, own)).replace(b'"request_id": "run-1"',
                                                      b'"request_id": "run-1", "entities": []'),
        b'{"context": ' + json.dumps(Context().as_json()).encode() + b', "calls": {}}',
    ]
    for body in cases:
        status, answer = http.exchange("POST", "/v1/authorize-batch", body)
        http._schemas.check_response("POST", "/v1/authorize-batch", status, answer)
        assert (status, answer["error"]["code"]) == (400, "INVALID_ARGUMENT"), (body, answer)
    assert calls_audited(sidecar) == []


# -- congestion marks ------------------------------------------------------------------------

@pytest.mark.parametrize("share", [0.0, 1.0])
def test_http_answers_carry_the_congestion_mark_as_a_header_while_the_pump_is_congested(http, monkeypatch, share):
    """As gRPC's trailing metadata (tests/test_congestion_marks.py): `toolauthz-congested: 1`
    on a share of the successful Authorize and AuthorizeBatch answers; never on an error."""
    from toolauthz.server.pump import DecisionPump

    monkeypatch.setattr(DecisionPump, "congestion", lambda self, peer="": share)
    bodies = {"/v1/authorize": _body(ctx=ALICE, call=Call(f"toolu_m{share}", REFUND.name, REFUND.input)),
              "/v1/authorize-batch": _batch_body(Context(), (Call(f"toolu_b{share}", REFUND.name, REFUND.input),
                                                             [order_entity("ord_1", "alice")])),
              "/v1/authorize?bad": b'{"context": 7}'}
    for path, body in bodies.items():
        connection = http_client.HTTPConnection("127.0.0.1", http.port, timeout=30)
        try:
            connection.request("POST", path.split("?")[0], body=body, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            status, mark = response.status, response.getheader("toolauthz-congested")
        finally:
            connection.close()
        if path.endswith("?bad"):
            assert (status, mark) == (400, None)  # an error is never marked
        else:
            assert (status, mark) == (200, "1" if share == 1.0 else None), path
