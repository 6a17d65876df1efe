"""The HTTP/JSON API: Authorize, Verify, ReportOutcome and GetKeys for runtimes that do
not speak gRPC (a TypeScript agent with `fetch`, a shell script with `curl`).

    POST /v1/authorize   {context, call}                      -> the AuthorizeResponse as JSON
    POST /v1/authorize-batch  {context, calls: [{call, entities}]}
                              -> {answers: [{response: <as /v1/authorize>} | {error: {code, message}}]}
    POST /v1/verify      {token, context, call}               -> {valid, code, decision_id}
    POST /v1/outcome     {context, call_id, status, ...}      -> {decision_id, unverified}
    GET  /v1/keys                                             -> {keys: [{kid, paserk, jwk, state}]}
    GET  /healthz                                             -> {status: "SERVING"}

The handlers hand the authorizer's plans to the decision pump exactly as the gRPC
handlers do (service/authorizer.py), so decisions, errors and audit records are the
same on both transports. `call.input` is a JSON value in the body, kept as the bytes
received (service/json_body.py): the digest, the strict parsing and the schema see the
text the runtime sent, as gRPC's `input_json` does. Errors map through the one table of
service/failures.py; the body is `{"error": {"code": <gRPC status name>, "message"}}`.

Callers are authenticated as on the gRPC listeners (service/callers.py): on a TLS
listener with a client CA, the verified client certificate's URI SAN (else its CN); on a
Unix socket, the listener's identity; on plaintext TCP no one (`unauthenticated`). The
listener puts the connection's `HttpPeer` in each request's scope (`_IdentifyingH11`),
and the roles gate reads the caller from there. Plaintext TCP is the listener a web page
in the machine's browser can reach: its requests must name a loopback `Host` (or, off
loopback, an IP address), so that no DNS name can be rebound to it. Every body must be
`Content-Type: application/json`, which a page cannot post without a CORS preflight the
API never passes. OpenAPI: docs/openapi.yaml.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from sidecar.authorizer import Authorizer, AuthorizeResult
from sidecar.batch import DEFAULT_LIMITS, BatchCall, BatchLimits, check_count, plan_batch
from sidecar.digest import MAX_DEPTH
from sidecar.display import shown
from sidecar.errors import InputError, RequestError
from sidecar.model import Principal, ProposedCall, TrustedContext
from sidecar.server.pump import DecisionPump
from sidecar.service.access import About, Gate
from sidecar.service.authorizer import log_decision
from sidecar.service.batching import settle_batch
from sidecar.service.callers import UNAUTHENTICATED, Caller, Transport, caller_through
from sidecar.service.failures import Failure, Status, failure_of
from sidecar.service.json_body import ANY_ITEM, JsonPath, RawJson, parse_body
from sidecar.service.loopback import address_host_header, loopback_host_header
from sidecar.strict_json import parse_strict_json
from sidecar.tokens.keyring import KeyRing

__all__ = ["HttpApi", "HttpListener", "HttpPeer", "HostRule"]

log = logging.getLogger("toolauthz.http")

OUTCOMES = ("completed", "failed", "cancelled", "outcome_unknown")
# The members whose bytes are kept as received: the model's arguments (digested) and the
# runtime's entities (handed to the engine as `entities_json` is over gRPC).
_RAW: frozenset[JsonPath] = frozenset({("call", "input"), ("context", "entities")})
_BATCH_RAW: frozenset[JsonPath] = frozenset({("context", "entities"), ("calls", ANY_ITEM, "call", "input"),
                                             ("calls", ANY_ITEM, "entities")})
# The body wraps `input` in two objects; a deeper input still reaches the authorizer,
# which refuses it past MAX_DEPTH with the DENY gRPC gives. Beyond this: not parsed.
_BODY_MAX_DEPTH = 2 * MAX_DEPTH


class _Refusal(Exception):
    """An HTTP-only refusal before any work (wrong media type, body too large)."""

    def __init__(self, http_status: int, failure: Failure):
        super().__init__(failure.message)
        self.http_status = http_status
        self.failure = failure


def _error_response(http_status: int, failure: Failure) -> JSONResponse:
    return JSONResponse({"error": {"code": failure.status.name, "message": failure.message}},
                        status_code=http_status)


Endpoint = Callable[[Request], Awaitable[Response]]

# Which `Host` a request must name: any (TLS and Unix sockets, which no web page can
# reach under a name of its choosing), a loopback one (plaintext loopback), or a
# loopback one or an IP address (plaintext off loopback, `insecure: true`).
HostRule = Callable[[str], bool]


def any_host(_host: str) -> bool:
    return True


@dataclass(frozen=True)
class HttpPeer:
    """What the listener proved about a connection: its caller, and the `Host` rule."""

    caller: Caller
    answers_host: HostRule


# A request without the listener's peer (an app driven by something else) proves no
# caller and gets the strictest Host rule.
_UNPROVEN = HttpPeer(UNAUTHENTICATED, loopback_host_header)
_PEER = "toolauthz.peer"


def peer_of(request: Request) -> HttpPeer:
    peer = request.scope.get(_PEER)
    return peer if isinstance(peer, HttpPeer) else _UNPROVEN


class HttpApi:
    """The Starlette application; one per sidecar process, on the gRPC server's loop."""

    def __init__(self, authorizer: Authorizer, pump: DecisionPump, keyring: KeyRing, *, gate: Gate,
                 max_body_bytes: int, max_concurrent: int, batch_limits: BatchLimits = DEFAULT_LIMITS):
        self._authorizer = authorizer
        self._batch_limits = batch_limits
        # The caller is the one the connection's listener proved (see the module's doc).
        self._gate = replace(gate, callers=lambda request: peer_of(request).caller)
        self._pump = pump
        self._keyring = keyring
        self._max_body_bytes = max_body_bytes
        self._max_concurrent = max_concurrent
        self._in_flight = 0
        self.routes: dict[str, tuple[str, Endpoint]] = {
            "/v1/authorize": ("POST", self.authorize),
            "/v1/authorize-batch": ("POST", self.authorize_batch),
            "/v1/verify": ("POST", self.verify),
            "/v1/outcome": ("POST", self.outcome),
            "/v1/keys": ("GET", self.keys),
            "/healthz": ("GET", self.health),
        }
        self.app = Starlette(
            routes=[Route(path, self._answering(endpoint), methods=[method])
                    for path, (method, endpoint) in self.routes.items()],
            exception_handlers={HTTPException: _http_exception})

    def _answering(self, endpoint: Endpoint) -> Endpoint:
        """The error boundary of every route: the listener's Host rule, at most
        `max_concurrent` requests at once, and every exception through the shared table."""
        where = f"HTTP {endpoint.__name__}"

        async def answer(request: Request) -> Response:
            if not peer_of(request).answers_host(request.headers.get("host", "")):
                return _error_response(403, Failure(Status.PERMISSION_DENIED,
                                                    "this HTTP listener answers requests for a loopback host "
                                                    "or an IP address only"))
            if self._in_flight >= self._max_concurrent:
                return _error_response(429, Failure(Status.RESOURCE_EXHAUSTED,
                                                    f"more than {self._max_concurrent} requests at once"))
            self._in_flight += 1
            try:
                return await endpoint(request)
            except _Refusal as refusal:
                return _error_response(refusal.http_status, refusal.failure)
            except Exception as exc:  # noqa: BLE001 - the boundary
                failure = failure_of(exc, where)
                return _error_response(failure.status.http_status, failure)
            finally:
                self._in_flight -= 1

        answer.__name__ = endpoint.__name__
        return answer

    async def authorize(self, request: Request) -> Response:
        body = await self._json_body(request)
        _only(body, "", ("context", "call"))
        ctx, call = _context(body.get("context")), _call(body.get("call"))
        caller = (await self._gate.admit_async(request, "Authorize", _about(ctx, call.call_id))).caller.id
        started = time.perf_counter()
        async with _client_presence(request) as gone:
            def wanted() -> bool:
                return not gone.is_set()

            result = await self._pump.answer(
                lambda: self._authorizer.plan_authorize(ctx, call, wanted, caller=caller))
        log_decision(ctx, call, result, caller=caller, seconds=time.perf_counter() - started, transport="http")
        return JSONResponse(authorize_json(result))

    async def authorize_batch(self, request: Request) -> Response:
        body = await self._json_body(request, raw=_BATCH_RAW)
        _only(body, "", ("context", "calls"))
        ctx, limits = _context(body.get("context")), self._batch_limits
        calls = _batch_calls(body.get("calls"), limits)
        caller = (await self._gate.admit_async(request, "AuthorizeBatch", _about(ctx, ""))).caller.id
        started = time.perf_counter()
        async with _client_presence(request) as gone:
            def wanted() -> bool:
                return not gone.is_set()

            answers = settle_batch(await self._pump.answer_group(
                lambda: plan_batch(self._authorizer, ctx, calls, limits, wanted, caller=caller), len(calls)))
        seconds = time.perf_counter() - started
        for item, answer in zip(calls, answers, strict=True):
            if not isinstance(answer, Failure):
                log_decision(ctx, item.call, answer, caller=caller, seconds=seconds,
                             transport="http")
        return JSONResponse({"answers": [
            {"error": {"code": a.status.name, "message": a.message}} if isinstance(a, Failure)
            else {"response": authorize_json(a)} for a in answers]})

    async def verify(self, request: Request) -> Response:
        body = await self._json_body(request)
        _only(body, "", ("token", "context", "call"))
        token, ctx, call = _string(body, "token", ""), _context(body.get("context")), _call(body.get("call"))
        caller = (await self._gate.admit_async(request, "Verify", _about(ctx, call.call_id))).caller.id
        result = await self._pump.answer(lambda: self._authorizer.plan_verify(token, ctx, call, caller=caller))
        return JSONResponse({"valid": result.valid, "code": result.code, "decision_id": result.decision_id})

    async def outcome(self, request: Request) -> Response:
        body = await self._json_body(request)
        _only(body, "", ("context", "call_id", "status", "error_code", "output_digest"))
        ctx = _context(body.get("context"))
        call_id, status = _string(body, "call_id", ""), _string(body, "status", "")
        error_code, digest = _string(body, "error_code", ""), _string(body, "output_digest", "")
        if status not in OUTCOMES:
            raise RequestError(f"status must be {', '.join(OUTCOMES[:-1])} or {OUTCOMES[-1]}")
        caller = (await self._gate.admit_async(request, "ReportOutcome", _about(ctx, call_id))).caller.id
        result = await self._pump.answer(
            lambda: self._authorizer.plan_report_outcome(ctx, call_id, status, error_code, digest, caller=caller))
        return JSONResponse({"decision_id": result.decision_id, "unverified": result.unverified})

    async def keys(self, request: Request) -> Response:
        await self._gate.admit_async(request, "GetKeys")
        keys = self._keyring.public_keys(self._authorizer.clock.now())
        return JSONResponse({"keys": [{"kid": k.kid, "paserk": k.paserk, "jwk": k.jwk, "state": k.state}
                                      for k in keys]})

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "SERVING"})

    async def _json_body(self, request: Request, raw: frozenset[JsonPath] = _RAW) -> dict[str, object]:
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type != "application/json":
            raise _Refusal(415, Failure(Status.INVALID_ARGUMENT, "the request body must be `application/json`"))
        too_large = _Refusal(413, Failure(Status.RESOURCE_EXHAUSTED,
                                          f"the request body is larger than {self._max_body_bytes} bytes"))
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._max_body_bytes:
            raise too_large
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > self._max_body_bytes:
                    raise too_large
                chunks.append(chunk)
        except ClientDisconnect:  # gone before its request was whole: nothing to decide, no one to answer
            raise _Refusal(400, Failure(Status.INVALID_ARGUMENT, "the client disconnected")) from None
        return parse_body(b"".join(chunks), raw=raw, max_depth=_BODY_MAX_DEPTH)


