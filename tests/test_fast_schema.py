"""jsonschema-rs decides exactly as `jsonschema` wherever the catalog lets it decide.

The differential part: the example and benchmark tool schemas, and schemas generated
from every keyword `bundle/fast_schema.py` admits, against inputs generated from the
schema and arbitrary JSON, all through the strict parse the decision path uses. Then
what is refused (formats, multipleOf, regex features the engines read apart), the log
line a refusal leaves, and the messages the model gets, which are still jsonschema's.
"""

from __future__ import annotations

import json
import logging
import pathlib
import re
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from bench import bundles
from toolauthz.bundle.catalog import _FORMAT_CHECKER, load_catalog, reference_validator
from toolauthz.bundle.fast_schema import _pattern_in_subset, fast_validator
from toolauthz.errors import InputError, Problem
from toolauthz.strict_json import parse_strict_json

ROOT = pathlib.Path(__file__).resolve().parent.parent
DRAFT = "https://json-schema.org/draft/2020-12/schema"
MAX_SAFE = 2**53 - 1
FORMATS = sorted(_FORMAT_CHECKER.checkers)  # every format a tool schema may use


def _strict(value: object) -> object:
    """`value` as the decision path sees it: sent as JSON text, strictly parsed."""
    try:
        return parse_strict_json(json.dumps(value).encode(), max_bytes=1 << 20)
    except InputError:
        assume(False)  # not an input the path would validate (-0.0, a big integer...)
        raise


def _validators(schema: dict[str, Any]) -> tuple[Any, Any]:
    reference = reference_validator(schema)
    fast, reason = fast_validator(schema, _FORMAT_CHECKER)
    assert fast is not None, reason
    return reference, fast


def _agree(schema: dict[str, Any], reference: Any, fast: Any, value: object) -> None:
    expected = reference.is_valid(value)
    assert fast.is_valid(value) == expected, (schema, value, expected)


# -- inputs ------------------------------------------------------------------------------

# ECMA-262's line terminators: `$` and `.` are where Python's `re`, Rust's `regex` and
# ECMA-262 part, so texts end with them and hold them.
LINE_TERMINATORS = ("\n", "\r", "\u2028", "\u2029")
_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12) | st.sampled_from(
    ["", "a", "ord_1", "item_x", "ord_1\n", "\u0663", "A", "r4", "\U0001f600", "e\u0301"]) | st.builds(
    lambda text, end, inside: text + end if inside is None else text[:1] + end + text[1:],
    st.sampled_from(["a", "b", "id", "x_1", "ab", "a.b", "tag_a", "0"]), st.sampled_from(LINE_TERMINATORS),
    st.none() | st.just(True))
_NUMBERS = (st.integers(-MAX_SAFE, MAX_SAFE) | st.floats(allow_nan=False, allow_infinity=False)
            | st.sampled_from([0, 1, -1, 1.0, 0.5, 7.0, 1e9, 100000000, 100000001, 1000000, 1000001, 1e-9]))
ANY_JSON = st.recursive(
    st.none() | st.booleans() | _NUMBERS | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=12,
)


