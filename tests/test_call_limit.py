"""`max_concurrent_rpcs` and `max_streaming_rpcs` (toolauthz/service/call_limit.py): a
call over its cap is refused RESOURCE_EXHAUSTED after its request was read, for every kind
of handler; the count follows each call to its end, errors and cancellations included; a
health Check is never refused; open streams (health watches included) and unary calls
count apart, so neither can starve the other."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as aio_health

from toolauthz.service.running import AioServer
from toolauthz.telemetry import metrics

LIMIT = 2
STREAMS = 3  # more than LIMIT: a stream counted with the unary calls would be refused early


class Health(aio_health.HealthServicer):
    """The real health service; `ended` is released as each Watch ends. The call limit
    gives the place back in the same step of the loop, before any later call is read."""

    def __init__(self) -> None:
        super().__init__()
        self.ended = threading.Semaphore(0)

    async def Watch(self, request, context):
        try:
            await super().Watch(request, context)
        finally:
            self.ended.release()


class Held:
    """Handlers of each kind that wait until released; `entered` counts those that ran."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = 0
        self.health = Health()

    async def coroutine(self, request, context):
        self.entered += 1
        while not self.release.is_set():
            await asyncio.sleep(0.005)
        return b"done"

    def plain(self, request, context):
        self.entered += 1
        self.release.wait(10)
        return b"done"

    async def stream(self, request, context):
        self.entered += 1
        yield b"first"
        while not self.release.is_set():
            await asyncio.sleep(0.005)
        yield b"last"

    async def quick(self, request, context):
        return b"quick"

    async def upload(self, requests, context):  # a client stream: open as long as its client sends
        return b"".join([r async for r in requests])

    async def failing(self, request, context):
        raise RuntimeError("boom")


@pytest.fixture
def server():
    held = Held()

    def build(srv) -> None:
        srv.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.S", {
            "Co": grpc.unary_unary_rpc_method_handler(held.coroutine),
            "Plain": grpc.unary_unary_rpc_method_handler(held.plain),
            "Stream": grpc.unary_stream_rpc_method_handler(held.stream),
            "Fail": grpc.unary_unary_rpc_method_handler(held.failing),
            "Quick": grpc.unary_unary_rpc_method_handler(held.quick),
            "Upload": grpc.stream_unary_rpc_method_handler(held.upload),
        }),))
        health_pb2_grpc.add_HealthServicer_to_server(held.health, srv)

    srv = AioServer(build, options=[], max_concurrent_rpcs=LIMIT, max_streaming_rpcs=STREAMS,
                    thread_pool_size=4)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield held, channel
    held.release.set()
    channel.close()
    srv.stop(None).wait(10)


def _until(predicate, what: str) -> None:
    done = threading.Event()
    for _ in range(2000):
        if predicate():
            return
        done.wait(0.005)
    raise AssertionError(f"never: {what}")


def _hold_every_place(held: Held, channel, method: str = "Co") -> list:
    """LIMIT held calls, running once this returns."""
    running = [channel.unary_unary(f"/t.S/{method}").future(b"x", timeout=10) for _ in range(LIMIT)]
    _until(lambda: held.entered == LIMIT, "every held call started")
    return running


def _over(channel, method: str, stream: bool = False) -> grpc.RpcError:
    call = (channel.unary_stream if stream else channel.unary_unary)(f"/t.S/{method}")
    with pytest.raises(grpc.RpcError) as refused:
        result = call(b"x", timeout=5)
        if stream:
            list(result)
    return refused.value


@pytest.mark.parametrize("method", ["Co", "Plain"])
def test_a_call_over_the_cap_is_refused_resource_exhausted_then_admitted_again(server, method):
    held, channel = server
    before = metrics.CALLS_OVER_LIMIT._value.get()
    running = _hold_every_place(held, channel, method)
    refusals = [_over(channel, method) for _ in range(20)]
    assert {(r.code(), r.details()) for r in refusals} == {
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "too many calls in progress on this sidecar; retry after a short wait")}
    assert held.entered == LIMIT  # the refused calls' handlers never ran
    assert metrics.CALLS_OVER_LIMIT._value.get() - before == 20
    held.release.set()
    assert [f.result() for f in running] == [b"done"] * LIMIT
    assert channel.unary_unary(f"/t.S/{method}")(b"x", timeout=5) == b"done"  # the places were given back