# -- the request envelope ------------------------------------------------------------------

def _about(ctx: TrustedContext, call_id: str) -> About:
    return About(ctx.tenant, str(ctx.principal), call_id, ctx.request_id)


def _members(value: object, at: str, names: tuple[str, ...]) -> dict[str, object]:
    if not isinstance(value, dict):
        raise RequestError(f"`{at or '/'}` must be a JSON object")
    _only(value, at, names)
    return value


def _only(members: dict[str, object], at: str, names: tuple[str, ...]) -> None:
    unknown = sorted(set(members) - set(names))
    if unknown:
        raise RequestError(f"unknown member `{at}/{shown(unknown[0])}`; expected {', '.join(names)}")


def _string(members: dict[str, object], name: str, at: str) -> str:
    """A string member; absent is empty, which the model's checks refuse where it matters."""
    value = members.get(name, "")
    if not isinstance(value, str):
        raise RequestError(f"`{at}/{name}` must be a string")
    return value


def _context(value: object) -> TrustedContext:
    if value is None:
        raise RequestError("missing `context`")
    members = _members(value, "/context", ("tenant", "principal", "request_id", "entities"))
    principal = _members(members.get("principal", {}), "/context/principal", ("type", "id"))
    entities_json = _entities(members.get("entities"), "/context/entities")
    return TrustedContext(_string(members, "tenant", "/context"),
                          Principal(_string(principal, "type", "/context/principal"),
                                    _string(principal, "id", "/context/principal")),
                          _string(members, "request_id", "/context"), entities_json)


