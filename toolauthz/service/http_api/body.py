"""Reading a request's body: after its caller was admitted, within its route's cap, and
parsed off the event loop when it is large.

The listener's event loop is shared by every transport (gRPC, HTTP, the console), so it
never parses a large body itself: a body over OFF_LOOP_BYTES is parsed on a worker
thread, and the loop keeps answering other requests meanwhile. The bytes are counted as
they arrive, and the reading stops at the route's cap (a declared `Content-Length` over
it is refused before any byte is read).
"""

from __future__ import annotations

import asyncio

from starlette.requests import ClientDisconnect, Request

from toolauthz.digest import MAX_DEPTH
from toolauthz.service.failures import Failure, Status
from toolauthz.service.http_api.answers import UNSUPPORTED_MEDIA_TYPE, HttpRefusal
from toolauthz.service.http_api.json_body import BodyShape, parse_body

__all__ = ["OFF_LOOP_BYTES", "declares_body", "parse_json", "read_body"]

# A body larger than this is parsed on a worker thread: a thread hop (tens of
# microseconds) is nothing beside the parse of anything this large.
OFF_LOOP_BYTES = 16 * 1024
# The body wraps `input` in two objects; a deeper input still reaches the authorizer,
# which refuses it past MAX_DEPTH with the DENY gRPC gives. Beyond this: not parsed.
BODY_MAX_DEPTH = 2 * MAX_DEPTH


def declares_body(request: Request) -> bool:
    """Whether the request's head announces a body (which an answer that does not read it
    leaves unread: the connection must then close)."""
    length = request.headers.get("content-length", "")
    return "transfer-encoding" in request.headers or (length not in ("", "0"))


def _too_large(max_bytes: int) -> HttpRefusal:
    return HttpRefusal(413, Failure(Status.RESOURCE_EXHAUSTED, f"the request body is larger than {max_bytes} bytes"))


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The body's bytes, at most `max_bytes` of them (0: the route takes no body).
    Raises HttpRefusal: 415 for a media type other than JSON, 413 past the cap."""
    if max_bytes == 0:
        if declares_body(request):
            raise _too_large(0)
        return b""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    body = await _read_within(request, max_bytes)
    if media_type != "application/json":
        # Refused once read (within the cap, from an admitted caller): a connection closed
        # on an unread body resets, and the client may lose this answer with it.
        raise HttpRefusal(415, Failure(Status.INVALID_ARGUMENT, "the request body must be `application/json`"),
                          UNSUPPORTED_MEDIA_TYPE, body_read=True)
    return body


async def _read_within(request: Request, max_bytes: int) -> bytes:
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise _too_large(max_bytes)
            chunks.append(chunk)
    except ClientDisconnect:  # gone before its request was whole: nothing to decide, no one to answer
        raise HttpRefusal(400, Failure(Status.INVALID_ARGUMENT, "the client disconnected")) from None
    return b"".join(chunks)


async def parse_json(body: bytes, shape: BodyShape) -> dict[str, object]:
    """The body parsed to `shape` (json_body.py); raises RequestError."""
    if len(body) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(parse_body, body, shape, max_depth=BODY_MAX_DEPTH)
    return parse_body(body, shape, max_depth=BODY_MAX_DEPTH)
