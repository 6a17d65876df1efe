"""The decision path, steps 1-6: resolve, parse, validate, derive the resource, evaluate
Cedar, interpret. Pure: no storage, no tokens, no gRPC. Each step is a failure boundary
that ends in a DENY with a stable code, never in an ALLOW."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import cedarpy
from jsonschema.exceptions import best_match

from toolauthz.bundle import Bundle
from toolauthz.bundle.catalog import resolve_pointer
from toolauthz.bundle.cedar_schema import APPROVE_ACTION, project
from toolauthz.bundle.entity_graph import UID, entity_references, normalize_entity, parents_of, show_uid, uid_of
from toolauthz.bundle.loader import ToolSlice
from toolauthz.digest import InputLimits, digest_call
from toolauthz.display.escape import shown
from toolauthz.errors import InputError, RequestError
from toolauthz.model import TOOL_NAME, Decision, ErrorDetail, Principal, ProposedCall, TrustedContext, Verdict
from toolauthz.usage.charges import Charge
from toolauthz.usage.metering import charges_of, over_ceiling, usage_context

_ERRORED_POLICY = re.compile(r"policy `([^`]*)`")


@dataclass(frozen=True)
class PreparedCall:
    """A call that passed steps 1-4: known tool, strictly parsed and valid input."""

    slice: ToolSlice
    input: Any
    digest: str
    resource_type: str
    resource_id: str
    # What the call charges to its tool's usage meters (metering.py), in their order.
    charges: tuple[Charge, ...] = ()

    @property
    def resource(self) -> str:
        return resource_uid(self.resource_type, self.resource_id)


def resource_uid(resource_type: str, resource_id: str) -> str:
    """The resource's Cedar uid as the audit, approvals and meters name it."""
    return f'{resource_type}::"{resource_id}"'


@dataclass(frozen=True)
class RunCounts:
    calls: int = 0  # calls of this request_id already allowed or approved
    tool_calls: int = 0  # of them, calls of this tool


def prepare(bundle: Bundle, ctx: TrustedContext, call: ProposedCall) -> PreparedCall:
    """Steps 1-4. Raises InputError (a DENY the model can recover from)."""
    if ctx.principal.type not in bundle.principal_types:
        raise RequestError(f"principal type `{ctx.principal.type}` is not one the bundle declares")
    tool_slice = bundle.tools.get(call.name) if TOOL_NAME.fullmatch(call.name) else None
    if tool_slice is None:
        raise InputError("unknown_tool", f"no tool named `{shown(call.name)}` is available")
    tool = tool_slice.tool
    digested = digest_call(ctx, call, InputLimits(tool.max_input_bytes))
    value = digested.input
    # `accepts` answers with jsonschema-rs where proven equal; the message is always
    # jsonschema's, and ranking every error is only worth its cost when there is one.
    if not tool.accepts(value):
        error = best_match(tool.validator.iter_errors(value))
        if error is None:  # the two validators disagree: still a refusal, never an ALLOW
            raise InputError("invalid_input", "input fails the tool's input schema")
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
        if "\x00" in rid:  # every store keeps the resource as text, and PostgreSQL's holds no NUL
            raise InputError("invalid_input", f"input at `{tool.resource_pointer}` holds a NUL character")
    return PreparedCall(tool_slice, value, digested.digest, rtype, rid,
                        charges_of(tool, ctx, value, resource_uid(rtype, rid)))


def evaluate(bundle: Bundle, ctx: TrustedContext, prepared: PreparedCall, run: RunCounts,
             entities: cedarpy.Entities, usage: Mapping[str, int] | None = None) -> Verdict:
    """Steps 5-6: Cedar, then the interpretation of its answer. `usage`: the value of
    each of the call's meters before it, by meter name (absent: 0)."""
    tool = prepared.slice.tool
    usage = usage or {}
    if tool.max_calls_per_run is not None and run.tool_calls >= tool.max_calls_per_run:
        return Verdict(Decision.DENY, errors=(ErrorDetail(
            "limit_exceeded", f"`{tool.name}` may be called at most {tool.max_calls_per_run} times in one run"),))
    if (overflow := over_ceiling(prepared.charges, usage)) is not None:
        return overflow
    if prepared.slice.enforcing is None:
        return Verdict(Decision.DENY, errors=(ErrorDetail("policy_denied", "no policy permits this call"),))
    context = {"input": prepared.input, "tenant": ctx.tenant, "side_effect": tool.side_effect,
               "request_id": ctx.request_id, "run": {"calls": run.calls, "tool_calls": run.tool_calls},
               "usage": usage_context(prepared.charges, usage)}
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
        return Verdict(Decision.DENY, (), errors + (ErrorDetail("policy_denied", "no policy permits this call"),),
                       detail=detail)
    if result.decision != cedarpy.Decision.Allow:
        unevaluated = ErrorDetail("evaluation_error", "the policy engine could not evaluate this call")
        return Verdict(Decision.DENY, (), errors + (unevaluated,),
                       detail={**detail, "engine_errors": list(diag.errors)})
    # Cedar skips a policy that errors. A forbid that could not be evaluated must not
    # let a permit through.
    if any(bundle.policies[pid].effect == "forbid" for pid in errored if pid in bundle.policies):
        return Verdict(Decision.DENY, (), errors, detail=detail)
    gated = [pid for pid in reasons if bundle.policies[pid].approval_group]
    if gated:
        return Verdict(Decision.APPROVAL_REQUIRED, reasons, errors,
                       bundle.policies[gated[0]].approval_group or "", gated[0], detail=detail)
    return Verdict(Decision.ALLOW, reasons, errors, detail=detail)


