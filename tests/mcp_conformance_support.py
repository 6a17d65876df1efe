"""For tests/test_mcp_conformance.py: the npm tools of tests/conformance/ (installed by
scripts/setup.sh --dev with `npm ci`), the reference server on a port it picked itself,
an allow-all bundle drafted from what the server offers, and the suite's results."""

from __future__ import annotations

import json
import os
import pathlib
import re
from typing import Any

import mcp_types as types
import yaml

from toolauthz.mcp_proxy.pins import schema_sha256

HERE = pathlib.Path(__file__).resolve().parent / "conformance"
NODE = HERE / "node_modules" / ".bin" / "node"  # Node.js 22, pinned by package-lock.json
SUITE = HERE / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
EVERYTHING = HERE / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
DRAFT = "https://json-schema.org/draft/2020-12/schema"
_ECMA_SYNTAX = set("^$\\.*+?()[]{}|/")
_VARIABLE = re.compile(r"\{[+#./;?&]?[A-Za-z0-9_.,*%]+\}")
_LISTEN = "0A"  # the TCP state LISTEN in /proc/net/tcp


def listening_port(pid: int) -> int | None:
    """The TCP port a process listens on, read from /proc (the server was told port 0 and
    does not say which it got)."""
    inodes = set()
    for fd in pathlib.Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in pathlib.Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == _LISTEN and fields[9] in inodes:
                return int(fields[1].rsplit(":", 1)[1], 16)
    return None


def _catalog_name(name: str, taken: set[str]) -> str:
    base = re.sub(r"[^a-z0-9_]", "_", name.lower()).strip("_")[:56] or "x"
    base = base if base[0].isalpha() else f"x_{base}"
    candidate, n = base, 1
    while candidate in taken:
        n += 1
        candidate = f"{base}_{n}"
    taken.add(candidate)
    return candidate


def _ecma_literal(text: str) -> str:
    return "".join("\\" + c if c in _ECMA_SYNTAX else c for c in text)


def template_pattern(template: str) -> str:
    """The URIs of an RFC 6570 template as an ECMA-262 regex (a simple `{var}`: one
    segment, as the gateway routes it)."""
    parts, at = [], 0
    for match in _VARIABLE.finditer(template):
        parts.append(_ecma_literal(template[at:match.start()]))
        parts.append("[^\\/?#]+")
        at = match.end()
    parts.append(_ecma_literal(template[at:]))
    return "^" + "".join(parts) + "$"


def _entry(name: str, description: str | None, schema: dict[str, Any], mcp: dict[str, Any],
           **extra: Any) -> str:
    document = {"name": name, "description": description or "", "side_effect": "read", "input_schema": schema,
                **extra, "mcp": mcp}
    return yaml.safe_dump(document, sort_keys=False)


def allow_all_bundle(root: pathlib.Path, tools: list[types.Tool], resources: list[types.Resource],
                     templates: list[types.ResourceTemplate], prompts: list[types.Prompt]) -> pathlib.Path:
    """A bundle that catalogues everything the server offers and allows every call."""
    (root / "tools").mkdir(parents=True)
    (root / "bundle.yaml").write_text("principal_types: [User]\n")
    (root / "schema.cedarschema").write_text("entity Tenant;\nentity User in [Tenant];\nentity Tool in [Tenant];\n"
                                             "entity Uri in [Tenant];\n")
    (root / "allow_all.cedar").write_text('@id("allow-all")\npermit (principal, action, resource);\n')
    taken: set[str] = set()
    files: dict[str, str] = {}
    for tool in tools:
        name = _catalog_name(tool.name, taken)
        files[name] = _entry(name, tool.description, {"$schema": DRAFT, "type": "object"},
                             {"name": tool.name, "input_schema_sha256": schema_sha256(tool.input_schema)})
    for resource in resources:
        name = _catalog_name(f"resource_{resource.name}", taken)
        schema = {"$schema": DRAFT, "type": "object", "required": ["uri"], "additionalProperties": False,
                  "properties": {"uri": {"type": "string", "const": str(resource.uri)}}}
        files[name] = _entry(name, resource.description, schema, {"kind": "resource", "uri": str(resource.uri)},
                             resource={"type": "Uri", "id": "/uri"})
    for template in templates:
        name = _catalog_name(f"template_{template.name}", taken)
        schema = {"$schema": DRAFT, "type": "object", "required": ["uri"], "additionalProperties": False,
                  "properties": {"uri": {"type": "string", "pattern": template_pattern(template.uri_template)}}}
        files[name] = _entry(name, template.description, schema,
                             {"kind": "resource_template", "uri_template": template.uri_template},
                             resource={"type": "Uri", "id": "/uri"})
    for prompt in prompts:
        name = _catalog_name(f"prompt_{prompt.name}", taken)
        arguments = prompt.arguments or []
        schema = {"$schema": DRAFT, "type": "object", "additionalProperties": False,
                  "properties": {a.name: {"type": "string"} for a in arguments},
                  "required": [a.name for a in arguments if a.required]}
        files[name] = _entry(name, prompt.description, schema, {"kind": "prompt", "name": prompt.name})
    for name, text in files.items():
        (root / "tools" / f"{name}.yaml").write_text(text)
    return root


def scenario_results(output: pathlib.Path) -> dict[str, bool]:
    """Scenario -> passed (no check FAILURE), from the suite's `-o` directory."""
    passed: dict[str, bool] = {}
    for checks in sorted(output.glob("server-*/checks.json")):
        scenario = re.sub(r"-\d{4}-\d{2}-\d{2}T.*$", "", checks.parent.name)[len("server-"):]
        found = json.loads(checks.read_text())
        passed[scenario] = all(c.get("status") != "FAILURE" for c in found)
    return passed
