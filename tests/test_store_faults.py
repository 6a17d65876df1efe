"""PostgreSQL going away: no answer without its committed record, NOT_SERVING while it
is gone, serving again once it is back (no restart), and a backend terminated in the
middle of a transaction loses nothing and duplicates nothing."""

from __future__ import annotations

import socket
import threading
import time

import grpc
import psycopg
import pytest
from conftest import make_request
from grpc_health.v1 import health_pb2, health_pb2_grpc

from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.server.build import build_sidecar, create_server
from toolauthz.store.postgres import migrate

WAIT = 30.0


class Proxy:
    """A TCP forwarder to PostgreSQL that the test cuts (every connection closed, new
    ones closed on arrival) and restores, or hangs (connections kept open, bytes taken
    in and acknowledged by the kernel, nothing forwarded) and resumes."""

    def __init__(self, target: tuple[str, int]):
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open = threading.Event()
        self._open.set()
        self._flowing = threading.Event()
        self._flowing.set()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._open.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self._target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                self._flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        self._open.clear()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def restore(self) -> None:
        self._open.set()

    def hang(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self._flowing.set()
        self.cut()
        self._listener.close()


@pytest.fixture
def proxied(postgres_url):
    migrate(postgres_url)
    proxy = Proxy(("127.0.0.1", 5432))
    yield postgres_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}", 1), proxy
    proxy.close()


def health_of(channel) -> int:
    try:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
    except grpc.RpcError:
        return -1


def until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"not {what} within {WAIT}s"
        time.sleep(0.05)


