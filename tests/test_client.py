"""The sync and asyncio clients: every RPC of the three services, deadlines on every
call, and retries only where retrying is safe."""

from __future__ import annotations

import asyncio
import json
import socket
from concurrent import futures

import grpc
import pytest
from conftest import order_entity

from toolauthz.client import (
    AsyncAuthzClient,
    AuthzClient,
    OfflineVerifier,
    Principal,
    ProposedCall,
    RetryPolicy,
    TrustedContext,
)
from toolauthz.client import _convert as cv
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc

FAST = RetryPolicy(max_attempts=3, initial_backoff=0.001, max_backoff=0.002)
ALICE = TrustedContext("acme", Principal("User", "alice"), "run-1")
BOB = TrustedContext("acme", Principal("User", "bob"), "approval-ui")
SMALL = '{"order_id": "ord_1", "amount_cents": 1500}'
LARGE = '{"order_id": "ord_1", "amount_cents": 6000}'


def alice(entities=True) -> pb.TrustedContext:
    return ALICE.to_proto([order_entity("ord_1", "alice")] if entities else None)


def call(call_id="toolu_1", raw=SMALL, name="issue_refund") -> ProposedCall:
    return ProposedCall.of(call_id, name, raw)


class Recorder(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Records (method, timeout) of every attempt that leaves the client."""

    def __init__(self):
        self.calls: list[tuple[str, float | None]] = []

    def _note(self, details):
        self.calls.append((details.method.rsplit("/", 1)[-1], details.timeout))

    def intercept_unary_unary(self, continuation, details, request):
        self._note(details)
        return continuation(details, request)

    def intercept_unary_stream(self, continuation, details, request):
        self._note(details)
        return continuation(details, request)

    def count(self, method: str) -> int:
        return sum(1 for m, _ in self.calls if m == method)


@pytest.fixture
def recorder():
    return Recorder()


@pytest.fixture
def client(channel, recorder):
    return AuthzClient(grpc.intercept_channel(channel, recorder), timeout=3.0, retry=FAST)


@pytest.fixture
def dead_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dead(recorder, dead_port):
    with grpc.insecure_channel(f"127.0.0.1:{dead_port}") as ch:
        yield AuthzClient(grpc.intercept_channel(ch, recorder), timeout=3.0, retry=FAST)


def test_every_rpc_of_the_three_services_with_a_deadline_on_each(client, recorder, clock):
    status = client.get_status()
    assert status.policy_version and status.bundle_dir
    keys = client.get_keys().keys
    assert keys and keys[0].paserk.startswith("k4.public.")

    allowed = client.authorize(alice(), call())
    assert allowed.decision == pb.ALLOW and allowed.token
    assert client.verify(allowed.token, alice(), call()).valid
    report = client.report_outcome(ALICE, "toolu_1", "completed", output_digest="0" * 64)
    assert report.decision_id == allowed.decision_id and not report.unverified and not report.already_recorded

    pending = client.authorize(alice(), call("toolu_2", LARGE))
    assert pending.decision == pb.APPROVAL_REQUIRED
    [listed] = client.list_approvals(tenant="acme", status="pending", group="finance")
    assert listed.approval_id == pending.approval_id and listed.token == ""
    stream = client.watch_approval(pending.approval_id, ALICE, timeout=10)
    assert next(stream).status == apb.PENDING
    decided = client.decide_approval(pending.approval_id, BOB, "approve", "ok")
    assert decided.status == apb.APPROVED and decided.token == ""  # the approver never sees it
    assert next(stream).token
    stream.cancel()
    assert client.get_approval(pending.approval_id, ALICE).token.startswith("v4.public.")
    assert client.get_approval(pending.approval_id).token == ""

    story = client.query_decisions(tenant="acme", call_id="toolu_1")
    assert [r.kind for r in story] == ["authorize", "verify", "outcome"]
    assert [r.kind for r in client.iter_decisions(page_size=2, tenant="acme")] == \
        [r.kind for r in client.query_decisions(tenant="acme")]
    assert client.query_decisions(kind="approval", result="APPROVE")[0].approver == 'User::"bob"'

    first, second = client.authorize_batch(ALICE, [call("toolu_3"), call("bad id")],
                                           entities=[[order_entity("ord_1", "alice")], None])
    assert first.response.decision == pb.ALLOW and first.response.token
    assert (second.WhichOneof("answer"), second.error.code) == ("error", "INVALID_ARGUMENT")
    assert client.verify(first.response.token, alice(), call("toolu_3")).valid

    methods = {m for m, _ in recorder.calls}
    assert methods == {"GetStatus", "GetKeys", "Authorize", "AuthorizeBatch", "Verify", "ReportOutcome",
                       "ListApprovals", "WatchApproval", "DecideApproval", "GetApproval", "QueryDecisions"}
    assert all(timeout is not None and 0 < timeout <= 10 for _, timeout in recorder.calls)


def test_read_only_rpcs_retry_unavailable_with_bounded_attempts(dead, recorder):
    for rpc in (dead.get_status, dead.get_keys, dead.list_approvals,
                lambda: dead.get_approval("a1"), lambda: dead.query_decisions(tenant="acme")):
        with pytest.raises(grpc.RpcError) as info:
            rpc()
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    for method in ("GetStatus", "GetKeys", "ListApprovals", "GetApproval", "QueryDecisions"):
        assert recorder.count(method) == 3


def test_verify_is_never_retried_and_authorize_at_most_once(dead, recorder):
    with pytest.raises(grpc.RpcError):
        dead.verify("v4.public.x", alice(), call())
    with pytest.raises(grpc.RpcError):
        dead.authorize(alice(), call())
    with pytest.raises(grpc.RpcError):
        dead.authorize_batch(ALICE, [call()])
    with pytest.raises(grpc.RpcError):
        dead.decide_approval("a1", BOB, "approve")
    with pytest.raises(grpc.RpcError):
        dead.report_outcome(ALICE, "toolu_1", "failed", error_code="denied")
    assert (recorder.count("Verify"), recorder.count("Authorize"), recorder.count("AuthorizeBatch"),
            recorder.count("DecideApproval"), recorder.count("ReportOutcome")) == (1, 2, 2, 1, 3)


def test_the_deadline_bounds_the_whole_call_retries_included(recorder, dead_port):
    slow_backoff = RetryPolicy(max_attempts=10, initial_backoff=1.0, jitter=False)
    with grpc.insecure_channel(f"127.0.0.1:{dead_port}") as ch:
        client = AuthzClient(grpc.intercept_channel(ch, recorder), timeout=0.2, retry=slow_backoff)
        with pytest.raises(grpc.RpcError):
            client.get_status()
    assert recorder.count("GetStatus") == 1  # a 1 s backoff does not fit in the 0.2 s deadline


def test_non_retryable_statuses_are_not_retried(client, recorder):
    with pytest.raises(grpc.RpcError) as info:
        client.get_approval("no-such-approval")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND and recorder.count("GetApproval") == 1


class LosingProxy(pb_grpc.ToolAuthorizerServicer):
    """Forwards to the real sidecar; the first response of the named methods is lost
    after the sidecar acted on the request (what a dropped connection looks like)."""

    def __init__(self, upstream: pb_grpc.ToolAuthorizerStub, lose: set[str]):
        self.upstream = upstream
        self.lose = set(lose)
        self.seen: list[str] = []

    def _forward(self, name, request, context):
        self.seen.append(name)
        response = getattr(self.upstream, name)(request, timeout=5)
        if name in self.lose:
            self.lose.discard(name)
            context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset")
        return response

    def Authorize(self, request, context):
        return self._forward("Authorize", request, context)

    def AuthorizeBatch(self, request, context):
        return self._forward("AuthorizeBatch", request, context)

    def Verify(self, request, context):
        return self._forward("Verify", request, context)

    def ReportOutcome(self, request, context):
        try:
            return self._forward("ReportOutcome", request, context)
        except grpc.RpcError as exc:  # the upstream's status, passed on
            context.abort(exc.code(), exc.details())


@pytest.fixture
def proxy(channel):
    def start(lose):
        servicer = LosingProxy(pb_grpc.ToolAuthorizerStub(channel), lose)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_ToolAuthorizerServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        started.append(server)
        return servicer, AuthzClient(f"127.0.0.1:{port}", timeout=3, retry=FAST)

    started = []
    yield start
    for server in started:
        server.stop(None)


def test_authorize_retried_after_a_lost_response_replays_the_same_decision(proxy, sidecar):
    servicer, client = proxy({"Authorize"})
    with client:
        response = client.authorize(alice(), call())
        assert servicer.seen == ["Authorize", "Authorize"]
        assert response.replayed and response.decision == pb.ALLOW and response.token
        original = sidecar.ledger.get("acme", "toolu_1")
        assert response.decision_id == original.decision_id  # one decision, not two
        assert client.verify(response.token, alice(), call()).valid


def test_a_batch_retried_after_a_lost_response_replays_every_decision(proxy, sidecar):
    servicer, client = proxy({"AuthorizeBatch"})
    with client:
        answers = client.authorize_batch(ALICE, [call("toolu_1"), call("toolu_2", LARGE)],
                                         entities=[[order_entity("ord_1", "alice")]] * 2)
        assert servicer.seen == ["AuthorizeBatch", "AuthorizeBatch"]
        assert [a.response.replayed for a in answers] == [True, True]
        assert [a.response.decision_id for a in answers] == \
            [sidecar.ledger.get("acme", c).decision_id for c in ("toolu_1", "toolu_2")]
        assert client.verify(answers[0].response.token, alice(), call()).valid


def test_report_outcome_retried_after_a_lost_response_gets_the_first_answer(proxy, sidecar):
    servicer, client = proxy({"ReportOutcome"})
    with client:
        allowed = client.authorize(alice(), call())
        client.verify(allowed.token, alice(), call())
        report = client.report_outcome(ALICE, "toolu_1", "completed")
        assert servicer.seen.count("ReportOutcome") == 2  # the first was recorded, its answer lost
        assert (report.decision_id, report.unverified) == (allowed.decision_id, False)
        assert sidecar.ledger.get("acme", "toolu_1").outcome == "completed"
        with pytest.raises(grpc.RpcError) as info:  # a first attempt that finds one: someone else's
            client.report_outcome(ALICE, "toolu_1", "failed")
        assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS


def test_report_outcome_of_an_unknown_call_is_not_found(client):
    with pytest.raises(grpc.RpcError) as info:
        client.report_outcome(ALICE, "toolu_never", "completed")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_offline_verification_checks_the_call_but_not_single_use(client, clock):
    allowed = client.authorize(alice(), call())
    offline = OfflineVerifier(client)
    assert offline.check(allowed.token, ALICE, call(), now=clock.now()).ok
    tampered = call(raw='{"order_id": "ord_1", "amount_cents": 150000}')
    assert offline.check(allowed.token, ALICE, tampered, now=clock.now()).code == "bad_signature"
    other = TrustedContext("acme", Principal("User", "carol"), "run-1")
    assert not offline.check(allowed.token, other, call(), now=clock.now()).ok
    assert client.verify(allowed.token, alice(), call()).valid
    assert offline.check(allowed.token, ALICE, call(), now=clock.now()).ok  # still "ok" offline...
    assert client.verify(allowed.token, alice(), call()).code == "already_used"  # ...single use needs Verify


def test_a_batchs_entities_go_with_its_calls():
    request = cv.batch_request(ALICE, [call("c1"), pb.BatchCall(call=call("c2").to_proto(), entities_json=b"[]")],
                               [[order_entity("ord_1", "alice")], None])
    assert request.context.entities_json == b""
    assert json.loads(request.calls[0].entities_json) == [order_entity("ord_1", "alice")]
    assert request.calls[1].entities_json == b"[]"
    with pytest.raises(ValueError):
        cv.batch_request(ALICE, [call("c1")], [None, None])
    with pytest.raises(ValueError):
        cv.batch_request(ALICE, [pb.BatchCall(call=call("c2").to_proto())], [[order_entity("ord_1", "alice")]])


def test_arguments_are_checked_before_sending():
    with pytest.raises(ValueError):
        AuthzClient("127.0.0.1:1", timeout=0)
    with pytest.raises(TypeError):
        ProposedCall.of("toolu_1", "issue_refund", {"order_id": "ord_1"})  # raw text only
    with AuthzClient("127.0.0.1:1") as client, pytest.raises(ValueError):
        client.report_outcome(ALICE, "toolu_1", "done")


def test_async_client_happy_path_over_every_service(server, sidecar):
    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}", timeout=3, retry=FAST) as client:
            assert (await client.get_status()).policy_version
            assert (await client.get_keys()).keys
            [batched] = await client.authorize_batch(ALICE, [call("toolu_b")],
                                                     entities=[[order_entity("ord_1", "alice")]])
            assert batched.response.decision == pb.ALLOW and batched.response.token
            allowed = await client.authorize(alice(), call())
            assert allowed.decision == pb.ALLOW
            assert (await client.verify(allowed.token, alice(), call())).valid
            assert (await client.report_outcome(ALICE, "toolu_1", "completed")).decision_id == allowed.decision_id
            pending = await client.authorize(alice(), call("toolu_2", LARGE))
            [listed] = await client.list_approvals(status="pending")
            stream = client.watch_approval(pending.approval_id, ALICE, timeout=10)
            first = await stream.read()
            await client.decide_approval(listed.approval_id, BOB, "approve")
            second = await stream.read()
            stream.cancel()
            mine = await client.get_approval(pending.approval_id, ALICE)
            story = [r.kind async for r in client.iter_decisions(page_size=1, tenant="acme", call_id="toolu_1")]
            return first, second, mine, story

    first, second, mine, story = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert first.status == apb.PENDING and second.status == apb.APPROVED and second.token
    assert mine.token.startswith("v4.public.")
    assert story == ["authorize", "verify", "outcome"]


def test_async_client_retries_like_the_sync_one(dead_port):
    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{dead_port}", timeout=3, retry=FAST) as client:
            results = {}
            for name, rpc in (("GetStatus", client.get_status),
                              ("Verify", lambda: client.verify("v4.public.x", alice(), call()))):
                try:
                    await rpc()
                except grpc.RpcError as exc:
                    results[name] = exc.code()
            return results

    assert asyncio.run(scenario()) == {"GetStatus": grpc.StatusCode.UNAVAILABLE,
                                       "Verify": grpc.StatusCode.UNAVAILABLE}


def test_trusted_entities_are_serialized_from_the_runtime_not_the_call():
    msg = ALICE.to_proto([order_entity("ord_1", "alice")])
    assert json.loads(msg.entities_json)[0]["attrs"]["owner"] == {"__entity": {"type": "User", "id": "alice"}}
    assert ALICE.to_proto().entities_json == b""


def provided(calls_seen):
    def provider(proposed: ProposedCall):
        calls_seen.append(proposed.call_id)
        return [order_entity(proposed.arguments["order_id"], "alice")]
    return provider


def test_the_sync_client_sends_the_entities_of_the_contexts_provider(client):
    seen: list[str] = []
    ctx = TrustedContext("acme", Principal("User", "alice"), "run-p", entities=provided(seen))
    # Without the owner entity the policy cannot decide: an ALLOW proves the entities went.
    assert client.authorize(ALICE, call("toolu_p0")).decision != pb.ALLOW
    assert client.authorize(ctx, call("toolu_p1")).decision == pb.ALLOW
    assert client.authorize(ctx, call("toolu_p2").to_proto()).decision == pb.ALLOW
    [batched] = client.authorize_batch(ctx, [call("toolu_p3")])
    assert batched.response.decision == pb.ALLOW
    assert seen == ["toolu_p1", "toolu_p2", "toolu_p3"]
    with pytest.raises(ValueError, match="not both"):
        client.authorize_batch(ctx, [call("toolu_p4")], entities=[None])


def test_the_sync_client_refuses_a_coroutine_provider_loudly(client, recorder):
    async def provider(proposed):
        return None
    ctx = TrustedContext("acme", Principal("User", "alice"), "run-p", entities=provider)
    with pytest.raises(TypeError, match="AsyncAuthzClient"):
        client.authorize(ctx, call("toolu_p5"))
    assert recorder.count("Authorize") == 0


def test_the_async_client_sends_the_entities_of_the_contexts_provider(server, sidecar):
    seen: list[str] = []
    plain = provided(seen)

    async def provider(proposed):
        return plain(proposed)

    async def scenario():
        ctx = TrustedContext("acme", Principal("User", "alice"), "run-q", entities=provider)
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}", timeout=3, retry=FAST) as client:
            single = await client.authorize(ctx, call("toolu_q1"))
            [batched] = await client.authorize_batch(ctx, [call("toolu_q2")])
            return single, batched

    single, batched = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert single.decision == pb.ALLOW and batched.response.decision == pb.ALLOW
    assert seen == ["toolu_q1", "toolu_q2"]
