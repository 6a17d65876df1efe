"""The one-round-trip PostgreSQL path (store/postgres/foreseen.py) attacked from outside:
sidecars on one database decide at once on the same run, meter, call id and chains; an
operator prunes calls and another replica decides approvals behind a replica's back; the
database kills a transaction in flight or gives up on its statement. Whatever the
foresight guessed, no more ALLOWs than a limit, one decision per call id, no token
without its committed record, and the audit trail verifies."""

from __future__ import annotations

import contextlib
import json
import pathlib
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import psycopg
import pytest
from conftest import make_request, order_entity, verify_request
from test_fleet_processes import Replica
from test_store_faults import rows_of, until

from toolauthz.audit.records import DEFAULT_CHAINS, AuditEvent, chain_of
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.server.build import build_sidecar, create_server
from toolauthz.store.open import open_store
from toolauthz.store.postgres import migrate
from toolauthz.store.postgres.transaction import lock_id
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
            request = small(f"warm-{car.name}-{n}", f"warm-{car.name}-{n}", {"order_id": "ord_1", "amount_cents": 1})
            assert car.stub.Authorize(request, timeout=WAIT).token


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


def test_batches_on_replicas_at_once_share_one_run_budget(settings, clock, postgres_url):
    """AuthorizeBatch: each batch's decisions are made one after another on the run's
    foreseen count plus those ahead of them in the batch; six batches of five calls in one
    run, from three replicas at once, allow exactly five calls between them."""
    context = pb.TrustedContext(tenant="acme", principal=pb.Principal(type="User", id="alice"),
                                request_id="batch-run")
    entities = json.dumps([order_entity("ord_1", "alice", refundable=10_000)]).encode()

    def batch(n: int) -> pb.AuthorizeBatchRequest:
        return pb.AuthorizeBatchRequest(context=context, calls=[
            pb.BatchCall(call=pb.ToolCall(call_id=f"bt{n}-{k}", name="issue_refund",
                                          input_json=json.dumps(SMALL).encode()), entities_json=entities)
            for k in range(5)])

    with fleet(settings, clock, postgres_url, 3) as cars:
        warm(cars)
        answered = at_once([lambda n=n: cars[n % 3].stub.AuthorizeBatch(batch(n), timeout=WAIT) for n in range(6)])
    answers = [(f"bt{n}-{k}", item.response) for n, got in enumerate(answered) for k, item in enumerate(got.answers)]
    assert all(item.decision in (pb.ALLOW, pb.DENY) for _, item in answers)
    allowed = {call: item.decision_id for call, item in answers if item.decision == pb.ALLOW}
    assert len(allowed) == RUN_LIMIT and all(item.token for _, item in answers if item.decision == pb.ALLOW)
    assert allowed_rows(postgres_url, "bt") == allowed
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


# -- stale foresight: rows changed behind a replica's back --


def until_denied(stub, prefix: str | list[str], run: str, most: int = 12) -> list[pb.AuthorizeResponse]:
    """New calls in `run` (ids `prefix`0, 1, ... or those given) until one is refused."""
    answers = []
    for call_id in prefix[:most] if isinstance(prefix, list) else [f"{prefix}{n}" for n in range(most)]:
        answers.append(stub.Authorize(small(call_id, run), timeout=WAIT))
        if answers[-1].decision != pb.ALLOW:
            break
    return answers


def ids_off_chains(prefix: str, avoided: list[str], count: int = 12) -> list[str]:
    """Call ids whose audit records go to none of the chains of the calls `avoided`: their
    decisions find the heads their replica foresaw, so only the rows a test moved behind
    its back are stale (a head that moved would teach the replica everything at once)."""
    def chain(call_id: str) -> str:
        return chain_of(AuditEvent(kind="authorize", time=0.0, tenant="acme", call_id=call_id), DEFAULT_CHAINS)

    taken = {chain(call_id) for call_id in avoided}
    return [c for c in (f"{prefix}{n}" for n in range(200)) if chain(c) not in taken][:count]


def decide(car: Car, approval_id: str, verdict: int) -> apb.Approval:
    return car.approvals.DecideApproval(apb.DecideApprovalRequest(
        approval_id=approval_id, approver=BOB, verdict=verdict, reason="checked"), timeout=WAIT)


