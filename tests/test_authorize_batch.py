"""AuthorizeBatch over gRPC: each call decided as its own Authorize would be, in one RPC
and one commit; answers in request order; a call's own failure is its answer alone; a
failure of the whole batch fails the RPC and hands out no token."""

from __future__ import annotations

import dataclasses
import json

import grpc
import pytest
from conftest import make_request, order_entity

from toolauthz.audit.store import AuditQuery
from toolauthz.errors import StoreUnavailable
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.server.build import build_sidecar
from toolauthz.service.common import proposed_call, trusted_context

SMALL = {"order_id": "ord_1", "amount_cents": 1500}
LARGE = {"order_id": "ord_1", "amount_cents": 6000}
TOO_MUCH = {"order_id": "ord_1", "amount_cents": 20_000}
OWN_ORDER = json.dumps([order_entity("ord_1", "alice")]).encode()


def member(call_id: str, args: dict | bytes = SMALL, tool: str = "issue_refund",
           entities: bytes = OWN_ORDER) -> pb.BatchCall:
    raw = args if isinstance(args, bytes) else json.dumps(args).encode()
    return pb.BatchCall(call=pb.ToolCall(call_id=call_id, name=tool, input_json=raw), entities_json=entities)


def batch(*calls: pb.BatchCall, tenant: str = "acme", request_id: str = "run-1") -> pb.AuthorizeBatchRequest:
    context = pb.TrustedContext(tenant=tenant, principal=pb.Principal(type="User", id="alice"),
                                request_id=request_id)
    return pb.AuthorizeBatchRequest(context=context, calls=list(calls))


def single(request: pb.AuthorizeBatchRequest, item: pb.BatchCall) -> pb.AuthorizeRequest:
    """The Authorize request that decides `item` alone."""
    context = pb.TrustedContext()
    context.CopyFrom(request.context)
    context.entities_json = item.entities_json
    return pb.AuthorizeRequest(context=context, call=item.call)


def decisions(response: pb.AuthorizeBatchResponse) -> list:
    return [a.response.decision if a.HasField("response") else a.error.code for a in response.answers]


def refused_with(call, request, code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.RpcError) as err:
        call(request)
    assert err.value.code() == code, err.value.details()
    return err.value.details()


def test_a_mixed_batch_is_answered_in_request_order_with_tokens_that_verify(stub, sidecar):
    request = batch(member("c_deny", TOO_MUCH), member("c_allow", SMALL), member("c_approve", LARGE),
                    member("c_lookup", {"order_id": "ord_1"}, tool="lookup_order"))
    response = stub.AuthorizeBatch(request)
    assert decisions(response) == [pb.DENY, pb.ALLOW, pb.APPROVAL_REQUIRED, pb.ALLOW]
    deny, allow, approve, lookup = (a.response for a in response.answers)
    assert list(deny.reasons) == ["refund-never-above-refundable"] and not deny.token
    assert approve.approval_id and approve.approval_expires_at.seconds and not approve.token
    for item, answer in zip(request.calls, response.answers, strict=True):
        recorded = sidecar.ledger.get("acme", item.call.call_id)
        assert recorded.decision_id == answer.response.decision_id
        [record] = sidecar.audit_log.query(AuditQuery(call_id=item.call.call_id), limit=10)
        assert (record.event.result, record.event.decision_id) == (recorded.decision, recorded.decision_id)
    for item, answer in ((request.calls[1], allow), (request.calls[3], lookup)):
        verified = stub.Verify(pb.VerifyRequest(token=answer.token, context=request.context, call=item.call))
        assert (verified.valid, verified.code, verified.decision_id) == (True, "ok", answer.decision_id)
    # A token is bound to its own call: another member's call does not verify with it.
    swapped = stub.Verify(pb.VerifyRequest(token=lookup.token, context=request.context, call=request.calls[0].call))
    assert not swapped.valid


