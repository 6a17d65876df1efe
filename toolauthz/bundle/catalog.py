"""The tool catalog: `tools/*.yaml` (or .json), one file per tool, the single source of
truth for the tool's schema, resource mapping, limits and audit allow-list."""

from __future__ import annotations

import json
import logging
import pathlib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import jsonschema.protocols
import jsonschema.validators
from jsonschema import Draft202012Validator, FormatChecker

from toolauthz.bundle.dialects import DIALECTS, DRAFT_07, DRAFT_2019_09, DRAFT_2020_12, NotTranslatable, to_2020_12
from toolauthz.bundle.ecma_regex import NotEcmaRegex, UnknownSchemaPlace, is_ecma_regex
from toolauthz.bundle.ecma_schema import ecma_schema
from toolauthz.bundle.entity_graph import ENTITY_TYPE_NAME
from toolauthz.bundle.fast_schema import fast_validator
from toolauthz.bundle.meters import Meter, parse_usage
from toolauthz.bundle.tool_fields import MAX_RETENTION_SECONDS, parse_duration, pinned_key_problem, schema_at
from toolauthz.display.escape import shown
from toolauthz.display.hints import DisplayHint, parse_display
from toolauthz.errors import Problem
from toolauthz.files.tools import check_mcp_block, tool_documents
from toolauthz.model import TOOL_NAME

SIDE_EFFECTS = ("read", "create", "update", "delete", "communicate", "purchase")
ENTITY_TYPE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
DEFAULT_MAX_INPUT_BYTES = 65536
MAX_INPUT_BYTES_CEILING = 1 << 20


def _ecma_format_checker() -> FormatChecker:
    """Draft 2020-12's format checker, with `format: regex` read as ECMA-262 (a value
    this sidecar cannot read as ECMA-262 does is not a regex to it): the metaschema
    asks it of every `pattern` and `patternProperties` name, and an input may too."""
    checker = FormatChecker(())
    checker.checkers = dict(Draft202012Validator.FORMAT_CHECKER.checkers)
    checker.checks("regex", raises=NotEcmaRegex)(is_ecma_regex)
    return checker


_FORMAT_CHECKER = _ecma_format_checker()
log = logging.getLogger(__name__)
_KNOWN_KEYS = {"name", "description", "side_effect", "input_schema", "output_schema",
               "resource", "limits", "audit", "mcp", "display", "usage"}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    side_effect: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    resource_type: str  # Cedar entity type of the resource
    resource_pointer: str | None  # JSON pointer into the input; None means Tool::"<name>"
    max_input_bytes: int
    max_calls_per_run: int | None
    audit_fields: tuple[str, ...]  # JSON pointers recorded in clear
    source: str  # file name, for messages
    validator: jsonschema.protocols.Validator = field(repr=False, compare=False)  # the reference; writes errors
    # Attributes of runtime-supplied entities recorded in the audit, by entity type:
    # JSON pointers into the entity's `attrs` (`audit.record_entities`). Any other
    # attribute is never stored; every entity's uid is.
    audit_entities: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # jsonschema-rs where it is proven to decide as `validator` (bundle/fast_schema.py),
    # else None and `schema_engine` says why.
    fast_validator: Any = field(default=None, repr=False, compare=False)
    schema_engine: str = "jsonschema"
    # How people see the arguments (`display`, toolauthz/display/hints.py); `show: true`
    # allow-lists a field for approvers.
    display: Mapping[str, DisplayHint] = field(default_factory=dict)

    @property
    def approver_fields(self) -> tuple[str, ...]:
        """The arguments approvers may see: `audit.record` and `display` with `show: true`."""
        shown = [p for p, hint in self.display.items() if hint.show and p not in self.audit_fields]
        return (*self.audit_fields, *sorted(shown))
    # `audit.retain_input`: keep each call's input (encrypted) this many seconds for
    # `toolauthz policy impact`; None: never kept.
    retain_input_seconds: int | None = None
    # `usage`: the meters a call of this tool charges, read by policies in
    # `context.usage` (bundle/meters.py).
    meters: tuple[Meter, ...] = ()

    def accepts(self, value: Any) -> bool:
        """Whether the parsed input is valid against the input schema."""
        checker = self.fast_validator if self.fast_validator is not None else self.validator
        valid: bool = checker.is_valid(value)
        return valid


