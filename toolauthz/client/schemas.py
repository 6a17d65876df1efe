"""What the runtime reads of a bundle's tool files: output schemas (checked by the Guard),
side effects (which calls of a turn may run at once) and input limits (enforced while
arguments stream).

    tools = ToolSet(output_schemas=load_output_schemas("policies"),
                    side_effects=load_side_effects("policies"))

It reads the files the sidecar's catalog reads (`tools/*.yaml`, `.yml`, `.json`) with
YAML and jsonschema only: a runtime that calls the sidecar loads no policy engine. It
checks only what it uses (the tool's `name` and its `output_schema`); the sidecar
checks the rest of each file when it loads the bundle. Anything it cannot use fails
loudly, as a BundleError naming the file, never as a tool without its output check.
"""

from __future__ import annotations

import pathlib
from typing import Any

import jsonschema
from jsonschema import Draft7Validator, Draft201909Validator, Draft202012Validator

from toolauthz.errors import BundleError, Problem
from toolauthz.files.tools import tool_documents

__all__ = ["load_output_schemas", "input_limits", "load_side_effects"]

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
_VALIDATORS: dict[str, Any] = {
    DRAFT_2020_12: Draft202012Validator, DRAFT_2020_12 + "#": Draft202012Validator,
    "https://json-schema.org/draft/2019-09/schema": Draft201909Validator,
    "https://json-schema.org/draft/2019-09/schema#": Draft201909Validator,
    "http://json-schema.org/draft-07/schema": Draft7Validator,
    "http://json-schema.org/draft-07/schema#": Draft7Validator,
}


def output_validator_class(schema: Any) -> Any:
    """The jsonschema class of the dialect a schema declares (2020-12 when it declares
    none, as MCP reads it), or None for any other declared dialect."""
    declared = schema.get("$schema", DRAFT_2020_12) if isinstance(schema, dict) else None
    return _VALIDATORS.get(declared) if isinstance(declared, str) else None


def load_output_schemas(bundle_dir: str | pathlib.Path) -> dict[str, dict[str, Any]]:
    """The `output_schema` of every tool in `bundle_dir/tools/` that declares one, by
    tool name. Raises BundleError listing every file it cannot use."""
    tools_dir = pathlib.Path(bundle_dir) / "tools"
    if not tools_dir.is_dir():
        raise BundleError([Problem(str(tools_dir), "the bundle has no `tools/` directory")])
    problems: list[Problem] = []
    schemas: dict[str, dict[str, Any]] = {}
    sources: dict[str, str] = {}
    for rel, document in tool_documents(tools_dir, problems):
        name = document.get("name")
        if not isinstance(name, str) or not name:
            problems.append(Problem(rel, "a tool file must name its tool (`name`)", pointer="/name"))
            continue
        if name in sources:
            problems.append(Problem(rel, f"duplicate tool name `{name}` (also in {sources[name]})", pointer="/name"))
            continue
        sources[name] = rel
        schema = _output_schema(document.get("output_schema"), rel, problems)
        if schema is not None:
            schemas[name] = schema
    if problems:
        raise BundleError(problems)
    return schemas


def _output_schema(schema: Any, rel: str, problems: list[Problem]) -> dict[str, Any] | None:
    """The schema, or None when the tool declares none (or, with a problem, a bad one)."""
    if schema is None:
        return None
    pointer = "/output_schema"
    if not isinstance(schema, dict):
        problems.append(Problem(rel, "a JSON Schema must be a mapping", pointer=pointer))
        return None
    # The Guard validates under the dialect the schema declares (2020-12, 2019-09 or
    # draft-07): read with another draft's rules, it would not mean what its author meant.
    dialect = output_validator_class(schema)
    if dialect is None or "$schema" not in schema:
        message = f"the schema must declare `$schema`: {DRAFT_2020_12} (or 2019-09, draft-07)"
        problems.append(Problem(rel, message, pointer=f"{pointer}/$schema"))
        return None
    try:
        dialect.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = pointer + "".join(f"/{p}" for p in exc.path)
        problems.append(Problem(rel, f"invalid JSON Schema: {exc.message}", pointer=where))
        return None
    return schema


def input_limits(bundle_dir: str | pathlib.Path) -> dict[str, int]:
    """Each tool's `limits.max_input_bytes`, by name (client/streaming.py enforces it while
    the arguments stream); a tool without one gets the assembly's default."""
    limits: dict[str, int] = {}
    for name, raw in _fields(bundle_dir, "limits").items():
        value = raw.get("max_input_bytes") if isinstance(raw, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            limits[name] = value
    return limits


def _fields(bundle_dir: str | pathlib.Path, key: str) -> dict[str, Any]:
    """One top-level field of every tool file that has it, by tool name (the sidecar checks
    the rest of each file when it loads the bundle)."""
    tools_dir = pathlib.Path(bundle_dir) / "tools"
    if not tools_dir.is_dir():
        raise BundleError([Problem(str(tools_dir), "the bundle has no `tools/` directory")])
    problems: list[Problem] = []
    found: dict[str, Any] = {}
    for _rel, document in tool_documents(tools_dir, problems):
        name = document.get("name")
        if isinstance(name, str) and key in document:
            found[name] = document[key]
    if problems:
        raise BundleError(problems)
    return found


def load_side_effects(bundle_dir: str | pathlib.Path) -> dict[str, str]:
    """Each tool's `side_effect` (read, create, update, delete, communicate, purchase), by
    name: `ToolSet(side_effects=...)` lets the calls of `read` tools of one turn run at once."""
    return {name: value for name, value in _fields(bundle_dir, "side_effect").items() if isinstance(value, str)}