def test_each_call_is_decided_exactly_as_its_own_authorize(settings, clock, tmp_path, stub, sidecar):
    """The same calls through AuthorizeBatch here and one Authorize each on a twin
    sidecar: the same answers and the same audit records, the run limit included
    (issue_refund allows 5 calls per run: the sixth and seventh are denied)."""
    calls = [member(f"r{i}", {"order_id": "ord_1", "amount_cents": 100 + i}) for i in range(7)]
    calls += [member("bad", b'{"order_id": "ord_1", "amount_cents": 1, "amount_cents": 2}'),
              member("nobody", SMALL, tool="no_such_tool"), member("big", LARGE)]
    request = batch(*calls)
    answers = [a.response for a in stub.AuthorizeBatch(request).answers]
    twin = build_sidecar(settings.model_copy(update={"data_dir": tmp_path / "twin"}), clock=clock)
    try:
        alone = [twin.authorizer.authorize(trusted_context(single(request, item).context),
                                           proposed_call(item.call), caller="unauthenticated") for item in calls]

        def audited(car, call_id):
            [record] = car.audit_log.query(AuditQuery(call_id=call_id), limit=10)
            return dataclasses.replace(record.event, decision_id="", jti="", approval_id="")

        for item, ours, theirs in zip(calls, answers, alone, strict=True):
            assert (pb.Decision.Name(ours.decision), list(ours.reasons), [(e.code, e.message) for e in ours.errors],
                    ours.digest, ours.policy_version) == \
                   (theirs.decision.value, list(theirs.reasons), [(e.code, e.message) for e in theirs.errors],
                    theirs.digest, theirs.policy_version), item.call.call_id
            assert audited(sidecar, item.call.call_id) == audited(twin, item.call.call_id)
    finally:
        twin.close()
    assert [a.decision for a in answers[:7]] == [pb.ALLOW] * 5 + [pb.DENY] * 2
    assert [e.code for e in answers[5].errors] == ["limit_exceeded"]


def test_a_batch_commits_once(stub, sidecar, monkeypatch):
    transactions = []
    run_batch = sidecar.ledger._writes._run_batch

    def counted(ops):
        transactions.append(len(ops))
        return run_batch(ops)

    monkeypatch.setattr(sidecar.ledger._writes, "_run_batch", counted)
    response = stub.AuthorizeBatch(batch(member("c1"), member("c2", LARGE), member("c3", TOO_MUCH),
                                         member("c4", b"{not json")))
    assert decisions(response) == [pb.ALLOW, pb.APPROVAL_REQUIRED, pb.DENY, pb.DENY]
    # Three reservations and the refused input's audit record: one transaction.
    assert transactions == [4]
    assert sidecar.audit_log.head()[0] == 1 + 4  # the bundle loaded at start-up, then the calls


def test_a_call_authorize_would_refuse_fails_alone_with_authorizes_status(stub, sidecar):
    other_tenant = json.dumps([order_entity("ord_1", "alice", tenant="globex")]).encode()
    request = batch(member("bad id!"), member("c_ok"), member("c_foreign", entities=other_tenant),
                    member("c_empty_tool", tool=""))
    response = stub.AuthorizeBatch(request)
    assert decisions(response) == ["INVALID_ARGUMENT", pb.ALLOW, "INVALID_ARGUMENT", "INVALID_ARGUMENT"]
    assert response.answers[1].response.token
    for i in (0, 2, 3):
        alone = refused_with(stub.Authorize, single(request, request.calls[i]), grpc.StatusCode.INVALID_ARGUMENT)
        assert response.answers[i].error.message == alone
    assert sidecar.ledger.get("acme", "bad id!") is None and sidecar.ledger.get("acme", "c_foreign") is None


def test_a_batch_of_nothing_but_bad_calls_answers_each(stub, sidecar):
    response = stub.AuthorizeBatch(batch(member(""), member("a b"), member("ok", tool="")))
    assert decisions(response) == ["INVALID_ARGUMENT"] * 3
    messages = [a.error.message for a in response.answers]
    assert messages == ["missing call_id", "call_id must match `^[A-Za-z0-9][A-Za-z0-9._:-]{0,255}\\Z`",
                        "missing tool name"]
    assert sidecar.audit_log.head()[0] == 1  # record 1: the bundle loaded at start-up


