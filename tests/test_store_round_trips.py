"""Round trips per decision on PostgreSQL, counted, not timed: a sidecar reaches its
database through bench's delay proxy (10 ms each way, far above the client's pauses
between writes, so each wave of statements it waits for is counted once), and a lone
Authorize waits for one: its reads are foreseen and checked in the pipeline that
commits it (store/postgres/foreseen.py). Where the foresight is wrong (another replica
wrote the run, the meter or the chain), the decision is still right and the trail
still verifies; it only costs round trips."""

from __future__ import annotations

import pathlib
import statistics
import subprocess
import sys

import grpc
import pytest
from conftest import make_request

from bench.delay_proxy import DelayProxy
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.server.build import build_sidecar, create_server
from toolauthz.store.open import open_store
from toolauthz.store.postgres import migrate

DELAY = 0.010  # seconds each way: a database in another zone
RUN_LIMIT = 5  # policies/tools/issue_refund.yaml: max_calls_per_run


@pytest.fixture
def delayed(postgres_url):
    migrate(postgres_url)
    proxy = DelayProxy(("127.0.0.1", 5432), DELAY)
    yield postgres_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}", 1), proxy
    proxy.close()


def _waves_of(proxy: DelayProxy, call) -> int:
    before = proxy.waves
    call()
    return proxy.waves - before


def test_a_lone_authorize_waits_for_one_round_trip(settings, clock, delayed):
    url, proxy = delayed
    car = build_sidecar(settings.model_copy(update={"store": url}), clock=clock)
    server, port = create_server(car, "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.ToolAuthorizerStub(channel)
            for n in range(3):  # warm: the pool's connections, the chains' heads seen once
                stub.Authorize(make_request(call_id=f"warm-{n}", request_id=f"warm-{n}"))
            answers, waves = [], []
            for n in range(12):  # an agent's runs of two tools: each call a new decision
                request = (make_request(call_id=f"call-{n}", request_id=f"run-{n // 4}") if n % 2 else
                           make_request("lookup_order", {"order_id": "ord_1"}, call_id=f"call-{n}",
                                        request_id=f"run-{n // 4}"))
                waves.append(_waves_of(proxy, lambda r=request: answers.append(stub.Authorize(r, timeout=30))))
    finally:
        server.stop(None)
        car.close()
    assert all(a.decision in (pb.ALLOW, pb.DENY) and not a.replayed for a in answers)
    assert any(a.token for a in answers)
    assert statistics.median(waves) <= 1.5, waves


def test_another_replica_moving_the_run_and_the_chains_costs_round_trips_not_correctness(settings, clock, delayed,
                                                                                           postgres_url):
    """Two sidecars share a run whose budget the policies count: each one's foresight of
    the run's counts and the chains' heads goes stale as the other writes, the database
    refuses the stale prediction, and the decision is made on the real counts."""
    url, _proxy = delayed
    cars = [build_sidecar(settings.model_copy(update={"store": url}), clock=clock) for _ in range(2)]
    servers = [create_server(car, "127.0.0.1:0") for car in cars]
    try:
        stubs = [pb_grpc.ToolAuthorizerStub(grpc.insecure_channel(f"127.0.0.1:{port}")) for _s, port in servers]
        answers = [stubs[n % 2].Authorize(make_request(call_id=f"c{n}", request_id="shared"), timeout=30)
                   for n in range(8)]
    finally:
        for server, _port in servers:
            server.stop(None)
        for car in cars:
            car.close()
    with open_store(postgres_url) as store:
        [standing] = store.ledger.standing([_entry_of("shared")])
        assert store.audit_log.heads()  # and every chain verifies (below)
    allowed = sum(a.decision == pb.ALLOW for a in answers)
    assert standing.calls == allowed  # the counts the decisions were made on are the ledger's own
    assert allowed == RUN_LIMIT
    _verify(postgres_url, settings)


def _entry_of(request_id: str):
    from toolauthz.store.ledger import CallEntry

    return CallEntry("acme", "probe", request_id, "issue_refund", "", 'User::"alice"', 1_800_000_000.0)


def _verify(url: str, settings) -> None:
    """`toolauthz audit verify`, as an auditor runs it: every chain links, every record
    hashes as written."""
    toolauthz = pathlib.Path(sys.executable).with_name("toolauthz")
    done = subprocess.run([str(toolauthz), "audit", "verify", "--store", url, "--data-dir", str(settings.data_dir)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