def _entities(value: object, at: str) -> bytes:
    """The runtime's entities as sent (absent: none)."""
    if not isinstance(value, RawJson):
        return b""
    try:  # the runtime's own text: held to the body's strict rules, handed on as sent
        parse_strict_json(value.data, max_bytes=len(value.data))
    except InputError as exc:
        raise RequestError(f"the request body at `{at}`: {exc.message}") from None
    return value.data


def _call(value: object, at: str = "/call") -> ProposedCall:
    named = at.lstrip("/").replace("/", ".")
    if value is None:
        raise RequestError(f"missing `{named}`")
    members = _members(value, at, ("call_id", "name", "input"))
    raw_input = members.get("input")
    if not isinstance(raw_input, RawJson):
        raise RequestError(f"missing `{named}.input`: the tool's arguments as a JSON value")
    return ProposedCall(_string(members, "call_id", at), _string(members, "name", at), raw_input.data)


def _batch_calls(value: object, limits: BatchLimits) -> list[BatchCall]:
    if value is None:
        raise RequestError("missing `calls`")
    if not isinstance(value, list):
        raise RequestError("`/calls` must be a JSON array")
    check_count(len(value), limits)  # before converting what may be a flood of calls
    calls = []
    for k, item in enumerate(value):
        members = _members(item, f"/calls/{k}", ("call", "entities"))
        calls.append(BatchCall(_call(members.get("call"), f"/calls/{k}/call"),
                               _entities(members.get("entities"), f"/calls/{k}/entities")))
    return calls