def test_a_batch_again_replays_every_decision_and_decides_nothing_twice(stub, sidecar):
    request = batch(member("c1"), member("c2", LARGE), member("c3", TOO_MUCH))
    first = stub.AuthorizeBatch(request)
    again = stub.AuthorizeBatch(request)
    assert decisions(again) == decisions(first) == [pb.ALLOW, pb.APPROVAL_REQUIRED, pb.DENY]
    for one, two in zip(first.answers, again.answers, strict=True):
        assert two.response.replayed and not one.response.replayed
        assert (two.response.decision_id, two.response.digest, two.response.approval_id) == \
               (one.response.decision_id, one.response.digest, one.response.approval_id)
    # The replayed ALLOW gets a token of its own for the same decision (the call has not run).
    assert again.answers[0].response.token and again.answers[0].response.token != first.answers[0].response.token
    assert sidecar.audit_log.query(AuditQuery(call_id="c1"), limit=10)[1].event.detail.get("replayed") is True
    # The same call ids with other arguments: each one's reuse is refused on its own.
    reused = stub.AuthorizeBatch(batch(member("c1", {"order_id": "ord_1", "amount_cents": 1}), member("c4")))
    assert [e.code for e in reused.answers[0].response.errors] == ["call_id_reused"]
    assert reused.answers[1].response.decision == pb.ALLOW and not reused.answers[1].response.replayed


@pytest.mark.parametrize("change, message", [
    (lambda r: r.calls.append(r.calls[0]), "call id `c0` appears more than once in the batch"),
    (lambda r: r.calls.extend(member(f"x{i}") for i in range(3)), "a batch holds at most 4 calls, not 5"),
    (lambda r: r.calls[1].call.__setattr__("input_json", b" " * 4000), "at most 4096 bytes"),
    (lambda r: r.context.__setattr__("entities_json", OWN_ORDER), "a batch's context carries no entities"),
    (lambda r: r.context.__setattr__("tenant", "acme\n"), "tenant must match"),
    (lambda r: r.context.__setattr__("request_id", ""), "missing request_id"),
    (lambda r: r.ClearField("calls"), "a batch needs at least one call"),
])
def test_a_refused_batch_decides_and_records_nothing(settings, clock, change, message):
    from toolauthz.server.build import create_server

    limited = settings.model_copy(update={"batch": settings.batch.model_copy(
        update={"max_calls": 4, "max_bytes": 4096})})
    car = build_sidecar(limited, clock=clock)
    server, port = create_server(car, "127.0.0.1:0")
    try:
        request = batch(member("c0"), member("c1"))
        change(request)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc

            details = refused_with(pb_grpc.ToolAuthorizerStub(channel).AuthorizeBatch, request,
                                   grpc.StatusCode.INVALID_ARGUMENT)
        assert message in details
        # record 1: the bundle loaded at start-up
        assert car.ledger.get("acme", "c0") is None and car.audit_log.head()[0] == 1
    finally:
        server.stop(None)
        car.close()


def test_the_store_unavailable_fails_the_batch_with_no_token(stub, sidecar, monkeypatch):
    def down(ops):
        raise StoreUnavailable("disk on fire")

    monkeypatch.setattr(sidecar.ledger._writes, "_run_batch", down)
    refused_with(stub.AuthorizeBatch, batch(member("c1"), member("c2", LARGE)), grpc.StatusCode.UNAVAILABLE)
    assert sidecar.ledger.get("acme", "c1") is None


def test_one_call_failing_inside_the_sidecar_fails_the_batch_and_withholds_every_token(stub, sidecar, monkeypatch):
    """An internal error deciding one call: the RPC fails, so the ALLOW decided beside
    it in the same commit reaches no one; asking again replays it with a token."""
    import toolauthz.authorizer.deciding as authorizer_module

    real = authorizer_module.evaluate

    def explode_on_lookups(bundle, ctx, prepared, *args):
        if prepared.slice.tool.name == "lookup_order":
            raise RuntimeError("cedar exploded")
        return real(bundle, ctx, prepared, *args)

    monkeypatch.setattr(authorizer_module, "evaluate", explode_on_lookups)
    request = batch(member("c1"), member("c2", {"order_id": "ord_1"}, tool="lookup_order"))
    assert refused_with(stub.AuthorizeBatch, request, grpc.StatusCode.INTERNAL) == "internal error"
    assert sidecar.ledger.get("acme", "c1").decision == "ALLOW" and sidecar.ledger.get("acme", "c2") is None
    monkeypatch.undo()
    again = stub.AuthorizeBatch(request)
    assert decisions(again) == [pb.ALLOW, pb.ALLOW]
    assert again.answers[0].response.replayed and again.answers[0].response.token
    assert not again.answers[1].response.replayed