def test_approvals_made_foreseen_then_decided_on_another_replica(settings, clock, postgres_url):
    """Two APPROVAL_REQUIRED decisions through the foreseen path (their approval rows
    created in the one round trip), one approved and one rejected on another replica:
    the approved one's token verifies, and the first replica, which foresaw both pending
    approvals in the run, decides the run's next calls on its real count (one)."""
    with fleet(settings, clock, postgres_url, 2) as (a, b):
        warm([a])
        before = foreseen()
        requests = [small(f"ap{n}", "ap-run", LARGE) for n in range(2)]
        asked = [a.stub.Authorize(request, timeout=WAIT) for request in requests]
        assert foreseen() - before == {"hit": 2}  # made in one round trip each, no miss
        assert [r.decision for r in asked] == [pb.APPROVAL_REQUIRED] * 2 and all(not r.token for r in asked)
        for answer in asked:
            assert a.sidecar.approvals.get(answer.approval_id).status == "pending"
        assert decide(b, asked[0].approval_id, apb.APPROVE).status == apb.APPROVED
        assert decide(b, asked[1].approval_id, apb.REJECT).status == apb.REJECTED
        token = b.approvals.GetApproval(apb.GetApprovalRequest(approval_id=asked[0].approval_id,
                                                               context=requests[0].context), timeout=WAIT).token
        assert a.stub.Verify(verify_request(requests[0], token), timeout=WAIT).valid
        answers = until_denied(a.stub, ids_off_chains("ap-small", ["ap0", "ap1"]), "ap-run")
    assert [r.decision for r in answers] == [pb.ALLOW] * (RUN_LIMIT - 1) + [pb.DENY]
    assert answers[-1].errors[0].code == "limit_exceeded"
    verify_trail(postgres_url, settings)


def test_a_rejected_approval_on_another_replica_gives_its_meter_share_back(settings, clock, bundle_dir,
                                                                             postgres_url):
    """Two pending refunds fill alice's meter on one replica; another replica rejects one:
    the first one's foresight of the meter is stale (too high) and its next decisions
    are made on the meter as it is."""
    lower_budget(bundle_dir)
    with fleet(settings, clock, postgres_url, 2) as (a, b):
        warm([a])
        asked = [a.stub.Authorize(small(f"mp{n}", f"mp-run-{n}", LARGE), timeout=WAIT) for n in range(2)]
        assert [r.decision for r in asked] == [pb.APPROVAL_REQUIRED] * 2
        assert a.stub.Authorize(small("mp-before", "mp-before"), timeout=WAIT).decision == pb.DENY  # 21,000
        assert decide(b, asked[1].approval_id, apb.REJECT).status == apb.REJECTED
        answers = [a.stub.Authorize(small(call_id, f"run-{call_id}"), timeout=WAIT)
                   for call_id in ids_off_chains("mp-after", ["mp1"], 3)]
    # 8,000 pending and 24 spent warming: two refunds of 5,000 fit in 20,000, a third does not.
    assert [r.decision for r in answers] == [pb.ALLOW, pb.ALLOW, pb.DENY]
    assert "refund-daily-budget" in answers[-1].reasons
    verify_trail(postgres_url, settings)


