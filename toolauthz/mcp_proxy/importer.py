"""`toolauthz catalog import-mcp`: tool file drafts from an upstream MCP server's tools/list.

A draft maps what the server says about a tool; a person reviews it before it is used:

* `inputSchema`/`outputSchema` become `input_schema`/`output_schema` (with `$schema`
  draft 2020-12, MCP's default dialect, when the server names none), and
  `mcp.input_schema_sha256` pins the schema as advertised, so that the catalog's schema
  may later be made stricter without breaking the pin. The draft's `input_schema` gets
  `additionalProperties: false` when the upstream's is a plain object schema that does
  not say otherwise; when it allows more (or composes schemas), a comment says why not;
* the annotations choose `side_effect`, conservatively, with MCP's defaults for a hint
  the server leaves out (readOnlyHint false, destructiveHint true, openWorldHint true):

    | readOnlyHint    | destructiveHint | openWorldHint   | side_effect  |
    |-----------------|-----------------|-----------------|--------------|
    | true            | any             | any             | read         |
    | false or absent | true or absent  | any             | delete       |
    | false or absent | false           | true or absent  | communicate  |
    | false or absent | false           | false           | create       |

  so a tool without annotations is `delete`; idempotentHint is noted in a comment (the
  catalog has no field for it: the sidecar's call ids make every call single-use);
* `resource` is left to a person (the default is `Tool::"<name>"`); the comment suggests
  one from the tool's own schema: a required `<thing>_id` (or `id`) property;
* with `--upstream NAME`, the tool is bound to that upstream of the gateway (`mcp.upstream`)
  and its catalog name takes the upstream's prefix (`crm__lookup_customer`).

Importing again merges (toolauthz/mcp_proxy/tool_merge.py): it updates the pins, the
description and the schemas the server changed, and keeps what a person wrote.

An annotation is the server's own claim, so the draft is a starting point, never a review.
"""

from __future__ import annotations

import difflib
import pathlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TextIO

import mcp_types as types
import yaml
from jsonschema import Draft202012Validator
from mcp import Client

from toolauthz.display.escape import display
from toolauthz.mcp_proxy.pins import DRAFT_2020_12, schema_sha256
from toolauthz.mcp_proxy.tool_merge import merge_tool_file
from toolauthz.model import TOOL_NAME

__all__ = ["Draft", "draft_for", "list_upstream_tools", "write_drafts", "catalog_name", "side_effect_of",
           "resource_hint"]

_NOT_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Draft:
    name: str
    file_name: str
    text: str


def catalog_name(upstream_name: str) -> str:
    """The catalog's spelling (toolauthz.model.TOOL_NAME: MCP's tool-name characters, 1 to
    128) of an upstream tool name: the same name when it is one already."""
    if TOOL_NAME.fullmatch(upstream_name):
        return upstream_name
    return (_NOT_NAME.sub("_", upstream_name).strip("_") or "tool")[:128]


def side_effect_of(hints: types.ToolAnnotations | None) -> tuple[str, str]:
    """(side_effect, why) from the tool's annotations, by the table in the module docstring."""
    read_only = hints.read_only_hint if hints is not None else None
    destructive = hints.destructive_hint if hints is not None else None
    open_world = hints.open_world_hint if hints is not None else None
    if read_only is True:
        return "read", "readOnlyHint"
    if destructive is not False:
        said = "destructiveHint" if destructive else "no destructiveHint: MCP presumes a tool may be destructive"
        return "delete", f"{said} (a person may choose update)"
    if open_world is not False:
        said = "openWorldHint" if open_world else "no openWorldHint: MCP presumes a tool reaches outside systems"
        return "communicate", said
    return "create", "neither read-only, destructive nor open-world: it adds things"


def _with_dialect(schema: dict[str, Any]) -> dict[str, Any]:
    return schema if "$schema" in schema else {"$schema": DRAFT_2020_12, **schema}


_COMPOSING = ("allOf", "anyOf", "oneOf", "$ref", "if", "not", "patternProperties", "unevaluatedProperties",
              "dependentSchemas")


