"""The cap on calls in progress (`max_concurrent_rpcs`), as a server interceptor.

grpc.aio has a cap of its own (`maximum_concurrent_rpcs`), but it answers before it has
read the request, and that answer races the request still arriving: a client may see
CANCELLED, which no client retries, instead of RESOURCE_EXHAUSTED (2,308 of 16,000 calls
sent at 2.5 times a sidecar's capacity). Here a call over the cap is refused once its
request was read, always RESOURCE_EXHAUSTED, safe to retry, before its handler does any
work, and counted (`toolauthz_calls_over_limit`).

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

from toolauthz.telemetry import metrics

__all__ = ["CallLimit"]

_NEVER_REFUSED = frozenset({"/grpc.health.v1.Health/Check"})
_REFUSAL = "too many calls in progress on this sidecar; retry after a short wait"
_KINDS = (("unary_unary", grpc.unary_unary_rpc_method_handler),
          ("unary_stream", grpc.unary_stream_rpc_method_handler),
          ("stream_unary", grpc.stream_unary_rpc_method_handler),
          ("stream_stream", grpc.stream_stream_rpc_method_handler))


class CallLimit(grpc.aio.ServerInterceptor):
    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError("the limit must be at least 1")
        self.limit = limit
        self.active = 0
        self._lock = threading.Lock()

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method in _NEVER_REFUSED:
            return handler
        for kind, make in _KINDS:
            behavior = getattr(handler, kind)
            if behavior is not None:
                return make(self._counted(behavior, streams=kind.endswith("_stream")),
                            request_deserializer=handler.request_deserializer,
                            response_serializer=handler.response_serializer)
        return handler

    def _enter(self) -> bool:
        with self._lock:
            if self.active >= self.limit:
                return False
            self.active += 1
            return True

    def _leave(self) -> None:
        with self._lock:
            self.active -= 1

    def _counted(self, behavior, *, streams: bool):
        """`behavior` of the same kind (coroutine, async generator, generator or plain
        function: grpc.aio runs each its own way), counted while it runs.

        A plain function answering a stream (a generator function, or one returning an
        iterator) is wrapped as a generator: grpc.aio calls such a function on the event
        loop and only iterates it on the thread pool, and a refusal there (the sync
        context's abort waits for the loop) would block the loop for good. A plain stream
        also gives its place back when its call's task ends: a stream the client abandons
        leaves grpc.aio's thread blocked on handing over the next message, its generator
        never closed. (This runs in the call's own task, from `intercept_service`.)"""
        enter, leave = self._enter, self._leave
        if inspect.isasyncgenfunction(behavior):
            async def stream(request, context):
                if not enter():
                    await _refuse(context)
                    return
                try:
                    async for response in behavior(request, context):
                        yield response
                finally:
                    leave()
            return stream
        if inspect.iscoroutinefunction(behavior):
            async def call(request, context):
                if not enter():
                    return await _refuse(context)
                try:
                    return await behavior(request, context)
                finally:
                    leave()
            return call
        if streams or inspect.isgeneratorfunction(behavior):
            ended = _TaskEnd(asyncio.get_running_loop(), asyncio.current_task())

            def plain_stream(request, context):
                if not enter():
                    _refuse_now(context)
                    return
                once = _Once(leave)
                ended.then(once)
                try:
                    yield from behavior(request, context)
                finally:
                    once()
            return plain_stream

        def plain(request, context):
            if not enter():
                return _refuse_now(context)
            try:
                return behavior(request, context)
            finally:
                leave()
        return plain


class _Once:
    """`leave`, at most once, whoever calls first (the thread or the loop)."""

    def __init__(self, leave) -> None:
        self._leave, self._lock, self._done = leave, threading.Lock(), False

    def __call__(self, *_) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        self._leave()


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


async def _refuse(context) -> None:
    metrics.CALLS_OVER_LIMIT.inc()
    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, _REFUSAL)


def _refuse_now(context) -> None:
    """For a plain handler on the thread pool: its context's abort raises there."""
    metrics.CALLS_OVER_LIMIT.inc()
    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, _REFUSAL)