@pytest.mark.parametrize("by", ["Store.prune", "toolauthz store prune"])
def test_a_prune_behind_a_replicas_back_is_decided_on_the_ledger(settings, clock, postgres_url, by):
    """A run's five refunds ran (outcomes reported), an operator prunes them: the ledger
    counts none, the replica foresaw five. Its next calls are decided on the ledger, a
    pruned call id is a new call again, and the run allows exactly its budget anew."""
    clock.set(time.time() - 3 * 3600)  # the console script prunes only calls ended an hour ago or more
    with fleet(settings, clock, postgres_url, 1) as (a,):
        warm([a])
        first = until_denied(a.stub, "pr", "pr-run")
        assert [r.decision for r in first] == [pb.ALLOW] * RUN_LIMIT + [pb.DENY]
        for n in range(RUN_LIMIT):
            a.stub.ReportOutcome(pb.ReportOutcomeRequest(context=small(f"pr{n}", "pr-run").context,
                                                         call_id=f"pr{n}", status=pb.COMPLETED), timeout=WAIT)
        if by == "Store.prune":
            with open_store(postgres_url) as store:
                assert store.prune(clock.now() + 1) == RUN_LIMIT + 1
        else:
            toolauthz = pathlib.Path(sys.executable).with_name("toolauthz")
            done = subprocess.run([str(toolauthz), "store", "prune", "--store", postgres_url, "--before", "2h"],
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0 and f" {RUN_LIMIT + 1} ended calls" in done.stdout, done.stdout + done.stderr
        clock.advance(60)  # a pruned id used again charges beside its old charge, keyed by its time
        again = until_denied(a.stub, "pr", "pr-run")
    assert [r.decision for r in again] == [pb.ALLOW] * RUN_LIMIT + [pb.DENY]
    assert not any(r.replayed for r in again)
    assert {r.decision_id for r in again}.isdisjoint(r.decision_id for r in first)
    assert len(allowed_rows(postgres_url, "pr")) == RUN_LIMIT
    verify_trail(postgres_url, settings)


# -- the database failing in the middle of a foreseen pipeline --


def backends_of(url: str, where: str) -> list[int]:
    return [pid for (pid,) in sql(url, "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'rtreview%%' "
                                       f"AND query NOT LIKE 'LISTEN%%' AND {where}")]


def kill(url: str, pids: list[int]) -> None:
    """Terminates each backend and waits until it is gone (its goodbye then on the socket)."""
    for pid in pids:
        sql(url, "SELECT pg_terminate_backend(%s, 10000)", (pid,))


@contextlib.contextmanager
def run_locked(url: str, run: str) -> Iterator[psycopg.Connection]:
    """The run's row key held from outside: a decision in it waits, in flight, on its lock."""
    with psycopg.connect(url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (lock_id(f"run\x00acme\x00{run}"),))
        try:
            yield holder
        finally:
            holder.execute("SELECT pg_advisory_unlock_all()")


def in_flight(url: str, call: Callable[[], object]) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(call()))
    thread.start()
    until(lambda: len(backends_of(url, "wait_event_type = 'Lock'")) == 1, "a decision waiting on the run's lock")
    return thread, out


def test_a_backend_killed_mid_pipeline_leaves_no_token_and_nothing_written(settings, clock, postgres_url):
    with fleet(settings, clock, postgres_url, 1) as (car,):
        warm([car])
        with run_locked(postgres_url, "kill-run"):
            thread, out = in_flight(postgres_url, lambda: answer_of(car.stub, small("k0", "kill-run")))
            kill(postgres_url, backends_of(postgres_url, "wait_event_type = 'Lock'"))
            thread.join(WAIT)
        assert out == [grpc.StatusCode.UNAVAILABLE]
        assert rows_of(postgres_url, "k0") == (0, 0)
        answers = until_denied(car.stub, "k", "kill-run")  # k0 again, then the run's next calls
    assert [r.decision for r in answers] == [pb.ALLOW] * RUN_LIMIT + [pb.DENY]
    assert not answers[0].replayed and all(r.token for r in answers[:RUN_LIMIT])
    assert rows_of(postgres_url, "k0") == (1, 1)
    verify_trail(postgres_url, settings)


def test_a_statement_timeout_mid_pipeline_leaves_no_token_and_nothing_written(settings, clock, postgres_url):
    """The store's bound on a statement (store_hang_seconds) cuts a decision stuck on a
    lock: UNAVAILABLE, nothing written, and the replica serves the next calls."""
    with fleet(settings, clock, postgres_url, 1, store_hang_seconds=2.0) as (car,):
        warm([car])
        with run_locked(postgres_url, "slow-run"):
            thread, out = in_flight(postgres_url, lambda: answer_of(car.stub, small("s0", "slow-run")))
            thread.join(WAIT)
        assert out == [grpc.StatusCode.UNAVAILABLE]
        assert rows_of(postgres_url, "s0") == (0, 0)
        answers = until_denied(car.stub, "s", "slow-run")
    assert [r.decision for r in answers] == [pb.ALLOW] * RUN_LIMIT + [pb.DENY]
    assert not answers[0].replayed
    verify_trail(postgres_url, settings)