def request_entities(bundle: Bundle, ctx: TrustedContext, prepared: PreparedCall,
                     supplied: Sequence[dict[str, Any]]) -> cedarpy.Entities:
    """Static entities + the runtime's trusted entities (`supplied`: `ctx.entities_json`
    read by `supplied_entities`, once per call), with the principal and the resource
    parented to the caller's tenant."""
    return trusted_entities(bundle, ctx.tenant, supplied,
                            [(ctx.principal.type, ctx.principal.id), (prepared.resource_type, prepared.resource_id)],
                            reach=prepared.slice.policy_reach)


def trusted_entities(bundle: Bundle, tenant_id: str, supplied: Sequence[dict[str, Any]], anchors: list[tuple[str, str]],
                     extra: Sequence[dict[str, Any]] = (), reach: frozenset[UID] = frozenset()) -> cedarpy.Entities:
    """The static entities of the request's tenant that it can reach + entities a trusted
    caller vouches for (checked by _check_supplied) + `extra` built by the sidecar itself.
    Every anchor (principal, resource) is inside `Tenant::"<tenant>"`: a supplied one gets
    the tenant as a parent, a shared static one gets it in this request, and one nobody
    describes is built in the tenant, attribute-less. A static entity of another tenant is
    never an anchor: invisible to this tenant, its uid is built afresh like any unknown one,
    so a request can neither use it nor learn that it exists. `reach`: the static entities
    the policies to be evaluated name, with all they lead to (ToolSlice.policy_reach)."""
    graph = bundle.static_graph
    tenant = {"type": "Tenant", "id": tenant_id}
    by_uid: dict[UID, dict[str, Any]] = {}
    for entity in supplied:
        uid = uid_of(entity)
        if uid in by_uid:
            raise RequestError(f"entity `{show_uid(uid)}` is supplied twice")
        _check_supplied(bundle, tenant_id, uid, entity)
        by_uid[uid] = {**entity, "parents": list(entity["parents"])}  # an anchor's gets its tenant below
    built = {uid_of(entity) for entity in extra}
    anchored: list[UID] = []  # anchors the tenant is added to here: shared static ones and unknown ones
    for uid in dict.fromkeys(anchors):
        if uid[0] == "Tenant" and uid[1] != tenant_id:
            raise RequestError(f"`{show_uid(uid)}` cannot be the principal or resource of another tenant's request")
        if uid in by_uid:
            if tenant not in by_uid[uid]["parents"]:
                by_uid[uid]["parents"].append(tenant)
        elif uid not in built and graph.tenant_of(uid) != tenant_id:
            anchored.append(uid)
    # Only what evaluation can reach of the static entities visible to the tenant
    # (bundle/entity_graph.py): a copy of all of them made each request cost more the
    # longer entities.json grew, and another tenant's must never be part of it.
    seeds = {*anchors, ("Tenant", tenant_id)}
    for entity in (*by_uid.values(), *extra):
        seeds.update(entity_references(entity))
    # An entity the sidecar builds (`extra`) stands instead of a static one of its uid.
    reach = graph.reach(reach, seeds, tenant_id) - built
    try:
        entities = _anchored(bundle, tenant_id, tuple(anchored), reach)
        if extra:
            entities = entities.with_added_json_str(json.dumps(list(extra)))
        if by_uid:
            entities = entities.with_added_json_str(json.dumps(list(by_uid.values())), bundle.entity_schema)
    except ValueError as exc:
        raise RequestError(f"entities_json does not match the schema: {exc}") from None
    return entities


RESERVED_TYPES = ("Tenant", "Approval", "Action")


