"""A model turn's parallel calls (Guard.run_turn, AsyncGuard.run_turn; client/turn.py),
against a real sidecar on port 0: one AuthorizeBatch, read tools together, the others in
the model's order, partial success, and cancellation of the turn."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import grpc
import pytest
from conftest import order_entity

from toolauthz.client import (
    NO_RETRY,
    AnthropicToolStream,
    AsyncAuthzClient,
    AsyncGuard,
    AuthzClient,
    Guard,
    Principal,
    RefusedCall,
    ToolError,
    ToolSet,
    TrustedContext,
    load_output_schemas,
    load_side_effects,
)
from toolauthz.client.turn import Slot, groups

ORDERS = {"ord_1": "alice", "ord_2": "alice", "ord_3": "carol"}


def context(request_id="run-1"):
    def entities(call):
        order = (call.arguments or {}).get("order_id") if isinstance(call.arguments, dict) else None
        return [order_entity(order, ORDERS[order])] if order in ORDERS else []

    return TrustedContext("acme", Principal("User", "alice"), request_id, entities=entities)


class Tools:
    def __init__(self, bundle_dir, barrier_parties=0):
        self.log: list[str] = []
        self.lock = threading.Lock()
        self.barrier = threading.Barrier(barrier_parties) if barrier_parties else None
        self.tools = ToolSet(output_schemas=load_output_schemas(bundle_dir), side_effects=load_side_effects(bundle_dir))
        self.tools.register("lookup_order", self.lookup)
        self.tools.register("issue_refund", self.refund)

    def note(self, what):
        with self.lock:
            self.log.append(what)

    def lookup(self, args, call):
        self.note(f"start {call.call_id}")
        if self.barrier is not None:
            self.barrier.wait(timeout=10)  # both read calls must be running at once to pass
        self.note(f"end {call.call_id}")
        return {"order_id": args["order_id"], "status": "shipped"}

    def refund(self, args, call):
        self.note(f"start {call.call_id}")
        self.note(f"end {call.call_id}")
        if args.get("reason") == "explode":
            raise ToolError("refund_failed", "The payment provider refused the refund.")
        return {"refund_id": f"rf_{call.call_id}"}


class CountingClient(AuthzClient):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.rpcs = Counter()

    def authorize(self, *a, **kw):
        self.rpcs["Authorize"] += 1
        return super().authorize(*a, **kw)

    def authorize_batch(self, *a, **kw):
        self.rpcs["AuthorizeBatch"] += 1
        return super().authorize_batch(*a, **kw)


def refund(order, cents, reason="late"):
    return f'{{"order_id": "{order}", "amount_cents": {cents}, "reason": "{reason}"}}'


def test_a_mixed_turn_is_one_batch_with_one_result_per_call_in_the_models_order(channel, bundle_dir, sidecar):
    tools = Tools(bundle_dir, barrier_parties=2)
    client = CountingClient(channel, timeout=5.0)
    guard = Guard(client, context(), tools.tools)
    turn = [("t1", "lookup_order", '{"order_id": "ord_1"}'),
            ("t2", "lookup_order", '{"order_id": "ord_2"}'),
            ("t3", "issue_refund", refund("ord_1", 1500)),            # allowed
            ("t4", "issue_refund", refund("ord_3", 1500)),            # carol's order: denied
            ("t5", "issue_refund", refund("ord_2", 6000)),            # above 50.00: approval required
            ("t6", "issue_refund", refund("ord_2", 100, "explode")),  # allowed, the tool fails
            ("t7", "send_fax", "{}"),                                  # not in the catalog
            ("t 8", "lookup_order", "{}")]                             # an unusable call id
    results = guard.run_turn(turn)
    assert [(r.call_id, r.status, r.code) for r in results] == [
        ("t1", "completed", ""), ("t2", "completed", ""), ("t3", "completed", ""),
        ("t4", "failed", "denied"), ("t5", "approval_pending", "approval_pending"),
        ("t6", "failed", "refund_failed"), ("t7", "failed", "unknown_tool"), ("t 8", "rejected", "invalid_call_id")]
    assert client.rpcs == {"AuthorizeBatch": 1}
    # A pending approval is an error result too (it did not run; one shape with MCP's).
    assert [r.is_error for r in results] == [False, False, False, True, True, True, True, True]
    assert [r.to_tool_result()["tool_use_id"] for r in results] == [c[0] for c in turn]
    # the two lookups ran at once (the barrier), the refunds after them, one at a time, in order
    assert sorted(tools.log[:4]) == ["end t1", "end t2", "start t1", "start t2"]
    assert tools.log[4:] == ["start t3", "end t3", "start t6", "end t6"]
    assert sidecar.ledger.get("acme", "t3").outcome == "completed"
    assert sidecar.ledger.get("acme", "t4").outcome == "failed"


def test_a_replayed_turn_runs_nothing_and_a_duplicate_id_in_a_turn_is_rejected(channel, bundle_dir, sidecar):
    tools = Tools(bundle_dir)
    guard = Guard(CountingClient(channel, timeout=5.0), context(), tools.tools)
    first = guard.run_turn([("t1", "issue_refund", refund("ord_1", 1500)),
                            ("t1", "issue_refund", refund("ord_1", 1500))])
    assert [(r.status, r.code) for r in first] == [("completed", ""), ("rejected", "call_in_progress")]
    again = guard.run_turn([("t1", "issue_refund", refund("ord_1", 1500))])
    assert (again[0].status, again[0].replayed) == ("completed", True)
    assert tools.log == ["start t1", "end t1"]


def test_a_whole_batch_failure_fails_every_call_and_runs_nothing(bundle_dir):
    tools = Tools(bundle_dir)
    with AuthzClient("127.0.0.1:1", timeout=1.0, retry=NO_RETRY) as down:
        results = Guard(down, context(), tools.tools).run_turn(
            [("t1", "lookup_order", '{"order_id": "ord_1"}'), ("t2", "issue_refund", refund("ord_1", 1))])
    assert [(r.status, r.code, r.executed) for r in results] == [
        ("failed", "authorization_unavailable", False), ("failed", "authorization_unavailable", False)]
    assert tools.log == []


def test_a_cancelled_blocking_turn_ends_unstarted_calls_cancelled(channel, bundle_dir, sidecar):
    tools = Tools(bundle_dir)
    cancel = threading.Event()

    def refund_then_cancel(args, call):
        out = tools.refund(args, call)
        cancel.set()  # the turn is cancelled while the first refund runs
        return out

    tools.tools = ToolSet(output_schemas=load_output_schemas(bundle_dir))
    tools.tools.register("issue_refund", refund_then_cancel)
    results = Guard(AuthzClient(channel, timeout=5.0), context(), tools.tools).run_turn(
        [("t1", "issue_refund", refund("ord_1", 100)), ("t2", "issue_refund", refund("ord_2", 200))], cancel=cancel)
    assert [(r.call_id, r.status) for r in results] == [("t1", "completed"), ("t2", "cancelled")]
    assert sidecar.ledger.get("acme", "t2").outcome == "cancelled"  # reported: the batch had decided it
    assert tools.log == ["start t1", "end t1"]


def test_async_turn_cancelled_mid_tool_ends_started_unknown_and_unstarted_cancelled(server, bundle_dir, sidecar):
    async def scenario():
        started, hold = asyncio.Event(), asyncio.Event()
        tools = ToolSet(output_schemas=load_output_schemas(bundle_dir), side_effects=load_side_effects(bundle_dir))

        async def slow_refund(args, call):
            started.set()
            await hold.wait()
            return {"refund_id": "never"}

        tools.register("issue_refund", slow_refund)
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client:
            guard = AsyncGuard(client, context(), tools)
            task = asyncio.ensure_future(guard.run_turn([("a1", "issue_refund", refund("ord_1", 100)),
                                                         ("a2", "issue_refund", refund("ord_2", 200))]))
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return guard.result("a1"), guard.result("a2")

    first, second = asyncio.run(scenario())
    assert (first.status, first.code, first.executed) == ("outcome_unknown", "cancelled_after_start", True)
    assert (second.status, second.executed) == ("cancelled", False)
    assert sidecar.ledger.get("acme", "a1").outcome == "outcome_unknown"
    assert sidecar.ledger.get("acme", "a2").outcome == "cancelled"


def test_async_turn_with_streamed_calls(server, bundle_dir, sidecar):
    async def scenario():
        tools = ToolSet(output_schemas=load_output_schemas(bundle_dir), side_effects=load_side_effects(bundle_dir))
        tools.register("lookup_order", lambda args, call: {"order_id": args["order_id"], "status": "shipped"})
        stream = AnthropicToolStream()
        answers = []
        for index, (call_id, text) in enumerate([("s1", '{"order_id": "ord_1"}'), ("s2", '{"order_id": "ord_')]):
            answers += stream.feed({"type": "content_block_start", "index": index, "content_block": {
                "type": "tool_use", "id": call_id, "name": "lookup_order", "input": {}}})
            answers += stream.feed({"type": "content_block_delta", "index": index,
                                    "delta": {"type": "input_json_delta", "partial_json": text}})
            if call_id == "s1":
                answers += stream.feed({"type": "content_block_stop", "index": index})
        answers += stream.close()
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client:
            return await AsyncGuard(client, context(), tools).run_turn(answers)

    results = asyncio.run(scenario())
    assert [(r.call_id, r.status, r.code) for r in results] == [("s1", "completed", ""),
                                                               ("s2", "failed", "stream_incomplete")]
    assert sidecar.ledger.get("acme", "s2") is None


def test_grouping_rule_keeps_non_concurrent_calls_alone_and_in_order():
    def slot(name, concurrent):
        s = Slot(call=object(), concurrent=concurrent)  # type: ignore[arg-type]
        s.authorized = (name, None)  # type: ignore[assignment]
        return s

    slots = [slot("r1", True), slot("r2", True), slot("w1", False), slot("r3", True), slot("w2", False),
             slot("w3", False), slot("r4", True), slot("r5", True)]
    assert [[s.authorized[0] for s in g] for g in groups(slots)] == [
        ["r1", "r2"], ["w1"], ["r3"], ["w2"], ["w3"], ["r4", "r5"]]
    assert RefusedCall("x", "t", "stream_broken").to_result().is_error
    assert grpc.StatusCode.INVALID_ARGUMENT.name == "INVALID_ARGUMENT"
