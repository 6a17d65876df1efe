"""The one table from errors to answers, for every transport (gRPC and HTTP/JSON).

    RequestError, InputError  -> INVALID_ARGUMENT     400  the caller sent an unusable request
    ForbiddenError            -> PERMISSION_DENIED    403
    NotFoundError             -> NOT_FOUND            404
    ConflictError             -> ALREADY_EXISTS       409
    PreconditionError         -> FAILED_PRECONDITION  412
    ResourceExhaustedError    -> RESOURCE_EXHAUSTED   429  (e.g. too many open approval watches)
    StoreUnavailable          -> UNAVAILABLE          503  and never a token or `valid`
    too many calls at once    -> RESOURCE_EXHAUSTED   429
    deadline already passed   -> DEADLINE_EXCEEDED    504
    anything else             -> INTERNAL             500  a generic message; the detail goes to the log

A DENY is an answer, not an error: it travels in the response. Each `Status` is named
as gRPC names its status code, so the gRPC boundary (common.py) looks the code up by
name, and the HTTP boundary (http_api.py) uses `http_status`.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

from toolauthz.display.escape import bounded_message
from toolauthz.errors import (
    ConflictError,
    ForbiddenError,
    InputError,
    NotFoundError,
    PreconditionError,
    RequestError,
    ResourceExhaustedError,
    StoreUnavailable,
)
from toolauthz.telemetry import metrics

log = logging.getLogger("toolauthz.service")


class Status(enum.Enum):
    """A failure's status: the member name is the gRPC status code, the value the HTTP one."""

    INVALID_ARGUMENT = 400
    PERMISSION_DENIED = 403
    NOT_FOUND = 404
    ALREADY_EXISTS = 409
    # 412: the state of the thing named (an approval) does not allow the change asked for.
    FAILED_PRECONDITION = 412
    RESOURCE_EXHAUSTED = 429
    INTERNAL = 500
    UNAVAILABLE = 503
    DEADLINE_EXCEEDED = 504

    @property
    def http_status(self) -> int:
        return self.value


@dataclass(frozen=True)
class Failure:
    """What a transport answers for a request that failed: a status and a one-line,
    escaped, bounded message that is safe to send to the caller."""

    status: Status
    message: str


_BY_ERROR: tuple[tuple[type[Exception] | tuple[type[Exception], ...], Status], ...] = (
    ((RequestError, InputError), Status.INVALID_ARGUMENT),
    (NotFoundError, Status.NOT_FOUND),
    (ConflictError, Status.ALREADY_EXISTS),
    (ForbiddenError, Status.PERMISSION_DENIED),
    (PreconditionError, Status.FAILED_PRECONDITION),
    (ResourceExhaustedError, Status.RESOURCE_EXHAUSTED),
)

STORE_UNAVAILABLE_MESSAGE = "the sidecar's store is unavailable; no decision was made"
DEADLINE_EXPIRED = Failure(Status.DEADLINE_EXCEEDED, "deadline expired before the request was handled")


def request_failure(exc: BaseException) -> Failure | None:
    """The failure when `exc` is the caller's own doing (a status of the table above the
    store's), else None: for one call of a batch, which then fails alone (the store, an
    internal error fail the whole batch)."""
    for kinds, status in _BY_ERROR:
        if isinstance(exc, kinds):
            return Failure(status, bounded_message(exc.message if isinstance(exc, InputError) else str(exc)))
    return None


def failure_of(exc: Exception, where: str) -> Failure:
    """The answer for `exc`, raised while handling `where` (a method or route name, for
    the log). A message may quote the caller's values: it is escaped and bounded, so that
    it stays one line and fits gRPC's trailer (16 KB)."""
    if (failure := request_failure(exc)) is not None:
        return failure
    if isinstance(exc, StoreUnavailable):
        metrics.STORE_ERRORS.inc()
        log.error("store unavailable in %s: %s", where, bounded_message(str(exc)))
        return Failure(Status.UNAVAILABLE, STORE_UNAVAILABLE_MESSAGE)
    log.error("internal error in %s", where, exc_info=exc)
    return Failure(Status.INTERNAL, "internal error")
