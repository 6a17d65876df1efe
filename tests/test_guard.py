"""The Guard's rules, against a real sidecar on port 0 (FrozenClock).

Deterministic by construction: cancellation points are reached by events the tool or
the observer sets, never by sleeping.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import threading
from collections import Counter

import pytest
from conftest import order_entity

from toolauthz.audit.store import AuditQuery
from toolauthz.client import (
    NO_RETRY,
    AsyncAuthzClient,
    AsyncGuard,
    AuthzClient,
    Guard,
    GuardStateError,
    Principal,
    ProposedCall,
    ToolError,
    ToolSet,
    TrustedContext,
    UnknownCallError,
    load_output_schemas,
)
from toolauthz.client.results import CallResult

SMALL = '{"order_id": "ord_1", "amount_cents": 1500}'
LARGE = '{"order_id": "ord_1", "amount_cents": 6000, "reason": "parcel lost"}'
LOOKUP = '{"order_id": "ord_1"}'


class Fakes:
    """Tool implementations that count their executions; behaviour switchable per test."""

    def __init__(self, bundle_dir):
        self.runs = Counter()
        self.refund_output = None  # override the refund tool's return value
        self.refund_error: BaseException | None = None
        self.hold: threading.Event | None = None  # when set up, the refund tool blocks on it
        self.entered = threading.Event()
        self.on_enter = None  # callable(invocation), run when the refund tool starts
        self.invocations = []
        self.tools = ToolSet(output_schemas=load_output_schemas(bundle_dir))
        self.tools.register("issue_refund", self.issue_refund)
        self.tools.register("lookup_order", self.lookup_order)

    def issue_refund(self, args, call):
        self.runs["issue_refund"] += 1
        self.invocations.append(call)
        self.entered.set()
        if self.on_enter:
            self.on_enter(call)
        if self.hold is not None:
            self.hold.wait(10)
        if self.refund_error is not None:
            raise self.refund_error
        return self.refund_output if self.refund_output is not None else {"refund_id": f"rf_{call.call_id}"}

    def lookup_order(self, args, call):
        self.runs["lookup_order"] += 1
        return {"order_id": args["order_id"], "status": "shipped"}


def alice_context(tenant="acme", owner="alice", refundable=10_000, request_id="run-1"):
    """The runtime's session for alice; ord_1 is looked up in its own store."""

    def entities(call: ProposedCall):
        if isinstance(call.arguments, dict) and call.arguments.get("order_id") == "ord_1":
            return [order_entity("ord_1", owner, refundable)]
        return []

    return TrustedContext(tenant, Principal("User", "alice"), request_id, entities=entities)


BOB = TrustedContext("acme", Principal("User", "bob"), "approval-ui")


@pytest.fixture
def client(channel):
    return AuthzClient(channel, timeout=5.0)


@pytest.fixture
def fakes(bundle_dir):
    return Fakes(bundle_dir)


@pytest.fixture
def events():
    return []


@pytest.fixture
def guard(client, fakes, events):
    return Guard(client, alice_context(), fakes.tools, observer=events.append)


def audit(sidecar, **query):
    """The records of calls: not the sidecar's own `bundle` records (the start-up's)."""
    return [r.event for r in sidecar.audit_log.query(AuditQuery(**query), limit=100) if r.event.kind != "bundle"]


def outcomes(sidecar, call_id):
    return [e for e in audit(sidecar, call_id=call_id) if e.kind == "outcome"]


# -- the happy path and replay -------------------------------------------------------------


def test_allowed_call_runs_once_reports_completed_and_maps_to_a_tool_result(guard, fakes, sidecar):
    result = guard.run("toolu_1", "issue_refund", SMALL)
    assert (result.status, result.code, result.executed, result.decision) == ("completed", "", True, "ALLOW")
    assert result.output == {"refund_id": "rf_toolu_1"} and result.reported == "recorded"
    assert result.to_tool_result() == {"type": "tool_result", "tool_use_id": "toolu_1",
                                       "content": '{"refund_id": "rf_toolu_1"}', "is_error": False}
    assert fakes.runs["issue_refund"] == 1
    entry = sidecar.ledger.get("acme", "toolu_1")
    assert entry.outcome == "completed" and entry.verified_jti and len(entry.extra["output_digest"]) == 64
    assert [e.kind for e in audit(sidecar, call_id="toolu_1")] == ["authorize", "verify", "outcome"]


