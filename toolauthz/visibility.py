"""Which catalogued tools a principal could ever be allowed to call: what a tool list
(the MCP gateway's `tools/list`, `resources/list`, `prompts/list`) shows them.

The rule: a tool is visible unless the tool's enforcing policies DENY every call of it
by this principal in this tenant, whatever the call's arguments. Cedar decides it by
partial evaluation with the same policies and static entities as a call: the principal,
the action and the tenant are known; the input (`context.input`), the resource when it
comes from the input, the run counters, the usage and the request id are unknown. Cedar
answers Deny only when no value of the unknowns can be allowed; Allow, or a residual
that depends on them, means some call may be, so the tool is shown. Approval gates count
as allowed (the call can be approved). Partial evaluation is an experimental Cedar
feature: it only previews, every call is still decided in full by Authorize.

Exact for policies whose argument conditions sit in permits: a forbid conditioned on
the arguments (or a permit whose own conditions contradict each other) leaves a residual,
so the tool stays listed although each call may be refused; the list errs on showing,
never on hiding what a call would allow.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import cedarpy

from toolauthz.bundle import Bundle
from toolauthz.engine import trusted_entities
from toolauthz.errors import RequestError
from toolauthz.model import TOOL_NAME, TrustedContext

__all__ = ["visible_tools", "MAX_NAMES"]

MAX_NAMES = 4096  # one request's names: a catalog's worth, bounded
# (bundle version, tenant, principal type, principal id, tool) -> visible. The answer depends
# on nothing else (the bundle's policies and static entities; the version is a hash of the
# files), and partial evaluation costs ~0.4 ms a tool: a list is asked for at every turn.
_CACHE: dict[tuple[str, str, str, str, str], bool] = {}
_CACHE_LIMIT = 1 << 16
_KNOWN_CONTEXT = ("tenant", "side_effect")


def _unknown(name: str) -> dict[str, Any]:
    return {"__extn": {"fn": "unknown", "arg": name}}


def _uid(entity_type: str, entity_id: str) -> str:
    """A Cedar entity uid literal; JSON string escapes that Cedar reads alike (quote,
    backslash), and no control character (Cedar spells those differently)."""
    if any(ord(c) < 0x20 or c == "\x7f" for c in entity_id):
        raise RequestError("the principal id holds a control character")
    return f"{entity_type}::{json.dumps(entity_id, ensure_ascii=False)}"


def visible_tools(bundle: Bundle, ctx: TrustedContext, names: Sequence[str]) -> list[str]:
    """The names, among `names` (in their order, once each), of catalogued tools that some
    call by `ctx.principal` in `ctx.tenant` could be allowed for. RequestError for a
    principal type the bundle does not declare, too many names, or a context Authorize
    would refuse (an empty tenant, a principal id past its pattern: the same names
    everywhere, and no unbounded key in the cache)."""
    ctx.check(require_request_id=False)
    if ctx.principal.type not in bundle.principal_types:
        raise RequestError(f"principal type `{ctx.principal.type}` is not one the bundle declares")
    if len(names) > MAX_NAMES:
        raise RequestError(f"at most {MAX_NAMES} tool names per request")
    principal = _uid(ctx.principal.type, ctx.principal.id)
    visible = []
    for name in dict.fromkeys(names):
        tool_slice = bundle.tools.get(name) if TOOL_NAME.fullmatch(name) else None
        if tool_slice is None or tool_slice.enforcing is None:
            continue
        key = (bundle.version, ctx.tenant, ctx.principal.type, ctx.principal.id, name)
        shown = _CACHE.get(key)
        if shown is None:
            shown = _may_allow(bundle, ctx, principal, tool_slice)
            if len(_CACHE) >= _CACHE_LIMIT:
                _CACHE.clear()  # bounded; a sweep of new principals just refills it
            _CACHE[key] = shown
        if shown:
            visible.append(name)
    return visible


def _may_allow(bundle: Bundle, ctx: TrustedContext, principal: str, tool_slice: Any) -> bool:
    tool = tool_slice.tool
    anchors = [(ctx.principal.type, ctx.principal.id)]
    request: dict[str, Any] = {"principal": principal, "action": f'Action::"tool:{tool.name}"'}
    if tool.resource_pointer is None:  # the resource is the tool itself, known
        anchors.append(("Tool", tool.name))
        request["resource"] = _uid("Tool", tool.name)
    known = {"tenant": ctx.tenant, "side_effect": tool.side_effect}
    declared = tool_slice.context_type[1] if isinstance(tool_slice.context_type, tuple) else {}
    request["context"] = {key: known[key] if key in _KNOWN_CONTEXT else _unknown(key) for key in declared}
    entities = trusted_entities(bundle, ctx.tenant, [], anchors, reach=tool_slice.policy_reach)
    result = cedarpy.is_authorized_partial(request, tool_slice.enforcing, entities)
    if result.decision == cedarpy.Decision.NoDecision and not result.residuals:
        return False  # an input error of the request itself: nothing shown (fail closed)
    return bool(result.decision != cedarpy.Decision.Deny)
