"""The decision path, steps 1-6: resolve, parse, validate, derive the resource, evaluate
Cedar, interpret. Pure: no storage, no tokens, no gRPC. Each step is a failure boundary
that ends in a DENY with a stable code, never in an ALLOW."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import cedarpy
from jsonschema.exceptions import best_match

from sidecar.bundle import Bundle
from sidecar.bundle.catalog import TOOL_NAME, resolve_pointer
from sidecar.bundle.cedar_schema import project
from sidecar.bundle.entity_graph import UID, entity_references
from sidecar.bundle.loader import ToolSlice
from sidecar.digest import call_digest
from sidecar.display import shown
from sidecar.errors import InputError, RequestError
from sidecar.model import Decision, ErrorDetail, ProposedCall, TrustedContext, Verdict
from sidecar.strict_json import parse_strict_json

MAX_DEPTH = 64
_ERRORED_POLICY = re.compile(r"policy `([^`]*)`")


@dataclass(frozen=True)
class PreparedCall:
    """A call that passed steps 1-4: known tool, strictly parsed and valid input."""

    slice: ToolSlice
    input: Any
    digest: str
    resource_type: str
    resource_id: str

    @property
    def resource(self) -> str:
        return f'{self.resource_type}::"{self.resource_id}"'


@dataclass(frozen=True)
class RunCounts:
    calls: int = 0  # calls already decided in this request_id
    tool_calls: int = 0  # of them, calls of this tool


def prepare(bundle: Bundle, ctx: TrustedContext, call: ProposedCall) -> PreparedCall:
    """Steps 1-4. Raises InputError (a DENY the model can recover from)."""
    if ctx.principal.type not in bundle.principal_types:
        raise RequestError(f"principal type `{ctx.principal.type}` is not one the bundle declares")
    tool_slice = bundle.tools.get(call.name) if TOOL_NAME.fullmatch(call.name) else None
    if tool_slice is None:
        raise InputError("unknown_tool", f"no tool named `{shown(call.name)}` is available")
    tool = tool_slice.tool
    value = parse_strict_json(call.input_json, max_bytes=tool.max_input_bytes, max_depth=MAX_DEPTH)
    # is_valid stops at the first failure; the ranking of every error is only worth its
    # cost when there is one to report.
    error = None if tool.validator.is_valid(value) else best_match(tool.validator.iter_errors(value))
    if error is not None:
        where = "/" + "/".join(str(p) for p in error.absolute_path)
        # Name the pointer and keyword only: jsonschema's own message may quote input values.
        raise InputError("invalid_input", f"input at `{where}` fails `{error.validator}`")
    if tool.resource_pointer is None:
        rtype, rid = "Tool", tool.name
    else:
        _found, raw = resolve_pointer(value, tool.resource_pointer)
        if isinstance(raw, float):  # `integer` accepts 7.0; the id is the canonical "7"
            raw = int(raw)
        rtype, rid = tool.resource_type, str(raw)
    digest = call_digest(tool=tool.name, input=value, principal_type=ctx.principal.type,
                         principal_id=ctx.principal.id, tenant=ctx.tenant, call_id=call.call_id)
    return PreparedCall(tool_slice, value, digest, rtype, rid)


def evaluate(bundle: Bundle, ctx: TrustedContext, prepared: PreparedCall, run: RunCounts,
             entities: cedarpy.Entities) -> Verdict:
    """Steps 5-6: Cedar, then the interpretation of its answer."""
    tool = prepared.slice.tool
    if tool.max_calls_per_run is not None and run.tool_calls >= tool.max_calls_per_run:
        return Verdict(Decision.DENY, errors=(ErrorDetail(
            "limit_exceeded", f"`{tool.name}` may be called at most {tool.max_calls_per_run} times in one run"),))
    if prepared.slice.enforcing is None:
        return Verdict(Decision.DENY, errors=(ErrorDetail("policy_denied", "no policy permits this call"),))
    context = {"input": prepared.input, "tenant": ctx.tenant, "side_effect": tool.side_effect,
               "request_id": ctx.request_id, "run": {"calls": run.calls, "tool_calls": run.tool_calls}}
    request = {
        "principal": {"type": ctx.principal.type, "id": ctx.principal.id},
        "action": {"type": "Action", "id": f"tool:{tool.name}"},
        "resource": {"type": prepared.resource_type, "id": prepared.resource_id},
        # Only what the slice's policies can read: Cedar parses all it is given.
        "context": project(context, prepared.slice.context_type),
    }
    verdict = _interpret(bundle, cedarpy.is_authorized(request, prepared.slice.enforcing, entities))
    if prepared.slice.shadow is not None:
        would = _interpret(bundle, cedarpy.is_authorized(request, prepared.slice.shadow, entities))
        if (would.decision, would.reasons) != (verdict.decision, verdict.reasons):
            shadow = {"decision": would.decision.value, "reasons": list(would.reasons)}
            verdict = Verdict(verdict.decision, verdict.reasons, verdict.errors, verdict.approval_group,
                              verdict.approval_policy, {**verdict.detail, "shadow": shadow})
    return verdict


def _interpret(bundle: Bundle, result: cedarpy.AuthzResult) -> Verdict:
    diag = result.diagnostics
    errored = [m.group(1) for m in map(_ERRORED_POLICY.search, diag.errors) if m]
    errors = tuple(ErrorDetail("policy_error", f"policy `{pid}` could not be evaluated") for pid in errored)
    detail = {"policy_errors": list(diag.errors)} if diag.errors else {}
    # Sorted: Cedar gives its reasons in no fixed order, and a shadow comparison or an
    # audit query must not see two answers where there is one.
    reasons = tuple(sorted(diag.reasons))
    if result.decision == cedarpy.Decision.Deny:
        if reasons:
            return Verdict(Decision.DENY, reasons, errors, detail=detail)
        return Verdict(Decision.DENY, (), errors + (ErrorDetail("policy_denied", "no policy permits this call"),), detail=detail)
    if result.decision != cedarpy.Decision.Allow:
        return Verdict(Decision.DENY, (), errors + (ErrorDetail("evaluation_error", "the policy engine could not evaluate this call"),),
                      detail={**detail, "engine_errors": list(diag.errors)})
    # Cedar skips a policy that errors. A forbid that could not be evaluated must not
    # let a permit through.
    if any(bundle.policies[pid].effect == "forbid" for pid in errored if pid in bundle.policies):
        return Verdict(Decision.DENY, (), errors, detail=detail)
    gated = [pid for pid in reasons if bundle.policies[pid].approval_group]
    if gated:
        return Verdict(Decision.APPROVAL_REQUIRED, reasons, errors,
                       bundle.policies[gated[0]].approval_group, gated[0], detail=detail)
    return Verdict(Decision.ALLOW, reasons, errors, detail=detail)


def request_entities(bundle: Bundle, ctx: TrustedContext, prepared: PreparedCall) -> cedarpy.Entities:
    """Static entities + the runtime's trusted entities, with the principal and the
    resource parented to the caller's tenant."""
    return trusted_entities(bundle, ctx.tenant, ctx.entities_json,
                            [(ctx.principal.type, ctx.principal.id), (prepared.resource_type, prepared.resource_id)],
                            reach=prepared.slice.policy_reach)


