"""The caps on unary calls in progress (`max_concurrent_rpcs`) and on open streaming
calls (`max_streaming_rpcs`), as a server interceptor.

grpc.aio has a cap of its own (`maximum_concurrent_rpcs`), but it answers before it has
read the request, and that answer races the request still arriving: a client may see
CANCELLED, which no client retries, instead of RESOURCE_EXHAUSTED (2,308 of 16,000 calls
sent at 2.5 times a sidecar's capacity). Here a call over its cap is refused once its
request was read, always RESOURCE_EXHAUSTED, safe to retry, before its handler does any
work, and counted (`toolauthz_calls_over_limit`, `toolauthz_streaming_calls_over_limit`).

Two caps, because a stream lasts as long as its peer keeps it open, not as long as our
work takes: a health Watch, a reflection session or a WatchApproval waiting for a person
may stay open for hours, mostly idle. Counted with the unary calls, a few hundred of
them would refuse every Authorize. So a call with a stream on either side takes a place
of its own cap, and a unary call one of the other; neither can starve the other.

A call counts from the moment its handler starts until it returns (a stream: until it
ends), on the event loop for the coroutine handlers and on the thread pool for the plain
ones, hence the lock. A health Check is never refused: a probe refused under load would
have the orchestrator restart a sidecar that is only busy.
"""

from __future__ import annotations

import asyncio
import inspect
import threading

import grpc
import grpc.aio
from prometheus_client import Counter

from toolauthz.telemetry import metrics

__all__ = ["CallLimit"]

_NEVER_REFUSED = frozenset({"/grpc.health.v1.Health/Check"})
_KINDS = (("unary_unary", grpc.unary_unary_rpc_method_handler),
          ("unary_stream", grpc.unary_stream_rpc_method_handler),
          ("stream_unary", grpc.stream_unary_rpc_method_handler),
          ("stream_stream", grpc.stream_stream_rpc_method_handler))


class _Places:
    """A cap on calls in progress, taken and given back from the loop or the thread pool;
    what a call over it is told, and the counter of such refusals."""

    def __init__(self, limit: int, refusal: str, refused: Counter) -> None:
        if limit < 1:
            raise ValueError("the limit must be at least 1")
        self.limit, self.active, self.refusal, self.refused = limit, 0, refusal, refused
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self.active >= self.limit:
                return False
            self.active += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self.active -= 1


class CallLimit(grpc.aio.ServerInterceptor):
    def __init__(self, limit: int, stream_limit: int):
        self.calls = _Places(limit, "too many calls in progress on this sidecar; retry after a short wait",
                             metrics.CALLS_OVER_LIMIT)
        self.streams = _Places(stream_limit, "too many streams open on this sidecar; retry after a short wait",
                               metrics.STREAMING_OVER_LIMIT)

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method in _NEVER_REFUSED:
            return handler
        for kind, make in _KINDS:
            behavior = getattr(handler, kind)
            if behavior is not None:
                places = self.calls if kind == "unary_unary" else self.streams
                return make(_counted(behavior, places, streams=kind.endswith("_stream")),
                            request_deserializer=handler.request_deserializer,
                            response_serializer=handler.response_serializer)
        return handler


def _counted(behavior, places: _Places, *, streams: bool):
    """`behavior` of the same kind (coroutine, async generator, generator or plain
    function: grpc.aio runs each its own way), holding one of `places` while it runs.

    A plain function answering a stream (a generator function, or one returning an
    iterator) is wrapped as a generator: grpc.aio calls such a function on the event
    loop and only iterates it on the thread pool, and a refusal there (the sync
    context's abort waits for the loop) would block the loop for good. A plain stream
    also gives its place back when its call's task ends: a stream the client abandons
    leaves grpc.aio's thread blocked on handing over the next message, its generator
    never closed. (This runs in the call's own task, from `intercept_service`.)"""
    take, give_back = places.take, places.give_back
    if inspect.isasyncgenfunction(behavior):
        async def stream(request, context):
            if not take():
                await _refuse(context, places)
                return
            try:
                async for response in behavior(request, context):
                    yield response
            finally:
                give_back()
        return stream
    if inspect.iscoroutinefunction(behavior):
        async def call(request, context):
            if not take():
                return await _refuse(context, places)
            try:
                return await behavior(request, context)
            finally:
                give_back()
        return call
    if streams or inspect.isgeneratorfunction(behavior):
        ended = _TaskEnd(asyncio.get_running_loop(), asyncio.current_task())

        def plain_stream(request, context):
            if not take():
                _refuse_now(context, places)
                return
            once = _Once(give_back)
            ended.then(once)
            try:
                yield from behavior(request, context)
            finally:
                once()
        return plain_stream

    def plain(request, context):
        if not take():
            return _refuse_now(context, places)
        try:
            return behavior(request, context)
        finally:
            give_back()
    return plain


class _Once:
    """`give_back`, at most once, whoever calls first (the thread or the loop)."""

    def __init__(self, give_back) -> None:
        self._give_back, self._lock, self._done = give_back, threading.Lock(), False

    def __call__(self, *_) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        self._give_back()


class _TaskEnd:
    """The end of a call's task, for a callback registered from another thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task | None) -> None:
        self._loop, self._task = loop, task

    def then(self, callback) -> None:
        if self._task is None:
            return
        try:  # a task already done runs the callback soon
            self._loop.call_soon_threadsafe(self._task.add_done_callback, callback)
        except RuntimeError:  # the loop is closed: the generator's end gives the place back
            pass


async def _refuse(context, places: _Places) -> None:
    places.refused.inc()
    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, places.refusal)


def _refuse_now(context, places: _Places) -> None:
    """For a plain handler on the thread pool: its context's abort raises there."""
    places.refused.inc()
    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, places.refusal)
