"""`max_streams_per_connection`: gRPC's transport holds a client connection to that many
open calls, before the interpreter sees any more (docs/performance.md, "Overload")."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from toolauthz.server.build import build_sidecar, create_server
from toolauthz.server.config import Settings

WAIT = 10.0
HELD = 0.5  # how long a call that must not be answered is given before it is judged held


@pytest.fixture
def serve(settings, clock):
    made = []

    def start(streams: int) -> str:
        car = build_sidecar(settings.model_copy(update={"max_streams_per_connection": streams}), clock=clock)
        server, port = create_server(car, "127.0.0.1:0")
        made.append((car, server))
        return f"127.0.0.1:{port}"

    yield start
    for car, server in made:
        server.stop(None).wait()
        car.close()


def _connection(address: str) -> grpc.Channel:
    # A channel of its own connection: channels to one address otherwise share one.
    return grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


def _check(channel: grpc.Channel, timeout: float) -> int:
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout).status


def _open_watch(channel: grpc.Channel):
    watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING  # the stream is open
    return watch


def test_a_connection_holds_at_most_its_streams_and_another_connection_is_served(serve):
    address = serve(1)
    with _connection(address) as held, _connection(address) as other:
        watch = _open_watch(held)
        with pytest.raises(grpc.RpcError) as waited:
            _check(held, HELD)  # the connection's one stream is the watch's
        assert waited.value.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
        assert _check(other, WAIT) == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
        assert _check(held, WAIT) == health_pb2.HealthCheckResponse.SERVING  # the stream is free again


def test_without_the_limit_a_connection_opens_calls_beside_an_open_one(serve):
    address = serve(0)
    with _connection(address) as channel:
        watch = _open_watch(channel)
        assert _check(channel, WAIT) == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()


def test_a_negative_limit_is_refused_when_the_settings_are_read(settings):
    with pytest.raises(ValueError, match="max_streams_per_connection"):
        Settings.model_validate({**settings.model_dump(), "max_streams_per_connection": -1})