def rows_of(url: str, call_id: str) -> tuple[int, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        calls = conn.execute("SELECT count(*) FROM calls WHERE call_id = %s", (call_id,)).fetchone()
        records = conn.execute("SELECT count(*) FROM audit_record WHERE call_id = %s", (call_id,)).fetchone()
    assert calls is not None and records is not None
    return calls[0], records[0]


def test_unreachable_database_means_unavailable_not_serving_then_recovery(settings, clock, postgres_url, proxied):
    url, proxy = proxied
    car = build_sidecar(settings.model_copy(update={"store": url}), clock=clock)
    server, port = create_server(car, "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ToolAuthorizerStub(channel)
            assert stub.Authorize(make_request(call_id="before")).token
            proxy.cut()
            with pytest.raises(grpc.RpcError) as info:
                stub.Authorize(make_request(call_id="during"), timeout=WAIT)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            until(lambda: health_of(channel) == health_pb2.HealthCheckResponse.NOT_SERVING, "NOT_SERVING")
            assert rows_of(postgres_url, "during") == (0, 0)  # nothing answered, nothing half-written
            proxy.restore()
            until(lambda: health_of(channel) == health_pb2.HealthCheckResponse.SERVING, "SERVING again")
            after = stub.Authorize(make_request(call_id="during"))
            assert after.decision == pb.ALLOW and after.token and not after.replayed
            assert rows_of(postgres_url, "during") == (1, 1)
    finally:
        server.stop(None)
        car.close()


def test_a_backend_terminated_mid_transaction_loses_and_duplicates_nothing(settings, clock, postgres_url,
                                                                          monkeypatch):
    from toolauthz.store.postgres.transaction import PgTransaction

    migrate(postgres_url)
    car = build_sidecar(settings.model_copy(update={"store": postgres_url}), clock=clock)
    real_append = PgTransaction.append_audit

    def terminated(self, events):  # the ledger row is written; the record is next
        with psycopg.connect(postgres_url, autocommit=True) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", (self._conn.info.backend_pid,))
        return real_append(self, events)

    server, port = create_server(car, "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ToolAuthorizerStub(channel)
            monkeypatch.setattr(PgTransaction, "append_audit", terminated)
            with pytest.raises(grpc.RpcError) as info:
                stub.Authorize(make_request(call_id="c1"))
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert rows_of(postgres_url, "c1") == (0, 0)
            monkeypatch.undo()
            retried = stub.Authorize(make_request(call_id="c1"))
            assert retried.decision == pb.ALLOW and retried.token and not retried.replayed
            assert rows_of(postgres_url, "c1") == (1, 1)
    finally:
        server.stop(None)
        car.close()


def test_a_hung_database_is_noticed_within_its_bound_then_serving_resumes(settings, clock, postgres_url, proxied):
    """The link to PostgreSQL stops forwarding without closing (a TCP peer that still
    acknowledges): on a fleet of two, calls are answered UNAVAILABLE at `store_hang_seconds`,
    not at their own 30 s deadline, and health turns NOT_SERVING; once the link forwards
    again both serve, and no call is left half-written."""
    url, proxy = proxied
    shared = settings.model_copy(update={"store": url, "store_hang_seconds": 1.0})
    cars = [build_sidecar(shared, clock=clock) for _ in range(2)]
    servers = [create_server(car, "127.0.0.1:0") for car in cars]
    channels = [grpc.insecure_channel(f"127.0.0.1:{port}") for _server, port in servers]
    try:
        stubs = [pb_grpc.ToolAuthorizerStub(channel) for channel in channels]
        for n, stub in enumerate(stubs):
            assert stub.Authorize(make_request(call_id=f"before_{n}")).token
        proxy.hang()
        for n, stub in enumerate(stubs):
            with pytest.raises(grpc.RpcError) as info:
                stub.Authorize(make_request(call_id=f"during_{n}"), timeout=WAIT)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
        for channel in channels:
            until(lambda channel=channel: health_of(channel) == health_pb2.HealthCheckResponse.NOT_SERVING,
                  "NOT_SERVING while the database hangs")
        proxy.resume()
        for channel in channels:
            until(lambda channel=channel: health_of(channel) == health_pb2.HealthCheckResponse.SERVING,
                  "SERVING once the database answers")
        for n, stub in enumerate(stubs):
            # Cut after its COMMIT was sent, the hung transaction may have committed once
            # the link forwarded its bytes: whole or not at all, never half.
            # (A transaction is one round trip: its COMMIT was sent with its first bytes.)
            # The retry then replays it: a response of its own, with a record of its own.
            hung = rows_of(postgres_url, f"during_{n}")
            assert hung in ((0, 0), (1, 1))
            again = stub.Authorize(make_request(call_id=f"during_{n}"))
            assert again.decision == pb.ALLOW and again.token
            assert again.replayed == (hung == (1, 1))
            assert rows_of(postgres_url, f"during_{n}") == (1, 1 + hung[1])
        assert all(car.store.unit._watchdog.cuts >= 1 for car in cars)
    finally:
        for channel in channels:
            channel.close()
        for server, _port in servers:
            server.stop(None)
        for car in cars:
            car.close()


def test_a_decision_past_its_callers_deadline_is_given_up_by_the_database(settings, clock, postgres_url):
    """The statement timeout of a decision's transaction is its caller's deadline, not
    only `store_hang_seconds`: a call stuck behind a lock its client stopped waiting for
    is cancelled on the server then, and leaves nothing behind."""
    from toolauthz.store.postgres.transaction import lock_id

    migrate(postgres_url)
    car = build_sidecar(settings.model_copy(update={"store": postgres_url, "store_hang_seconds": 120.0}),
                        clock=clock)
    server, port = create_server(car, "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel, \
                psycopg.connect(postgres_url, autocommit=True) as holder:
            stub = pb_grpc.ToolAuthorizerStub(channel)
            assert stub.Authorize(make_request(call_id="warm", request_id="other")).token
            holder.execute("SELECT pg_advisory_lock(%s)", (lock_id("run\x00acme\x00run-1"),))
            with pytest.raises(grpc.RpcError) as info:
                stub.Authorize(make_request(call_id="late"), timeout=1.0)
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            until(lambda: _waiting_on_locks(holder) == 0, "the late call's statement given up")
            holder.execute("SELECT pg_advisory_unlock_all()")
        assert rows_of(postgres_url, "late") == (0, 0)
    finally:
        server.stop(None)
        car.close()


def _waiting_on_locks(conn) -> int:
    row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock' AND pid != pg_backend_pid()").fetchone()
    return int(row[0])