def test_tool_receives_the_trusted_context_and_arguments_from_the_authorized_bytes(guard, fakes):
    raw = '{"amount_cents": 1500,\n "order_id": "ord_1"}'
    assert guard.run("toolu_1", "issue_refund", raw.encode()).status == "completed"
    [call] = fakes.invocations
    assert call.context.principal == Principal("User", "alice") and call.context.tenant == "acme"
    assert (call.call_id, call.name) == ("toolu_1", "issue_refund") and call.decision_id


def test_a_replayed_call_id_does_not_execute_again(guard, fakes, sidecar):
    first = guard.run("toolu_1", "issue_refund", SMALL)
    records = len(audit(sidecar))
    again = guard.run("toolu_1", "issue_refund", SMALL)
    reformatted = guard.run("toolu_1", "issue_refund", ' {"amount_cents":1500, "order_id":"ord_1"} ')
    assert again.replayed and reformatted.replayed and not first.replayed
    assert dataclasses.replace(again, replayed=False) == first
    assert fakes.runs["issue_refund"] == 1
    assert len(audit(sidecar)) == records  # the sidecar was not even asked
    assert len(outcomes(sidecar, "toolu_1")) == 1


def test_the_same_call_id_for_another_call_is_rejected_and_keeps_the_first_outcome(guard, fakes):
    first = guard.run("toolu_1", "issue_refund", SMALL)
    other = guard.run("toolu_1", "issue_refund", '{"order_id": "ord_1", "amount_cents": 1499}')
    renamed = guard.run("toolu_1", "lookup_order", LOOKUP)
    assert (other.status, other.code, other.is_error) == ("rejected", "call_id_reused", True)
    assert renamed.code == "call_id_reused" and fakes.runs == Counter(issue_refund=1)
    assert guard.result("toolu_1") == first


def test_a_new_guard_cannot_run_a_call_another_runtime_executed(client, guard, fakes, sidecar):
    guard.run("toolu_1", "issue_refund", SMALL)
    restarted = Guard(client, alice_context(), fakes.tools)
    result = restarted.run("toolu_1", "issue_refund", SMALL)
    assert (result.status, result.code, result.executed) == ("failed", "already_executed", False)
    assert result.reported == "not_reported" and fakes.runs["issue_refund"] == 1
    assert len(outcomes(sidecar, "toolu_1")) == 1  # the executing runtime's outcome stands


def test_a_call_running_now_is_not_started_twice(guard, fakes):
    fakes.hold = threading.Event()
    first: list[CallResult] = []
    worker = threading.Thread(target=lambda: first.append(guard.run("toolu_1", "issue_refund", SMALL)))
    worker.start()
    assert fakes.entered.wait(10)
    second = guard.run("toolu_1", "issue_refund", SMALL)
    assert (second.status, second.code) == ("rejected", "call_in_progress")
    assert guard.pending() == ["toolu_1"]
    fakes.hold.set()
    worker.join(10)
    assert first[0].status == "completed" and fakes.runs["issue_refund"] == 1 and guard.pending() == []


# -- one terminal result per known pending call -----------------------------------------------


def test_a_result_must_refer_to_a_known_pending_call(guard):
    done = guard.run("toolu_1", "lookup_order", LOOKUP)
    assert done.terminal
    stray = CallResult("toolu_9", "lookup_order", "completed")
    with pytest.raises(UnknownCallError):
        guard._finish("toolu_9", stray)  # never proposed
    with pytest.raises(UnknownCallError):
        guard._finish("toolu_1", done)  # finished: not pending any more
    with pytest.raises(UnknownCallError):
        guard.cancel("toolu_9")
    with pytest.raises(UnknownCallError):
        guard.cancel("toolu_1")
    assert guard.finished() == {"toolu_1": done}