def load_catalog(tools_dir: pathlib.Path | Mapping[str, bytes], problems: list[Problem]) -> dict[str, Tool]:
    """The tools of a bundle: from its tool files already read (`tools/<file>` -> bytes,
    a snapshot's), or from a `tools/` directory."""
    tools: dict[str, Tool] = {}
    if isinstance(tools_dir, pathlib.Path) and not tools_dir.is_dir():
        problems.append(Problem(str(tools_dir), "the bundle has no `tools/` directory"))
        return tools
    for rel, raw in tool_documents(tools_dir, problems):
        tool = _parse_tool(raw, rel, problems)
        if tool is None:
            continue
        if tool.name in tools:
            problems.append(Problem(rel, f"duplicate tool name `{tool.name}` (also in {tools[tool.name].source})",
                                    pointer="/name"))
            continue
        # Names that differ only in case are two tools to Cedar and the ledger but one to a
        # reader (and to a case-insensitive file system): refused.
        twin = next((other for other in tools.values() if other.name.lower() == tool.name.lower()), None)
        if twin is not None:
            problems.append(Problem(rel, f"tool name `{tool.name}` differs from `{twin.name}` (in {twin.source}) "
                                         "only in case", pointer="/name"))
            continue
        tools[tool.name] = tool
        if tool.fast_validator is None:
            log.info("tool `%s`: input checked by %s", tool.name, tool.schema_engine)
    return tools


