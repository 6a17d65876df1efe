"""The conformance cases both SDKs run (tests/conformance/sdk/*.json), on the Python side.

The same files are run by the TypeScript SDK's tests (clients/typescript/test/
conformance.test.ts), so the two cannot drift: digests of the same calls (numbers,
Unicode, key order), the Guard's behaviour against a scripted sidecar answer, and the
assembly of streamed argument fragments. Deterministic: a scripted answer cancels a run
by setting its event; a tool that must be cut waits for its own cancellation event.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from toolauthz.client import Guard, Principal, ToolError, ToolSet, TrustedContext
from toolauthz.client.assembly import CallAssembly
from toolauthz.client.streaming import AnthropicToolStream, ChatCompletionsToolStream, ResponsesToolStream
from toolauthz.client.sync import OutcomeReport
from toolauthz.client.turn import CallError
from toolauthz.digest import call_digest, canonical_json
from toolauthz.errors import InputError
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.strict_json import parse_strict_json

CASES = Path(__file__).resolve().parent / "conformance" / "sdk"
DIGESTS = json.loads((CASES / "digests.json").read_text(encoding="utf-8"))["cases"]
GUARD = json.loads((CASES / "guard.json").read_text(encoding="utf-8"))["cases"]
STREAMS = json.loads((CASES / "streams.json").read_text(encoding="utf-8"))["cases"]


def _input_bytes(case: dict) -> bytes:
    if "input_hex" in case:
        return bytes.fromhex(case["input_hex"])
    return case["input_json"].encode("utf-8", "surrogatepass")


# ---- digests -------------------------------------------------------------------------


@pytest.mark.parametrize("case", DIGESTS, ids=[c["name"] for c in DIGESTS])
def test_digest(case):
    call = case["call"]
    if "error" in case["expect"]:
        with pytest.raises(InputError):
            parse_strict_json(_input_bytes(case), max_bytes=1 << 20)
        return
    value = parse_strict_json(_input_bytes(case), max_bytes=1 << 20)
    whole = {"call_id": call["call_id"], "input": value, "principal": call["principal"], "tenant": call["tenant"],
             "tool": call["tool"]}
    assert canonical_json(whole).decode("utf-8") == case["expect"]["canonical"]
    assert call_digest(tool=call["tool"], input=value, principal_type=call["principal"]["type"],
                       principal_id=call["principal"]["id"], tenant=call["tenant"],
                       call_id=call["call_id"]) == case["expect"]["digest"]


def test_the_digest_cases_cover_what_naive_encoders_get_wrong():
    names = {c["name"] for c in DIGESTS}
    assert {"utf16_order", "numbers", "nfc", "nfd", "keys_by_utf16_units", "exponent_thresholds",
            "duplicate_key", "integer_above_2_53", "negative_zero"} <= names


# ---- the Guard against a scripted sidecar ----------------------------------------------


class ScriptedClient:
    """Answers each RPC from the case's script, in order, and records what was asked."""

    def __init__(self, script: dict, cancel: list[threading.Event]):
        self.script = {name: list(answers) for name, answers in script.items()}
        self.cancel = cancel  # the current run's event (a one-element list, replaced per run)
        self.rpcs: list[list[Any]] = []

    def _next(self, name: str) -> dict:
        queue = self.script.get(name)
        answer = queue.pop(0) if queue else {"error": "UNIMPLEMENTED"}
        if answer.get("then_cancel"):
            self.cancel[0].set()
        if "error" in answer:
            raise CallError(grpc.StatusCode[answer["error"]], "scripted")
        return {k: v for k, v in answer.items() if k != "then_cancel"}

    def authorize(self, context, call, *, timeout=None):
        self.rpcs.append(["Authorize", call.call_id])
        return json_format.ParseDict(self._next("Authorize"), pb.AuthorizeResponse())

    def authorize_batch(self, context, calls, *, timeout=None):
        self.rpcs.append(["AuthorizeBatch", [c.call.call_id for c in calls]])
        answer = self._next("AuthorizeBatch")
        return list(json_format.ParseDict(answer, pb.AuthorizeBatchResponse()).answers)

    def verify(self, token, context, call, *, timeout=None):
        self.rpcs.append(["Verify", call.call_id, token])
        return json_format.ParseDict(self._next("Verify"), pb.VerifyResponse())

    def report_outcome(self, context, call_id, status, *, error_code="", output_digest="", timeout=None):
        self.rpcs.append(["ReportOutcome", call_id, status, error_code, output_digest])
        queue = self.script.get("ReportOutcome")
        answer = self._next("ReportOutcome") if queue else {}
        return OutcomeReport(answer.get("decision_id", ""), answer.get("unverified", False))

    def watch_approval(self, approval_id, context=None, *, timeout=None):
        self.rpcs.append(["WatchApproval", approval_id])
        queue = self.script.get("WatchApproval")
        return _Stream(queue.pop(0) if queue else [{"error": "UNIMPLEMENTED"}], self.cancel)


class _Stream:
    def __init__(self, states: list[dict], cancel: list[threading.Event]):
        self._states = states
        self._cancel = cancel

    def __iter__(self) -> Iterator[apb.Approval]:
        for state in self._states:
            if "error" in state:
                raise CallError(grpc.StatusCode[state["error"]], "scripted")
            if state.get("then_cancel"):
                self._cancel[0].set()
            yield json_format.ParseDict({k: v for k, v in state.items() if k != "then_cancel"}, apb.Approval())

    def cancel(self) -> bool:
        return True


