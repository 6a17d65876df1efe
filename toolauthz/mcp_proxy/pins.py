"""What the catalog pinned about each upstream MCP tool, and the drift check.

A tool file pins an upstream tool "as catalogued" by three things:

* its upstream: `mcp.upstream`, one of the gateway's configured upstreams (optional
  when the gateway has one);
* its name upstream: `mcp.name`, or the tool's `name`;
* its description: the upstream `description` must equal the tool's `description`;
* its input schema: when `mcp.input_schema_sha256` is set, the SHA-256 of the upstream
  `inputSchema` in RFC 8785 canonical JSON must equal it (so the catalog's own
  `input_schema` may be stricter than the upstream's); otherwise the upstream
  `inputSchema` must equal the tool's `input_schema`, an absent `$schema` upstream read
  as draft 2020-12 (MCP's default dialect).

The proxy advertises the catalog's description and schemas, never the upstream's.
"""

from __future__ import annotations

import hashlib
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import rfc8785

from toolauthz.errors import BundleError, Problem
from toolauthz.files.tools import check_mcp_block, tool_documents

__all__ = ["PinnedTool", "load_pins", "schema_sha256", "advertised_sha256", "drift", "DRAFT_2020_12"]

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"


@dataclass(frozen=True)
class PinnedTool:
    name: str  # the catalog's (and the sidecar's) name
    upstream_name: str
    description: str
    input_schema: Mapping[str, Any]
    output_schema: Mapping[str, Any] | None
    side_effect: str
    input_schema_sha256: str | None  # the pin of the upstream schema, when the catalog's may differ
    upstream: str | None = None  # `mcp.upstream`: which of the gateway's upstreams serves it
    kind: str = "tool"  # `mcp.kind`: tool, resource, resource_template or prompt (mcp_proxy/governed.py)
    uri: str | None = None  # `mcp.uri` of a resource, `mcp.uri_template` of a resource template

    @property
    def pin(self) -> str:
        """One value for everything the pin compares: a catalog edit of any of it changes it."""
        return schema_sha256({"n": self.upstream_name, "d": self.description, "s": dict(self.input_schema),
                              "h": self.input_schema_sha256 or "", **({"u": self.uri} if self.uri is not None else {})})


def schema_sha256(value: Any) -> str:
    return hashlib.sha256(rfc8785.dumps(value)).hexdigest()


def advertised_sha256(upstream_name: str, description: str | None, input_schema: Mapping[str, Any]) -> str:
    """One digest of what the upstream advertises for a tool, to record next to the pin
    it broke (the upstream's text itself is never recorded); "" when it has no canonical
    JSON form."""
    try:
        return schema_sha256({"n": upstream_name, "d": description or "", "s": dict(input_schema)})
    except (rfc8785.CanonicalizationError, TypeError, ValueError, RecursionError):
        return ""


def drift(tool: PinnedTool, description: str | None, input_schema: Mapping[str, Any]) -> str | None:
    """Why the upstream's advertised tool differs from its pin, or None when it matches.
    The reason names what changed, never the upstream's text."""
    if (description or "") != tool.description:
        return "description"
    try:
        if tool.input_schema_sha256 is not None:
            return None if schema_sha256(dict(input_schema)) == tool.input_schema_sha256 else "input_schema"
        advertised = {"$schema": DRAFT_2020_12, **dict(input_schema)}
        return None if rfc8785.dumps(advertised) == rfc8785.dumps(dict(tool.input_schema)) else "input_schema"
    except (rfc8785.CanonicalizationError, TypeError, ValueError, RecursionError):
        return "input_schema"


def load_pins(bundle: str | pathlib.Path | Mapping[str, bytes]) -> dict[str, PinnedTool]:
    """The pinned tools of a bundle by catalog name: from its tool files as the sidecar
    serves them (`tools/<file>` -> bytes, GetCatalog: the verified bytes it enforces), or
    from a bundle directory (`catalog import-mcp`, tests). BundleError names every file
    it cannot use (the sidecar checks the rest of each file when it loads the bundle)."""
    tools_dir: pathlib.Path | Mapping[str, bytes]
    if isinstance(bundle, Mapping):
        tools_dir = bundle
    else:
        tools_dir = pathlib.Path(bundle) / "tools"
        if not tools_dir.is_dir():
            raise BundleError([Problem(str(tools_dir), "the bundle has no `tools/` directory")])
    problems: list[Problem] = []
    pins: dict[str, PinnedTool] = {}
    upstream_names: dict[tuple[str, str | None, str], str] = {}
    for rel, document in tool_documents(tools_dir, problems):
        tool = _pinned(rel, document, problems)
        if tool is None:
            continue
        pinned_as = (tool.kind, tool.upstream, tool.uri if tool.uri is not None else tool.upstream_name)
        if tool.name in pins or pinned_as in upstream_names:
            problems.append(Problem(rel, f"tool `{tool.name}` is pinned twice", pointer="/name"))
            continue
        pins[tool.name] = tool
        upstream_names[pinned_as] = tool.name
    if problems:
        raise BundleError(problems)
    return pins


def _pinned(rel: str, document: dict[str, Any], problems: list[Problem]) -> PinnedTool | None:
    name, description = document.get("name"), document.get("description", "")
    input_schema, output_schema = document.get("input_schema"), document.get("output_schema")
    before = len(problems)
    if not isinstance(name, str) or not name:
        problems.append(Problem(rel, "a tool file must name its tool (`name`)", pointer="/name"))
    if not isinstance(description, str):
        problems.append(Problem(rel, "description must be a string", pointer="/description"))
    if not isinstance(input_schema, dict):
        problems.append(Problem(rel, "missing JSON Schema", pointer="/input_schema"))
    if output_schema is not None and not isinstance(output_schema, dict):
        problems.append(Problem(rel, "a JSON Schema must be a mapping", pointer="/output_schema"))
    for pointer, message in check_mcp_block(document.get("mcp")):
        problems.append(Problem(rel, message, pointer=pointer))
    if len(problems) > before:
        return None
    assert isinstance(name, str) and isinstance(input_schema, dict)  # checked above
    mcp = document.get("mcp") or {}
    return PinnedTool(name=name, upstream_name=mcp.get("name", name), description=description,
                      input_schema=input_schema, output_schema=output_schema,
                      side_effect=str(document.get("side_effect", "")),
                      input_schema_sha256=mcp.get("input_schema_sha256"), upstream=mcp.get("upstream"),
                      kind=mcp.get("kind", "tool"), uri=mcp.get("uri", mcp.get("uri_template")))
