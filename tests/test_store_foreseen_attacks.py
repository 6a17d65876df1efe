"""The one-round-trip PostgreSQL path (store/postgres/foreseen.py) attacked from outside:
sidecars on one database decide at once on the same run, meter, call id and chains; an
operator prunes calls and another replica decides approvals behind a replica's back; the
database kills a transaction in flight or gives up on its statement. Whatever the
foresight guessed, no more ALLOWs than a limit, one decision per call id, no token
without its committed record, and the audit trail verifies."""

from __future__ import annotations

import contextlib
import pathlib
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import psycopg
import pytest
from conftest import make_request, order_entity, verify_request
from test_fleet_processes import Replica
from test_store_faults import rows_of

from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.server.build import build_sidecar, create_server
from toolauthz.store.postgres import migrate
from toolauthz.telemetry import metrics

WAIT = 60
RUN_LIMIT = 5  # policies/tools/issue_refund.yaml: max_calls_per_run
SMALL = {"order_id": "ord_1", "amount_cents": 5000}  # allowed directly (policies/refunds.cedar)
LARGE = {"order_id": "ord_1", "amount_cents": 8000}  # APPROVAL_REQUIRED (finance)
BUDGET = 20_000  # refund_cents_24h, lowered in the test's bundle: four SMALL refunds
BOB = pb.TrustedContext(tenant="acme", principal=pb.Principal(type="User", id="bob"))


class Car:
    """A sidecar on the shared database, served on port 0, its connections named so the
    test can find (and kill) its backends."""

    def __init__(self, settings, clock, url: str, name: str):
        self.name = name
        self.sidecar = build_sidecar(settings.model_copy(update={"store": f"{url}&application_name={name}"}),
                                     clock=clock)
        self.server, port = create_server(self.sidecar, "127.0.0.1:0")
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = pb_grpc.ToolAuthorizerStub(self.channel)
        self.approvals = apb_grpc.ApprovalsStub(self.channel)

    def close(self) -> None:
        self.channel.close()
        self.server.stop(None)
        self.sidecar.close()


@contextlib.contextmanager
def fleet(settings, clock, url: str, count: int, **overrides) -> Iterator[list[Car]]:
    migrate(url)
    settings = settings.model_copy(update=overrides)
    cars: list[Car] = []
    try:
        cars.extend(Car(settings, clock, url, f"rtreview{n}") for n in range(count))
        yield cars
    finally:
        for car in cars:
            car.close()


def small(call_id: str, run: str, args: dict | None = None) -> pb.AuthorizeRequest:
    return make_request(call_id=call_id, request_id=run, args=args or SMALL,
                        entities=[order_entity("ord_1", "alice", refundable=10_000)])


def answer_of(stub, request) -> pb.AuthorizeResponse | grpc.StatusCode:
    """The answer, or the status code of the error it failed with."""
    try:
        return stub.Authorize(request, timeout=WAIT)
    except grpc.RpcError as exc:
        return exc.code()


def at_once(jobs: list[Callable[[], object]]) -> list:
    """Every job on a thread of its own, all released together."""
    start = threading.Barrier(len(jobs))

    def run(job):
        start.wait(WAIT)
        return job()

    with ThreadPoolExecutor(len(jobs)) as pool:
        return list(pool.map(run, jobs))


def warm(cars: list[Car]) -> None:
    """A call of its own on every replica, on every chain: each one's foresight then knows
    the chains' heads, and its next decisions are foreseen (one round trip)."""
    for car in cars:
        for n in range(24):
            assert car.stub.Authorize(small(f"warm-{car.name}-{n}", f"warm-{car.name}-{n}"), timeout=WAIT).token


def foreseen() -> Counter[str]:
    return Counter({result: metrics.FORESEEN.labels(result)._value.get() for result in ("hit", "miss")})


