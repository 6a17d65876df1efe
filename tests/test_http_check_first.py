"""Check first, then read: the HTTP API knows its caller from the connection and refuses
an unauthorized one before reading a byte of its body; each route reads at most its own
cap; a body's shape is enforced while it is scanned; a large body is parsed off the event
loop. Structural proofs (bytes pulled from the ASGI `receive`, calls made to the parser),
never timings: the figures are in bench/ and docs/performance.md."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from dataclasses import replace
from typing import Any

import pytest
from conftest import calls_audited, order_entity
from transports import Call, Context, _body

from toolauthz.batch import DEFAULT_LIMITS, BatchLimits
from toolauthz.service.http_api import HttpApi, json_body
from toolauthz.service.http_api import body as http_body
from toolauthz.service.roles import CallerGrant, RolePolicy

RUNTIME = "spiffe://acme.example/agent/support"
ALICE = Context(entities=[order_entity("ord_1", "alice")])
REFUND = Call("toolu_1", "issue_refund", b'{"order_id": "ord_1", "amount_cents": 1500}')
FOUR_MB = 4 * 1024 * 1024
CHUNK = 64 * 1024


class Exchange:
    """One request driven straight into the ASGI app, counting the body bytes it pulls."""

    def __init__(self, app: Any, method: str, path: str, body: bytes, *, headers: dict[str, str] | None = None,
                 declare_length: bool = True):
        self._app, self._method, self._path = app, method, path
        self._chunks = [body[i:i + CHUNK] for i in range(0, len(body), CHUNK)] or [b""]
        sent = {"host": "127.0.0.1", "content-type": "application/json", **(headers or {})}
        if declare_length:
            sent["content-length"] = str(len(body))
        else:
            sent["transfer-encoding"] = "chunked"
        self._headers = [(k.lower().encode(), v.encode()) for k, v in sent.items()]
        self.pulled = 0
        self.status = 0
        self.response_headers: dict[str, str] = {}
        self.answer: Any = None

    def with_header(self, name: str, value: str) -> Exchange:
        self._headers.append((name.encode(), value.encode()))
        return self

    async def run(self) -> Exchange:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": self._method,
                 "scheme": "http", "path": self._path, "raw_path": self._path.encode(), "root_path": "",
                 "query_string": b"", "headers": self._headers, "client": ("127.0.0.1", 50000),
                 "server": ("127.0.0.1", 8080)}
        chunks = iter(enumerate(self._chunks))
        body_parts: list[bytes] = []

        async def receive() -> dict[str, Any]:
            item = next(chunks, None)
            if item is None:  # the body is whole: the client waits for its answer
                await asyncio.Event().wait()
            k, chunk = item
            self.pulled += len(chunk)
            return {"type": "http.request", "body": chunk, "more_body": k < len(self._chunks) - 1}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.status = message["status"]
                self.response_headers = {k.decode(): v.decode() for k, v in message["headers"]}
            elif message["type"] == "http.response.body":
                body_parts.append(message.get("body", b""))

        await self._app(scope, receive, send)
        self.answer = json.loads(b"".join(body_parts))
        return self


def drive(exchange: Exchange) -> Exchange:
    return asyncio.run(exchange.run())


@pytest.fixture
def never_parsed(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("the body was parsed")

    monkeypatch.setattr(http_body, "parse_body", refuse)


def _api(sidecar, *, callers: bool, max_body_bytes: int = FOUR_MB * 2,
         limits: BatchLimits = DEFAULT_LIMITS) -> HttpApi:
    gate = sidecar.gate
    if callers:
        gate = replace(gate, policy=RolePolicy.of([CallerGrant(RUNTIME, frozenset({"runtime"}),
                                                                frozenset({"acme"}))]))
    return HttpApi(sidecar.authorizer, sidecar.pump, sidecar.keyring, gate=gate, desk=sidecar.approvals,
                   watches=sidecar.watches, audit_log=sidecar.audit_log, max_body_bytes=max_body_bytes,
                   max_concurrent=8, batch_limits=limits)


def _hostile_batch(calls: int) -> bytes:
    """The reproduction's body: a batch of `calls` calls."""
    item = '{"call": {"call_id": "c%d", "name": "issue_refund", "input": {"order_id": "ord_1", "amount_cents": 1}}}'
    context = json.dumps({k: v for k, v in Context().as_json().items() if k != "entities"})
    return f'{{"context": {context}, "calls": [{", ".join(item % k for k in range(calls))}]}}'.encode()


