"""`max_concurrent_rpcs` (toolauthz/service/call_limit.py): a call over the cap is refused
RESOURCE_EXHAUSTED after its request was read, for every kind of handler; the count
follows each call to its end, errors included; a health Check is never refused."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from toolauthz.service.running import AioServer
from toolauthz.telemetry import metrics

LIMIT = 2


class Held:
    """Handlers of each kind that wait until released; `entered` counts those that ran."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = 0

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
        }),))
        from grpc_health.v1.health import aio as aio_health
        health = aio_health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, srv)

    srv = AioServer(build, options=[], max_concurrent_rpcs=LIMIT, thread_pool_size=4)
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


def test_a_stream_holds_its_place_until_it_ends(server):
    held, channel = server
    streams = [channel.unary_stream("/t.S/Stream")(b"x", timeout=10) for _ in range(LIMIT)]
    assert [next(s) for s in streams] == [b"first"] * LIMIT
    assert _over(channel, "Co").code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _over(channel, "Stream", stream=True).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    held.release.set()
    assert [list(s) for s in streams] == [[b"last"]] * LIMIT
    assert list(channel.unary_stream("/t.S/Stream")(b"x", timeout=5)) == [b"first", b"last"]


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