def sql(url: str, query: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(query, params).fetchall()


def allowed_rows(url: str, prefix: str) -> dict[str, str]:
    """call_id -> decision_id of the ALLOW rows of the calls whose id starts with `prefix`."""
    return dict(sql(url, "SELECT call_id, decision_id FROM calls WHERE decision = 'ALLOW' AND call_id LIKE %s",
                    (f"{prefix}%",)))


def verify_trail(url: str, settings) -> None:
    """`toolauthz audit verify`, as an auditor runs it, then each chain's records in order:
    their cursor (`seq`) increases along the chain, their place in it (`chain_seq`) has
    no gap."""
    toolauthz = pathlib.Path(sys.executable).with_name("toolauthz")
    done = subprocess.run([str(toolauthz), "audit", "verify", "--store", url, "--data-dir", str(settings.data_dir)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    chains: dict[str, list[tuple[int, int]]] = {}
    for chain, chain_seq, seq in sql(url, "SELECT chain, chain_seq, seq FROM audit_record ORDER BY chain, chain_seq"):
        chains.setdefault(chain, []).append((chain_seq, seq))
    for chain, places in chains.items():
        assert [place for place, _ in places] == list(range(1, len(places) + 1)), chain
        seqs = [seq for _, seq in places]
        assert all(a < b for a, b in zip(seqs, seqs[1:], strict=False)), (chain, seqs)
        assert seqs[0] > 0, (chain, seqs)


def audited(url: str, kind: str) -> Counter[str]:
    """How many records of `kind` each decision id has."""
    return Counter(d for (d,) in sql(url, "SELECT decision_id FROM audit_record WHERE kind = %s", (kind,)))


def lower_budget(bundle_dir: pathlib.Path) -> None:
    policies = bundle_dir / "refunds.cedar"
    text = policies.read_text()
    assert "> 500000" in text
    policies.write_text(text.replace("> 500000", f"> {BUDGET}"))


# -- limits under concurrent replicas --


@pytest.mark.parametrize("replicas", [2, 4])
def test_a_run_budget_holds_exactly_when_replicas_decide_at_once(settings, clock, postgres_url, replicas):
    """Fresh replicas (nothing foreseen yet: every run guessed at zero) on three runs at
    once: each run ends with exactly its budget of ALLOWs, and the ledger counts what
    was answered."""
    before = foreseen()
    with fleet(settings, clock, postgres_url, replicas) as cars:
        jobs = [lambda n=n: answer_of(cars[n % replicas].stub, small(f"b{n}", f"run-{n % 3}")) for n in range(24)]
        answers = at_once(jobs)
    assert all(isinstance(a, pb.AuthorizeResponse) for a in answers), answers
    allowed = {f"b{n}": a.decision_id for n, a in enumerate(answers) if a.decision == pb.ALLOW}
    assert all(a.token for a in answers if a.decision == pb.ALLOW)
    per_run = Counter(int(call[1:]) % 3 for call in allowed)
    assert per_run == {0: RUN_LIMIT, 1: RUN_LIMIT, 2: RUN_LIMIT}
    assert all(a.errors[0].code == "limit_exceeded" for a in answers if a.decision != pb.ALLOW)
    assert allowed_rows(postgres_url, "b") == allowed  # the ledger counts exactly the ALLOWs answered
    assert foreseen()["hit"] > before["hit"]  # the foreseen path was taken
    verify_trail(postgres_url, settings)


def test_a_usage_meter_holds_exactly_when_replicas_charge_it_at_once(settings, clock, bundle_dir, postgres_url):
    """One principal, a run per call (no run budget in the way), four replicas that
    already foresee the meter: at most BUDGET of refunds, the meter equals the ALLOWs."""
    lower_budget(bundle_dir)
    with fleet(settings, clock, postgres_url, 4) as cars:
        for n, car in enumerate(cars):  # each replica's foresight: the chains, and the meter at 0
            assert car.stub.Authorize(small(f"m-warm-{n}", f"m-warm-{n}", {"order_id": "ord_1", "amount_cents": 1}),
                                      timeout=WAIT).token
        jobs = [lambda n=n: answer_of(cars[n % 4].stub, small(f"mc{n}", f"m-run-{n}")) for n in range(16)]
        answers = at_once(jobs)
    assert all(isinstance(a, pb.AuthorizeResponse) for a in answers), answers
    allowed = {f"mc{n}": a.decision_id for n, a in enumerate(answers) if a.decision == pb.ALLOW}
    assert len(allowed) == (BUDGET - 4) // SMALL["amount_cents"]  # 4 cents spent warming
    assert all("refund-daily-budget" in a.reasons for a in answers if a.decision != pb.ALLOW)
    assert allowed_rows(postgres_url, "mc") == allowed
    [(charged,)] = sql(postgres_url, "SELECT sum(amount) FROM usage_charges")
    assert charged == 4 + SMALL["amount_cents"] * len(allowed)
    verify_trail(postgres_url, settings)


def test_one_call_id_on_every_replica_at_once_is_decided_once(settings, clock, postgres_url):
    """The same call (small, then large: an approval) sent to four replicas twice each,
    some fresh and some warmed: one row, one approval, one decision; every other answer
    is its replay."""
    with fleet(settings, clock, postgres_url, 4) as cars:
        warm(cars[:2])
        for k, args in enumerate([SMALL, LARGE, SMALL, LARGE]):
            request = small(f"same-{k}", f"run-same-{k}", args)
            answers = at_once([lambda n=n, r=request: answer_of(cars[n % 4].stub, r) for n in range(8)])
            assert all(isinstance(a, pb.AuthorizeResponse) for a in answers), answers
            assert len({a.decision_id for a in answers}) == 1, answers
            assert sorted(a.replayed for a in answers) == [False] + [True] * 7
            assert {a.decision for a in answers} == {pb.ALLOW if args is SMALL else pb.APPROVAL_REQUIRED}
            assert len({a.approval_id for a in answers}) == 1
            assert rows_of(postgres_url, f"same-{k}")[0] == 1
            approvals = sql(postgres_url, "SELECT count(*) FROM approvals WHERE approval_id = %s",
                            (answers[0].approval_id,))
            assert approvals == [(1 if args is LARGE else 0,)]
    verify_trail(postgres_url, settings)


# -- the audit trail --


def test_the_trail_verifies_after_foreseen_appends_from_replicas_and_a_process(settings, clock, postgres_url):
    """Three replicas in this process and a `toolauthz serve` process append to the same
    sixteen chains at once (decisions, verifications, outcomes): the trail verifies, each
    chain's records are in cursor order, and every answer has its record."""
    with fleet(settings, clock, postgres_url, 3) as cars:
        warm(cars)
        process = Replica(postgres_url, str(settings.data_dir))
        try:
            channel = grpc.insecure_channel(f"127.0.0.1:{process.wait_serving()}")
            stubs = [car.stub for car in cars] + [pb_grpc.ToolAuthorizerStub(channel)]

            def agent(n: int) -> list:
                stub, done = stubs[n % 4], []
                for k in range(6):
                    request = small(f"a{n}-{k}", f"a-run-{n}")
                    answer = stub.Authorize(request, timeout=WAIT)
                    done.append(("authorize", answer.decision_id))
                    if answer.token:
                        # On another replica of this process (same clock), the process on itself.
                        checker = stubs[3] if n % 4 == 3 else stubs[(n + 1) % 3]
                        checked = checker.Verify(verify_request(request, answer.token), timeout=WAIT)
                        assert checked.valid
                        done.append(("verify", answer.decision_id))
                return done

            answered = [step for steps in at_once([lambda n=n: agent(n) for n in range(8)]) for step in steps]
            channel.close()
        finally:
            process.stop()
    for kind in ("authorize", "verify"):
        records = audited(postgres_url, kind)
        assert all(records[decision_id] >= 1 for k, decision_id in answered if k == kind), kind
    assert sum(k == "authorize" for k, _ in answered) == 48
    verify_trail(postgres_url, settings)
