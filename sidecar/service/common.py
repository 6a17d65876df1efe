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

from sidecar.errors import (ConflictError, ForbiddenError, InputError, NotFoundError, PreconditionError,
                            RequestError, StoreUnavailable)
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


def _check_deadline(context: grpc.ServicerContext) -> None:
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline expired before the request was handled")


def _abort_for(exc: Exception, name: str, context: grpc.ServicerContext):
    for kinds, code in _STATUS:
        if isinstance(exc, kinds):
            context.abort(code, exc.message if isinstance(exc, InputError) else str(exc))
    if isinstance(exc, StoreUnavailable):
        log.error("store unavailable in %s: %s", name, exc)
        context.abort(grpc.StatusCode.UNAVAILABLE, "the sidecar's store is unavailable; no decision was made")
    log.error("internal error in %s", name, exc_info=exc)
    context.abort(grpc.StatusCode.INTERNAL, "internal error")


def status_mapped(handler):
    """Runs a unary handler with the error-to-status mapping above."""

    @functools.wraps(handler)
    def wrapper(self, request, context: grpc.ServicerContext):
        _check_deadline(context)
        try:
            return handler(self, request, context)
        except Exception as exc:  # noqa: BLE001 - the boundary
            _abort_for(exc, handler.__name__, context)

    return wrapper


def status_mapped_stream(handler):
    """The same mapping for a server-streaming handler (a generator)."""

    @functools.wraps(handler)
    def wrapper(self, request, context: grpc.ServicerContext):
        _check_deadline(context)
        try:
            yield from handler(self, request, context)
        except Exception as exc:  # noqa: BLE001 - the boundary
            _abort_for(exc, handler.__name__, context)

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