# -- the caller before the body ------------------------------------------------------------

@pytest.mark.parametrize("path", ["/v1/authorize-batch", "/v1/authorize", "/v1/verify", "/v1/outcome",
                                  "/v1/approval", "/v1/approval/wait", "/v1/call-story"])
def test_an_unauthenticated_caller_is_refused_before_a_byte_of_its_4_mb_body_is_read(sidecar, never_parsed, path):
    hostile = _hostile_batch(44_000)
    assert len(hostile) > FOUR_MB
    done = drive(Exchange(_api(sidecar, callers=True).app, "POST", path, hostile))
    assert (done.status, done.answer["error"]["code"]) == (403, "PERMISSION_DENIED")
    assert done.pulled == 0
    assert done.response_headers["connection"] == "close"  # the unread body is not drained


def test_the_refusal_before_the_body_is_audited_with_the_caller_alone(sidecar, never_parsed):

    drive(Exchange(_api(sidecar, callers=True).app, "POST", "/v1/authorize", _body(ctx=ALICE, call=REFUND)))
    [record] = calls_audited(sidecar)
    # The caller is bound to no tenant: the system stream, never the tenant the body names.
    assert (record.event.result, record.event.caller, record.event.tenant, record.event.call_id) == \
        ("refused", "unauthenticated", "_system", "")