# -- responses -----------------------------------------------------------------------------

def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


def authorize_json(result: AuthorizeResult) -> dict[str, Any]:
    """The AuthorizeResponse as JSON: absent values are null."""
    token = result.token
    return {
        "decision": result.decision.value,
        "decision_id": result.decision_id,
        "reasons": list(result.reasons),
        "errors": [{"code": e.code, "message": e.message} for e in result.errors],
        "policy_version": result.policy_version,
        "digest": result.digest,
        "token": token.token if token is not None else None,
        "expires_at": rfc3339(token.expires_at) if token is not None else None,
        "approval_id": result.approval_id or None,
        "approval_expires_at": (rfc3339(result.approval_expires_at)
                                if result.approval_expires_at is not None else None),
        "replayed": result.replayed,
    }


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own answers (no such route, wrong method) in the API's error shape."""
    http_status = exc.status_code if isinstance(exc, HTTPException) else 500
    status = Status.NOT_FOUND if http_status == 404 else Status.INVALID_ARGUMENT
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    return _error_response(http_status, Failure(status, str(detail)))


@contextlib.asynccontextmanager
async def _client_presence(request: Request) -> AsyncIterator[threading.Event]:
    """An event set when the client disconnects while its request is being decided: the
    pump then mints no token for it (the gRPC handler does the same on cancellation)."""
    gone = threading.Event()

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone.set()

    watcher = asyncio.create_task(watch())
    try:
        yield gone
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