def _check_supplied(bundle: Bundle, tenant_id: str, uid: UID, entity: dict[str, Any]) -> None:
    """The rules for an entity the runtime supplies (normalized: every reference read as
    Cedar reads it). Tenants, approvals and actions are the sidecar's; a static entity the
    tenant sees is the bundle's and is not redefined. The membership of static entities is
    the bundle's too: the only static parent a supplied entity may name is its own tenant,
    or a group bundle.yaml opens to the runtime (`runtime_groups`) that the tenant sees.
    That holds for the static entities of every tenant, whose names the policies share."""
    graph = bundle.static_graph
    if uid[0] in RESERVED_TYPES:
        raise RequestError(f"entity `{show_uid(uid)}` may not be supplied by the runtime: `{uid[0]}` entities are "
                           f"the sidecar's")
    if graph.visible(uid, tenant_id):
        raise RequestError(f"entity `{show_uid(uid)}` may not be supplied by the runtime: the bundle defines it")
    for ref in entity_references(entity):
        if ref[0] == "Tenant" and ref[1] != tenant_id:
            raise RequestError(f"entity `{show_uid(uid)}` names another tenant, `{show_uid(ref)}`")
    for parent in parents_of(entity):
        opened = parent in bundle.runtime_groups and graph.visible(parent, tenant_id)
        if parent in graph and parent != ("Tenant", tenant_id) and not opened:
            raise RequestError(f"entity `{show_uid(uid)}` may not have parent `{show_uid(parent)}`: the members "
                               f"of a static entity are the bundle's (bundle.yaml `runtime_groups` opens a group)")


MAX_ANCHORED = 4096


def _anchored(bundle: Bundle, tenant_id: str, uids: tuple[UID, ...], reach: frozenset[UID]) -> cedarpy.Entities:
    """The static entities in `reach` with each of `uids` (anchors) inside the tenant: a
    shared static one with the tenant added to its parents, any other an attribute-less
    entity in the tenant. Cached on the bundle by tenant, anchors and reach (itself of one
    tenant): calls of one session repeat them, and parsing them is most of building a
    request's entities."""
    key = (tenant_id, uids, reach)
    cached = bundle.anchored_entities.get(key)
    if cached is None:
        graph, tenant = bundle.static_graph, {"type": "Tenant", "id": tenant_id}
        shared = {uid for uid in uids if graph.visible(uid, tenant_id)}
        cached = cedarpy.Entities.from_json_str(graph.entities_json(reach - shared), schema=bundle.entity_schema)
        if uids:
            cached = cached.with_added_json_str(json.dumps(
                [graph.in_tenant(uid, tenant_id) if uid in shared else
                 {"uid": {"type": uid[0], "id": uid[1]}, "attrs": {}, "parents": [tenant]} for uid in uids]))
        if len(bundle.anchored_entities) >= MAX_ANCHORED:
            bundle.anchored_entities.clear()  # bounded; a sweep of new principals just refills it
        bundle.anchored_entities[key] = cached
    return cached


def supplied_entities(raw: bytes) -> list[dict[str, Any]]:
    """The runtime's entities, normalized (entity_graph.normalize_entity): every later
    check reads the uids Cedar will read, and Cedar is given exactly what was checked."""
    if not raw:
        return []
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise RequestError("entities_json is not valid JSON") from None
    if not isinstance(data, list):
        raise RequestError("entities_json must be a JSON array of Cedar entities")
    try:
        return [normalize_entity(entity) for entity in data]
    except ValueError as exc:
        raise RequestError(f"entities_json: {exc}") from None


def decide(bundle: Bundle, ctx: TrustedContext, call: ProposedCall, run: RunCounts = RunCounts(),
           usage: Mapping[str, int] | None = None) -> Verdict:
    """Steps 1-6 without any storage: for policy tests and local `toolauthz authorize`;
    `usage`: the meters' values before the call, by name. RequestError still raises
    (the request itself is unusable)."""
    try:
        prepared = prepare(bundle, ctx, call)
    except InputError as exc:
        return Verdict(Decision.DENY, errors=(ErrorDetail(exc.code, exc.message),))
    return evaluate(bundle, ctx, prepared, run,
                    request_entities(bundle, ctx, prepared, supplied_entities(ctx.entities_json)), usage)


@dataclass(frozen=True)
class ApprovalSubject:
    """What Cedar sees of an approval: `Approval::"<approval_id>"` with these attributes."""

    approval_id: str
    tenant: str
    tool: str
    group: str
    requester: str  # the requester's Cedar uid, e.g. User::"alice"


GROUP_TYPE = "Group"


