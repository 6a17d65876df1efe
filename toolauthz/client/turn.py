"""A model turn's parallel tool calls: one AuthorizeBatch, then each call run as the Guard
runs one, with one result per call in the model's order.

The rules (`Guard.run_turn`, `AsyncGuard.run_turn`):

1. Admission, per call, as `run` admits it: an unusable call id, a replay, a call id given
   twice in the turn, or a call the stream assembly refused ends at once without an RPC.
2. Authorization: every admitted call in one `AuthorizeBatch` (in chunks of at most
   `MAX_BATCH_CALLS` calls and `MAX_BATCH_BYTES` of arguments and entities), each with the
   entities the runtime's provider vouches for it. A call's own error in the batch, or a
   failure of the whole batch, fails that call (`authorization_error` /
   `authorization_unavailable`) and never the others' decisions.
3. Execution: in the model's order, except that consecutive calls whose tools may run at
   the same time (`Tool.concurrent`: by default a tool whose `side_effect` is `read`, the
   seeds' contract field for calls that commute) run together as one group. A tool with
   any other side effect runs alone, after every call before it ended and before any call
   after it starts, because the model may have meant that order.
4. Partial success: a denied, failed or approval-pending call is that call's result (its
   `is_error`, its `to_tool_result()`); it never stops the other calls.
5. Cancellation of the turn: a call that has not started ends `cancelled` (reported: the
   batch decided it), one that started ends `outcome_unknown`, exactly as one call's
   cancellation does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import grpc

from toolauthz.client.assembly import REFUSALS, AssembledCall, RefusedCall
from toolauthz.client.context import ProposedCall
from toolauthz.client.guard_core import Authorized, GuardCore
from toolauthz.client.results import CallResult
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

__all__ = ["TurnCall", "Slot", "admit", "batches", "authorized_of", "groups", "MAX_BATCH_CALLS", "MAX_BATCH_BYTES"]

MAX_BATCH_CALLS = 64  # the sidecar's default `batch.max_calls`
MAX_BATCH_BYTES = 512 * 1024  # half the default `batch.max_bytes`: room for the envelope

# One proposed call of a turn: (call id, tool name, argument text) or what a stream assembled.
TurnCall = tuple[str, str, bytes | str] | AssembledCall | RefusedCall


@dataclass
class Slot:
    """One call of the turn: either answered at admission (`result`) or to be run."""
    call: ProposedCall | None = None
    result: CallResult | None = None
    context: pb.TrustedContext | None = None
    authorized: Authorized | None = None
    concurrent: bool = False


class CallError(grpc.RpcError):
    """A batch answer's own error for one call, shaped as the status Authorize would raise."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self._code, self._message = code, message

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._message


def admit(guard: GuardCore, calls: Iterable[TurnCall]) -> list[Slot]:
    slots = []
    for item in calls:
        if isinstance(item, RefusedCall):
            slots.append(Slot(result=guard.refuse(item.call_id, item.name, item.code, REFUSALS[item.code])))
            continue
        call_id, name, input_json = ((item.call_id, item.name, item.input_json) if isinstance(item, AssembledCall)
                                     else item)
        opened = guard._open(call_id, name, input_json)
        if isinstance(opened, CallResult):
            slots.append(Slot(result=opened))
            continue
        tool = guard.tools.get(opened.name)
        slots.append(Slot(call=opened, concurrent=bool(tool and tool.concurrent)))
    return slots


def batches(slots: Sequence[Slot]) -> list[list[Slot]]:
    """The slots to authorize (admitted, with a context), in chunks the sidecar accepts."""
    chunks: list[list[Slot]] = []
    size = 0
    for slot in slots:
        if slot.call is None or slot.context is None:
            continue
        weight = len(slot.call.input_json) + len(slot.context.entities_json)
        if not chunks or len(chunks[-1]) >= MAX_BATCH_CALLS or size + weight > MAX_BATCH_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(slot)
        size += weight
    return chunks


def batch_calls(chunk: Sequence[Slot]) -> list[pb.BatchCall]:
    return [pb.BatchCall(call=s.call.to_proto(), entities_json=s.context.entities_json)  # type: ignore[union-attr]
            for s in chunk]


def authorized_of(chunk: Sequence[Slot], answers: Sequence[pb.BatchAnswer] | grpc.RpcError) -> None:
    """Gives each slot of the chunk its answer: the decision, or the status it failed with."""
    for i, slot in enumerate(chunk):
        assert slot.context is not None
        if isinstance(answers, grpc.RpcError):
            slot.authorized = (slot.context, answers)
        elif i >= len(answers):
            slot.authorized = (slot.context, CallError(grpc.StatusCode.INTERNAL, "the batch answered fewer calls"))
        elif answers[i].WhichOneof("answer") == "response":
            slot.authorized = (slot.context, answers[i].response)
        else:
            error = answers[i].error
            code = getattr(grpc.StatusCode, error.code, grpc.StatusCode.UNKNOWN)
            slot.authorized = (slot.context, CallError(code, error.message))


def groups(slots: Sequence[Slot]) -> list[list[Slot]]:
    """The slots to run, in the model's order: consecutive concurrent calls together, any
    other call alone."""
    out: list[list[Slot]] = []
    for slot in slots:
        if slot.call is None or slot.authorized is None:
            continue
        if slot.concurrent and out and all(s.concurrent for s in out[-1]):
            out[-1].append(slot)
        else:
            out.append([slot])
    return out