def _watch(channel):
    """An open health Watch, once it has answered its first status."""
    health: Any = health_pb2_grpc.HealthStub(channel)
    watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=10)
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    return watch


def _fill_the_stream_places(channel) -> list:
    """STREAMS open streams: health watches, and one of our own."""
    ours = channel.unary_stream("/t.S/Stream")(b"x", timeout=10)
    assert next(ours) == b"first"
    return [ours, *(_watch(channel) for _ in range(STREAMS - 1))]


def _refused_stream(channel) -> grpc.RpcError:
    health: Any = health_pb2_grpc.HealthStub(channel)
    with pytest.raises(grpc.RpcError) as refused:
        next(health.Watch(health_pb2.HealthCheckRequest(), timeout=5))
    return refused.value


def test_open_streams_never_refuse_a_unary_call_and_over_their_own_cap_are_refused(server):
    held, channel = server
    before = metrics.STREAMING_OVER_LIMIT._value.get(), metrics.CALLS_OVER_LIMIT._value.get()
    streams = _fill_the_stream_places(channel)
    assert len(streams) > LIMIT
    assert [channel.unary_unary("/t.S/Quick")(b"x", timeout=5) for _ in range(2 * LIMIT)] == [b"quick"] * 2 * LIMIT
    refused = [_refused_stream(channel), _over(channel, "Stream", stream=True)]
    with pytest.raises(grpc.RpcError) as upload:  # a client stream is a stream too
        channel.stream_unary("/t.S/Upload")(iter([b"a", b"b"]), timeout=5)
    refused.append(upload.value)
    assert {(r.code(), r.details()) for r in refused} == {
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "too many streams open on this sidecar; retry after a short wait")}
    assert metrics.STREAMING_OVER_LIMIT._value.get() - before[0] == 3
    assert metrics.CALLS_OVER_LIMIT._value.get() == before[1]
    held.release.set()
    assert list(streams[0]) == [b"last"]
    for watch in streams[1:]:
        watch.cancel()


def test_unary_calls_at_their_cap_never_refuse_a_stream(server):
    held, channel = server
    running = _hold_every_place(held, channel)
    assert _over(channel, "Quick").code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    watch = _watch(channel)
    assert channel.stream_unary("/t.S/Upload")(iter([b"a", b"b"]), timeout=5) == b"ab"
    held.release.set()
    assert [f.result() for f in running] == [b"done"] * LIMIT
    watch.cancel()


def test_a_stream_gives_its_place_back_when_it_ends_or_its_client_cancels(server):
    held, channel = server
    streams = _fill_the_stream_places(channel)
    assert _refused_stream(channel).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    held.release.set()  # our stream ends: its place comes back
    assert list(streams[0]) == [b"last"]
    assert list(channel.unary_stream("/t.S/Stream")(b"x", timeout=5)) == [b"first", b"last"]
    for watch in streams[1:]:  # the clients cancel their watches: their places come back
        watch.cancel()
        assert held.health.ended.acquire(timeout=5)
    again = [_watch(channel) for _ in range(STREAMS)]
    assert _refused_stream(channel).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    for watch in again:
        watch.cancel()


def test_a_failing_handler_gives_its_place_back(server):
    held, channel = server
    for _ in range(3 * LIMIT):
        with pytest.raises(grpc.RpcError) as failed:
            channel.unary_unary("/t.S/Fail")(b"x", timeout=5)
        assert failed.value.code() == grpc.StatusCode.UNKNOWN
    # all LIMIT places are free again: as many held calls start, one more is refused
    running = _hold_every_place(held, channel)
    assert _over(channel, "Co").code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    held.release.set()
    assert all(f.result() == b"done" for f in running)


def test_a_health_check_is_never_refused(server):
    held, channel = server
    running = _hold_every_place(held, channel)
    check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert check.status == health_pb2.HealthCheckResponse.SERVING
    assert _over(channel, "Co").code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    held.release.set()
    assert all(f.result() == b"done" for f in running)


def test_a_burst_over_the_cap_is_answered_resource_exhausted_never_cancelled(server):
    held, channel = server
    running = _hold_every_place(held, channel)
    burst = [channel.unary_unary("/t.S/Co").future(b"x" * 1000, timeout=10) for _ in range(300)]
    codes = {f.exception().code() for f in burst}
    assert codes == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    held.release.set()
    assert all(f.result() == b"done" for f in running)