def from_schema(schema: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    """Inputs near `schema`: mostly what it describes, with arbitrary JSON mixed in at
    every level so that each keyword is seen failing as well as passing."""
    if not isinstance(schema, dict) or depth > 4:
        return ANY_JSON
    options: list[st.SearchStrategy[Any]] = [ANY_JSON]
    if "enum" in schema:
        options.append(st.sampled_from(schema["enum"]))
    if "const" in schema:
        options.append(st.just(schema["const"]))
    if "pattern" in schema:
        options.append(near_pattern(schema["pattern"]))
    kind = schema.get("type")
    if kind == "string" or "maxLength" in schema or "minLength" in schema:
        options.append(st.text(max_size=schema.get("maxLength", 8) + 2))
    if kind in ("integer", "number") or any(k in schema for k in ("minimum", "maximum")):
        bounds = [schema[k] for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if k in schema]
        low, high = min(bounds, default=-1000), max(bounds, default=1000)
        options.append(st.integers(int(low) - 2, int(high) + 2) | st.floats(float(low) - 2, float(high) + 2)
                       | st.sampled_from(bounds or [0]))
    if "properties" in schema or kind == "object":
        props = schema.get("properties", {})
        required = schema.get("required", [])
        options.append(st.fixed_dictionaries(
            {k: from_schema(props[k], depth + 1) for k in required if k in props},
            optional={**{k: from_schema(v, depth + 1) for k, v in props.items() if k not in required},
                      "extra": ANY_JSON}))
    key_patterns = list(schema.get("patternProperties", {}))
    if isinstance(schema.get("propertyNames"), dict) and "pattern" in schema["propertyNames"]:
        key_patterns.append(schema["propertyNames"]["pattern"])
    if key_patterns:  # names that match the object's regexes, or nearly (a line terminator added)
        values = [from_schema(sub, depth + 1) for sub in schema.get("patternProperties", {}).values()]
        options.append(st.dictionaries(st.one_of([near_pattern(p) for p in key_patterns]),
                                       st.one_of([ANY_JSON, *values]), max_size=3))
    if "items" in schema or "prefixItems" in schema or kind == "array":
        options.append(st.lists(from_schema(schema.get("items", True), depth + 1), max_size=4))
    for key in ("allOf", "anyOf", "oneOf"):
        for sub in schema.get(key, []):
            options.append(from_schema(sub, depth + 1))
    return st.one_of(options)


def _python_regex(pattern: str) -> str:
    return pattern.replace("$", r"\Z") if "\\$" not in pattern else pattern


def near_pattern(pattern: str) -> st.SearchStrategy[str]:
    """Texts that match `pattern`, as they are or with a line terminator added at the
    end or inside: where `$` and `.` read as Python or Rust would part from ECMA-262."""
    return st.builds(lambda text, terminator, at: text if at is None else text[:at] + terminator + text[at:],
                     st.from_regex(_python_regex(pattern), fullmatch=False), st.sampled_from(LINE_TERMINATORS),
                     st.none() | st.integers(0, 12))


# -- the project's schemas ----------------------------------------------------------------

def _catalog_schemas() -> dict[str, dict[str, Any]]:
    schemas: dict[str, dict[str, Any]] = {}
    for tools_dir in (ROOT / "policies" / "tools", ROOT / "examples" / "mcp_gateway" / "bundle" / "tools"):
        problems: list[Problem] = []
        for name, tool in load_catalog(tools_dir, problems).items():
            schemas[f"{tools_dir.parent.name}/{name}"] = tool.input_schema
        assert not problems
    bench_tool = yaml.safe_load(bundles.TOOL_YAML.format(name="t_00001", index=1, side_effect="read"))
    schemas["bench/t_00001"] = bench_tool["input_schema"]
    return schemas


CATALOG = _catalog_schemas()
CATALOG_VALIDATORS = {name: _validators(schema) for name, schema in CATALOG.items()}


@pytest.mark.parametrize("name", sorted(CATALOG))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
def test_the_project_schemas_decide_alike(name: str, data: st.DataObject) -> None:
    schema = CATALOG[name]
    reference, fast = CATALOG_VALIDATORS[name]
    value = _strict(data.draw(from_schema(schema)))
    _agree(schema, reference, fast, value)


def test_every_project_schema_runs_on_jsonschema_rs() -> None:
    for tools_dir in (ROOT / "policies" / "tools", ROOT / "examples" / "mcp_gateway" / "bundle" / "tools"):
        problems: list[Problem] = []
        for tool in load_catalog(tools_dir, problems).values():
            assert tool.schema_engine == "jsonschema-rs" and tool.fast_validator is not None


# -- generated schemas ---------------------------------------------------------------------

_NAMES = st.sampled_from(["a", "b", "id", "x_1", "é", "\U0001f600"])
_LITERALS = st.none() | st.booleans() | st.sampled_from([0, 1, -1, 1.0, 1.5, 7, "a", "", "1", [1], {"a": 1}])
_PATTERN_PIECES = st.sampled_from([
    "a", "b", "_", "0", "[a-z]", "[^a]", "[0-9]", "[A-Za-z0-9]", ".", "\\.", "\\$", "\\-", "x",
    "[a-]", "[\\.\\-]", "%", "/", "@",
])


@st.composite
def subset_patterns(draw: st.DrawFn) -> str:
    """Patterns of the subset `fast_schema` admits: atoms, classes, groups, alternation,
    anchors and one quantifier per atom."""
    parts = []
    if draw(st.booleans()):
        parts.append("^")
    for _ in range(draw(st.integers(1, 4))):
        piece = draw(_PATTERN_PIECES)
        if draw(st.integers(0, 5)) == 0:
            piece = f"({piece}{'|' + draw(_PATTERN_PIECES) if draw(st.booleans()) else ''})"
        quantifier = draw(st.sampled_from(["", "", "*", "+", "?", "{2}", "{1,3}", "{0,}", "+?", "{1,2}?"]))
        parts.append(piece + quantifier)
    if draw(st.booleans()):
        parts.append("$")
    return "".join(parts)


def _schemas(depth: int) -> st.SearchStrategy[Any]:
    leaf = st.one_of(
        st.booleans(),
        st.fixed_dictionaries({"type": st.sampled_from(["string", "integer", "number", "boolean", "null",
                                                        "object", "array"])}),
        st.fixed_dictionaries({"type": st.just("string")}, optional={
            "minLength": st.integers(0, 3), "maxLength": st.integers(0, 5), "pattern": subset_patterns()}),
        st.fixed_dictionaries({"format": st.sampled_from(FORMATS)}),
        st.fixed_dictionaries({}, optional={
            "minimum": _NUMBER_BOUNDS, "maximum": _NUMBER_BOUNDS,
            "exclusiveMinimum": _NUMBER_BOUNDS, "exclusiveMaximum": _NUMBER_BOUNDS}),
        st.fixed_dictionaries({"enum": st.lists(_LITERALS, min_size=1, max_size=4)}),
        st.fixed_dictionaries({"const": _LITERALS}),
    )
    if depth == 0:
        return leaf
    sub = _schemas(depth - 1)
    return st.one_of(
        leaf,
        st.fixed_dictionaries({"type": st.just("object")}, optional={
            "properties": st.dictionaries(_NAMES, sub, max_size=3),
            "required": st.lists(_NAMES, max_size=3, unique=True),
            "additionalProperties": sub,
            "patternProperties": st.dictionaries(subset_patterns(), sub, max_size=2),
            "propertyNames": sub,
            "minProperties": st.integers(0, 2), "maxProperties": st.integers(0, 3),
            "dependentRequired": st.dictionaries(_NAMES, st.lists(_NAMES, max_size=2, unique=True), max_size=2),
            "dependentSchemas": st.dictionaries(_NAMES, sub, max_size=2),
        }),
        st.fixed_dictionaries({}, optional={
            "items": sub, "prefixItems": st.lists(sub, max_size=2), "contains": sub,
            "minContains": st.integers(0, 2), "maxContains": st.integers(0, 3),
            "minItems": st.integers(0, 2), "maxItems": st.integers(0, 4), "uniqueItems": st.booleans()}),
        st.fixed_dictionaries({}, optional={key: st.lists(sub, min_size=1, max_size=3)
                                            for key in ("allOf", "anyOf", "oneOf")}),
        st.fixed_dictionaries({"not": sub}),
        st.fixed_dictionaries({"if": sub}, optional={"then": sub, "else": sub}),
    )


_NUMBER_BOUNDS = st.sampled_from([0, 1, -1, 0.5, 1.5, 2, 1e9, -2.5, MAX_SAFE])


@settings(max_examples=700, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(schema=_schemas(2), by_ref=st.booleans(), data=st.data())
def test_generated_schemas_decide_alike(schema: Any, by_ref: bool, data: st.DataObject) -> None:
    if by_ref:  # the same schema reached through `$ref`, from a property and from the root
        document: Any = {"$schema": DRAFT, "$defs": {"d": schema}, "$ref": "#/$defs/d",
                         "properties": {"again": {"$ref": "#/$defs/d"}}}
    else:
        document = {"$schema": DRAFT, **schema} if isinstance(schema, dict) else schema
    try:
        jsonschema.Draft202012Validator.check_schema(document)
    except jsonschema.SchemaError:
        assume(False)
    if isinstance(document, bool):
        document = {"$schema": DRAFT, "allOf": [document]}
    reference = reference_validator(document)
    fast, reason = fast_validator(document, _FORMAT_CHECKER)
    assert fast is not None or reason.startswith("jsonschema-rs refused"), reason
    assume(fast is not None)  # a refusal keeps the reference: nothing to compare
    for _ in range(3):
        value = _strict(data.draw(from_schema(schema) | from_schema(document)))
        _agree(document, reference, fast, value)


def test_a_recursive_ref_decides_alike() -> None:
    schema = {"$schema": DRAFT, "$ref": "#/$defs/node",
              "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                                 "next": {"$ref": "#/$defs/node"}}}}}
    reference, fast = _validators(schema)
    for value in ({"v": 1, "next": {"v": 2, "next": {}}}, {"v": 1, "next": {"v": "2"}}, {"next": 3}, []):
        _agree(schema, reference, fast, value)


# -- formats: asserted by jsonschema's own checker, called back --------------------------

_FORMAT_SAMPLES = st.sampled_from([
    "123e4567-e89b-12d3-a456-426614174000", "123E4567-E89B-12D3-A456-426614174000",
    "123e4567e89b12d3a456426614174000", "{123e4567-e89b-12d3-a456-426614174000}",
    "urn:uuid:123e4567-e89b-12d3-a456-426614174000", "2024-02-29", "2023-02-29", "2024-01-01T10:00:00Z",
    "10:00:00Z", "a@example.com", "not an email", "1.2.3.4", "256.1.1.1", "::1", "example.com", "-bad-",
    "/a/b~1c", "a~", "0/a", "a(", "^a$", "https://example.com/x", "P1D", "x", "",
])


@pytest.mark.parametrize("name", FORMATS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_FORMAT_SAMPLES | ANY_JSON)
def test_formats_decide_alike(name: str, value: object) -> None:
    schema = {"$schema": DRAFT, "type": "object", "properties": {"v": {"format": name}}}
    reference, fast = _validators(schema)
    _agree(schema, reference, fast, _strict({"v": value}))


def test_a_uuid_resource_runs_on_jsonschema_rs(tmp_path: pathlib.Path) -> None:
    _write_tool(tmp_path / "tools", {"properties": {"id": {"type": "string", "format": "uuid"}}})
    tool = load_catalog(tmp_path / "tools", [])["t"]
    assert tool.schema_engine == "jsonschema-rs"
    assert tool.accepts({"id": "123e4567-e89b-12d3-a456-426614174000"})
    assert not tool.accepts({"id": "123e4567e89b12d3a456426614174000"})


# -- the regex subset ---------------------------------------------------------------------

_REGEX_TEXT = st.text(st.sampled_from("ab_0x9.$-%/@\nAé\u0663 \r\u2028\u2029"), max_size=8)


@pytest.mark.parametrize("keyword", ["pattern", "patternProperties", "propertyNames"])
@settings(max_examples=400, deadline=None)
@given(pattern=subset_patterns(), texts=st.lists(_REGEX_TEXT, min_size=1, max_size=6), data=st.data())
def test_subset_patterns_match_alike(keyword: str, pattern: str, texts: list[str], data: st.DataObject) -> None:
    """A regex of the subset, as a value's `pattern`, a `patternProperties` name (with
    `additionalProperties: false`) and a `propertyNames` pattern, over texts that end
    with and hold line terminators."""
    assert _pattern_in_subset(pattern)
    try:
        re.compile(pattern)  # what the metaschema check asks of a `pattern`
    except re.error:
        assume(False)
    texts += data.draw(st.lists(near_pattern(pattern), min_size=1, max_size=4))
    schema: dict[str, Any] = {
        "pattern": {"type": "string", "pattern": pattern},
        "patternProperties": {"type": "object", "patternProperties": {pattern: {"type": "integer"}},
                              "additionalProperties": False},
        "propertyNames": {"type": "object", "propertyNames": {"pattern": pattern}},
    }[keyword]
    schema = {"$schema": DRAFT, **schema}
    reference, fast = _validators(schema)
    for text in texts:
        _agree(schema, reference, fast, text if keyword == "pattern" else {text: 1})


@pytest.mark.parametrize("pattern", [
    "\\d", "\\w+", "\\s", "\\bx", "a\\<", "\\>", "(?i)a", "(?=a)", "(?!a)", "(?<=a)b", "(a)\\1", "a{,3}",
    "a++", "a*+", "[[a]]", "[a&&b]", "[a--b]", "[a~~b]", "\\p{L}", "\\x41", "\\u0041", "\\Z", "\\A",
    "\\n", "*a", "(?P<n>a)", "\t", "a{99999}",
])
def test_patterns_outside_the_subset_keep_jsonschema(pattern: str) -> None:
    assert not _pattern_in_subset(pattern)
    schema = {"$schema": DRAFT, "type": "object", "properties": {"a": {"type": "string", "pattern": pattern}}}
    fast, reason = fast_validator(schema, _FORMAT_CHECKER)
    assert fast is None and "pattern" in reason


@pytest.mark.parametrize(("schema", "why"), [
    ({"type": "number", "multipleOf": 0.1}, "multipleOf"),
    ({"type": "object", "unevaluatedProperties": False}, "unevaluatedProperties"),
    ({"$ref": "https://example.com/s"}, "$ref"),
    ({"$defs": {"d": {"$id": "x"}}, "$ref": "#/$defs/d"}, "$id"),
    ({"patternProperties": {"\\w": True}}, "pattern"),
    ({"$dynamicRef": "#x"}, "$dynamicRef"),
    ({"$ref": "#/$defs/d/properties/a", "$defs": {"d": {"properties": {"a": True}}}}, "$ref"),
    ({"$ref": "#/$defs/a%20b", "$defs": {"a b": True}}, "$ref"),
    ({"properties": {"a": {"$defs": {"d": True}}}}, "$defs"),
    ({"properties": {"a": {"$schema": "http://json-schema.org/draft-07/schema#"}}}, "$schema"),
])
def test_unproven_keywords_keep_jsonschema(schema: dict[str, Any], why: str) -> None:
    fast, reason = fast_validator({"$schema": DRAFT, **schema}, _FORMAT_CHECKER)
    assert fast is None and why in reason


# -- numbers in the schema past the safe integers ------------------------------------------

_NUMBER_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "const", "enum")
_BIG_BOUNDS = st.sampled_from([MAX_SAFE, 2**53, 2**60, 2**63, 2**64, 2**65]).flatmap(
    lambda base: st.integers(base - 4096, base + 4096)) | st.integers(-(2**66), 2**66)


@settings(max_examples=700, deadline=None)
@given(keyword=st.sampled_from(_NUMBER_KEYWORDS), bound=_BIG_BOUNDS, negative=st.booleans(),
       offset=st.integers(-4096, 4096))
def test_large_integer_bounds_decide_alike(keyword: str, bound: int, negative: bool, offset: int) -> None:
    """An integer input is at most 2^53-1, but a float input is any size: against an
    integer past 2^53 in the schema, jsonschema-rs compares in floats (2^64 meets
    `minimum: 2^64+1`), jsonschema exactly. Whichever validator the catalog picks agrees."""
    bound = -bound if negative else bound
    document = {"$schema": DRAFT, keyword: [bound] if keyword == "enum" else bound}
    reference = reference_validator(document)
    fast, reason = fast_validator(document, _FORMAT_CHECKER)
    assert fast is not None or "2^53" in reason, reason
    picked = fast if fast is not None else reference
    for value in (float(bound), float(bound + offset), float(bound) + offset):
        assert picked.is_valid(_strict(value)) == reference.is_valid(value), (document, value)


@pytest.mark.parametrize(("schema", "value"), [
    ({"minimum": 2**64 + 1}, 2.0**64),
    ({"maximum": -(2**63) - 1}, -(2.0**63)),
    ({"const": 1152921504606845600}, 1152921504606845568.0),
    ({"enum": ["a", 2**64]}, 2.0**64),
    ({"properties": {"n": {"const": {"a": [2**64]}}}}, {"n": {"a": [2.0**64]}}),
])
def test_integers_past_the_safe_range_keep_jsonschema(schema: dict[str, Any], value: object) -> None:
    import jsonschema_rs

    document = {"$schema": DRAFT, **schema}
    reference = reference_validator(document)
    assert jsonschema_rs.Draft202012Validator(document).is_valid(value) != reference.is_valid(value)  # why
    fast, reason = fast_validator(document, _FORMAT_CHECKER)
    assert fast is None and "2^53" in reason


def test_multiple_of_is_where_the_engines_part() -> None:
    # Why `multipleOf` stays with jsonschema: the two answer differently.
    import jsonschema_rs

    schema = {"$schema": DRAFT, "multipleOf": 0.1}
    assert jsonschema_rs.Draft202012Validator(schema).is_valid(0.3)
    assert not jsonschema.Draft202012Validator(schema).is_valid(0.3)


# -- at bundle load, and what the model is told ----------------------------------------------

def _write_tool(tools_dir: pathlib.Path, schema: dict[str, Any]) -> None:
    tools_dir.mkdir(exist_ok=True)
    (tools_dir / "t.yaml").write_text(yaml.safe_dump({
        "name": "t", "side_effect": "read", "input_schema": {"$schema": DRAFT, "type": "object", **schema}}))


def test_a_tool_on_the_fallback_is_named_in_the_log(tmp_path: pathlib.Path, caplog) -> None:
    _write_tool(tmp_path / "tools", {"properties": {"n": {"type": "number", "multipleOf": 0.5}}})
    with caplog.at_level(logging.INFO, logger="toolauthz.bundle.catalog"):
        tool = load_catalog(tmp_path / "tools", [])["t"]
    assert tool.fast_validator is None and tool.schema_engine == "jsonschema: the keyword `multipleOf`"
    assert "tool `t`: input checked by jsonschema: the keyword `multipleOf`" in caplog.text
    assert tool.accepts({"n": 1.5}) and not tool.accepts({"n": 0.3})  # the reference decides


def test_a_proven_tool_is_checked_by_jsonschema_rs(tmp_path: pathlib.Path, caplog) -> None:
    _write_tool(tmp_path / "tools", {"properties": {"n": {"type": "integer"}}, "required": ["n"]})
    with caplog.at_level(logging.INFO, logger="toolauthz.bundle.catalog"):
        tool = load_catalog(tmp_path / "tools", [])["t"]
    assert tool.schema_engine == "jsonschema-rs" and "input checked by" not in caplog.text
    assert tool.accepts({"n": 1}) and not tool.accepts({"n": "1"}) and not tool.accepts({})


class _RejectsAll:
    def is_valid(self, value: object) -> bool:
        return False


def _lookup(bundle_dir: pathlib.Path, order_id: object, fast: Any = None):
    from dataclasses import replace

    from toolauthz.bundle import load_bundle
    from toolauthz.engine import prepare
    from toolauthz.model import Principal, ProposedCall, TrustedContext

    bundle = load_bundle(bundle_dir)
    if fast is not None:
        tool_slice = bundle.tools["lookup_order"]
        bundle.tools["lookup_order"] = replace(tool_slice, tool=replace(tool_slice.tool, fast_validator=fast))
    ctx = TrustedContext("acme", Principal("User", "alice"), "r-1", b"[]")
    call = ProposedCall("c-1", "lookup_order", json.dumps({"order_id": order_id}).encode())
    return prepare(bundle, ctx, call)


def test_the_model_gets_jsonschemas_message(bundle_dir: pathlib.Path) -> None:
    assert _lookup(bundle_dir, "ord_1").resource_id == "ord_1"
    for bad, keyword in (("ord_1\n", "pattern"), (7, "type")):
        with pytest.raises(InputError) as info:
            _lookup(bundle_dir, bad)
        assert (info.value.code, info.value.message) == ("invalid_input", f"input at `/order_id` fails `{keyword}`")


def test_a_disagreement_still_refuses(bundle_dir: pathlib.Path) -> None:
    # Were jsonschema-rs to refuse what jsonschema accepts, there is no error to rank:
    # the call is still refused with a stable code, never let through.
    with pytest.raises(InputError) as info:
        _lookup(bundle_dir, "ord_1", fast=_RejectsAll())
    assert (info.value.code, info.value.message) == ("invalid_input", "input fails the tool's input schema")
