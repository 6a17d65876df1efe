"""Reading a bundle's tool files (`tools/*.yaml`, `.yml`, `.json`) into mappings: shared by
the catalog, which checks every field, and the client, which reads only output schemas
and must not load the policy engine to do so."""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Iterator, Mapping
from typing import Any

import yaml

from toolauthz.errors import Problem
from toolauthz.model import TOOL_NAME

SUFFIXES = (".yaml", ".yml", ".json")
# libyaml's safe loader when PyYAML has it (its wheels do): the same documents, read in
# 0.5 s for the 1,000 tool files of the benchmark's largest bundle (pure Python: 3.5 s).
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# The optional `mcp` block of a tool file: how `toolauthz mcp-proxy` pins the upstream tool
# (see toolauthz/mcp_proxy/pins.py). Checked here so that `check` and the proxy agree.
_MCP_KEYS = {"name", "input_schema_sha256", "upstream", "kind", "uri", "uri_template"}
# What an `mcp` block pins: an upstream tool (the default), one resource by its exact URI,
# the resources of one URI template, or a prompt (toolauthz/mcp_proxy/governed.py).
MCP_KINDS = ("tool", "resource", "resource_template", "prompt")
_MAX_URI = 2048
UPSTREAM_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}\Z")  # an upstream of the MCP gateway
_SHA256 = re.compile(r"^[0-9a-f]{64}\Z")


def tool_documents(tools: pathlib.Path | Mapping[str, bytes],
                   problems: list[Problem]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(`tools/<file>`, its mapping) for each tool file in name order; a file that cannot
    be read or parsed, or holds no mapping, is a problem instead. `tools` is the tool
    files already read (`tools/<file>` -> bytes: a verified bundle snapshot's), or a
    directory the caller checked exists, read here."""
    if isinstance(tools, pathlib.Path):
        for path in sorted(p for p in tools.iterdir() if p.suffix in SUFFIXES):
            rel = f"tools/{path.name}"
            try:
                data = path.read_bytes()
            except OSError as exc:
                problems.append(Problem(rel, f"cannot read file: {exc}"))
                continue
            document = _parse_document(data, rel, problems)
            if document is not None:
                yield rel, document
        return
    for rel in sorted(tools):
        if rel.startswith("tools/") and rel.count("/") == 1 and rel.endswith(SUFFIXES):
            document = _parse_document(tools[rel], rel, problems)
            if document is not None:
                yield rel, document


def _parse_document(data: bytes, rel: str, problems: list[Problem]) -> dict[str, Any] | None:
    try:
        text = data.decode("utf-8")
        parsed = json.loads(text) if rel.endswith(".json") else yaml.load(text, Loader=_YAML_LOADER)
    except UnicodeDecodeError as exc:
        problems.append(Problem(rel, f"cannot read file: {exc}"))
        return None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        problems.append(Problem(rel, f"cannot parse YAML: {getattr(exc, 'problem', None) or exc}", line, col))
        return None
    except json.JSONDecodeError as exc:
        problems.append(Problem(rel, f"cannot parse JSON: {exc.msg}", exc.lineno, exc.colno))
        return None
    except RecursionError:
        problems.append(Problem(rel, "cannot parse: nested too deeply"))
        return None
    if not isinstance(parsed, dict):
        problems.append(Problem(rel, "a tool file must hold a mapping"))
        return None
    return parsed


def check_mcp_block(raw: Any) -> list[tuple[str, str]]:
    """Problems of a tool file's optional `mcp` block as (pointer, message)."""
    if raw is None:
        return []
    if not isinstance(raw, dict):
        return [("/mcp", "`mcp` must be a mapping")]
    found = [(f"/mcp/{key}", f"unknown key `{key}`") for key in sorted(set(raw) - _MCP_KEYS)]
    name = raw.get("name")
    if name is not None and (not isinstance(name, str) or not TOOL_NAME.fullmatch(name)):
        found.append(("/mcp/name", "`mcp.name` must be the upstream tool name (1-128 of A-Z a-z 0-9 _ - .)"))
    upstream = raw.get("upstream")
    if upstream is not None and (not isinstance(upstream, str) or not UPSTREAM_NAME.fullmatch(upstream)):
        found.append(("/mcp/upstream", "`mcp.upstream` must name an upstream of the gateway's configuration "
                                       "(a-z 0-9 _ -, 1 to 32 characters, starting with a letter)"))
    found.extend(_kind_problems(raw))
    digest = raw.get("input_schema_sha256")
    if digest is not None and (not isinstance(digest, str) or not _SHA256.fullmatch(digest)):
        found.append(("/mcp/input_schema_sha256", "`mcp.input_schema_sha256` must be 64 lowercase hex digits"))
    return found


def _kind_problems(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """`kind` and the key it needs: `uri` for a resource, `uri_template` for a template."""
    kind = raw.get("kind", "tool")
    if kind not in MCP_KINDS:
        return [("/mcp/kind", f"`mcp.kind` must be one of {', '.join(MCP_KINDS)}")]
    found = []
    for key, needed_by in (("uri", "resource"), ("uri_template", "resource_template")):
        value = raw.get(key)
        if kind == needed_by and value is None:
            found.append((f"/mcp/{key}", f"`mcp.kind: {kind}` needs `mcp.{key}`"))
        elif value is not None and kind != needed_by:
            found.append((f"/mcp/{key}", f"`mcp.{key}` belongs to `mcp.kind: {needed_by}` only"))
        elif value is not None and (not isinstance(value, str) or not 0 < len(value) <= _MAX_URI):
            found.append((f"/mcp/{key}", f"`mcp.{key}` must be 1 to {_MAX_URI} characters"))
    return found