# -- the listener --------------------------------------------------------------------------

class _Server(uvicorn.Server):
    """uvicorn's server with an event set once it listens."""

    def __init__(self, config: uvicorn.Config):
        super().__init__(config)
        self.listening = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.listening.set()


def host_rule(*, plaintext: bool, loopback: bool) -> HostRule:
    if not plaintext:
        return any_host
    return loopback_host_header if loopback else address_host_header


def _identifying(app: ASGIApp, peer: HttpPeer) -> ASGIApp:
    async def with_peer(scope: Scope, receive: Receive, send: Send) -> None:
        scope[_PEER] = peer
        await app(scope, receive, send)
    return with_peer


def _identifying_protocol(transport: Transport, answers_host: HostRule) -> type[H11Protocol]:
    """uvicorn's h11 protocol, which puts the connection's HttpPeer in each request's
    scope. asyncio calls `connection_made` once the TLS handshake has verified the client
    certificate, so the certificate is read once per connection."""

    class _IdentifyingH11(H11Protocol):
        def connection_made(self, connection: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(connection)
            ssl_object = connection.get_extra_info("ssl_object")
            der = ssl_object.getpeercert(binary_form=True) if isinstance(ssl_object, ssl.SSLObject) else None
            certificates = [ssl.DER_cert_to_PEM_cert(der).encode("ascii")] if der else []
            self.app = _identifying(self.app, HttpPeer(caller_through(transport, certificates), answers_host))

    return _IdentifyingH11


class HttpListener:
    """uvicorn serving an HttpApi (or the console) on the running event loop (the gRPC
    server's), so that every transport shares one loop, one decision pump and one desk."""

    def __init__(self, server: _Server, task: asyncio.Task[None], port: int):
        self._server = server
        self._task = task
        self.port = port

    @classmethod
    async def start(cls, app: ASGIApp, sock: socket.socket, *, transport: Transport, answers_host: HostRule,
                    tls: ssl.SSLContext | None = None) -> HttpListener:
        """Serves `app` (an HttpApi's, or the console's) on `sock` (bound and listening;
        the listener owns it from here), with
        `tls` if given; callers are proven as `transport` says. Raises OSError when it
        cannot serve."""
        config = uvicorn.Config(app, http=_identifying_protocol(transport, answers_host), ws="none",
                                lifespan="off", log_config=None, access_log=False, proxy_headers=False,
                                server_header=False, timeout_graceful_shutdown=5,
                                ssl_context_factory=None if tls is None else (lambda _config, _default: tls))
        server = _Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        listening = asyncio.create_task(server.listening.wait())
        await asyncio.wait({task, listening}, return_when=asyncio.FIRST_COMPLETED)
        if not server.listening.is_set():
            listening.cancel()
            sock.close()
            task.result()  # raises what stopped it
            raise OSError(f"cannot serve HTTP on {transport.address}")
        name = sock.getsockname()
        return cls(server, task, name[1] if isinstance(name, tuple) else 0)

    async def stop(self, grace: float | None) -> None:
        """Stops taking requests; those in flight get `grace` seconds (None: none)."""
        self._server.config.timeout_graceful_shutdown = None if grace is None else max(1, round(grace))
        self._server.should_exit = True
        if grace is None:
            self._server.force_exit = True
        await self._task
