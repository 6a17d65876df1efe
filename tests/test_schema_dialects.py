"""Draft-07 and 2019-09 tool schemas (toolauthz/bundle/dialects.py): each construct that
differs between the dialects is translated to a 2020-12 schema that accepts exactly what
the original accepts under its own dialect (random instances and the edge cases, both
validators), or is refused with the reason; the catalog loads such tools and reads their
regexes as ECMA-262. Also the `format`s a schema may assert."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft7Validator, Draft201909Validator, Draft202012Validator

from toolauthz.bundle import load_bundle
from toolauthz.bundle.dialects import DRAFT_07, DRAFT_2019_09, NotTranslatable, to_2020_12
from toolauthz.errors import BundleError

D7, D9 = DRAFT_07 + "#", DRAFT_2019_09
VALIDATORS = {D7: Draft7Validator, D9: Draft201909Validator}

# (name, dialect, schema, instances that matter: some valid, some not)
CONSTRUCTS: list[tuple[str, str, dict[str, Any], list[Any]]] = [
    ("tuple items and additionalItems", D7,
     {"type": "array", "items": [{"type": "string"}, {"type": "integer"}], "additionalItems": False},
     [["a", 1], ["a"], [], ["a", 1, 2], [1, "a"], ["a", "b"]]),
    ("tuple items, additionalItems a schema", D9,
     {"type": "array", "items": [{"type": "string"}], "additionalItems": {"type": "boolean"}},
     [["a"], ["a", True, False], ["a", 1], [True], []]),
    ("items a schema: additionalItems ignored", D7,
     {"type": "array", "items": {"type": "integer"}, "additionalItems": False},
     [[1, 2, 3], [], [1, "a"]]),
    ("definitions and $ref", D7,
     {"definitions": {"id": {"type": "string", "pattern": "^n[0-9]+$"}}, "type": "object",
      "properties": {"note": {"$ref": "#/definitions/id"}}},
     [{"note": "n1"}, {"note": "x1"}, {"note": 1}, {}]),
    ("dependencies: a list", D7,
     {"type": "object", "dependencies": {"card": ["cvv"]}},
     [{"card": 1, "cvv": 2}, {"card": 1}, {"cvv": 2}, {}]),
    ("dependencies: a schema", D7,
     {"type": "object", "dependencies": {"card": {"required": ["zip"], "properties": {"zip": {"type": "string"}}}}},
     [{"card": 1, "zip": "x"}, {"card": 1}, {"card": 1, "zip": 3}, {"zip": 3}]),
    ("$ref with annotation siblings", D7,
     {"definitions": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/definitions/n", "description": "x"}}},
     [{"a": 1}, {"a": "1"}]),
    ("$ref with siblings in 2019-09: applied", D9,
     {"$defs": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/n", "minimum": 3}}},
     [{"a": 1}, {"a": 3}, {"a": "x"}]),
    ("the root $ref", D7,
     {"type": ["object", "integer"], "properties": {"next": {"$ref": "#"}}},
     [{"next": {"next": 1}}, {"next": "x"}, 5]),
]


def translated(dialect: str, schema: dict[str, Any]) -> dict[str, Any]:
    return to_2020_12({"$schema": dialect, **schema}, DRAFT_07 if dialect == D7 else DRAFT_2019_09)


@pytest.mark.parametrize("name, dialect, schema, instances", CONSTRUCTS, ids=[c[0] for c in CONSTRUCTS])
def test_each_construct_decides_as_in_its_own_dialect(name, dialect, schema, instances):
    original = VALIDATORS[dialect]({"$schema": dialect, **schema})
    VALIDATORS[dialect].check_schema({"$schema": dialect, **schema})
    ours = Draft202012Validator(translated(dialect, schema))
    Draft202012Validator.check_schema(ours.schema)
    decided = [original.is_valid(i) for i in instances]
    assert True in decided and False in decided  # the instances tell the readings apart
    assert [ours.is_valid(i) for i in instances] == decided


JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from(["a", "n1", "x1", "cvv", ""]),
                    lambda inner: st.lists(inner, max_size=4) |
                    st.dictionaries(st.sampled_from(["a", "note", "card", "cvv", "zip", "next"]), inner, max_size=4),
                    max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(instance=JSON)
def test_random_instances_are_decided_alike(instance):
    for _name, dialect, schema, _ in CONSTRUCTS:
        original = VALIDATORS[dialect]({"$schema": dialect, **schema})
        assert Draft202012Validator(translated(dialect, schema)).is_valid(instance) == original.is_valid(instance)


@pytest.mark.parametrize("dialect, schema, says", [
    (D7, {"properties": {"a": {"$ref": "#/definitions/n", "pattern": "^x$"}}, "definitions": {"n": {}}},
     "draft-07 ignores `pattern` beside `$ref`"),
    (D7, {"prefixItems": [{"type": "string"}]}, "`prefixItems` is not read as 2020-12 reads it"),
    (D7, {"dependentRequired": {"a": ["b"]}}, "`dependentRequired` is not read"),
    (D7, {"contains": {"type": "integer"}, "minContains": 0}, "`minContains` is not read"),
    (D9, {"$recursiveAnchor": True, "properties": {"a": {"$recursiveRef": "#"}}}, "is not read as 2020-12"),
    (D7, {"properties": {"a": {"$ref": "https://example.com/schema"}}}, "only a local `$ref`"),
    (D7, {"items": [{"type": "string"}], "properties": {"a": {"$ref": "#/items/0"}}}, "walks through a keyword"),
    (D7, {"$id": "https://example.com/s"}, "`$id` is not read"),
    (D7, {"definitions": {}, "$defs": {}}, "`definitions` and `$defs` side by side"),
])
def test_constructs_without_a_faithful_translation_are_refused(dialect, schema, says):
    with pytest.raises(NotTranslatable) as refused:
        translated(dialect, schema)
    assert says in str(refused.value)


# -- through the catalog --------------------------------------------------------------------


def tool_file(bundle_dir: pathlib.Path, input_schema: dict[str, Any]) -> None:
    document = {"name": "draft_tool", "description": "d", "side_effect": "read", "input_schema": input_schema}
    (bundle_dir / "tools" / "draft_tool.json").write_text(json.dumps(document))


def test_a_draft_07_tool_loads_and_reads_its_tuple_regexes_as_ecma(bundle_dir):
    tool_file(bundle_dir, {"$schema": D7, "type": "object", "required": ["pair"],
                           "definitions": {"code": {"type": "string", "pattern": "^a$"}},
                           "properties": {"pair": {"type": "array", "items": [{"$ref": "#/definitions/code"},
                                                                              {"type": "integer"}],
                                                   "additionalItems": False}},
                           "additionalProperties": False})
    tool = load_bundle(bundle_dir).tools["draft_tool"].tool
    assert tool.accepts({"pair": ["a", 1]})
    assert not tool.accepts({"pair": ["a\n", 1]})  # ECMA-262: `$` ends the input (Python's `re` would allow it)
    assert not tool.accepts({"pair": ["a", 1, 2]})  # additionalItems: false
    assert tool.validator.is_valid({"pair": ["a", 1]}) and not tool.validator.is_valid({"pair": ["a\n", 1]})


def test_a_2019_09_tool_loads(bundle_dir):
    tool_file(bundle_dir, {"$schema": D9, "type": "object", "properties": {"tags": {
        "type": "array", "items": [{"type": "string", "format": "uri"}], "additionalItems": False}}})
    tool = load_bundle(bundle_dir).tools["draft_tool"].tool
    assert tool.accepts({"tags": ["https://a.example/"]}) and not tool.accepts({"tags": ["not a uri"]})


@pytest.mark.parametrize("declared", ["https://json-schema.org/draft/2019-09/schema#", "http://json-schema.org/draft-07/schema"])
def test_the_dialect_uri_with_or_without_its_empty_fragment(bundle_dir, declared):
    tool_file(bundle_dir, {"$schema": declared, "type": "object"})
    assert "draft_tool" in load_bundle(bundle_dir).tools


@pytest.mark.parametrize("declared", ["http://json-schema.org/draft-04/schema#", ["x"], None, 7])
def test_other_dialects_are_refused_by_name(bundle_dir, declared):
    tool_file(bundle_dir, {"$schema": declared, "type": "object"})
    with pytest.raises(BundleError) as refused:
        load_bundle(bundle_dir)
    assert [p.pointer for p in refused.value.problems] == ["/input_schema/$schema"]


def test_a_draft_07_schema_that_breaks_its_own_metaschema_is_refused(bundle_dir):
    tool_file(bundle_dir, {"$schema": D7, "type": "object", "dependencies": {"a": 3}})
    with pytest.raises(BundleError) as refused:
        load_bundle(bundle_dir)
    assert "invalid JSON Schema" in str(refused.value.problems[0])


# -- formats -------------------------------------------------------------------------------

FORMATS = [("uri", "https://a.example/x?q=1", "not a uri"), ("uri-reference", "/a/b", "a b\\"),
           ("email", "ada@example.com", "ada"), ("date-time", "2026-07-28T10:00:00Z", "2026-07-28 10:00"),
           ("date", "2026-07-28", "28/07/2026"), ("uuid", "8b7e0f6a-2b1c-4d1e-9f00-0a1b2c3d4e5f", "8b7e0f6a"),
           ("hostname", "api.example.com", "-bad-"), ("ipv4", "10.0.0.1", "10.0.0.256"),
           ("json-pointer", "/a/0", "a/0"), ("uri-template", "https://a.example/{id}", "https://a.example/{id")]


@pytest.mark.parametrize("fmt, good, bad", FORMATS, ids=[f[0] for f in FORMATS])
def test_common_formats_are_asserted_by_both_validators(bundle_dir, fmt, good, bad):
    tool_file(bundle_dir, {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                           "properties": {"v": {"type": "string", "format": fmt}}})
    tool = load_bundle(bundle_dir).tools["draft_tool"].tool
    assert tool.fast_validator is not None  # the fast path asserts it through jsonschema's own checker
    for checker in (tool.fast_validator, tool.validator):
        assert checker.is_valid({"v": good}) and not checker.is_valid({"v": bad}), fmt


@pytest.mark.parametrize("fmt", ["int32", "password", "binary", "color"])
def test_a_format_that_cannot_be_asserted_is_refused(bundle_dir, fmt):
    tool_file(bundle_dir, {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                           "properties": {"v": {"type": "string", "format": fmt}}})
    with pytest.raises(BundleError) as refused:
        load_bundle(bundle_dir)
    assert f"format `{fmt}` cannot be asserted" in str(refused.value.problems[0])


def test_an_imported_draft_07_tool_with_a_hyphenated_name_loads(bundle_dir):
    """What `catalog import-mcp` drafts from a zod-style server loads as it is."""
    import io

    import mcp_types as types

    from toolauthz.mcp_proxy.importer import write_drafts

    schema = {"$schema": D7, "type": "object", "required": ["url"],
              "properties": {"url": {"type": "string", "format": "uri"},
                             "tags": {"type": "array", "items": [{"$ref": "#/definitions/tag"}],
                                      "additionalItems": False}},
              "definitions": {"tag": {"type": "string", "maxLength": 20}}}
    odd = {"type": "object", "properties": {"n": {"type": "integer", "format": "int32"}}}
    out = io.StringIO()
    write_drafts(bundle_dir, [types.Tool(name="fetch-page.v2", input_schema=schema,
                                         annotations=types.ToolAnnotations(read_only_hint=True)),
                              types.Tool(name="count", input_schema=odd)], out)
    assert "format `int32` cannot be asserted" in (bundle_dir / "tools" / "count.yaml").read_text()
    (bundle_dir / "tools" / "count.yaml").unlink()  # what the note asks a person to fix
    tool = load_bundle(bundle_dir).tools["fetch-page.v2"].tool
    assert tool.accepts({"url": "https://a.example/", "tags": ["x"]})
    assert not tool.accepts({"url": "https://a.example/", "tags": ["x", "y"]})
    assert not tool.accepts({"url": "no uri"})
