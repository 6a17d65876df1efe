"""Review of `CallLimit` (toolauthz/service/call_limit.py): the plain stream handlers.

grpc.aio calls a plain (thread-pool) stream handler on the event loop and only iterates
what it returned on the thread pool. A refusal made in that call (the sync context's
abort waits for the loop) blocked the loop for good; and a plain generator stream the
client abandoned kept its place, grpc.aio's thread staying blocked on handing over the
next message."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from toolauthz.service.running import AioServer


class Handlers:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()

    async def hold_stream(self, request, context):
        self.started.set()
        while not self.release.is_set():
            await asyncio.sleep(0.005)
        yield b"done"

    def iterator(self, request, context):  # a plain function returning an iterator, not a generator
        return iter([b"a", b"b"])

    def stream_iterator(self, requests, context):
        return iter(list(requests))

    def generator(self, request, context):
        yield b"first"
        self.release.wait(10)  # then ends without a second message: grpc.aio's thread can finish


@pytest.fixture
def server():
    h = Handlers()

    def build(srv) -> None:
        srv.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.S", {
            "HoldStream": grpc.unary_stream_rpc_method_handler(h.hold_stream),
            "Iterator": grpc.unary_stream_rpc_method_handler(h.iterator),
            "StreamIterator": grpc.stream_stream_rpc_method_handler(h.stream_iterator),
            "Generator": grpc.unary_stream_rpc_method_handler(h.generator),
        }),))
        from grpc_health.v1.health import aio as aio_health
        health_pb2_grpc.add_HealthServicer_to_server(aio_health.HealthServicer(), srv)
        reflection.enable_server_reflection(["t.S", reflection.SERVICE_NAME], srv)

    srv = AioServer(build, options=[], max_concurrent_rpcs=1, max_streaming_rpcs=1, thread_pool_size=4)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield h, channel
    h.release.set()
    channel.close()
    srv.stop(None).wait(10)


def test_plain_functions_returning_an_iterator_still_stream(server):
    h, channel = server
    assert list(channel.unary_stream("/t.S/Iterator")(b"x", timeout=5)) == [b"a", b"b"]
    assert list(channel.stream_stream("/t.S/StreamIterator")(iter([b"1", b"2"]), timeout=5)) == [b"1", b"2"]


@pytest.mark.parametrize("stream_request", [False, True])
def test_refusing_a_plain_stream_function_leaves_the_loop_running(server, stream_request):
    h, channel = server
    held = channel.unary_stream("/t.S/HoldStream")(b"x", timeout=10)  # the one stream place
    assert h.started.wait(5)
    with pytest.raises(grpc.RpcError) as refused:
        if stream_request:
            list(channel.stream_stream("/t.S/StreamIterator")(iter([b"1"]), timeout=3))
        else:
            list(channel.unary_stream("/t.S/Iterator")(b"x", timeout=3))
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # the loop still answers (a blocked loop would not even answer a health Check)
    health: Any = health_pb2_grpc.HealthStub(channel)
    check = health.Check(health_pb2.HealthCheckRequest(), timeout=3)
    assert check.status == health_pb2.HealthCheckResponse.SERVING
    h.release.set()
    assert list(held) == [b"done"]


def test_an_abandoned_plain_generator_stream_gives_its_place_back(server):
    h, channel = server
    stream = channel.unary_stream("/t.S/Generator")(b"x", timeout=10)
    assert next(stream) == b"first"
    stream.cancel()
    codes = []
    for _ in range(100):  # its place comes back when its call ends, not when the generator does
        try:
            assert list(channel.unary_stream("/t.S/Iterator")(b"x", timeout=3)) == [b"a", b"b"]
            break
        except grpc.RpcError as exc:
            codes.append(exc.code())
            threading.Event().wait(0.02)
    else:
        raise AssertionError(f"the place never came back: {set(codes)}")
    assert not h.release.is_set()


def test_reflection_and_health_watch_pass_through(server):
    h, channel = server
    stub: Any = reflection_pb2_grpc.ServerReflectionStub(channel)
    answers = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
    names = {s.name for answer in answers for s in answer.list_services_response.service}
    assert "t.S" in names
    health: Any = health_pb2_grpc.HealthStub(channel)
    watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=5)
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    watch.cancel()
