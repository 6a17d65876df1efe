"""The output schemas of a bundle's tools, read for the Guard.

    tools = ToolSet(output_schemas=load_output_schemas("policies"))

It reads the files the sidecar's catalog reads (`tools/*.yaml`, `.yml`, `.json`) with
YAML and jsonschema only: a runtime that calls the sidecar loads no policy engine. It
checks only what it uses (the tool's `name` and its `output_schema`); the sidecar
checks the rest of each file when it loads the bundle. Anything it cannot use fails
loudly, as a BundleError naming the file, never as a tool without its output check.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import jsonschema
import yaml
from jsonschema import Draft202012Validator

from sidecar.errors import BundleError, Problem

__all__ = ["load_output_schemas"]

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
_SUFFIXES = (".yaml", ".yml", ".json")
# libyaml's safe loader when PyYAML has it, as the catalog does: the same documents.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_output_schemas(bundle_dir: str | pathlib.Path) -> dict[str, dict[str, Any]]:
    """The `output_schema` of every tool in `bundle_dir/tools/` that declares one, by
    tool name. Raises BundleError listing every file it cannot use."""
    tools_dir = pathlib.Path(bundle_dir) / "tools"
    if not tools_dir.is_dir():
        raise BundleError([Problem(str(tools_dir), "the bundle has no `tools/` directory")])
    problems: list[Problem] = []
    schemas: dict[str, dict[str, Any]] = {}
    sources: dict[str, str] = {}
    for path in sorted(p for p in tools_dir.iterdir() if p.suffix in _SUFFIXES):
        rel = f"tools/{path.name}"
        document = _read_document(path, rel, problems)
        if document is None:
            continue
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


def _read_document(path: pathlib.Path, rel: str, problems: list[Problem]) -> dict[str, Any] | None:
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.load(text, Loader=_YAML_LOADER)
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(Problem(rel, f"cannot read file: {exc}"))
        return None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line, column = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        problems.append(Problem(rel, f"cannot parse YAML: {getattr(exc, 'problem', None) or exc}", line, column))
        return None
    except json.JSONDecodeError as exc:
        problems.append(Problem(rel, f"cannot parse JSON: {exc.msg}", exc.lineno, exc.colno))
        return None
    if not isinstance(data, dict):
        problems.append(Problem(rel, "a tool file must hold a mapping"))
        return None
    return data


def _output_schema(schema: Any, rel: str, problems: list[Problem]) -> dict[str, Any] | None:
    """The schema, or None when the tool declares none (or, with a problem, a bad one)."""
    if schema is None:
        return None
    pointer = "/output_schema"
    if not isinstance(schema, dict):
        problems.append(Problem(rel, "a JSON Schema must be a mapping", pointer=pointer))
        return None
    # The Guard validates with draft 2020-12: a schema written for another draft would
    # be read with other rules than its author meant.
    if schema.get("$schema") != DRAFT_2020_12:
        message = f"the schema must declare `$schema: {DRAFT_2020_12}`"
        problems.append(Problem(rel, message, pointer=f"{pointer}/$schema"))
        return None
    try:
        Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = pointer + "".join(f"/{p}" for p in exc.path)
        problems.append(Problem(rel, f"invalid JSON Schema: {exc.message}", pointer=where))
        return None
    return schema
