"""The HTTP API's request envelopes: each route's body shape, and the model values a
parsed body stands for (the messages gRPC receives as protobuf).

A shape is checked while the body is scanned (json_body.py): an unknown member is refused
at its key and a batch past `max_calls` at its first extra call, before the rest is read.
The checks here repeat the member names for bodies parsed without a shape, and give each
missing or mistyped member its own message.
"""

from __future__ import annotations

import re

from toolauthz.batch import BatchCall, BatchLimits, check_count
from toolauthz.display.escape import shown
from toolauthz.errors import InputError, RequestError
from toolauthz.model import CALL_ID, TENANT, Principal, ProposedCall, TrustedContext
from toolauthz.service.access import About
from toolauthz.service.http_api.json_body import ANY_ITEM, BodyShape, JsonPath, RawJson
from toolauthz.strict_json import parse_strict_json

__all__ = ["APPROVAL", "APPROVAL_ID", "APPROVAL_WAIT", "AUTHORIZE", "CALL_STORY", "MAX_APPROVAL_ID", "MAX_WAIT_SECONDS",
           "OUTCOME", "OUTCOMES", "VERIFY", "about", "approval_id_of", "batch_calls", "batch_shape", "call_story_of",
           "context_of", "only", "proposed_call", "required_string", "string_member", "viewer_of", "wait_seconds_of"]

OUTCOMES = ("completed", "failed", "cancelled", "outcome_unknown")

_CONTEXT = ("tenant", "principal", "request_id", "entities")
_PRINCIPAL = ("type", "id")
_CALL = ("call_id", "name", "input")
_BATCH_CALL = ("call", "entities")


def _context_members(at: JsonPath) -> dict[JsonPath, tuple[str, ...]]:
    return {(*at, "context"): _CONTEXT, (*at, "context", "principal"): _PRINCIPAL}


# The members whose bytes are kept as received: the model's arguments (digested) and the
# runtime's entities (handed to the engine as `entities_json` is over gRPC).
AUTHORIZE = BodyShape(raw=frozenset({("call", "input"), ("context", "entities")}),
                      members={(): ("context", "call"), **_context_members(()), ("call",): _CALL})
VERIFY = BodyShape(raw=AUTHORIZE.raw,
                   members={(): ("token", "context", "call"), **_context_members(()), ("call",): _CALL})
OUTCOME = BodyShape(raw=frozenset({("context", "entities")}),
                    members={(): ("context", "call_id", "status", "error_code", "output_digest"),
                             **_context_members(())})


# Reading an approval: the reader's own context (the call's tenant, principal and run,
# for its token), never entities.
_VIEWER = ("tenant", "principal", "request_id")
APPROVAL = BodyShape(members={(): ("approval_id", "context"), ("context",): _VIEWER,
                              ("context", "principal"): _PRINCIPAL})
APPROVAL_WAIT = BodyShape(members={**APPROVAL.members, (): ("approval_id", "context", "wait_seconds")})
CALL_STORY = BodyShape(members={(): ("tenant", "call_id")})
# Approval ids are ULIDs (26 letters and digits); the bound keeps a hostile id (a NUL, a
# megabyte) out of the store and out of messages.
MAX_APPROVAL_ID = 128
APPROVAL_ID = re.compile(rf"^[0-9A-Za-z_-]{{1,{MAX_APPROVAL_ID}}}\Z")
# A long poll's bound: below the idle timeouts of common proxies, so that a wait ends
# with an answer rather than a dropped connection.
MAX_WAIT_SECONDS = 55
DEFAULT_WAIT_SECONDS = 30


def batch_shape(limits: BatchLimits) -> BodyShape:
    calls = ("calls", ANY_ITEM)
    return BodyShape(
        raw=frozenset({("context", "entities"), (*calls, "call", "input"), (*calls, "entities")}),
        members={(): ("context", "calls"), **_context_members(()), calls: _BATCH_CALL, (*calls, "call"): _CALL},
        max_items={("calls",): (limits.max_calls, f"a batch holds at most {limits.max_calls} calls")})


def about(ctx: TrustedContext, call_id: str) -> About:
    return About(ctx.tenant, str(ctx.principal), call_id, ctx.request_id)


def _members(value: object, at: str, names: tuple[str, ...]) -> dict[str, object]:
    if not isinstance(value, dict):
        raise RequestError(f"`{at or '/'}` must be a JSON object")
    only(value, at, names)
    return value


