"""What every gRPC handler shares: the error-to-status mapping and message conversions.

The service layer is the only place where errors become status codes. Which error gets
which status is one table for every transport, `failures.py`; here it becomes a gRPC
status, plus two refusals only gRPC has:

    deadline already passed   -> DEADLINE_EXCEEDED, before any work
    bytes that are no message -> INVALID_ARGUMENT, before any work (see `TolerantRegistration`)
A DENY is an answer, not an error: it travels in the response.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import grpc
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from toolauthz.batch import BatchCall
from toolauthz.model import Principal, ProposedCall, TrustedContext
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.service.failures import DEADLINE_EXPIRED, Failure, failure_of


def _expired(context: grpc.ServicerContext | grpc.aio.ServicerContext) -> bool:
    remaining = context.time_remaining()
    return remaining is not None and remaining <= 0


def grpc_status(failure: Failure) -> tuple[grpc.StatusCode, str]:
    """The gRPC status code named as the failure's status, and its message."""
    return grpc.StatusCode[failure.status.name], failure.message


_EXPIRED = grpc_status(DEADLINE_EXPIRED)


def _status_for(exc: Exception, name: str) -> tuple[grpc.StatusCode, str]:
    return grpc_status(failure_of(exc, name))


@dataclass(frozen=True)
class MalformedRequest:
    """What a handler receives in place of a request whose bytes do not parse."""

    message_name: str


def _malformed(request: object) -> tuple[grpc.StatusCode, str] | None:
    if isinstance(request, MalformedRequest):
        return grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid `{request.message_name}` message"
    return None


def _tolerant(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """The handler with a deserializer that returns MalformedRequest for bytes that do
    not parse. grpc itself answers a raising deserializer with UNKNOWN and the
    exception's class; returning a value lets `status_mapped` answer INVALID_ARGUMENT."""
    parse = handler.request_deserializer
    if parse is None:
        return handler
    message_name = getattr(getattr(parse, "__self__", None), "DESCRIPTOR", None)
    shown_name = getattr(message_name, "full_name", "request")

    def tolerant_parse(raw: bytes) -> object:
        try:
            return parse(raw)
        except Exception:  # noqa: BLE001 - any failure to parse caller bytes is the caller's fault
            return MalformedRequest(shown_name)

    # grpc's handlers are namedtuples; its type stubs declare only the protocol.
    return handler._replace(request_deserializer=tolerant_parse)  # type: ignore[attr-defined]


class _TolerantGenericHandler(grpc.GenericRpcHandler):
    def __init__(self, inner: grpc.GenericRpcHandler):
        self._inner = inner

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = self._inner.service(handler_call_details)
        return None if handler is None else _tolerant(handler)


class TolerantRegistration:
    """A view of a grpc server for the generated `add_*Servicer_to_server` functions:
    the handlers it registers give a MalformedRequest to their `status_mapped` servicer
    method instead of failing inside grpc."""

    def __init__(self, server: grpc.aio.Server):
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(tuple(_TolerantGenericHandler(h) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self._server.add_registered_method_handlers(service, {name: _tolerant(h) for name, h in handlers.items()})


Handler = TypeVar("Handler", bound=Callable[..., Any])
Request = Message | MalformedRequest


def status_mapped(handler: Handler) -> Handler:
    """Runs a handler with the error-to-status mapping above: a plain method (unary),
    a coroutine (grpc.aio unary) or an async generator (server streaming). Nothing is
    done once the deadline has passed."""
    name = handler.__name__
    if inspect.isasyncgenfunction(handler):
        @functools.wraps(handler)
        async def streaming(self: object, request: Request,
                            context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if (refusal := _malformed(request) or (_EXPIRED if _expired(context) else None)) is not None:
                await context.abort(*refusal)
            try:
                async for message in handler(self, request, context):
                    yield message
            except Exception as exc:  # noqa: BLE001 - the boundary
                await context.abort(*_status_for(exc, name))

        return cast(Handler, streaming)
    if inspect.iscoroutinefunction(handler):
        @functools.wraps(handler)
        async def unary_async(self: object, request: Request, context: grpc.aio.ServicerContext) -> Any:
            if (refusal := _malformed(request) or (_EXPIRED if _expired(context) else None)) is not None:
                await context.abort(*refusal)
            try:
                return await handler(self, request, context)
            except Exception as exc:  # noqa: BLE001 - the boundary
                await context.abort(*_status_for(exc, name))

        return cast(Handler, unary_async)

    @functools.wraps(handler)
    def unary(self: object, request: Request, context: grpc.ServicerContext) -> Any:
        if (refusal := _malformed(request) or (_EXPIRED if _expired(context) else None)) is not None:
            context.abort(*refusal)
        try:
            return handler(self, request, context)
        except Exception as exc:  # noqa: BLE001 - the boundary
            context.abort(*_status_for(exc, name))

    return cast(Handler, unary)


def trusted_context(msg: pb.TrustedContext) -> TrustedContext:
    return TrustedContext(msg.tenant, Principal(msg.principal.type, msg.principal.id), msg.request_id,
                          bytes(msg.entities_json))


def proposed_call(msg: pb.ToolCall) -> ProposedCall:
    return ProposedCall(msg.call_id, msg.name, bytes(msg.input_json))


def batch_call(msg: pb.BatchCall) -> BatchCall:
    return BatchCall(proposed_call(msg.call), bytes(msg.entities_json))


def timestamp(epoch: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(epoch * 1e9))
    return ts


