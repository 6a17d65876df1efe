"""What the HTTP API answers: the JSON of a decision, and of a failure.

A failure's status comes from the one table of service/failures.py; here it becomes
`{"error": {"code": <gRPC status name>, "message"}}` with the table's HTTP status. An
answer given before the request's body was read closes the connection: the body is not
drained, so an unread 4 MB costs the listener nothing more.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from toolauthz.authorizer import AuthorizeResult
from toolauthz.service.failures import Failure, Status

__all__ = ["HttpRefusal", "authorize_json", "error_response", "http_exception", "rfc3339"]


class HttpRefusal(Exception):
    """An HTTP-only refusal before any work (wrong media type, body too large)."""

    def __init__(self, http_status: int, failure: Failure):
        super().__init__(failure.message)
        self.http_status = http_status
        self.failure = failure


def error_response(http_status: int, failure: Failure, *, close: bool = False) -> JSONResponse:
    """The error body; `close`: the body was left unread, so the connection ends here."""
    return JSONResponse({"error": {"code": failure.status.name, "message": failure.message}},
                        status_code=http_status, headers={"Connection": "close"} if close else None)


async def http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own answers (no such route, wrong method) in the API's error shape."""
    http_status = exc.status_code if isinstance(exc, HTTPException) else 500
    status = Status.NOT_FOUND if http_status == 404 else Status.INVALID_ARGUMENT
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    return error_response(http_status, Failure(status, str(detail)))


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
