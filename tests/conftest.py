"""Shared fixtures: the example bundle, throw-away bundles, and a sidecar on port 0."""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import shutil
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import grpc
import pyseto
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from toolauthz.clock import FrozenClock
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.server.config import Settings

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE_BUNDLE = ROOT / "policies"


@pytest.fixture
def bundle_dir(tmp_path) -> pathlib.Path:
    """A private copy of the example bundle that a test may edit."""
    target = tmp_path / "bundle"
    shutil.copytree(EXAMPLE_BUNDLE, target)
    return target


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(1_800_000_000.0)


def pytest_addoption(parser):
    parser.addoption("--console-screenshots", action="store_true",
                     help="tests/test_console_browser.py also writes docs/console/*.png")


def pytest_configure(config):
    config.addinivalue_line("markers", "both_stores: run the test against a sidecar on SQLite and one on "
                                       "PostgreSQL (the `backend` fixture)")


def pytest_generate_tests(metafunc):
    if metafunc.definition.get_closest_marker("both_stores"):
        metafunc.parametrize("backend", ["sqlite", "postgresql"])


@pytest.fixture
def backend() -> str:
    """The store of the `sidecar` fixture: SQLite, unless the test is marked both_stores."""
    return "sqlite"


@pytest.fixture
def settings(request, tmp_path, bundle_dir, backend) -> Settings:
    store = ""
    if backend == "postgresql":
        from toolauthz.store.postgres import migrate

        store = request.getfixturevalue("postgres_url")
        migrate(store)
    # No polling watcher: tests reload explicitly, so a background reload never races them.
    # No time bound on the decision queue: on a loaded machine it would shed calls at
    # random (tests/test_pump_overload.py tests the bound on an injected clock).
    return Settings(bundle=bundle_dir, data_dir=tmp_path / "data", listen="127.0.0.1:0",
                    audit={"checkpoint_interval_seconds": 3600}, reload_poll_seconds=0, store=store,
                    max_queue_seconds=0)


# The PostgreSQL server the tests use (CI starts one): each test session creates a
# database of its own there and drops it at the end.
POSTGRES_ADMIN_URL = os.environ.get("TOOLAUTHZ_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    """The URL of a fresh database for this test session. PostgreSQL must be reachable:
    a session without it fails with the reason, it never skips."""
    import psycopg

    name = f"toolauthz_test_{secrets.token_hex(6)}"
    try:
        admin = psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        pytest.fail(f"PostgreSQL is unreachable at {POSTGRES_ADMIN_URL} ({str(exc).strip()}): the storage tests "
                    "run against it; start it, or set TOOLAUTHZ_TEST_POSTGRES to a server's URL", pytrace=False)
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _with_database(POSTGRES_ADMIN_URL, name)
    finally:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture
def postgres_url(postgres_database) -> str:
    """A database URL whose tables live in a schema of this test's own (empty)."""
    import psycopg

    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return f"{postgres_database}?options=-csearch_path%3D{schema}"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    """The URL of a fresh, empty store of each backend, its schema made."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    from toolauthz.store.postgres import migrate

    url = request.getfixturevalue("postgres_url")
    migrate(url)
    return url


@pytest.fixture
def store(store_url):
    """A fresh, empty store of each backend."""
    from toolauthz.store.open import open_store

    opened = open_store(store_url)
    yield opened
    opened.close()


@pytest.fixture
def sidecar(settings, clock):
    from toolauthz.server.build import build_sidecar

    car = build_sidecar(settings, clock=clock)
    yield car
    car.close()


def replicas_of(settings, clock, postgres_url: str, count: int):
    """`count` sidecars in this process on one migrated PostgreSQL database (a fleet),
    closed when the generator ends: a fixture's body."""
    from toolauthz.server.build import build_sidecar
    from toolauthz.store.postgres import migrate

    migrate(postgres_url)
    shared = settings.model_copy(update={"store": postgres_url})
    cars = [build_sidecar(shared, clock=clock) for _ in range(count)]
    yield cars
    for car in cars:
        car.close()


@pytest.fixture
def server(sidecar):
    from toolauthz.server.build import create_server

    srv, port = create_server(sidecar, "127.0.0.1:0")
    yield srv, port
    srv.stop(None)


@pytest.fixture
def channel(server):
    _srv, port = server
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield ch


@pytest.fixture
def stub(channel) -> pb_grpc.ToolAuthorizerStub:
    return pb_grpc.ToolAuthorizerStub(channel)


@pytest.fixture
def serve_authorizer():
    """`serve_authorizer(servicer)`: a fake sidecar (a ToolAuthorizer servicer) on port 0,
    its address returned; stopped when the test ends."""
    from concurrent import futures

    started = []

    def start(servicer: pb_grpc.ToolAuthorizerServicer) -> str:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_ToolAuthorizerServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        started.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in started:
        server.stop(None)


@pytest.fixture
def spans():
    """Tracing on, into an in-memory exporter, for the test's duration."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from toolauthz.telemetry import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_tracer_provider(provider)
    yield exporter
    tracing.use_tracer_provider(None)
    provider.shutdown()


def hold_ledger_writes(monkeypatch, sidecar):
    """Every ledger write waits until `release` is set; `entered` is set when the first
    one arrives (a decision is then in flight, inside the pump)."""
    import threading

    entered, release = threading.Event(), threading.Event()
    real_apply = sidecar.ledger.apply

    def held_apply(ops):
        entered.set()
        release.wait(30)
        return real_apply(ops)

    monkeypatch.setattr(sidecar.ledger, "apply", held_apply)
    return entered, release


def calls_audited(sidecar, limit: int = 50) -> list:
    """The audit records of callers' requests: all but the sidecar's own `bundle` records
    (the bundle loaded at start-up, reloads), which are in the tenant `_system`."""
    from toolauthz.audit.store import AuditQuery

    return [r for r in sidecar.audit_log.query(AuditQuery(), limit=limit) if r.event.kind != "bundle"]


def order_entity(order_id: str, owner: str, refundable: int = 10_000, tenant: str | None = None) -> dict:
    entity = {"uid": {"type": "Order", "id": order_id},
              "attrs": {"owner": {"__entity": {"type": "User", "id": owner}}, "refundable_cents": refundable},
              "parents": []}
    if tenant:
        entity["parents"].append({"type": "Tenant", "id": tenant})
    return entity


def make_request(tool: str = "issue_refund", args: dict | bytes | None = None, *, call_id: str = "toolu_1",
                 principal: str = "alice", tenant: str = "acme", request_id: str = "run-1",
                 entities: list | None = None) -> pb.AuthorizeRequest:
    if args is None:
        args = {"order_id": "ord_1", "amount_cents": 1500}
    raw = args if isinstance(args, bytes) else json.dumps(args).encode()
    if entities is None:
        entities = [order_entity("ord_1", "alice")]
    return pb.AuthorizeRequest(
        context=pb.TrustedContext(tenant=tenant, principal=pb.Principal(type="User", id=principal),
                                  request_id=request_id, entities_json=json.dumps(entities).encode()),
        call=pb.ToolCall(call_id=call_id, name=tool, input_json=raw))


def verify_request(req: pb.AuthorizeRequest, token: str) -> pb.VerifyRequest:
    return pb.VerifyRequest(token=token, context=req.context, call=req.call)


def key_pair() -> tuple[pyseto.KeyInterface, pyseto.KeyInterface]:
    """A fresh Ed25519 key pair as PASETO v4.public keys (private, public)."""
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    return pyseto.Key.new(4, "public", private_pem), pyseto.Key.new(4, "public", public_pem)
