"""What the HTTP API answers: the JSON of a decision, and of a failure.

A failure's status comes from the one table of service/failures.py; here it becomes
`{"error": {"code": <gRPC status name>, "message"}}` with the table's HTTP status. Two
refusals have no gRPC twin, as HTTP alone has methods and media types, and say so in
their own codes: 405 `METHOD_NOT_ALLOWED` (with the `Allow` header) and 415
`UNSUPPORTED_MEDIA_TYPE`. An
answer given before the request's body was read closes the connection: the body is not
drained, so an unread 4 MB costs the listener nothing more.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from toolauthz.authorizer import AuthorizeResult
from toolauthz.display.escape import shown
from toolauthz.service.failures import Failure, Status

__all__ = ["METHOD_NOT_ALLOWED", "UNSUPPORTED_MEDIA_TYPE", "HttpRefusal", "authorize_json", "error_response",
           "http_exception", "rfc3339"]

METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"


class HttpRefusal(Exception):
    """An HTTP-only refusal before any work (wrong media type, body too large); `code`:
    the error code when it is not the failure's gRPC status name; `body_read`: the body
    was read whole, so the connection may stay open."""

    def __init__(self, http_status: int, failure: Failure, code: str = "", *, body_read: bool = False):
        super().__init__(failure.message)
        self.http_status = http_status
        self.failure = failure
        self.code = code
        self.body_read = body_read


def error_response(http_status: int, failure: Failure, *, code: str = "", close: bool = False,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The error body; `code`: an HTTP-only code in place of the status name; `close`:
    the body was left unread, so the connection ends here."""
    sent = {**(headers or {}), **({"Connection": "close"} if close else {})}
    return JSONResponse({"error": {"code": code or failure.status.name, "message": failure.message}},
                        status_code=http_status, headers=sent or None)


async def http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own answers (no such route, wrong method) in the API's error shape;
    a 405 keeps the `Allow` header Starlette gives it."""
    if isinstance(exc, HTTPException) and exc.status_code == 405:
        allow = (exc.headers or {}).get("Allow", "")
        refused = Failure(Status.INVALID_ARGUMENT, f"this route does not answer `{shown(request.method[:32])}`")
        return error_response(405, refused, code=METHOD_NOT_ALLOWED, headers={"Allow": allow})
    if isinstance(exc, HTTPException) and exc.status_code == 404:
        return error_response(404, Failure(Status.NOT_FOUND, "no such route"))
    return error_response(500, Failure(Status.INTERNAL, "internal error"))


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