def test_over_the_wire_the_refused_connection_closes_without_reading_the_body(settings, clock):
    """A plaintext listener with callers configured: the head of a 4 MB request is answered
    403 and the connection closed while almost all of the body is still unsent."""
    from toolauthz.server.build import build_sidecar, create_server

    configured = type(settings).model_validate({**settings.model_dump(), "http_listen": "127.0.0.1:0", "callers": [
        {"id": RUNTIME, "roles": ["runtime"], "tenants": ["acme"]}]})
    car = build_sidecar(configured, clock=clock)
    server, _port = create_server(car, "127.0.0.1:0")
    try:
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as conn:
            conn.sendall(b"POST /v1/authorize-batch HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                         b"\r\nContent-Length: %d\r\n\r\n" % FOUR_MB + b"[" * CHUNK)
            received = b""
            while chunk := conn.recv(65536):  # until the server closes the connection
                received += chunk
        head, _, answer = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 403 ")
        assert b"connection: close" in head.lower()
        assert json.loads(answer)["error"]["code"] == "PERMISSION_DENIED"
    finally:
        server.stop(None).wait()
        car.close()


# -- each route's cap ------------------------------------------------------------------------

def test_an_authorized_4_mb_body_to_a_route_capped_lower_is_413_without_reading_or_parsing(sidecar, never_parsed):
    api = _api(sidecar, callers=False)  # no callers configured: everyone is admitted
    cap = api.routes["/v1/authorize"].max_body_bytes
    assert cap < FOUR_MB
    body = b'{"x": "' + b"a" * FOUR_MB + b'"}'
    declared = drive(Exchange(api.app, "POST", "/v1/authorize", body))
    assert (declared.status, declared.answer["error"]["code"]) == (413, "RESOURCE_EXHAUSTED")
    assert declared.pulled == 0 and declared.response_headers["connection"] == "close"
    chunked = drive(Exchange(api.app, "POST", "/v1/authorize", body, declare_length=False))
    assert (chunked.status, chunked.answer["error"]["code"]) == (413, "RESOURCE_EXHAUSTED")
    assert cap < chunked.pulled <= cap + CHUNK  # stopped at the first chunk past the cap


def test_each_route_declares_its_cap_near_what_it_carries(sidecar):
    from toolauthz.bundle.catalog import MAX_INPUT_BYTES_CEILING
    from toolauthz.model import MAX_ENTITIES_BYTES

    limits = BatchLimits(max_calls=64, max_bytes=1 << 20)
    routes = _api(sidecar, callers=False, limits=limits).routes
    single = MAX_INPUT_BYTES_CEILING + MAX_ENTITIES_BYTES
    assert single < routes["/v1/authorize"].max_body_bytes == routes["/v1/verify"].max_body_bytes < single * 1.1
    assert limits.max_bytes < routes["/v1/authorize-batch"].max_body_bytes < limits.max_bytes * 1.5
    assert routes["/v1/outcome"].max_body_bytes < single
    assert routes["/v1/keys"].max_body_bytes == routes["/healthz"].max_body_bytes == 0
    # max_message_bytes bounds every route.
    small = _api(sidecar, callers=False, max_body_bytes=4096).routes
    assert {r.max_body_bytes for r in small.values()} == {4096, 0}


def test_a_get_route_reads_no_body(sidecar, never_parsed):
    done = drive(Exchange(_api(sidecar, callers=False).app, "GET", "/v1/keys", b"x" * CHUNK))
    assert (done.status, done.answer["error"]["code"], done.pulled) == (413, "RESOURCE_EXHAUSTED", 0)


# -- the shape, while scanning ---------------------------------------------------------------

def test_a_batch_of_44000_calls_is_refused_at_its_65th_call(sidecar, monkeypatch):
    """With the byte cap raised far enough to read it, the scan still stops at call 65:
    the objects walked are counted, not the time taken."""
    walked = []
    object_at = json_body._Walk.object_at

    def counting(self, i, path):
        walked.append(path)
        return object_at(self, i, path)

    monkeypatch.setattr(json_body._Walk, "object_at", counting)
    api = _api(sidecar, callers=False, limits=BatchLimits(max_calls=64, max_bytes=FOUR_MB * 2))
    done = drive(Exchange(api.app, "POST", "/v1/authorize-batch", _hostile_batch(44_000)))
    assert (done.status, done.answer["error"]) == (400, {"code": "INVALID_ARGUMENT",
                                                         "message": "a batch holds at most 64 calls"})
    items = {path[1] for path in walked if path[:1] == ("calls",)}
    assert items == set(range(64))  # calls 0..63 walked; call 64 refused before its scan
    assert sidecar.pump.answered == 0


def test_a_4_mb_unknown_member_is_refused_at_its_key_before_its_value_is_scanned(sidecar, monkeypatch):
    scanned = []
    end_of_value = json_body._end_of_value

    def counting(text, i):
        scanned.append(i)
        return end_of_value(text, i)

    monkeypatch.setattr(json_body, "_end_of_value", counting)
    hostile = b'{"x": [' + b"1," * (FOUR_MB // 2) + b'1], "context": {}}'
    api = _api(sidecar, callers=False, limits=BatchLimits(max_calls=64, max_bytes=FOUR_MB * 2))
    done = drive(Exchange(api.app, "POST", "/v1/authorize-batch", hostile))
    assert done.pulled == len(hostile)  # read whole: the cap was raised to let it through
    assert (done.status, done.answer["error"]["code"]) == (400, "INVALID_ARGUMENT")
    assert done.answer["error"]["message"] == "unknown member `/x`; expected context, calls"
    assert scanned == []


@pytest.mark.parametrize("body, message", [
    (b'{"context": {"tenant": "acme", "principle": 1}}', "unknown member `/context/principle`"),
    (b'{"context": {"principal": {"type": "User", "name": 1}}}', "unknown member `/context/principal/name`"),
    (b'{"call": {"call_id": "c", "args": {}}}', "unknown member `/call/args`"),
])
def test_unknown_members_are_refused_at_every_level_of_the_envelope(body, message):
    from toolauthz.errors import RequestError
    from toolauthz.service.http_api import envelope

    with pytest.raises(RequestError, match=message):
        json_body.parse_body(body, envelope.AUTHORIZE, max_depth=10)


# -- off the event loop ----------------------------------------------------------------------

def test_a_large_body_is_parsed_on_a_worker_thread_while_the_loop_runs(sidecar, monkeypatch):
    """The parse waits for a callback it schedules on the loop: on the loop's own thread
    it could never run (the wait would time out); off the loop it runs at once."""
    parse_body = http_body.parse_body
    seen: dict[str, Any] = {}

    def watched(body, shape, **kwargs):
        seen["thread"] = threading.get_ident()
        ran = threading.Event()
        seen["loop"].call_soon_threadsafe(ran.set)
        seen["loop_ran_meanwhile"] = ran.wait(timeout=30)
        return parse_body(body, shape, **kwargs)

    monkeypatch.setattr(http_body, "parse_body", watched)
    api = _api(sidecar, callers=False)
    large = _body(ctx=ALICE, call=Call("toolu_big", "issue_refund",
                                       b'{"order_id": "ord_1", "note": "' + b"n" * 40_000 + b'"}'))
    assert len(large) > http_body.OFF_LOOP_BYTES
    large = large.replace(b'"context"', b'"kontext"', 1)  # refused once parsed: no decision needed here

    async def run() -> Exchange:
        seen["loop"], seen["loop_thread"] = asyncio.get_running_loop(), threading.get_ident()
        return await Exchange(api.app, "POST", "/v1/authorize", large).run()

    done = asyncio.run(run())
    assert done.status == 400 and "unknown member `/kontext`" in done.answer["error"]["message"]
    assert seen["thread"] != seen["loop_thread"]
    assert seen["loop_ran_meanwhile"]


def test_a_small_body_is_parsed_on_the_loop(sidecar, monkeypatch):
    parse_body = http_body.parse_body
    threads = []

    def watched(body, shape, **kwargs):
        threads.append(threading.get_ident())
        return parse_body(body, shape, **kwargs)

    monkeypatch.setattr(http_body, "parse_body", watched)
    small = _body(ctx=ALICE, call=REFUND).replace(b'"context"', b'"kontext"', 1)
    assert drive(Exchange(_api(sidecar, callers=False).app, "POST", "/v1/authorize", small)).status == 400
    assert threads == [threading.get_ident()]  # asyncio.run's loop runs on this thread


# -- Host ------------------------------------------------------------------------------------

def test_two_host_headers_are_refused(sidecar, never_parsed):
    exchange = Exchange(_api(sidecar, callers=False).app, "POST", "/v1/authorize", _body(ctx=ALICE, call=REFUND))
    done = drive(exchange.with_header("host", "127.0.0.1"))
    assert (done.status, done.answer["error"]["code"], done.pulled) == (403, "PERMISSION_DENIED", 0)


@pytest.mark.parametrize("host", ["localhost:80@evil", "localhost@evil", "user@localhost", "localhost:80/x",
                                  "localhost:80 evil", "localhost:8o", "localhost:65536", "localhost:000080000",
                                  "[::1]x", "[::1]:80@evil", "127.0.0.1%2f", "[127.0.0.1]", "[::1", "", ":80",
                                  "localhost.", "evil.example"])
def test_a_host_that_is_not_host_and_port_is_refused(sidecar, never_parsed, host):
    from toolauthz.service.loopback import address_host_header, host_of_header, loopback_host_header

    assert not loopback_host_header(host)
    assert not address_host_header(host) or host_of_header(host) is not None
    done = drive(Exchange(_api(sidecar, callers=False).app, "POST", "/v1/authorize",
                          _body(ctx=ALICE, call=REFUND), headers={"host": host}))
    assert (done.status, done.answer["error"]["code"]) == (403, "PERMISSION_DENIED")


@pytest.mark.parametrize("host, name", [("localhost", "localhost"), ("LOCALHOST:8080", "LOCALHOST"),
                                        ("127.0.0.1:80", "127.0.0.1"), ("[::1]:9", "::1"), ("[::1]", "::1"),
                                        ("localhost:", "localhost"), ("10.0.0.1:65535", "10.0.0.1")])
def test_host_and_port_name_their_host(host, name):
    from toolauthz.service.loopback import address_host_header, host_of_header

    assert host_of_header(host) == name
    assert address_host_header(host)


# -- the console -----------------------------------------------------------------------------

def test_the_console_refuses_a_form_from_someone_not_signed_in_without_reading_it(sidecar, monkeypatch):
    from console_pages import browser, console_for, propose

    import toolauthz.console.app as console_app

    def never(_request):
        raise AssertionError("the form was read")

    console = console_for(sidecar, sign_in="dev")
    _, result = propose(sidecar)
    monkeypatch.setattr(console_app, "_form", never)
    answer = browser(console).post(f"/approvals/{result.approval_id}/decide",
                                   data={"csrf_token": "x", "verdict": "APPROVE", "reason": "r" * 30_000})
    assert answer.status_code == 403 and "sign in first" in answer.text
    assert answer.headers["connection"] == "close"
    assert sidecar.approvals.get(result.approval_id).status == "pending"