def trusted_entities(bundle: Bundle, tenant_id: str, entities_json: bytes, anchors: list[tuple[str, str]],
                     extra: list[dict] = (), reach: frozenset[UID] = frozenset()) -> cedarpy.Entities:
    """The static entities the request can reach + entities a trusted caller vouches for
    + `extra` built by the sidecar itself. Every anchor (principal, resource) gets the
    tenant as a parent; no supplied entity may name another tenant, define a tenant, or
    redefine a static entity. `reach`: the static entities the policies to be evaluated
    name, with all they lead to (ToolSlice.policy_reach)."""
    tenant = {"type": "Tenant", "id": tenant_id}
    by_uid = {}
    for entity in _supplied_entities(entities_json):
        uid = (entity["uid"]["type"], entity["uid"]["id"])
        if uid in bundle.static_uids or uid in by_uid or uid[0] in ("Tenant", "Approval", "Action"):
            raise RequestError(f"entity `{uid[0]}::\"{uid[1]}\"` may not be supplied by the runtime")
        for parent in entity["parents"]:
            if parent.get("type") == "Tenant" and parent.get("id") != tenant_id:
                raise RequestError(f"entity `{uid[0]}::\"{uid[1]}\"` names another tenant")
        by_uid[uid] = entity
    synthesized = []
    for uid in anchors:
        if uid in by_uid:
            if tenant not in by_uid[uid]["parents"]:
                by_uid[uid]["parents"].append(tenant)
        elif uid not in bundle.static_uids and uid not in synthesized and \
                all(e["uid"] != {"type": uid[0], "id": uid[1]} for e in extra):
            synthesized.append(uid)
    # Only what evaluation can reach of the static entities (bundle/entity_graph.py): a
    # copy of all of them made each request cost more the longer entities.json grew.
    seeds = {*anchors, ("Tenant", tenant_id)}
    for entity in (*by_uid.values(), *extra):
        seeds.update(entity_references(entity))
    reach = bundle.static_graph.reach(reach, seeds)
    try:
        entities = _anchored(bundle, tenant_id, tuple(synthesized), reach)
        if extra:
            entities = entities.with_added_json_str(json.dumps(list(extra)))
        if by_uid:
            entities = entities.with_added_json_str(json.dumps(list(by_uid.values())), bundle.entity_schema)
    except ValueError as exc:
        raise RequestError(f"entities_json does not match the schema: {exc}") from None
    return entities


