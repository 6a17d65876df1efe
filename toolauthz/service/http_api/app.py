"""The HTTP API's application: its routes, each with the RPC its caller must be allowed
and the largest body it reads, and the one boundary every request passes.

The boundary's order is the point (issue: "check first, then read"):
  1. the `Host` (one, and one the listener answers);
  2. at most `max_concurrent` requests at once;
  3. the caller, which the connection's listener proved (listener.py), admitted to the
     route's RPC by the roles gate, before a byte of the body is read;
  4. the body, read up to the route's cap (413 past it, before reading when
     `Content-Length` says so) and parsed to the route's shape, off the event loop when
     it is large (body.py), refusing an unknown member or a call past the batch's bound
     as soon as the scan reaches it (json_body.py);
  5. the handler (handlers.py), which admits the caller again for the tenant the body
     names, and decides through the decision pump.
An answer given before the body was read closes the connection rather than drain it.
Every exception becomes an answer through the shared table (service/failures.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from toolauthz.approvals import ApprovalDesk
from toolauthz.audit.store import AuditLog
from toolauthz.authorizer import Authorizer
from toolauthz.batch import DEFAULT_LIMITS, BatchLimits
from toolauthz.bundle.catalog import MAX_INPUT_BYTES_CEILING
from toolauthz.model import MAX_ENTITIES_BYTES
from toolauthz.server.pump import DecisionPump
from toolauthz.service.access import Gate
from toolauthz.service.failures import Failure, Status, failure_of
from toolauthz.service.http_api import envelope
from toolauthz.service.http_api.answers import HttpRefusal, error_response, http_exception
from toolauthz.service.http_api.approval_routes import HttpApprovals
from toolauthz.service.http_api.body import declares_body, parse_json, read_body
from toolauthz.service.http_api.handlers import Body, HttpHandlers
from toolauthz.service.http_api.json_body import BodyShape
from toolauthz.service.http_api.listener import peer_of
from toolauthz.service.observe import Observation, observed
from toolauthz.service.roles import Rpc
from toolauthz.service.watching import WatchLimits
from toolauthz.tokens.keyring import KeyRing

__all__ = ["ENVELOPE_BYTES", "HttpApi", "HttpRoute"]

Handler = Callable[[Request, Body, Observation], Awaitable[Response]]

# What a body holds beside the arguments and entities it carries as sent: ids, names,
# the principal, the token; JSON escapes may spell each character in six bytes.
ENVELOPE_BYTES = 16 * 1024
# Per call of a batch: its call id and tool name.
BATCH_CALL_ENVELOPE_BYTES = 4 * 1024


@dataclass(frozen=True)
class HttpRoute:
    """One route. `rpc`: what its caller must be allowed (None: anyone, no body, not
    observed: the health check). `max_body_bytes`: the body it reads at most (0: none).
    `observed`: recorded as its gRPC twin is (metrics, a span)."""

    method: str
    rpc: Rpc | None
    max_body_bytes: int
    shape: BodyShape | None
    handle: Handler
    observed: bool = True


def single_call_bytes(max_body_bytes: int) -> int:
    """The cap of a body with one call: the largest arguments any tool may take, the
    largest entities, and the envelope."""
    return min(max_body_bytes, MAX_INPUT_BYTES_CEILING + MAX_ENTITIES_BYTES + ENVELOPE_BYTES)


def batch_bytes(max_body_bytes: int, limits: BatchLimits) -> int:
    """The cap of a batch: `batch.max_bytes` of arguments and entities, and each call's
    envelope."""
    return min(max_body_bytes, limits.max_bytes + limits.max_calls * BATCH_CALL_ENVELOPE_BYTES + ENVELOPE_BYTES)


class HttpApi:
    """The Starlette application; one per sidecar process, on the gRPC server's loop."""

    def __init__(self, authorizer: Authorizer, pump: DecisionPump, keyring: KeyRing, *, gate: Gate,
                 desk: ApprovalDesk, watches: WatchLimits, audit_log: AuditLog,
                 max_body_bytes: int, max_concurrent: int, batch_limits: BatchLimits = DEFAULT_LIMITS):
        # The caller is the one the connection's listener proved (listener.py).
        self._gate = replace(gate, callers=lambda request: peer_of(request).caller)
        self._max_concurrent = max_concurrent
        self._in_flight = 0
        handlers = HttpHandlers(authorizer, pump, keyring, self._gate, batch_limits)
        approvals = HttpApprovals(desk, watches, audit_log, self._gate)
        small = min(max_body_bytes, ENVELOPE_BYTES)
        single = single_call_bytes(max_body_bytes)
        outcome = min(max_body_bytes, MAX_ENTITIES_BYTES + ENVELOPE_BYTES)
        self.routes: dict[str, HttpRoute] = {
            "/v1/authorize": HttpRoute("POST", "Authorize", single, envelope.AUTHORIZE, handlers.authorize),
            "/v1/authorize-batch": HttpRoute("POST", "AuthorizeBatch", batch_bytes(max_body_bytes, batch_limits),
                                             envelope.batch_shape(batch_limits), handlers.authorize_batch),
            "/v1/verify": HttpRoute("POST", "Verify", single, envelope.VERIFY, handlers.verify),
            "/v1/outcome": HttpRoute("POST", "ReportOutcome", outcome, envelope.OUTCOME, handlers.outcome),
            "/v1/approval": HttpRoute("POST", "GetApproval", small, envelope.APPROVAL, approvals.get_approval),
            "/v1/approval/wait": HttpRoute("POST", "WatchApproval", small, envelope.APPROVAL_WAIT,
                                           approvals.wait_approval),
            "/v1/call-story": HttpRoute("POST", "QueryDecisions", small, envelope.CALL_STORY, approvals.call_story),
            "/v1/keys": HttpRoute("GET", "GetKeys", 0, None, handlers.keys, observed=False),
            "/healthz": HttpRoute("GET", None, 0, None, handlers.health, observed=False),
        }
        self.app = Starlette(
            routes=[Route(path, self._answering(path, route), methods=[route.method])
                    for path, route in self.routes.items()],
            exception_handlers={HTTPException: http_exception})

    def _answering(self, path: str, route: HttpRoute) -> Callable[[Request], Awaitable[Response]]:
        """The error boundary of a route, in the order the module's doc gives."""
        where = f"HTTP {path}"

        async def answer(request: Request) -> Response:
            unread = declares_body(request)
            hosts = request.headers.getlist("host")
            if len(hosts) > 1 or not peer_of(request).answers_host(hosts[0] if hosts else ""):
                return error_response(403, Failure(Status.PERMISSION_DENIED,
                                                   "this HTTP listener answers requests for a loopback host "
                                                   "or an IP address only"), close=unread)
            if self._in_flight >= self._max_concurrent:
                return error_response(429, Failure(Status.RESOURCE_EXHAUSTED,
                                                   f"more than {self._max_concurrent} requests at once"), close=unread)
            self._in_flight += 1
            try:
                with _observation(route, request) as seen:
                    if route.rpc is not None:  # who is calling, before a byte of the body
                        await self._gate.admit_async(request, route.rpc)
                    body = await read_body(request, route.max_body_bytes)
                    unread = False
                    members = await parse_json(body, route.shape) if route.shape is not None else {}
                    return await route.handle(request, members, seen)
            except HttpRefusal as refusal:
                return error_response(refusal.http_status, refusal.failure, code=refusal.code,
                                      close=unread and not refusal.body_read)
            except Exception as exc:  # noqa: BLE001 - the boundary
                failure = failure_of(exc, where)
                return error_response(failure.status.http_status, failure, close=unread)
            finally:
                self._in_flight -= 1

        answer.__name__ = route.handle.__name__
        return answer


@contextlib.contextmanager
def _observation(route: HttpRoute, request: Request) -> Iterator[Observation]:
    name = route.rpc or "Health"
    if not route.observed:
        yield Observation(name, "http", None, None)
        return
    with observed(name, "http", lambda: request.headers.items()) as seen:
        yield seen