def _closed(schema: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The input schema with `additionalProperties: false` when the upstream's allows it
    (a plain object schema that does not say otherwise), and a note when it does not."""
    if "additionalProperties" in schema:
        if schema["additionalProperties"] is False:
            return schema, ""
        return schema, "the server's schema allows additional properties: not closed (a person may)"
    if schema.get("type") != "object" or any(key in schema for key in _COMPOSING):
        return schema, "not a plain object schema: `additionalProperties: false` left to a person"
    return {**schema, "additionalProperties": False}, ""


_ID_PROPERTY = re.compile(r"^(?:(?P<thing>[A-Za-z][A-Za-z0-9]*)_)?id\Z")
_PINNED_STRING = ("pattern", "enum", "const")


def resource_hint(schema: dict[str, Any]) -> str:
    """A `resource:` line suggested from the schema's first required id-like property."""
    properties = schema.get("properties")
    required = schema.get("required")
    if not isinstance(properties, dict) or not isinstance(required, list):
        required = []
    for name in required:
        match = _ID_PROPERTY.match(name) if isinstance(name, str) else None
        prop = properties.get(name) if match is not None and isinstance(properties, dict) else None
        if match is None or not isinstance(prop, dict):
            continue
        entity = "".join(part.capitalize() for part in (match.group("thing") or "item").split("_") if part)
        pinned = prop.get("type") == "integer" or any(k in prop for k in _PINNED_STRING) or \
            prop.get("format") == "uuid"
        note = "" if pinned else " (pin the id first: a pattern, enum, const or format: uuid)"
        return f"# resource: {{type: {entity}, id: /{name}}}   (from the required `{name}`){note}"
    return "# resource: the schema has no required `<thing>_id` property; choose what the policies decide on"


def draft_for(tool: types.Tool, *, upstream: str | None = None, prefix: str = "") -> Draft:
    name = catalog_name(prefix + catalog_name(tool.name))
    side_effect, why = side_effect_of(tool.annotations)
    input_schema, closed_note = _closed(_with_dialect(dict(tool.input_schema)))
    document: dict[str, Any] = {"name": name, "description": tool.description or "", "side_effect": side_effect,
                                "input_schema": input_schema}
    if tool.output_schema is not None:
        document["output_schema"] = _with_dialect(dict(tool.output_schema))
    pin: dict[str, Any] = {"upstream": upstream} if upstream else {}
    if name != tool.name:
        pin["name"] = tool.name
    pin["input_schema_sha256"] = schema_sha256(dict(tool.input_schema))
    document["mcp"] = pin
    notes = [f"# Draft of `{name}` from an MCP server's tools/list (`toolauthz catalog import-mcp`): review it.",
             f"# side_effect: {side_effect}, from {why}."]
    if tool.annotations is not None and tool.annotations.idempotent_hint is not None:
        notes.append(f"# idempotentHint: {str(tool.annotations.idempotent_hint).lower()} (noted only).")
    if closed_note:
        notes.append(f"# input_schema: {closed_note}.")
    unasserted = sorted(set(_formats(input_schema)) - set(Draft202012Validator.FORMAT_CHECKER.checkers))
    if unasserted:
        shown = ", ".join(f"`{display(fmt[:40])}`" for fmt in unasserted[:5])
        notes.append(f"# input_schema: format {shown} cannot be asserted, so `check` refuses it: replace it with "
                     "`pattern` or remove it (the pin keeps the server's schema).")
    notes += [resource_hint(dict(tool.input_schema)),
              f'# Until a person sets `resource`, it is Tool::"{name}". Add limits and audit.record as needed.',
              "# mcp: the upstream tool as advertised; `toolauthz mcp-proxy` refuses it if it changes."]
    body = yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=100)
    return Draft(name, f"{name}.yaml", "\n".join(notes) + "\n" + body)


def _formats(node: Any) -> list[str]:
    """Every `format` value of a schema (and, harmlessly, of a property named `format`)."""
    if isinstance(node, dict):
        found = [node["format"]] if isinstance(node.get("format"), str) else []
        return found + [fmt for value in node.values() for fmt in _formats(value)]
    if isinstance(node, list):
        return [fmt for value in node for fmt in _formats(value)]
    return []


async def list_upstream_tools(upstream: Any) -> list[types.Tool]:
    """Every tool the upstream lists (a URL, StdioServerParameters, or a server object)."""
    tools: list[types.Tool] = []
    async with Client(upstream, cache=None) as client:
        cursor: str | None = None
        for _ in range(100):
            page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
    return tools


def write_drafts(bundle_dir: pathlib.Path, tools: Iterable[types.Tool], out: TextIO, *, force: bool = False,
                 upstream: str | None = None, prefix: str = "") -> int:
    """Writes `tools/<name>.yaml` for each tool, or merges the draft into the existing
    file (tool_merge.py; `force` overwrites it instead), and prints each diff. Returns
    how many existing files were kept as they were because they could not be merged."""
    tools_dir = bundle_dir / "tools"
    tools_dir.mkdir(parents=True, exist_ok=True)
    kept = 0
    for tool in tools:
        draft = draft_for(tool, upstream=upstream, prefix=prefix)
        path = tools_dir / draft.file_name
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        new, notes = draft.text, tuple[str, ...]()
        if old and not force:
            merged = merge_tool_file(old, draft.text)
            if merged is None:
                print(f"kept: tools/{draft.file_name} is not a YAML mapping; fix it or use --force", file=out)
                kept += 1
                continue
            new, notes = merged.text, merged.notes
        for note in notes:
            print(f"note: tools/{draft.file_name}: {note}", file=out)
        if old == new:
            print(f"unchanged: tools/{draft.file_name}", file=out)
            continue
        out.writelines(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                            f"a/tools/{draft.file_name}", f"b/tools/{draft.file_name}"))
        path.write_text(new, encoding="utf-8")
        print(f"{'merged' if old and not force else 'wrote'}: tools/{draft.file_name}", file=out)
    return kept