def proven_approver(bundle: Bundle, approver: TrustedContext, groups: Sequence[str]) -> dict[str, Any]:
    """The approver as an identity provider proved them (a verified ID token): the
    principal inside the approver's tenant, a member of `Group::"<g>"` for each group the
    token names, except a group the bundle gives to another tenant (policies name groups
    without a tenant, so a token of one tenant never joins another tenant's group). Built
    by the sidecar, it replaces any static entity of the same uid: with an identity
    provider, who a person is and which groups they are in is the provider's word."""
    graph = bundle.static_graph
    honoured = [g for g in groups if graph.tenant_of((GROUP_TYPE, g)) in (None, approver.tenant)]
    return {"uid": {"type": approver.principal.type, "id": approver.principal.id}, "attrs": {},
            "parents": [{"type": "Tenant", "id": approver.tenant},
                        *({"type": GROUP_TYPE, "id": g} for g in honoured)]}


def may_approve(bundle: Bundle, approver: TrustedContext, subject: ApprovalSubject,
                proven_groups: Sequence[str] | None = None) -> Verdict:
    """Whether `approver` may decide on `subject`: `Action::"approve"`, read as every
    evaluation is (`_interpret`: an erroring forbid or an answer that is neither Allow nor
    Deny denies). ALLOW, or a DENY with its reasons and errors; never APPROVAL_REQUIRED.
    With `proven_groups` (from a verified ID token) the approver entity is built from
    them alone (`proven_approver`); the approver's `entities_json` must then be empty."""
    if bundle.approve is None:
        return Verdict(Decision.DENY, errors=(ErrorDetail("policy_denied", "no policy permits approving this call"),))
    approval = {"uid": {"type": "Approval", "id": subject.approval_id},
                "attrs": {"tool": subject.tool, "group": subject.group, "tenant": subject.tenant,
                          "requester": subject.requester},
                "parents": [{"type": "Tenant", "id": subject.tenant}]}
    if proven_groups is None:
        entities = trusted_entities(bundle, approver.tenant, supplied_entities(approver.entities_json),
                                    [(approver.principal.type, approver.principal.id)], [approval],
                                    reach=bundle.approve_reach)
    else:
        if approver.entities_json:
            raise RequestError("an approver proven by an ID token supplies no entities")
        home = bundle.static_graph.tenant_of((approver.principal.type, approver.principal.id))
        if home not in (None, approver.tenant):
            # A user the bundle declares in another tenant: whatever a token says, not one of this tenant's.
            return Verdict(Decision.DENY, errors=(ErrorDetail("cross_tenant_approver",
                                                              "the approver is a user of another tenant"),))
        entities = trusted_entities(bundle, approver.tenant, (), [],
                                    [approval, proven_approver(bundle, approver, proven_groups)],
                                    reach=bundle.approve_reach)
    request = {"principal": {"type": approver.principal.type, "id": approver.principal.id},
               "action": {"type": "Action", "id": APPROVE_ACTION},
               "resource": {"type": "Approval", "id": subject.approval_id}, "context": {}}
    verdict = _interpret(bundle, cedarpy.is_authorized(request, bundle.approve, entities))
    if verdict.decision is Decision.APPROVAL_REQUIRED:  # an approval of an approval is not one
        gated = ErrorDetail("policy_denied", "an approver's permit cannot itself ask for approval")
        return Verdict(Decision.DENY, verdict.reasons, verdict.errors + (gated,), detail=verdict.detail)
    return verdict


def approver_refusal(approver: TrustedContext, tenant: str, requester: Principal) -> ErrorDetail | None:
    """The two rules that hold whatever the policies say, before any policy is asked: an
    approver is in the tenant of the call (`cross_tenant`), and a requester never approves
    their own call (`self_approval`). None when neither refuses."""
    if approver.tenant != tenant:
        return ErrorDetail("cross_tenant", "the approver is not in the tenant of the call")
    if approver.principal == requester:
        return ErrorDetail("self_approval", "a requester never approves their own call")
    return None


def approver_verdict(bundle: Bundle, approver: TrustedContext, subject: ApprovalSubject, requester: Principal,
                     proven_groups: Sequence[str] | None = None) -> Verdict:
    """The whole approver check of DecideApproval: `approver_refusal`, then `may_approve`.
    ALLOW, or a DENY whose errors say why. RequestError still raises (the approver's
    entities break a rule)."""
    refusal = approver_refusal(approver, subject.tenant, requester)
    if refusal is not None:
        return Verdict(Decision.DENY, errors=(refusal,))
    return may_approve(bundle, approver, subject, proven_groups)