def reference_validator(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    """`jsonschema`'s Draft 2020-12 validator of `schema` with every regex read as
    ECMA-262, as JSON Schema defines it (bundle/ecma_regex.py). `schema` has passed
    `_check_schema`, which refuses a regex that cannot be read so."""
    validator: jsonschema.protocols.Validator = Draft202012Validator(ecma_schema(schema),
                                                                     format_checker=_FORMAT_CHECKER)
    return validator


def _parse_tool(raw: dict[str, Any], rel: str, problems: list[Problem]) -> Tool | None:
    before = len(problems)

    def bad(pointer: str, message: str) -> None:
        problems.append(Problem(rel, message, pointer=pointer))

    for key in sorted(set(raw) - _KNOWN_KEYS):
        bad(f"/{key}", f"unknown key `{key}`")
    for mcp_pointer, mcp_problem in check_mcp_block(raw.get("mcp")):
        bad(mcp_pointer, mcp_problem)
    name = raw.get("name")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        bad("/name", "tool name must be 1-128 of A-Z a-z 0-9 _ - . (MCP's tool-name characters)")
    description = raw.get("description", "")
    if not isinstance(description, str):
        bad("/description", "description must be a string")
    side_effect = raw.get("side_effect")
    if side_effect not in SIDE_EFFECTS:
        bad("/side_effect", f"unknown side-effect class `{side_effect}`; expected one of {', '.join(SIDE_EFFECTS)}")

    input_schema = _check_schema(raw.get("input_schema"), "/input_schema", bad, required=True)
    output_schema = _check_schema(raw.get("output_schema"), "/output_schema", bad, required=False)
    if input_schema is not None and input_schema.get("type") != "object":
        bad("/input_schema/type", "input_schema must describe an object (`type: object`)")

    resource_type, pointer = _parse_resource(raw.get("resource"), input_schema, bad)
    max_bytes, max_calls = _parse_limits(raw.get("limits"), bad)
    audit_fields = _parse_audit(raw.get("audit"), input_schema, bad)
    audit_entities = _parse_audit_entities(raw.get("audit"), bad)
    hints = parse_display(raw.get("display"),
                          lambda ptr: schema_at(input_schema, ptr)[0] if input_schema is not None else None, bad)
    retain = _parse_retention(raw.get("audit"), bad)
    meters = parse_usage(raw.get("usage"), input_schema, bad)

    if len(problems) > before or input_schema is None:
        return None
    assert isinstance(name, str) and isinstance(side_effect, str)  # checked above: a problem otherwise
    fast, unproven = fast_validator(input_schema, _FORMAT_CHECKER)
    return Tool(
        name=name, description=description, side_effect=side_effect,
        input_schema=input_schema, output_schema=output_schema,
        resource_type=resource_type, resource_pointer=pointer,
        max_input_bytes=max_bytes, max_calls_per_run=max_calls,
        audit_fields=audit_fields, audit_entities=audit_entities, source=rel,
        validator=reference_validator(input_schema),
        fast_validator=fast, schema_engine="jsonschema-rs" if fast is not None else f"jsonschema: {unproven}",
        display=hints,
        retain_input_seconds=retain,
        meters=meters,
    )


Complain = Callable[[str, str], None]  # (JSON pointer, message): records a problem


def _check_schema(schema: Any, pointer: str, bad: Complain, *, required: bool) -> dict[str, Any] | None:
    if schema is None:
        if required:
            bad(pointer, "missing JSON Schema")
        return None
    if not isinstance(schema, dict):
        bad(pointer, "a JSON Schema must be a mapping")
        return None
    declared = schema.get("$schema")
    dialect = DIALECTS.get(declared) if isinstance(declared, str) else None
    if dialect is None:
        bad(f"{pointer}/$schema", f"the schema must declare `$schema`: {DRAFT_2020_12} (or {DRAFT_2019_09}, "
                                  f"{DRAFT_07}#)")
        return None
    try:
        _check_against_metaschema(schema)
    except jsonschema.SchemaError as exc:
        where = pointer + "".join(f"/{p}" for p in exc.path)
        bad(where, f"invalid JSON Schema: {exc.message}" + (f" ({exc.cause})" if exc.cause else ""))
        return None
    try:  # from here on the schema is 2020-12, deciding as the original does under its dialect
        translated = to_2020_12(schema, dialect)
    except NotTranslatable as exc:
        bad(pointer, f"unsupported JSON Schema: {exc}")
        return None
    try:  # every regex is read as ECMA-262, or the schema is refused
        ecma_schema(translated)
    except (NotEcmaRegex, UnknownSchemaPlace) as exc:
        bad(pointer, f"invalid JSON Schema: {exc}")
        return None
    # A format the checker cannot assert would silently pass everything: refuse it.
    for where, fmt in _formats(translated, pointer):
        if fmt not in _FORMAT_CHECKER.checkers:
            bad(where, f"format `{fmt}` cannot be asserted by this sidecar; remove it or use `pattern`")
            return None
    return translated


_VALID_SCHEMAS: set[str] = set()  # canonical texts of schemas that passed, in this process
_MAX_VALID_SCHEMAS = 8192


def _check_against_metaschema(schema: dict[str, Any]) -> None:
    """The check against the metaschema of the schema's own dialect (`$schema`, one of
    dialects.DIALECTS), remembered for schemas that passed: it costs
    about 10 ms a schema, and a reload reads every tool again while it is mostly the
    policies that changed."""
    key = json.dumps(schema, sort_keys=True)
    if key in _VALID_SCHEMAS:
        return
    checker: Any = jsonschema.validators.validator_for(schema)  # the dialect's own class
    checker.check_schema(schema, format_checker=_FORMAT_CHECKER)
    if len(_VALID_SCHEMAS) >= _MAX_VALID_SCHEMAS:
        _VALID_SCHEMAS.clear()
    _VALID_SCHEMAS.add(key)


def _formats(node: Any, pointer: str) -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            child = f"{pointer}/{key}"
            if key == "format" and isinstance(value, str):
                yield child, value
            else:
                yield from _formats(value, child)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _formats(value, f"{pointer}/{i}")


def _parse_resource(raw: Any, input_schema: dict[str, Any] | None, bad: Complain) -> tuple[str, str | None]:
    if raw is None:
        return "Tool", None
    if not isinstance(raw, dict) or set(raw) - {"type", "id"}:
        bad("/resource", "resource must be a mapping with `type` and `id`")
        return "Tool", None
    rtype, pointer = raw.get("type"), raw.get("id")
    if not isinstance(rtype, str) or not ENTITY_TYPE.fullmatch(rtype):
        bad("/resource/type", "resource type must be a Cedar entity type name")
    if not isinstance(pointer, str) or not pointer.startswith("/"):
        bad("/resource/id", "resource id must be a JSON pointer into the input, such as `/order_id`")
        return "Tool", None
    if input_schema is not None and (problem := pinned_key_problem(input_schema, pointer, "resource")):
        bad("/resource/id", problem)
    return rtype if isinstance(rtype, str) else "Tool", pointer


def _parse_limits(raw: Any, bad: Complain) -> tuple[int, int | None]:
    if raw is None:
        return DEFAULT_MAX_INPUT_BYTES, None
    if not isinstance(raw, dict):
        bad("/limits", "limits must be a mapping")
        return DEFAULT_MAX_INPUT_BYTES, None
    for key in sorted(set(raw) - {"max_input_bytes", "max_calls_per_run"}):
        bad(f"/limits/{key}", f"unknown limit `{key}`")
    max_bytes = raw.get("max_input_bytes", DEFAULT_MAX_INPUT_BYTES)
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or not 2 <= max_bytes <= MAX_INPUT_BYTES_CEILING:
        bad("/limits/max_input_bytes", f"max_input_bytes must be an integer from 2 to {MAX_INPUT_BYTES_CEILING}")
        max_bytes = DEFAULT_MAX_INPUT_BYTES
    max_calls = raw.get("max_calls_per_run")
    if max_calls is not None and (not isinstance(max_calls, int) or isinstance(max_calls, bool) or max_calls < 1):
        bad("/limits/max_calls_per_run", "max_calls_per_run must be a positive integer")
        max_calls = None
    return max_bytes, max_calls


def _parse_audit(raw: Any, input_schema: dict[str, Any] | None, bad: Complain) -> tuple[str, ...]:
    if raw is None:
        return ()
    for key in sorted(set(raw) - {"record", "record_entities", "retain_input"}) if isinstance(raw, dict) else ():
        bad(f"/audit/{key}", f"unknown audit rule `{key}`; expected record, record_entities or retain_input")
    if isinstance(raw, dict) and "record" not in raw:
        return ()
    record = raw.get("record") if isinstance(raw, dict) else None
    if not isinstance(record, list) or not all(isinstance(p, str) and p.startswith("/") for p in record):
        bad("/audit/record", "audit.record must be a list of JSON pointers such as `/order_id`")
        return ()
    for i, pointer in enumerate(record):
        if input_schema is not None and schema_at(input_schema, pointer)[0] is None:
            bad(f"/audit/record/{i}", f"the input schema has no property at `{pointer}`")
    return tuple(record)


def _parse_audit_entities(raw: Any, bad: Complain) -> dict[str, tuple[str, ...]]:
    """`audit.record_entities`: `{EntityType: [/attr, /attr/nested], ...}`."""
    rules = raw.get("record_entities") if isinstance(raw, dict) else None
    if rules is None:
        return {}
    if not isinstance(rules, dict):
        bad("/audit/record_entities", "audit.record_entities must map entity types to lists of JSON pointers")
        return {}
    out: dict[str, tuple[str, ...]] = {}
    for kind, pointers in rules.items():
        where = f"/audit/record_entities/{str(kind).replace('~', '~0').replace('/', '~1')}"
        if not isinstance(kind, str) or not ENTITY_TYPE_NAME.fullmatch(kind):
            bad(where, f"`{shown(str(kind))}` is not an entity type name")
        elif not isinstance(pointers, list) or not all(isinstance(p, str) and p.startswith("/") for p in pointers):
            bad(where, "each entity type takes a list of JSON pointers into its attributes, such as `/status`")
        else:
            out[kind] = tuple(pointers)
    return out


def _parse_retention(raw: Any, bad: Complain) -> int | None:
    """`audit.retain_input: 7d`: how long a call's input is kept for replay (at most 90d)."""
    value = raw.get("retain_input") if isinstance(raw, dict) else None
    if value is None:
        return None
    seconds = parse_duration(value)
    if seconds is None or seconds > MAX_RETENTION_SECONDS:
        bad("/audit/retain_input", "audit.retain_input must be a duration such as `7d`, `12h` or `30m`, "
                                   "at most 90d")
        return None
    return seconds


def resolve_pointer(instance: Any, pointer: str) -> tuple[bool, Any]:
    """Follow a JSON pointer through a parsed instance: (found, value)."""
    node = instance
    for token in pointer.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return False, None
    return True, node