def test_a_batch_is_one_run_of_one_tenant_by_its_shape(stub, sidecar):
    """No member carries a tenant, a principal or a run of its own: only its call and its
    entities, which are anchored in the batch's tenant like Authorize's."""
    assert [f.name for f in pb.BatchCall.DESCRIPTOR.fields] == ["call", "entities_json"]
    globex = batch(member("g1", entities=json.dumps([order_entity("ord_1", "alice")]).encode()), tenant="globex")
    answer = stub.AuthorizeBatch(globex).answers[0].response
    alone = stub.Authorize(make_request(tenant="globex", call_id="g2"))
    assert (answer.decision, list(answer.reasons)) == (alone.decision, list(alone.reasons))
    assert sidecar.ledger.get("globex", "g1") is not None and sidecar.ledger.get("acme", "g1") is None


def test_a_flood_of_calls_is_refused_before_any_call_is_read(stub, sidecar, monkeypatch):
    import toolauthz.service.authorizer as handlers

    def never(_msg):
        raise AssertionError("a call of a refused batch was converted")

    monkeypatch.setattr(handlers, "batch_call", never)
    flood = batch(*(pb.BatchCall(call=pb.ToolCall(call_id=f"f{i}")) for i in range(20_000)))
    details = refused_with(stub.AuthorizeBatch, flood, grpc.StatusCode.INVALID_ARGUMENT)
    assert details == "a batch holds at most 64 calls, not 20000"
    assert sidecar.audit_log.head()[0] == 1  # record 1: the bundle loaded at start-up


def test_a_call_id_an_earlier_authorize_used_is_refused_as_reused_in_a_batch(stub, sidecar):
    first = stub.Authorize(make_request(call_id="c1"))
    reused = stub.AuthorizeBatch(batch(member("c1", {"order_id": "ord_1", "amount_cents": 1}), member("c2")))
    assert [e.code for e in reused.answers[0].response.errors] == ["call_id_reused"]
    assert not reused.answers[0].response.token and reused.answers[1].response.token
    again = stub.AuthorizeBatch(batch(member("c1")))  # the same call: its decision, replayed
    assert again.answers[0].response.replayed and again.answers[0].response.decision_id == first.decision_id


@pytest.mark.parametrize("same_args", [True, False])
def test_a_batch_and_an_authorize_of_one_call_id_in_one_commit_decide_it_once(sidecar, same_args):
    """The batch and the lone Authorize meet in one pump batch, so in one transaction:
    the call is decided once, and the other asker gets its replay or `call_id_reused`."""
    import asyncio

    from test_pump import held_first_batch

    from toolauthz.batch import DEFAULT_LIMITS, BatchCall, plan_batch
    from toolauthz.server.pump import DecisionPump

    pump = DecisionPump(sidecar.authorizer, inline_after=None)
    hold, entered, release = held_first_batch(pump)
    lone = make_request(call_id="c1", args=SMALL if same_args else {"order_id": "ord_1", "amount_cents": 1})
    ctx = trusted_context(batch().context)
    calls = [BatchCall(proposed_call(member(call_id).call), OWN_ORDER) for call_id in ("c1", "c2")]

    async def main():
        held = asyncio.ensure_future(pump.answer(hold))
        await asyncio.get_running_loop().run_in_executor(None, entered.wait, 30)
        group = asyncio.ensure_future(pump.answer_group(
            lambda: plan_batch(sidecar.authorizer, ctx, calls, DEFAULT_LIMITS), len(calls)))
        single = asyncio.ensure_future(pump.answer(
            lambda: sidecar.authorizer.plan_authorize(trusted_context(lone.context), proposed_call(lone.call))))
        await asyncio.sleep(0)
        assert pump.waiting == 2
        release.set()
        await asyncio.gather(held, return_exceptions=True)
        return await group, await single

    try:
        (in_batch, other), alone = asyncio.run(main())
    finally:
        pump.close()
    assert pump.batches == 2 and other.decision.value == "ALLOW" and not other.replayed
    assert in_batch.decision.value == "ALLOW" and not in_batch.replayed and in_batch.token
    if same_args:
        assert alone.replayed and alone.decision_id == in_batch.decision_id
    else:
        assert [e.code for e in alone.errors] == ["call_id_reused"] and alone.token is None
    assert sidecar.ledger.get("acme", "c1").decision_id == in_batch.decision_id
    records = sidecar.audit_log.query(AuditQuery(call_id="c1"), limit=10)
    assert sorted(r.event.result for r in records) == ["ALLOW", "ALLOW" if same_args else "DENY"]
