"""`toolauthz catalog import-mcp`: tool file drafts from an upstream MCP server's tools/list.

A draft maps what the server says about a tool; a person reviews it before it is used:

* `inputSchema`/`outputSchema` become `input_schema`/`output_schema` (with `$schema`
  draft 2020-12, MCP's default dialect, when the server names none), and
  `mcp.input_schema_sha256` pins the schema as advertised, so that the catalog's schema
  may later be made stricter without breaking the pin;
* the annotations choose `side_effect`: readOnlyHint → read; destructiveHint → delete
  (or update, a person decides); openWorldHint → communicate; no hint at all → update,
  because MCP presumes an unannotated tool may be destructive; idempotentHint is noted
  in a comment (the catalog has no field for it: the sidecar's call ids make every call
  single-use whatever the tool);
* `resource` is left out (the default, `Tool::"<name>"`), with a comment asking a person
  to choose it.

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
from mcp import Client

from sidecar.mcp_proxy.pins import DRAFT_2020_12, schema_sha256

__all__ = ["Draft", "draft_for", "list_upstream_tools", "write_drafts", "catalog_name"]

_NOT_NAME = re.compile(r"[^a-z0-9_]+")


@dataclass(frozen=True)
class Draft:
    name: str
    file_name: str
    text: str


def catalog_name(upstream_name: str) -> str:
    """The catalog's spelling (`^[a-z][a-z0-9_]{0,63}$`) of an upstream tool name."""
    name = _NOT_NAME.sub("_", upstream_name.lower()).strip("_") or "tool"
    if not name[0].isalpha():
        name = "t_" + name
    return name[:64]


def _side_effect(hints: types.ToolAnnotations | None) -> tuple[str, str]:
    """(side_effect, why) from the tool's annotations."""
    if hints is None or all(getattr(hints, f) is None for f in ("read_only_hint", "destructive_hint",
                                                                 "open_world_hint")):
        return "update", "no annotations: MCP presumes such a tool may be destructive"
    if hints.read_only_hint:
        return "read", "readOnlyHint"
    if hints.destructive_hint is not False:
        return "delete", "destructiveHint (or absent): delete, or update if it only changes things"
    if hints.open_world_hint:
        return "communicate", "openWorldHint: it reaches outside systems"
    return "create", "neither read-only nor destructive: it adds things"


def _with_dialect(schema: dict[str, Any]) -> dict[str, Any]:
    return schema if "$schema" in schema else {"$schema": DRAFT_2020_12, **schema}


def draft_for(tool: types.Tool) -> Draft:
    name = catalog_name(tool.name)
    side_effect, why = _side_effect(tool.annotations)
    document: dict[str, Any] = {"name": name, "description": tool.description or "", "side_effect": side_effect,
                                "input_schema": _with_dialect(dict(tool.input_schema))}
    if tool.output_schema is not None:
        document["output_schema"] = _with_dialect(dict(tool.output_schema))
    pin: dict[str, Any] = {"name": tool.name} if name != tool.name else {}
    pin["input_schema_sha256"] = schema_sha256(dict(tool.input_schema))
    document["mcp"] = pin
    notes = [f"# Draft of `{name}` from an MCP server's tools/list (`toolauthz catalog import-mcp`): review it.",
             f"# side_effect: {side_effect}, from {why}."]
    if tool.annotations is not None and tool.annotations.idempotent_hint is not None:
        notes.append(f"# idempotentHint: {str(tool.annotations.idempotent_hint).lower()} (noted only).")
    notes += ["# resource: choose what the policies decide on, e.g. `resource: {type: Note, id: /note_id}`",
              "# (a string id must be pinned by pattern, enum, const or format: uuid); until then it is",
              f'# Tool::"{name}". Add limits and audit.record as needed.',
              "# mcp: the upstream tool as advertised; `toolauthz mcp-proxy` refuses it if it changes."]
    body = yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=100)
    return Draft(name, f"{name}.yaml", "\n".join(notes) + "\n" + body)


async def list_upstream_tools(upstream: Any) -> list[types.Tool]:
    """Every tool the upstream lists (a URL, StdioServerParameters, or a server object)."""
    tools: list[types.Tool] = []
    async with Client(upstream, mode="legacy", cache=None) as client:
        cursor: str | None = None
        for _ in range(100):
            page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
    return tools


def write_drafts(bundle_dir: pathlib.Path, tools: Iterable[types.Tool], out: TextIO, *, force: bool = False) -> int:
    """Writes `tools/<name>.yaml` for each tool and prints each diff; an existing,
    different file is kept (its diff printed) unless `force`. Returns how many were kept."""
    tools_dir = bundle_dir / "tools"
    tools_dir.mkdir(parents=True, exist_ok=True)
    kept = 0
    for tool in tools:
        draft = draft_for(tool)
        path = tools_dir / draft.file_name
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        if old == draft.text:
            print(f"unchanged: tools/{draft.file_name}", file=out)
            continue
        out.writelines(difflib.unified_diff(old.splitlines(keepends=True), draft.text.splitlines(keepends=True),
                                            f"a/tools/{draft.file_name}", f"b/tools/{draft.file_name}"))
        if old and not force:
            print(f"kept: tools/{draft.file_name} exists and differs (--force overwrites it)", file=out)
            kept += 1
            continue
        path.write_text(draft.text, encoding="utf-8")
        print(f"wrote: tools/{draft.file_name}", file=out)
    return kept