def test_pooled_connections_killed_while_idle_are_replaced_before_a_call_uses_them(settings, clock, postgres_url):
    """A pooled connection is lent without a round trip: one whose backend was terminated
    while idle must be noticed from its socket, not fail the next call."""
    with fleet(settings, clock, postgres_url, 1, store_pool_size=2) as (car,):
        warm([car])
        answers = []
        for n in range(5):
            idle = backends_of(postgres_url, "state = 'idle'")
            assert idle
            kill(postgres_url, idle)
            answers.append(answer_of(car.stub, small(f"i{n}", f"idle-run-{n}")))
    assert all(isinstance(a, pb.AuthorizeResponse) and a.token for a in answers), answers


def test_backends_killed_while_replicas_decide_never_yield_a_token_without_its_record(settings, clock, postgres_url):
    """Three replicas, eight agents on two shared runs; every fourth answer, every busy
    backend of the fleet is terminated (and, every other time, every idle one). No
    token is answered without its committed row and audit record, no run goes over its
    budget; once the killing stops, a retry of each failed call answers it (a replay
    where its decision had committed) and each run holds exactly its budget."""
    with fleet(settings, clock, postgres_url, 3) as cars:
        warm(cars)
        kills, answered, stop = threading.Semaphore(0), Counter[str](), threading.Event()
        lock = threading.Lock()

        def killer() -> None:
            for n in range(1_000_000):
                kills.acquire()
                if stop.is_set():
                    return
                victims = backends_of(postgres_url, "state <> 'idle'" if n % 2 else "true")
                kill(postgres_url, victims)
                with lock:
                    answered["killed"] += len(victims)

        def agent(n: int) -> list:
            out = []
            for k in range(6):
                request = small(f"x{n}-{k}", f"x-run-{n % 2}")
                out.append((request, answer_of(cars[(n + k) % 3].stub, request)))
                with lock:
                    answered["all"] += 1
                    if answered["all"] % 4 == 0:
                        kills.release()
            return out

        thread = threading.Thread(target=killer)
        thread.start()
        try:
            results = [r for rs in at_once([lambda n=n: agent(n) for n in range(8)]) for r in rs]
        finally:
            stop.set()
            kills.release()
            thread.join(WAIT)
        assert answered["killed"] > 0  # the fleet's connections were cut while it decided
        tokens = {r.call.call_id: a.decision_id for r, a in results if isinstance(a, pb.AuthorizeResponse) and a.token}
        rows = allowed_rows(postgres_url, "x")
        assert all(rows.get(call) == decision for call, decision in tokens.items())  # no token without its row
        records = audited(postgres_url, "authorize")
        assert all(records[decision] >= 1 for decision in tokens.values())  # nor without its record
        assert all(n <= RUN_LIMIT for n in Counter(run_of(call) for call in rows).values())
        failed = [r for r, a in results if not isinstance(a, pb.AuthorizeResponse)]
        assert all(a == grpc.StatusCode.UNAVAILABLE for r, a in results if r in failed)
        committed = dict(sql(postgres_url, "SELECT call_id, decision_id FROM calls WHERE call_id LIKE %s", ("x%",)))
        retried = [(r, cars[0].stub.Authorize(r, timeout=WAIT)) for r in failed]
    for request, answer in retried:  # whole or not at all: a committed decision is replayed
        assert answer.replayed == (request.call.call_id in committed)
        assert answer.decision_id == committed.get(request.call.call_id, answer.decision_id)
    assert Counter(run_of(call) for call in allowed_rows(postgres_url, "x")) == {0: RUN_LIMIT, 1: RUN_LIMIT}
    verify_trail(postgres_url, settings)


def run_of(call_id: str) -> int:
    """The run of the chaos test's call `x{agent}-{k}`."""
    return int(call_id.split("-")[0][1:]) % 2


def test_a_replica_with_many_files_open_still_lends_its_pooled_connections(settings, clock, postgres_url):
    """A busy sidecar has more than a thousand descriptors open (clients' sockets, files):
    its database connections get descriptors above 1023, which `select.select` refuses.
    The check that lends a pooled connection must still peek at them."""
    import os

    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with fleet(settings, clock, postgres_url, 1, store_hang_seconds=10.0) as (car,):
            answers = [answer_of(car.stub, small(f"fd{n}", "fd-run")) for n in range(2)]
    finally:
        for fd in held:
            os.close(fd)
    assert all(isinstance(a, pb.AuthorizeResponse) and a.token for a in answers), answers
