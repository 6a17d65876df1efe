"""The upstream's requests to the client (sampling, elicitation, roots), passed on only
within the call that caused them.

One upstream connection serves every user of the gateway, and a server-to-client
request names no call (over stdio, and on the 2025-11-25 era, it arrives on the
connection, not inside the call). So the gateway passes such a request on only while
exactly one downstream request (a `tools/call`, `resources/read` or `prompts/get`) is
running on that upstream: to that request's client, on that request's stream. With none
or several in flight the request is refused (an MCP error to the upstream): it never
reaches a client it might not belong to. A client of the 2026-07-28 era has no back
channel in a call the gateway serves; such requests are refused too.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata

from toolauthz.display.escape import display

__all__ = ["ClientRequests"]

log = logging.getLogger("toolauthz.mcp_proxy")
R = TypeVar("R")


class ClientRequests:
    """`calling(upstream, ctx)` around a downstream request; `callbacks_for(upstream)`
    are the SDK Client options of that upstream's link."""

    def __init__(self) -> None:
        self._in_flight: dict[str, list[Any]] = {}

    @contextlib.contextmanager
    def calling(self, upstream: str | None, ctx: Any) -> Iterator[None]:
        if upstream is None:
            yield
            return
        calls = self._in_flight.setdefault(upstream, [])
        calls.append(ctx)
        try:
            yield
        finally:
            calls.remove(ctx)

    def _only_call(self, upstream: str) -> Any:
        calls = self._in_flight.get(upstream, [])
        return calls[0] if len(calls) == 1 else None

    def callbacks_for(self, upstream: str) -> dict[str, Any]:
        async def sampling(context: Any, params: types.CreateMessageRequestParams) -> Any:
            return await self._pass_on(upstream, "sampling", lambda ctx: ctx.session.send_request(
                types.CreateMessageRequest(params=params), types.CreateMessageResult, metadata=_related(ctx)))

        async def elicitation(context: Any, params: Any) -> Any:
            return await self._pass_on(upstream, "elicitation", lambda ctx: ctx.session.send_request(
                types.ElicitRequest(params=params), types.ElicitResult, metadata=_related(ctx)))

        async def roots(context: Any) -> Any:
            return await self._pass_on(upstream, "roots", lambda ctx: ctx.session.send_request(
                types.ListRootsRequest(), types.ListRootsResult, metadata=_related(ctx)))

        return {"sampling_callback": sampling, "elicitation_callback": elicitation, "list_roots_callback": roots}

    async def _pass_on(self, upstream: str, what: str, send: Callable[[Any], Awaitable[R]]) -> R | types.ErrorData:
        ctx = self._only_call(upstream)
        if ctx is None:
            log.info("refused a %s request of upstream %s: not within exactly one call", what, display(upstream))
            return types.ErrorData(code=types.INVALID_REQUEST,
                                   message=f"{what} is passed on only within the one call that caused it")
        try:
            return await send(ctx)
        except MCPError as exc:
            return exc.error
        except Exception as exc:  # no back channel, or the client went away: the upstream hears why
            log.info("could not pass a %s request of upstream %s on", what, display(upstream), exc_info=True)
            return types.ErrorData(code=types.INTERNAL_ERROR, message=f"the client could not take the {what} "
                                                                      f"request ({type(exc).__name__})")


def _related(ctx: Any) -> ServerMessageMetadata:
    return ServerMessageMetadata(related_request_id=ctx.request_id)