def test_one_terminal_result_per_call_and_the_name_must_agree(guard):
    guard._admit(ProposedCall.of("toolu_2", "lookup_order", LOOKUP))
    with pytest.raises(GuardStateError):
        guard._finish("toolu_2", CallResult("toolu_2", "issue_refund", "completed"))
    guard._finish("toolu_2", CallResult("toolu_2", "lookup_order", "failed", "denied"))
    with pytest.raises(GuardStateError):
        guard._finish("toolu_2", CallResult("toolu_2", "lookup_order", "completed"))
    assert guard.result("toolu_2").code == "denied"


def test_an_unusable_call_id_is_rejected_without_a_request(guard, sidecar):
    result = guard.run("bad id with spaces", "lookup_order", LOOKUP)
    assert (result.status, result.code) == ("rejected", "invalid_call_id") and audit(sidecar) == []


# -- denials ------------------------------------------------------------------------------


def test_a_denied_call_never_executes_and_reports_exactly_one_outcome(client, fakes, sidecar):
    guard = Guard(client, alice_context(owner="carol"), fakes.tools)  # ord_1 belongs to carol
    result = guard.run("toolu_1", "lookup_order", LOOKUP)
    assert (result.status, result.code, result.decision, result.executed) == ("failed", "denied", "DENY", False)
    assert result.is_error and "no policy permits this call" in result.content
    assert result.reported == "recorded" and sidecar.ledger.get("acme", "toolu_1").outcome == "failed"
    assert guard.run("toolu_1", "lookup_order", LOOKUP).replayed
    assert fakes.runs == Counter()
    [outcome] = outcomes(sidecar, "toolu_1")
    assert (outcome.result, outcome.detail["error_code"]) == ("failed", "denied")


def test_a_forbid_names_its_policy_in_the_model_safe_message(client, fakes):
    guard = Guard(client, alice_context(refundable=1000), fakes.tools)
    result = guard.run("toolu_1", "issue_refund", SMALL)
    assert result.code == "denied" and "`refund-never-above-refundable`" in result.content
    assert fakes.runs == Counter()


def test_invalid_input_is_refused_before_the_ledger_and_not_found_is_handled(guard, fakes, sidecar):
    result = guard.run("toolu_1", "issue_refund",
                       '{"order_id": "ord_1", "amount_cents": 1500, "customer_id": "cus_8"}')
    assert (result.status, result.code, result.reported) == ("failed", "invalid_input", "not_in_ledger")
    assert "additionalProperties" in result.content and "cus_8" not in result.content
    duplicate = guard.run("toolu_2", "issue_refund", '{"order_id": "ord_1", "order_id": "ord_2", "amount_cents": 1}')
    assert duplicate.code == "invalid_input"
    assert fakes.runs == Counter() and outcomes(sidecar, "toolu_1") == []
    assert guard.run("toolu_1", "issue_refund", '{"order_id": "ord_1", "amount_cents": 1500, '
                                                '"customer_id": "cus_8"}').replayed


def test_unknown_tools_do_not_run(client, bundle_dir, sidecar):
    only_lookup = ToolSet()
    only_lookup.register("lookup_order", lambda args, call: {"ok": True})
    guard = Guard(client, alice_context(), only_lookup)
    unknown = guard.run("toolu_1", "delete_everything", "{}")
    assert (unknown.status, unknown.code) == ("failed", "unknown_tool")
    unimplemented = guard.run("toolu_2", "issue_refund", SMALL)  # allowed by policy, no implementation here
    assert (unimplemented.code, unimplemented.decision, unimplemented.reported) == ("unknown_tool", "ALLOW", "recorded")
    assert "`issue_refund` is not available" in unimplemented.content
    assert sidecar.ledger.get("acme", "toolu_2").verified_jti == ""  # never verified, never run


# -- execution: output, errors, cancellation, deadlines -----------------------------------


