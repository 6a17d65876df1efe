"""No audit record lost: `toolauthz serve` processes killed (SIGKILL) under load, in the
middle of their transactions, then one started again. Every decision a client received
has exactly one audit record, none was recorded twice, and `audit verify` finds every
chain intact: a transaction cut off wrote nothing, not half a chain. On both stores
(PostgreSQL: two replicas killed at once)."""

from __future__ import annotations

import secrets
import sqlite3
import threading

import grpc
import psycopg
import pytest
from conftest import make_request
from test_fleet_processes import Replica

from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.store.postgres import migrate

ANSWERS_BEFORE_KILL = 40
THREADS = 8
WAIT = 60


@pytest.fixture(params=["sqlite", "postgresql"])
def store_and_replicas(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'data' / 'toolauthz.db'}", 1
    url = request.getfixturevalue("postgres_url")
    migrate(url)
    return url, 2


def _records(url: str) -> list[str]:
    query = "SELECT decision_id FROM audit_record WHERE kind = 'authorize'"
    if url.startswith("sqlite://"):
        conn = sqlite3.connect(url[len("sqlite://"):])
        rows = conn.execute(query).fetchall()
        conn.close()
    else:
        with psycopg.connect(url, autocommit=True) as pg:
            rows = pg.execute(query).fetchall()
    return [str(row[0]) for row in rows]


def test_killed_under_load_no_answered_decision_lacks_its_record_and_every_chain_verifies(
        store_and_replicas, tmp_path):
    from toolauthz.cli.main import main

    url, count = store_and_replicas
    data = str(tmp_path / "data")
    replicas = [Replica(url, data)]
    answered: list[str] = []
    lock, enough, stop = threading.Lock(), threading.Event(), threading.Event()
    try:
        ports = [replicas[0].wait_serving()]
        replicas += [Replica(url, data) for _ in range(count - 1)]
        ports += [r.wait_serving() for r in replicas[1:]]

        def load(t: int) -> None:
            with grpc.insecure_channel(f"127.0.0.1:{ports[t % len(ports)]}") as channel:
                stub = pb_grpc.ToolAuthorizerStub(channel)
                n = 0
                while not stop.is_set():
                    n += 1
                    try:
                        answer = stub.Authorize(make_request(call_id=f"k{t}-{n}-{secrets.token_hex(2)}",
                                                             request_id=f"run-{t}-{n}"), timeout=WAIT)
                    except grpc.RpcError:
                        return  # its server was killed
                    if answer.decision == pb.ALLOW and answer.token:
                        with lock:
                            answered.append(answer.decision_id)
                            if len(answered) >= ANSWERS_BEFORE_KILL:
                                enough.set()

        threads = [threading.Thread(target=load, args=(t,)) for t in range(THREADS)]
        for thread in threads:
            thread.start()
        assert enough.wait(WAIT * 2), "the load got no answers"
        for replica in replicas:
            replica.proc.kill()  # SIGKILL: mid-transaction, mid-fsync, wherever it is
        for replica in replicas:
            replica.proc.wait(WAIT)
        stop.set()
        for thread in threads:
            thread.join(WAIT)
    finally:
        stop.set()
        for replica in replicas:
            replica.stop()

    again = Replica(url, data)  # the store is usable again, the trail goes on
    try:
        with grpc.insecure_channel(f"127.0.0.1:{again.wait_serving()}") as channel:
            after = pb_grpc.ToolAuthorizerStub(channel).Authorize(make_request(call_id="after-restart"), timeout=WAIT)
            assert after.decision == pb.ALLOW and after.token
    finally:
        again.stop()

    records = _records(url)
    with lock:
        received = list(answered)
    assert len(received) >= ANSWERS_BEFORE_KILL
    assert not set(received) - set(records)  # every answer the clients got is recorded
    assert len(records) == len(set(records))  # and nothing is recorded twice
    assert main(["audit", "verify", "--store", url, "--data-dir", data]) == 0
