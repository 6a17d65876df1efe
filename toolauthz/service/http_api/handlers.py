"""What each HTTP route does once its caller is admitted and its body parsed: the same
authorizer plans, handed to the same decision pump, as the gRPC handlers
(service/authorizer.py), and the same observation (service/observe.py), so decisions,
errors, audit records, metrics and spans are the same on both transports."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Collection

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from toolauthz.authorizer import Authorizer
from toolauthz.batch import BatchLimits, plan_batch
from toolauthz.errors import RequestError
from toolauthz.server.pump import DecisionPump
from toolauthz.service.access import Gate
from toolauthz.service.batching import settle_batch
from toolauthz.service.congestion import CONGESTED_METADATA, drawn
from toolauthz.service.failures import Failure
from toolauthz.service.http_api.answers import authorize_json
from toolauthz.service.http_api.envelope import (
    OUTCOMES,
    about,
    batch_calls,
    context_of,
    proposed_call,
    required_string,
    string_member,
)
from toolauthz.service.observe import Observation
from toolauthz.tokens.keyring import KeyRing

__all__ = ["HttpHandlers"]

Body = dict[str, object]


def _peer(request: Request) -> str:
    """The connection whose turn a request takes in the decision pump's queue."""
    client = request.client
    return f"http:{client.host}:{client.port}" if client is not None else "http"


class HttpHandlers:
    """The routes' handlers; `gate` resolves the caller the connection's listener proved."""

    def __init__(self, authorizer: Authorizer, pump: DecisionPump, keyring: KeyRing, gate: Gate,
                 batch_limits: BatchLimits):
        self._authorizer = authorizer
        self._pump = pump
        self._keyring = keyring
        self._gate = gate
        self.batch_limits = batch_limits

    def _tools(self) -> Collection[str]:
        return self._authorizer.bundles.current.tools

    def _congestion(self, request: Request) -> dict[str, str]:
        """The header `toolauthz-congested: 1` on a share of the connection's answers while
        its calls queue long, as gRPC's trailing metadata (service/authorizer.py `marked`)."""
        return {CONGESTED_METADATA: "1"} if drawn(self._pump.congestion(_peer(request))) else {}

    async def authorize(self, request: Request, body: Body, seen: Observation) -> Response:
        ctx, call = context_of(body.get("context")), proposed_call(body.get("call"))
        caller = (await self._gate.admit_async(request, "Authorize", about(ctx, call.call_id))).caller.id
        async with _client_presence(request) as gone:
            def wanted() -> bool:
                return not gone.is_set()

            result = await self._pump.answer(seen.plan(
                lambda: self._authorizer.plan_authorize(ctx, call, wanted, caller=caller)), peer=_peer(request))
        tool, outcome = seen.decided(self._tools(), ctx, call, result, caller=caller)
        seen.annotate(decision_id=result.decision_id, tool=tool, result=outcome, replayed=result.replayed)
        return JSONResponse(authorize_json(result), headers=self._congestion(request))

    async def authorize_batch(self, request: Request, body: Body, seen: Observation) -> Response:
        ctx, limits = context_of(body.get("context")), self.batch_limits
        calls = batch_calls(body.get("calls"), limits)
        caller = (await self._gate.admit_async(request, "AuthorizeBatch", about(ctx, ""))).caller.id
        async with _client_presence(request) as gone:
            def wanted() -> bool:
                return not gone.is_set()

            answers = settle_batch(await self._pump.answer_group(seen.plan(
                lambda: plan_batch(self._authorizer, ctx, calls, limits, wanted, caller=caller)), len(calls),
                peer=_peer(request)))
        shown: list[dict[str, object]] = []
        for item, answer in zip(calls, answers, strict=True):
            if isinstance(answer, Failure):
                shown.append({"error": {"code": answer.status.name, "message": answer.message}})
                continue
            seen.decided(self._tools(), ctx, item.call, answer, caller=caller)
            shown.append({"response": authorize_json(answer)})
        seen.annotate(calls=len(calls))
        return JSONResponse({"answers": shown}, headers=self._congestion(request))

    async def verify(self, request: Request, body: Body, seen: Observation) -> Response:
        token, ctx, call = (required_string(body, "token", ""), context_of(body.get("context")),
                            proposed_call(body.get("call")))
        caller = (await self._gate.admit_async(request, "Verify", about(ctx, call.call_id))).caller.id
        result = await self._pump.answer(seen.plan(
            lambda: self._authorizer.plan_verify(token, ctx, call, caller=caller)), peer=_peer(request))
        seen.verified(self._tools(), ctx, call, result)
        return JSONResponse({"valid": result.valid, "code": result.code, "decision_id": result.decision_id})

    async def outcome(self, request: Request, body: Body, seen: Observation) -> Response:
        ctx = context_of(body.get("context"))
        call_id, status = string_member(body, "call_id", ""), string_member(body, "status", "")
        error_code, digest = string_member(body, "error_code", ""), string_member(body, "output_digest", "")
        if status not in OUTCOMES:
            raise RequestError(f"status must be {', '.join(OUTCOMES[:-1])} or {OUTCOMES[-1]}")
        caller = (await self._gate.admit_async(request, "ReportOutcome", about(ctx, call_id))).caller.id
        result = await self._pump.answer(seen.plan(
            lambda: self._authorizer.plan_report_outcome(ctx, call_id, status, error_code, digest, caller=caller)),
            peer=_peer(request))
        seen.annotate(decision_id=result.decision_id, result=status)
        return JSONResponse({"decision_id": result.decision_id, "unverified": result.unverified})

    async def keys(self, request: Request, body: Body, seen: Observation) -> Response:
        keys = self._keyring.public_keys(self._authorizer.clock.now())
        return JSONResponse({"keys": [{"kid": k.kid, "paserk": k.paserk, "jwk": k.jwk, "state": k.state}
                                      for k in keys]})

    async def health(self, request: Request, body: Body, seen: Observation) -> Response:
        return JSONResponse({"status": "SERVING"})


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