def test_invalid_output_is_a_failure_with_a_code_and_the_output_is_withheld(guard, fakes, sidecar):
    fakes.refund_output = {"refund": "secret-internal-value"}
    result = guard.run("toolu_1", "issue_refund", SMALL)
    assert (result.status, result.code, result.executed) == ("failed", "invalid_output", True)
    assert "secret-internal-value" not in result.content and result.output is None
    assert "required" in result.detail["why"]  # for operators
    [outcome] = outcomes(sidecar, "toolu_1")
    assert (outcome.result, outcome.detail["error_code"]) == ("failed", "invalid_output")


def test_output_that_is_not_json_is_invalid_output(guard, fakes):
    fakes.refund_output = {"refund_id": float("nan")}
    assert guard.run("toolu_1", "issue_refund", SMALL).code == "invalid_output"


def test_an_execution_error_reaches_the_model_without_its_details(guard, fakes, sidecar):
    fakes.refund_error = RuntimeError("password=hunter2 at db.internal:5432")
    result = guard.run("toolu_1", "issue_refund", SMALL)
    assert (result.status, result.code) == ("failed", "execution_error")
    assert result.content == "The tool failed while running."
    assert "hunter2" not in json.dumps(result.to_tool_result())
    assert outcomes(sidecar, "toolu_1")[0].detail["error_code"] == "execution_error"


def test_a_tool_error_carries_its_own_code_and_model_safe_message(guard, fakes):
    fakes.refund_error = ToolError("exceeds_refundable", "the amount exceeds what the order can still refund")
    result = guard.run("toolu_1", "issue_refund", SMALL)
    assert (result.code, result.content) == ("exceeds_refundable", "the amount exceeds what the order can still refund")


def test_cancelled_before_anything_is_cancelled_and_nothing_is_asked(guard, fakes, sidecar):
    cancel = threading.Event()
    cancel.set()
    result = guard.run("toolu_1", "issue_refund", SMALL, cancel=cancel)
    assert (result.status, result.executed, result.reported) == ("cancelled", False, "not_reported")
    assert audit(sidecar) == [] and fakes.runs == Counter()
    assert guard.run("toolu_1", "issue_refund", SMALL).replayed  # terminal: never runs later


def test_cancelled_while_waiting_for_approval_is_cancelled_and_reported(client, fakes, sidecar):
    cancel = threading.Event()

    def observer(event):
        if event.kind == "approval" and event.data["status"] == "PENDING":
            cancel.set()  # the watch is open: cancel now

    guard = Guard(client, alice_context(), fakes.tools, approval_wait=30, observer=observer)
    result = guard.run("toolu_1", "issue_refund", LARGE, cancel=cancel)
    assert (result.status, result.code, result.executed) == ("cancelled", "cancelled", False)
    assert result.reported == "recorded" and sidecar.ledger.get("acme", "toolu_1").outcome == "cancelled"
    assert fakes.runs == Counter()


def test_cancelled_after_the_tool_started_is_outcome_unknown(guard, fakes, sidecar):
    cancel = threading.Event()
    fakes.hold = threading.Event()
    fakes.on_enter = lambda call: cancel.set()  # the tool is running when the run is cancelled
    try:
        result = guard.run("toolu_1", "issue_refund", SMALL, cancel=cancel)
        assert (result.status, result.code, result.executed) == ("outcome_unknown", "cancelled_after_start", True)
        assert "unknown" in result.content and result.is_error
        assert fakes.invocations[0].cancelled.is_set()  # the tool was asked to stop
        assert sidecar.ledger.get("acme", "toolu_1").outcome == "outcome_unknown"
    finally:
        fakes.hold.set()


def test_a_deadline_passed_after_the_start_is_outcome_unknown(guard, fakes, sidecar):
    fakes.hold = threading.Event()
    try:
        result = guard.run("toolu_1", "issue_refund", SMALL, timeout=0.05)
        assert (result.status, result.code) == ("outcome_unknown", "timeout")
        assert outcomes(sidecar, "toolu_1")[0].result == "outcome_unknown"
    finally:
        fakes.hold.set()
    assert guard.run("toolu_1", "issue_refund", SMALL).replayed and fakes.runs["issue_refund"] == 1


