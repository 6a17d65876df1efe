"""What every gRPC handler shares: the error-to-status mapping and message conversions.

The service layer is the only place where errors become status codes:

    RequestError, InputError  -> INVALID_ARGUMENT (the caller sent an unusable request)
    NotFoundError             -> NOT_FOUND
    ConflictError             -> ALREADY_EXISTS
    ForbiddenError            -> PERMISSION_DENIED
    PreconditionError         -> FAILED_PRECONDITION
    StoreUnavailable          -> UNAVAILABLE (and never a token or `valid`)
    deadline already passed   -> DEADLINE_EXCEEDED, before any work
    anything else             -> INTERNAL with a generic message; the detail goes to the log
A DENY is an answer, not an error: it travels in the response.
"""

from __future__ import annotations

import functools
import logging

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from sidecar.errors import (
    ConflictError,
    ForbiddenError,
    InputError,
    NotFoundError,
    PreconditionError,
    RequestError,
    StoreUnavailable,
)
from sidecar.model import Principal, ProposedCall, TrustedContext
from sidecar.proto.toolauthz.v1 import authorizer_pb2 as pb

log = logging.getLogger("toolauthz.service")

_STATUS = [
    ((RequestError, InputError), grpc.StatusCode.INVALID_ARGUMENT),
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (ConflictError, grpc.StatusCode.ALREADY_EXISTS),
    (ForbiddenError, grpc.StatusCode.PERMISSION_DENIED),
    (PreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
]


def _expired(context) -> bool:
    remaining = context.time_remaining()
    return remaining is not None and remaining <= 0


_EXPIRED = (grpc.StatusCode.DEADLINE_EXCEEDED, "deadline expired before the request was handled")


def _status_for(exc: Exception, name: str) -> tuple[grpc.StatusCode, str]:
    for kinds, code in _STATUS:
        if isinstance(exc, kinds):
            return code, exc.message if isinstance(exc, InputError) else str(exc)
    if isinstance(exc, StoreUnavailable):
        log.error("store unavailable in %s: %s", name, exc)
        return grpc.StatusCode.UNAVAILABLE, "the sidecar's store is unavailable; no decision was made"
    log.error("internal error in %s", name, exc_info=exc)
    return grpc.StatusCode.INTERNAL, "internal error"


def status_mapped(handler):
    """Runs a unary handler with the error-to-status mapping above."""

    @functools.wraps(handler)
    def wrapper(self, request, context: grpc.ServicerContext):
        if _expired(context):
            context.abort(*_EXPIRED)
        try:
            return handler(self, request, context)
        except Exception as exc:  # noqa: BLE001 - the boundary
            context.abort(*_status_for(exc, handler.__name__))

    return wrapper


def status_mapped_async(handler):
    """The same mapping for a coroutine handler (grpc.aio)."""

    @functools.wraps(handler)
    async def wrapper(self, request, context):
        if _expired(context):
            await context.abort(*_EXPIRED)
        try:
            return await handler(self, request, context)
        except Exception as exc:  # noqa: BLE001 - the boundary
            await context.abort(*_status_for(exc, handler.__name__))

    return wrapper


def status_mapped_async_stream(handler):
    """The same mapping for a server-streaming coroutine handler (an async generator)."""

    @functools.wraps(handler)
    async def wrapper(self, request, context):
        if _expired(context):
            await context.abort(*_EXPIRED)
        try:
            async for message in handler(self, request, context):
                yield message
        except Exception as exc:  # noqa: BLE001 - the boundary
            await context.abort(*_status_for(exc, handler.__name__))

    return wrapper


def trusted_context(msg: pb.TrustedContext) -> TrustedContext:
    return TrustedContext(msg.tenant, Principal(msg.principal.type, msg.principal.id), msg.request_id,
                          bytes(msg.entities_json))


def proposed_call(msg: pb.ToolCall) -> ProposedCall:
    return ProposedCall(msg.call_id, msg.name, bytes(msg.input_json))


def timestamp(epoch: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(epoch * 1e9))
    return ts