def _tool(behaviour: dict, cancel: list[threading.Event]):
    def run(args, call):
        if "returns" in behaviour:
            return behaviour["returns"]
        if "tool_error" in behaviour:
            raise ToolError(*behaviour["tool_error"])
        if behaviour.get("throws"):
            raise RuntimeError("scripted crash")
        if behaviour.get("returns_special") == "nan":
            return {"value": math.nan}
        if behaviour.get("cancels_then_waits"):
            cancel[0].set()
        if behaviour.get("cancels_then_waits") or behaviour.get("waits_for_cancel"):
            call.cancelled.wait(10)
            return "late"
        raise AssertionError(f"unknown behaviour {behaviour}")

    return run


def _expected_rpcs(rpcs: list) -> list:
    def resolve(item):
        if isinstance(item, str) and item.startswith("$digest:"):
            return hashlib.sha256(item.removeprefix("$digest:").encode("utf-8")).hexdigest()
        return item
    return [[resolve(item) for item in rpc] for rpc in rpcs]


def _check(result, expect: dict) -> None:
    fields = {"status": result.status, "code": result.code, "executed": result.executed,
              "reported": result.reported, "replayed": result.replayed, "content": result.content,
              "approval_id": result.approval_id, "decision": result.decision, "decision_id": result.decision_id}
    for name, want in expect.items():
        assert fields[name] == want, f"{name}: {fields[name]!r} != {want!r}"
    assert result.to_tool_result()["is_error"] == (result.status != "completed")


@pytest.mark.parametrize("case", GUARD, ids=[c["name"] for c in GUARD])
def test_guard(case):
    cancel = [threading.Event()]
    client = ScriptedClient(case["script"], cancel)
    tools = ToolSet()
    for name, behaviour in case["tools"].items():
        tools.register(name, _tool(behaviour, cancel))
    def failing_entities(call):
        raise RuntimeError("the runtime's store is down")

    context = TrustedContext("acme", Principal("User", "alice"), "run-1",
                             entities=failing_entities if case.get("entities") == "throws" else None)
    guard = Guard(client, context, tools)  # type: ignore[arg-type]  # the scripted stand-in
    for step in case["runs"]:
        cancel[0] = threading.Event()
        if "cancel_pending" in step:
            _check(guard.cancel(step["cancel_pending"]), step["expect"])
            continue
        if step.get("cancel") == "before":
            cancel[0].set()
        options: dict[str, Any] = {"cancel": cancel[0]}
        if "timeout_ms" in step:
            options["timeout"] = step["timeout_ms"] / 1000
        if "approval_wait_ms" in step:
            options["approval_wait"] = step["approval_wait_ms"] / 1000
        if "turn" in step:
            results = guard.run_turn([tuple(c) for c in step["turn"]], **options)
            assert len(results) == len(step["expect"])
            for result, expect in zip(results, step["expect"], strict=True):
                _check(result, expect)
        else:
            _check(guard.run(*step["call"], **options), step["expect"])
    assert client.rpcs == _expected_rpcs(case["rpcs"])


# ---- streamed fragments -----------------------------------------------------------------


def _answer(answer) -> dict:
    if hasattr(answer, "input_json"):
        return {"call_id": answer.call_id, "name": answer.name, "input_json": answer.input_json.decode("utf-8")}
    return {"call_id": answer.call_id, "name": answer.name, "refused": answer.code}


@pytest.mark.parametrize("case", STREAMS, ids=[c["name"] for c in STREAMS])
def test_stream_assembly(case):
    if "api" in case:
        adapters = {"anthropic": AnthropicToolStream, "chat_completions": ChatCompletionsToolStream,
                    "responses": ResponsesToolStream}
        stream = adapters[case["api"]](case.get("limits", {}))
        answers = [a for event in case["api_events"] for a in stream.feed(event)] + stream.close()
        assert [_answer(a) for a in answers] == case["expect"]
        assert stream.assembly.broken == case.get("broken", False)
        return
    assembly = CallAssembly(case.get("limits", {}), **({"max_calls": case["max_calls"]} if "max_calls" in case else {}))
    answers: list = []
    for op in case["events"]:
        kind = op[0]
        if kind == "open":
            answers += assembly.open(op[1], op[2], op[3])
        elif kind == "append":
            answers += assembly.append(op[1], op[2])
        elif kind == "end":
            answers += assembly.end(op[1], **({"final": op[2]} if len(op) > 2 else {}))
        elif kind == "close":
            answers += assembly.close()
        else:
            raise AssertionError(f"unknown event {kind}")
    assert [_answer(a) for a in answers] == case["expect"]
    assert assembly.broken == case.get("broken", False)


# ---- the model-safe texts -----------------------------------------------------------------


def test_the_model_safe_texts_are_the_shared_ones():
    from toolauthz.client.assembly import REFUSALS
    from toolauthz.client.results import MESSAGES

    shared = json.loads((CASES / "messages.json").read_text(encoding="utf-8"))
    assert MESSAGES == shared["messages"]
    assert REFUSALS == shared["refusals"]