def test_the_sidecar_down_means_not_executed_and_a_model_safe_message(fakes):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with AuthzClient(f"127.0.0.1:{port}", timeout=2, retry=NO_RETRY) as down:
        result = Guard(down, alice_context(), fakes.tools).run("toolu_1", "issue_refund", SMALL)
    assert (result.status, result.code, result.reported) == ("failed", "authorization_unavailable", "report_failed")
    assert "127.0.0.1" not in result.content and str(port) not in result.content
    assert fakes.runs == Counter()


def test_a_failing_entities_provider_fails_closed_without_a_request(client, fakes, sidecar):
    def broken(call):
        raise ConnectionError("orders-db.internal unreachable")

    guard = Guard(client, TrustedContext("acme", Principal("User", "alice"), "run-1", entities=broken), fakes.tools)
    result = guard.run("toolu_1", "issue_refund", SMALL)
    assert (result.code, result.content) == ("context_error", "The call could not be prepared and was not executed.")
    assert audit(sidecar) == []


# -- approvals ------------------------------------------------------------------------------


def test_approval_pending_by_default_then_resumed_once_bob_approved(client, guard, fakes, sidecar):
    pending = guard.run("toolu_1", "issue_refund", LARGE)
    assert (pending.status, pending.is_error, pending.terminal) == ("approval_pending", True, False)
    assert pending.to_tool_result()["is_error"] is True
    assert pending.approval_id in pending.content and "has not been executed" in pending.content
    assert guard.pending() == ["toolu_1"] and fakes.runs == Counter()
    assert guard.run("toolu_1", "issue_refund", LARGE).status == "approval_pending"  # still waiting
    client.decide_approval(pending.approval_id, BOB, "approve", reason="ok")
    done = guard.run("toolu_1", "issue_refund", LARGE)
    assert (done.status, done.approval_id, done.replayed) == ("completed", pending.approval_id, False)
    assert fakes.runs["issue_refund"] == 1 and guard.pending() == []
    assert [e.kind for e in audit(sidecar, call_id="toolu_1")] == [
        "authorize", "authorize", "approval", "authorize", "verify", "outcome"]


def test_approval_wait_receives_the_token_when_bob_approves(client, fakes, sidecar):
    deciders = []

    def observer(event):
        if event.kind == "approval" and event.data["status"] == "PENDING":
            t = threading.Thread(target=client.decide_approval,
                                 args=(event.data["approval_id"], BOB, "approve", "checked"))
            t.start()
            deciders.append(t)

    guard = Guard(client, alice_context(), fakes.tools, approval_wait=30, observer=observer)
    result = guard.run("toolu_1", "issue_refund", LARGE)
    for t in deciders:
        t.join(10)
    assert (result.status, result.decision) == ("completed", "APPROVAL_REQUIRED")
    assert fakes.runs["issue_refund"] == 1 and fakes.invocations[0].approval_id == result.approval_id
    kinds = [(e.kind, e.result) for e in audit(sidecar, call_id="toolu_1")]
    assert kinds == [("authorize", "APPROVAL_REQUIRED"), ("approval", "APPROVE"), ("verify", "ok"),
                     ("outcome", "completed")]


def test_a_rejected_approval_fails_and_is_reported(client, fakes, sidecar):
    def observer(event):
        if event.kind == "approval" and event.data["status"] == "PENDING":
            threading.Thread(target=client.decide_approval,
                             args=(event.data["approval_id"], BOB, "reject", "not refundable")).start()

    guard = Guard(client, alice_context(), fakes.tools, approval_wait=30, observer=observer)
    result = guard.run("toolu_1", "issue_refund", LARGE)
    assert (result.status, result.code, result.reported) == ("failed", "approval_rejected", "recorded")
    assert fakes.runs == Counter()


def test_a_call_waiting_for_approval_can_be_cancelled_once(guard, sidecar):
    guard.run("toolu_1", "issue_refund", LARGE)
    cancelled = guard.cancel("toolu_1")
    assert (cancelled.status, cancelled.reported) == ("cancelled", "recorded")
    assert sidecar.ledger.get("acme", "toolu_1").outcome == "cancelled"
    with pytest.raises(UnknownCallError):
        guard.cancel("toolu_1")
    assert guard.run("toolu_1", "issue_refund", LARGE).replayed