MAX_ANCHORED = 4096


def _anchored(bundle: Bundle, tenant_id: str, uids: tuple[UID, ...], reach: frozenset[UID]) -> cedarpy.Entities:
    """The static entities in `reach` plus an attribute-less entity in the tenant for
    each of `uids` (anchors nobody described), cached on the bundle: calls of one
    session repeat them, and parsing them is most of building a request's entities."""
    key = (tenant_id, uids, reach)
    cached = bundle.anchored_entities.get(key)
    if cached is None:
        tenant = {"type": "Tenant", "id": tenant_id}
        cached = cedarpy.Entities.from_json_str(bundle.static_graph.entities_json(reach), schema=bundle.entity_schema)
        if uids:
            cached = cached.with_added_json_str(json.dumps(
                [{"uid": {"type": t, "id": i}, "attrs": {}, "parents": [tenant]} for t, i in uids]))
        if len(bundle.anchored_entities) >= MAX_ANCHORED:
            bundle.anchored_entities.clear()  # bounded; a sweep of new principals just refills it
        bundle.anchored_entities[key] = cached
    return cached


def _supplied_entities(raw: bytes) -> list[dict]:
    if not raw:
        return []
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise RequestError("entities_json is not valid JSON") from None
    if not isinstance(data, list):
        raise RequestError("entities_json must be a JSON array of Cedar entities")
    for entity in data:
        uid = entity.get("uid") if isinstance(entity, dict) else None
        if not (isinstance(uid, dict) and isinstance(uid.get("type"), str) and isinstance(uid.get("id"), str)):
            raise RequestError("each entity needs a `uid` with string `type` and `id`")
        entity.setdefault("attrs", {})
        entity.setdefault("parents", [])
        if not isinstance(entity["parents"], list) or not all(isinstance(p, dict) for p in entity["parents"]):
            raise RequestError("entity `parents` must be a list of entity references")
    return data


def decide(bundle: Bundle, ctx: TrustedContext, call: ProposedCall, run: RunCounts = RunCounts()) -> Verdict:
    """Steps 1-6 without any storage: for policy tests and local `toolauthz authorize`.
    RequestError still raises (the request itself is unusable)."""
    try:
        prepared = prepare(bundle, ctx, call)
    except InputError as exc:
        return Verdict(Decision.DENY, errors=(ErrorDetail(exc.code, exc.message),))
    return evaluate(bundle, ctx, prepared, run, request_entities(bundle, ctx, prepared))
