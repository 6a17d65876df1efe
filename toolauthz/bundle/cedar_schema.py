"""Cedar actions generated from the tool catalog, and the context each action sees.

One action `tool:<name>` per tool. Its context is `{input, tenant, side_effect,
request_id, run: {calls, tool_calls}, usage: {<meter>: Long, ...}}`, where `input` is
typed from the tool's JSON Schema and `usage` has one attribute per meter of the tool
(bundle/meters.py), so that a policy reading a misspelt attribute or another tool's
meter fails validation at load time.

JSON Schema -> Cedar mapping (anything else is left out of `context.input`, so a
policy cannot read it and validation says so):
  object with properties -> record (properties not in `required` become optional)
  string, enum/const of strings -> String
  integer, enum/const of integers -> Long
  boolean -> Bool
  array with `items` of a mappable type -> Set<T>
Not mapped: number (Cedar has no floats), null, type lists, oneOf/anyOf/allOf,
objects without `properties` (free-form maps), tuples (`prefixItems`).

MCP resources and prompts (a tool file with `mcp.kind`, toolauthz/mcp_proxy/governed.py)
are catalog entries like tools, so they get the same shape: `tool:<name>` for a
`resources/read` of a resource or template entry, whose context is
`{input: {uri: String}, ...}` and whose resource is what the entry's `resource` makes of
the URI (`resource: {type: Doc, id: /uri}`: `Doc::"note://readme"`); and `tool:<name>` for
a `prompts/get`, whose `context.input` holds the prompt's arguments (Strings):

    permit (principal, action == Action::"tool:notes__readme", resource);
    forbid (principal, action == Action::"tool:notes__note_file", resource)
      when { context.input.uri like "note://notes/a*" };
    permit (principal in Group::"editors", action == Action::"tool:notes__summarize", resource);

What a list shows a principal (toolauthz/visibility.py) is decided from these same
actions by partial evaluation: no separate action to write.
"""

from __future__ import annotations

import json
from typing import Any

from toolauthz.bundle.catalog import Tool

# A Cedar type as a small tree: ("String"|"Long"|"Bool") | ("Set", t) | ("Record", {name: (t, required)})
CedarType = Any


def cedar_type(schema: Any) -> CedarType | None:
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    if kind is None:
        literals = schema.get("enum", [schema["const"]] if "const" in schema else None)
        if literals:
            if all(isinstance(v, str) for v in literals):
                kind = "string"
            elif all(isinstance(v, int) and not isinstance(v, bool) for v in literals):
                kind = "integer"
    if kind == "string":
        return "String"
    if kind == "integer":
        return "Long"
    if kind == "boolean":
        return "Bool"
    if kind == "array":
        item = cedar_type(schema.get("items"))
        return ("Set", item) if item is not None else None
    if kind == "object" and isinstance(schema.get("properties"), dict):
        required = set(schema.get("required", []))
        fields = {}
        for name, sub in schema["properties"].items():
            mapped = cedar_type(sub)
            if mapped is not None:
                fields[name] = (mapped, name in required)
        return ("Record", fields)
    return None


def render_type(t: CedarType, indent: str = "") -> str:
    if isinstance(t, str):
        return t
    if t[0] == "Set":
        return f"Set<{render_type(t[1], indent)}>"
    inner = indent + "  "
    lines = [f"{inner}{json.dumps(name)}{'' if req else '?'}: {render_type(sub, inner)}"
             for name, (sub, req) in t[1].items()]
    return "{\n" + ",\n".join(lines) + f"\n{indent}}}" if lines else "{}"


APPROVE_ACTION = "approve"


def approval_declarations(principal_types: list[str]) -> str:
    """`Action::"approve"` on `Approval::"<id>"`: who may approve is decided by Cedar too."""
    return (
        "entity Approval in [Tenant] {\n  \"tool\": String,\n  \"group\": String,\n"
        "  \"tenant\": String,\n  \"requester\": String\n};\n"
        f"action {json.dumps(APPROVE_ACTION)} appliesTo {{\n  principal: [{', '.join(principal_types)}],\n"
        "  resource: [Approval],\n  context: {}\n};\n"
    )


def input_type(tool: Tool) -> CedarType:
    """What `context.input` is for this tool."""
    return cedar_type(tool.input_schema) or ("Record", {})


def context_type(tool_input: CedarType, meters: tuple[str, ...] = ()) -> CedarType:
    """The context of a `tool:<name>` action, as declared and as sent to Cedar;
    `meters`: the names of the tool's usage meters."""
    run = ("Record", {"calls": ("Long", True), "tool_calls": ("Long", True)})
    usage = ("Record", {name: ("Long", True) for name in meters})
    return ("Record", {"input": (tool_input, True), "tenant": ("String", True), "side_effect": ("String", True),
                       "request_id": ("String", True), "run": (run, True), "usage": (usage, True)})


def tool_context_type(tool: Tool) -> CedarType:
    """`context_type` of one tool."""
    return context_type(input_type(tool), tuple(meter.name for meter in tool.meters))


def action_declarations(tools: dict[str, Tool], principal_types: list[str]) -> str:
    out = []
    for tool in tools.values():
        out.append(
            f"action {json.dumps('tool:' + tool.name)} appliesTo {{\n"
            f"  principal: [{', '.join(principal_types)}],\n"
            f"  resource: [{tool.resource_type}],\n"
            f"  context: {render_type(tool_context_type(tool), '  ')}\n"
            f"}};"
        )
    return "\n".join(out) + "\n"


def project(value: Any, t: CedarType) -> Any:
    """The part of a validated input that the Cedar type describes, as Cedar values.

    Runs per request: the input already passed the JSON Schema, so this only drops what
    the mapping leaves out and turns integral floats (`1.0`, valid for `integer`) into ints.
    """
    if t == "Long":
        return int(value)
    if isinstance(t, str):
        return value
    if t[0] == "Set":
        return [project(v, t[1]) for v in value]
    return {name: project(value[name], sub) for name, (sub, _req) in t[1].items() if name in value}