# -- trusted context ----------------------------------------------------------------------


def test_the_trusted_context_is_frozen_checked_and_required():
    ctx = alice_context()
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.tenant = "globex"
    with pytest.raises(ValueError):
        TrustedContext("acme corp", Principal("User", "alice"), "run-1")
    with pytest.raises(ValueError):
        Principal("User", 'alice" || true')
    with pytest.raises(TypeError):
        Guard(None, {"tenant": "acme", "principal": "alice"}, ToolSet())


# -- asyncio -------------------------------------------------------------------------------


def _async(test):
    return asyncio.run(asyncio.wait_for(test(), 20))


def test_async_guard_happy_path_and_replay(server, fakes, sidecar):
    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client:
            guard = AsyncGuard(client, alice_context(), fakes.tools)
            result = await guard.run("toolu_1", "issue_refund", SMALL)
            again = await guard.run("toolu_1", "issue_refund", SMALL)
            return result, again

    result, again = _async(scenario)
    assert (result.status, result.reported) == ("completed", "recorded") and again.replayed
    assert fakes.runs["issue_refund"] == 1 and sidecar.ledger.get("acme", "toolu_1").outcome == "completed"


def test_async_guard_cancellation_before_and_after_start(server, fakes, sidecar):
    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client:
            waiting = asyncio.Event()
            guard = AsyncGuard(client, alice_context(), fakes.tools, approval_wait=30,
                               observer=lambda e: e.kind == "approval" and waiting.set())
            task = asyncio.create_task(guard.run("toolu_1", "issue_refund", LARGE))
            await waiting.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            before = guard.result("toolu_1")

            tools = ToolSet()
            entered, release = asyncio.Event(), asyncio.Event()

            async def slow_refund(args, call):
                entered.set()
                await release.wait()
                return {"refund_id": "never"}

            tools.register("issue_refund", slow_refund)
            guard2 = AsyncGuard(client, alice_context(), tools)
            task = asyncio.create_task(guard2.run("toolu_2", "issue_refund", SMALL))
            await entered.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return before, guard2.result("toolu_2")

    before, after = _async(scenario)
    assert (before.status, before.executed, before.reported) == ("cancelled", False, "recorded")
    assert (after.status, after.code, after.executed) == ("outcome_unknown", "cancelled_after_start", True)
    assert sidecar.ledger.get("acme", "toolu_1").outcome == "cancelled"
    assert sidecar.ledger.get("acme", "toolu_2").outcome == "outcome_unknown"
    assert fakes.runs == Counter()


def test_async_guard_waits_for_bob_and_times_out_a_slow_tool(server, bundle_dir, sidecar):
    async def scenario():
        async with AsyncAuthzClient(f"127.0.0.1:{server[1]}") as client:
            async def approve(approval_id):
                await client.decide_approval(approval_id, BOB, "approve", "ok")

            approvers = []

            def observer(event):
                if event.kind == "approval" and event.data["status"] == "PENDING":
                    approvers.append(asyncio.get_running_loop().create_task(approve(event.data["approval_id"])))

            tools = ToolSet(output_schemas=load_output_schemas(bundle_dir))

            async def refund(args, call):
                if args["amount_cents"] < 5000:
                    await asyncio.Event().wait()  # never returns: the deadline ends it
                return {"refund_id": "rf_1"}

            tools.register("issue_refund", refund)
            guard = AsyncGuard(client, alice_context(), tools, approval_wait=30, observer=observer)
            approved = await guard.run("toolu_1", "issue_refund", LARGE)
            await asyncio.gather(*approvers)
            slow = await guard.run("toolu_2", "issue_refund", SMALL, timeout=0.05)
            return approved, slow

    approved, slow = _async(scenario)
    assert (approved.status, approved.output) == ("completed", {"refund_id": "rf_1"})
    assert (slow.status, slow.code) == ("outcome_unknown", "timeout")