def only(members: dict[str, object], at: str, names: tuple[str, ...]) -> None:
    unknown = sorted(set(members) - set(names))
    if unknown:
        raise RequestError(f"unknown member `{at}/{shown(unknown[0])}`; expected {', '.join(names)}")


def string_member(members: dict[str, object], name: str, at: str) -> str:
    """A string member; absent is empty, which the model's checks refuse where it matters."""
    value = members.get(name, "")
    if not isinstance(value, str):
        raise RequestError(f"`{at}/{name}` must be a string")
    return value


def required_string(members: dict[str, object], name: str, at: str) -> str:
    """A string member the body must hold."""
    if name not in members:
        raise RequestError(f"missing `{name}`" if not at else f"missing `{at.lstrip('/')}.{name}`")
    return string_member(members, name, at)


def approval_id_of(body: dict[str, object]) -> str:
    approval_id = required_string(body, "approval_id", "")
    if not APPROVAL_ID.fullmatch(approval_id):
        raise RequestError(f"approval_id must match `{APPROVAL_ID.pattern}`")
    return approval_id


def viewer_of(body: dict[str, object]) -> TrustedContext | None:
    """The reader's context when the body gives one: checked as a runtime's context is."""
    value = body.get("context")
    if value is None:
        return None
    members = _members(value, "/context", _VIEWER)
    principal = _members(members.get("principal", {}), "/context/principal", _PRINCIPAL)
    viewer = TrustedContext(required_string(members, "tenant", "/context"),
                            Principal(string_member(principal, "type", "/context/principal"),
                                      string_member(principal, "id", "/context/principal")),
                            required_string(members, "request_id", "/context"))
    viewer.check()
    return viewer


def wait_seconds_of(body: dict[str, object]) -> float:
    value = body.get("wait_seconds", DEFAULT_WAIT_SECONDS)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_WAIT_SECONDS:
        raise RequestError(f"wait_seconds must be a number from 0 to {MAX_WAIT_SECONDS}")
    return float(value)


def call_story_of(body: dict[str, object]) -> tuple[str, str]:
    """The tenant and call id of a story, each as the model spells them."""
    tenant, call_id = required_string(body, "tenant", ""), required_string(body, "call_id", "")
    if not TENANT.fullmatch(tenant):
        raise RequestError(f"tenant must match `{TENANT.pattern}`")
    if not CALL_ID.fullmatch(call_id):
        raise RequestError(f"call_id must match `{CALL_ID.pattern}`")
    return tenant, call_id


def context_of(value: object) -> TrustedContext:
    if value is None:
        raise RequestError("missing `context`")
    members = _members(value, "/context", _CONTEXT)
    principal = _members(members.get("principal", {}), "/context/principal", _PRINCIPAL)
    entities_json = _entities(members.get("entities"), "/context/entities")
    return TrustedContext(string_member(members, "tenant", "/context"),
                          Principal(string_member(principal, "type", "/context/principal"),
                                    string_member(principal, "id", "/context/principal")),
                          string_member(members, "request_id", "/context"), entities_json)


def _entities(value: object, at: str) -> bytes:
    """The runtime's entities as sent (absent: none)."""
    if not isinstance(value, RawJson):
        return b""
    try:  # the runtime's own text: held to the body's strict rules, handed on as sent
        parse_strict_json(value.data, max_bytes=len(value.data))
    except InputError as exc:
        raise RequestError(f"the request body at `{at}`: {exc.message}") from None
    return value.data


def proposed_call(value: object, at: str = "/call") -> ProposedCall:
    named = at.lstrip("/").replace("/", ".")
    if value is None:
        raise RequestError(f"missing `{named}`")
    members = _members(value, at, _CALL)
    raw_input = members.get("input")
    if not isinstance(raw_input, RawJson):
        raise RequestError(f"missing `{named}.input`: the tool's arguments as a JSON value")
    return ProposedCall(string_member(members, "call_id", at), string_member(members, "name", at), raw_input.data)


def batch_calls(value: object, limits: BatchLimits) -> list[BatchCall]:
    if value is None:
        raise RequestError("missing `calls`")
    if not isinstance(value, list):
        raise RequestError("`/calls` must be a JSON array")
    check_count(len(value), limits)  # before converting what may be a flood of calls
    calls = []
    for k, item in enumerate(value):
        members = _members(item, f"/calls/{k}", _BATCH_CALL)
        calls.append(BatchCall(proposed_call(members.get("call"), f"/calls/{k}/call"),
                               _entities(members.get("entities"), f"/calls/{k}/entities")))
    return calls
