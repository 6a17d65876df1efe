"""AuthorizeBatch: the parallel tool calls of one model turn, planned as one group.

A batch is one trusted context (tenant, principal, request id) and N calls, each with
the entities the runtime vouches for it. Call i is planned exactly as
`Authorizer.plan_authorize(ctx with call i's entities, call i)`, the plan its own
Authorize would make, so a batch cannot decide anything N Authorize calls would not.
The decision pump hands the plans to `Authorizer.run_many` together: their writes land
in one transaction.

What fails the whole batch, before anything is decided (RequestError: INVALID_ARGUMENT):
  * the context is malformed, or carries entities (they belong to each call);
  * no calls, more than `max_calls`, or more than `max_bytes` of arguments and entities;
  * a call id given twice. The tool-use ids of one model turn are unique by construction,
    so a repeat is a runtime assembling its batch wrongly. Deciding the first and
    answering the second with the first's replay (or `call_id_reused`) would hand back
    two answers under one id that the runtime cannot tell apart; refusing the batch
    reserves nothing, so the corrected batch is decided as new.
What fails one call alone is whatever its own Authorize would fail with (a malformed
call id, entities naming another tenant): that exception is the call's answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from toolauthz.authorizer import Authorizer, AuthorizeResult, Plan
from toolauthz.display.escape import shown
from toolauthz.errors import RequestError
from toolauthz.model import ProposedCall, TrustedContext

DEFAULT_MAX_CALLS = 64
DEFAULT_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class BatchLimits:
    max_calls: int = DEFAULT_MAX_CALLS
    max_bytes: int = DEFAULT_MAX_BYTES  # every call's input_json and entities_json, summed


DEFAULT_LIMITS = BatchLimits()


@dataclass(frozen=True)
class BatchCall:
    call: ProposedCall
    entities_json: bytes = b""  # as Authorize's context.entities_json, for this call

    @property
    def size(self) -> int:
        return len(self.call.input_json) + len(self.entities_json)


def check_count(count: int, limits: BatchLimits) -> None:
    """How many calls a batch holds; a transport checks it before converting the calls."""
    if not count:
        raise RequestError("a batch needs at least one call")
    if count > limits.max_calls:
        raise RequestError(f"a batch holds at most {limits.max_calls} calls, not {count}")


def check_batch(ctx: TrustedContext, calls: Sequence[BatchCall], limits: BatchLimits) -> None:
    """The batch's envelope; raises RequestError for the whole batch."""
    ctx.check()
    if ctx.entities_json:
        raise RequestError("a batch's context carries no entities: give each call its own `entities_json`")
    check_count(len(calls), limits)
    if sum(item.size for item in calls) > limits.max_bytes:
        raise RequestError(f"a batch's arguments and entities hold at most {limits.max_bytes} bytes")
    seen: set[str] = set()
    for item in calls:
        call_id = item.call.call_id
        if call_id in seen:  # an empty id is each call's own error (`missing call_id`)
            raise RequestError(f"call id `{shown(call_id)}` appears more than once in the batch")
        if call_id:
            seen.add(call_id)


def plan_batch(authorizer: Authorizer, ctx: TrustedContext, calls: Sequence[BatchCall], limits: BatchLimits,
               still_wanted: Callable[[], bool] = lambda: True, *,
               caller: str = "", deadline: float | None = None) -> list[Plan[AuthorizeResult] | Exception]:
    """Each call's plan, or the exception its own Authorize would have failed with, in
    order. Raises RequestError when the batch's envelope is refused (`check_batch`)."""
    check_batch(ctx, calls, limits)
    members: list[Plan[AuthorizeResult] | Exception] = []
    for item in calls:
        try:
            members.append(authorizer.plan_authorize(replace(ctx, entities_json=item.entities_json), item.call,
                                                     still_wanted, caller=caller, deadline=deadline))
        except Exception as exc:  # noqa: BLE001 - this call's answer alone, as its Authorize's would be
            members.append(exc)
    return members
