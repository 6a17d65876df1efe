"""Every regex of a tool schema is read as ECMA-262, by both validators.

The translation (toolauthz/bundle/ecma_regex.py) against a table of ECMA-262's answers
and, where Node.js is installed, against V8's own `RegExp(pattern, "u")` over generated
patterns and texts; then the schemas: `pattern`, `patternProperties` (and with it
`additionalProperties`), `propertyNames`, in `$defs` and nested, on the fast path and on
the fallback; and what a bundle with a regex that cannot be read so is told.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolauthz.bundle.catalog import load_catalog, reference_validator
from toolauthz.bundle.ecma_regex import NotEcmaRegex, UnknownSchemaPlace, ecma_regex
from toolauthz.bundle.ecma_schema import ecma_schema
from toolauthz.errors import Problem

DRAFT = "https://json-schema.org/draft/2020-12/schema"
TERMINATORS = ("\n", "\r", "\u2028", "\u2029")

# (pattern, text, whether ECMA-262 with the `u` flag finds a match), as V8 answers.
ECMA_ANSWERS = [
    ("^a$", "a", True), ("^a$", "a\n", False), ("^a$", "a\r", False), ("^a$", "\na", False),
    ("^a.b$", "a\rb", False), ("^a.b$", "a\u2028b", False), ("^a.b$", "a\u2029b", False), ("^a.b$", "a\tb", True),
    (".", "\n", False), ("[^a]", "\n", True), ("[^]", "\n", True), ("[]", "a", False), ("a[]", "a", False),
    ("^\\d$", "\u0663", False), ("^\\d$", "7", True), ("^\\w$", "é", False), ("^\\w$", "_", True),
    ("^\\s$", "\ufeff", True), ("^\\s$", "\x85", False), ("^\\s$", "\x1c", False), ("^\\s$", "\u3000", True),
    ("^\\S$", "\x85", True), ("^[\\S]$", " ", False), ("^[^\\S]$", " ", True), ("^[^\\S]$", "a", False),
    ("^[a\\D]$", "b", True), ("^[a\\D]$", "1", False), ("^[^a\\D]$", "1", True), ("^[^a\\D]$", "a", False),
    ("\\bé", "xé", True), ("x\\B", "xé", False), ("a\\b", "aé", True), ("^[\\b]$", "\b", True), ("^\\cJ$", "\n", True),
    ("^\\u{1F600}$", "\U0001f600", True), ("^\\uD83D\\uDE00$", "\U0001f600", True), ("^.$", "\U0001f600", True),
    ("^\\x41$", "A", True), ("^\\/$", "/", True), ("^[\\-]$", "-", True), ("^(?<n>a)$", "a", True),
    ("(?<=a)b", "ab", True), ("(?<!a)b", "ab", False), ("^a{2,3}$", "aaaa", False), ("^(?:a|b)+$", "abba", True),
    ("\\$", "$", True), ("^$", "", True), ("^$", "\n", False),
]
# Refused: not ECMA-262 with the `u` flag, or (the backreferences, `\\p{L}`, a lookbehind of
# no fixed width) ECMA-262 that Python's `re` cannot run with ECMA's meaning.
NOT_ECMA = ["\\Z", "\\A", "(?i)a", "(?P<n>a)", "a{", "a{,3}", "}", "]", "(a)\\1", "\\k<n>(?<n>a)", "\\p{L}",
            "(?=a)*", "*a", "a**", "a++", "\\e", "\\z", "(a", "a)", "\\", "[a", "[b-a]", "[a-\\d]", "(?<=a+)b",
            "\\u{110000}"]


@pytest.mark.parametrize(("pattern", "text", "matches"), ECMA_ANSWERS)
def test_regexes_match_as_ecma_262(pattern: str, text: str, matches: bool) -> None:
    assert bool(ecma_regex(pattern).search(text)) is matches


@pytest.mark.parametrize("pattern", NOT_ECMA)
def test_what_cannot_be_read_as_ecma_262_is_refused(pattern: str) -> None:
    with pytest.raises(NotEcmaRegex):
        ecma_regex(pattern)


# -- against V8 ---------------------------------------------------------------------------

_NODE = shutil.which("node")
_V8 = """
const cases = JSON.parse(require("fs").readFileSync(0, "utf8"));
process.stdout.write(JSON.stringify(cases.map(([p, texts]) => {
  try { const re = new RegExp(p, "u"); return texts.map((t) => re.test(t)); } catch (e) { return null; }
})));
"""
_PIECES = st.sampled_from([
    "a", "b", "_", "0", ".", "\\d", "\\D", "\\w", "\\W", "\\s", "\\S", "\\b", "\\B", "[a-c]", "[^a]", "[\\s\\d]",
    "[^\\S]", "[a\\W]", "[^]", "[]", "\\.", "\\$", "\\n", "\\r", "\\u2028", "\\x41", "\\u{e9}", "é", "(?:a|b)",
    "(a|)", "(?=a)", "(?!b)", "(?<=a)", "(?<!b)", " ", "\\t", "[\\b]",
])


@st.composite
def _ecma_patterns(draw: st.DrawFn) -> str:
    parts = ["^"] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(1, 4))):
        piece = draw(_PIECES)
        repeatable = not piece.startswith(("(?=", "(?!", "(?<", "\\b", "\\B"))
        quantifier = draw(st.sampled_from(["", "", "*", "+", "?", "{2}", "{0,1}", "+?"]))
        parts.append(piece + (quantifier if repeatable else ""))
    if draw(st.booleans()):
        parts.append("$")
    return "".join(parts)


_ECMA_TEXT = st.text(st.sampled_from("ab_0A9.$ é\u0663\t\n\r\u2028\u2029\ufeff\x85\x0b\U0001f600"), max_size=6)


@pytest.mark.skipif(_NODE is None, reason="needs Node.js for V8's RegExp")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases=st.lists(st.tuples(_ecma_patterns(), st.lists(_ECMA_TEXT, min_size=1, max_size=8)),
                      min_size=1, max_size=40))
def test_regexes_match_as_v8_does(cases: list[tuple[str, list[str]]]) -> None:
    assert _NODE is not None
    answers = json.loads(subprocess.run([_NODE, "-e", _V8], input=json.dumps(cases), capture_output=True,
                                        text=True, check=True, timeout=60).stdout)
    for (pattern, texts), v8 in zip(cases, answers, strict=True):
        try:
            ours = [bool(ecma_regex(pattern).search(text)) for text in texts]
        except NotEcmaRegex:
            assert v8 is None or "(?<=" in pattern or "(?<!" in pattern, pattern  # refused: V8 must refuse too
            continue
        assert v8 == ours, (pattern, texts)


# -- in schemas ----------------------------------------------------------------------------

def _write_tool(tools_dir: pathlib.Path, schema: dict[str, Any]) -> None:
    tools_dir.mkdir(exist_ok=True)
    (tools_dir / "t.yaml").write_text(yaml.safe_dump({
        "name": "t", "side_effect": "read", "input_schema": {"$schema": DRAFT, "type": "object", **schema}}))


def _tool(tmp_path: pathlib.Path, schema: dict[str, Any]):
    _write_tool(tmp_path / "tools", schema)
    problems: list[Problem] = []
    tools = load_catalog(tmp_path / "tools", problems)
    assert not problems, problems
    return tools["t"]


def test_pattern_properties_are_read_as_ecma_262_on_the_fast_path(tmp_path: pathlib.Path) -> None:
    # "a\n" is not a name `^a$` matches (ECMA's `$` ends the input), so its value is free.
    tool = _tool(tmp_path, {"patternProperties": {"^a$": {"type": "string"}}})
    assert tool.schema_engine == "jsonschema-rs"
    for value, valid in (({"a\n": 1}, True), ({"a": 1}, False), ({"a": "x"}, True)):
        assert tool.accepts(value) is valid
        assert tool.validator.is_valid(value) is valid  # the reference, which writes the model's message


def test_the_fallback_refuses_a_name_with_a_trailing_newline(tmp_path: pathlib.Path) -> None:
    tool = _tool(tmp_path, {"properties": {"n": {"type": "number", "multipleOf": 0.5}},
                            "patternProperties": {"^tag_[a-z]+$": {"type": "string"}},
                            "additionalProperties": False})
    assert tool.fast_validator is None and "multipleOf" in tool.schema_engine
    assert tool.accepts({"n": 1.5, "tag_a": "x"})
    for name in ("tag_a\n", "tag_a\r", "tag_a\u2028", "tag_\na"):
        assert not tool.accepts({"n": 1.5, name: "x"}), name


@pytest.mark.parametrize("fallback", [False, True])
@pytest.mark.parametrize("terminator", TERMINATORS)
def test_every_regex_keyword_reads_dot_and_dollar_as_ecma_262(tmp_path: pathlib.Path, fallback: bool,
                                                              terminator: str) -> None:
    nested = {"$ref": "#/$defs/code"}
    schema: dict[str, Any] = {
        "$defs": {"code": {"type": "string", "pattern": "^c.d$"}},
        "properties": {"code": nested, "tags": {"type": "object", "propertyNames": {"pattern": "^t.g$"}},
                       "deep": {"type": "array", "items": {"anyOf": [{"type": "string", "pattern": "^x$"}]}}},
        "patternProperties": {"^p.q$": {"type": "integer"}}, "additionalProperties": {"type": "boolean"},
    }
    if fallback:
        schema["properties"]["n"] = {"multipleOf": 0.5}
    tool = _tool(tmp_path, schema)
    assert (tool.fast_validator is None) is fallback
    ok = {"code": "cxd", "tags": {"tag": 1}, "deep": ["x"], "pxq": 1}
    assert tool.accepts(ok) and tool.validator.is_valid(ok)
    for bad in ({"code": f"c{terminator}d"}, {"code": f"cxd{terminator}"}, {"tags": {f"t{terminator}g": 1}},
                {"tags": {f"tag{terminator}": 1}}, {"deep": [f"x{terminator}"]},
                {f"p{terminator}q": 1}, {f"pxq{terminator}": 1}):  # the last two are additional: not boolean
        assert not tool.accepts(bad), bad
        assert not tool.validator.is_valid(bad), bad


def test_a_regex_outside_ecma_262_refuses_the_bundle(tmp_path: pathlib.Path) -> None:
    for schema, where in (({"properties": {"a": {"type": "string", "pattern": "\\Z"}}}, "/properties/a/pattern"),
                          ({"patternProperties": {"(a)\\1": True}}, "/patternProperties"),
                          ({"$defs": {"d": {"propertyNames": {"pattern": "(?i)a"}}}}, "/$defs/d/propertyNames")):
        _write_tool(tmp_path / "tools", schema)
        problems: list[Problem] = []
        assert load_catalog(tmp_path / "tools", problems) == {}
        assert len(problems) == 1 and "ECMA-262" in problems[0].message, problems
        assert problems[0].pointer.startswith(f"/input_schema{where}"), problems


def test_ecma_regexes_python_cannot_compile_are_read(tmp_path: pathlib.Path) -> None:
    # Valid ECMA-262 that Python's `re` refuses as it is: the metaschema's `format: regex` reads ECMA.
    tool = _tool(tmp_path, {"properties": {"e": {"type": "string", "pattern": "^\\u{1F600}(?<n>[^])$"}}})
    assert tool.accepts({"e": "\U0001f600\n"}) and not tool.accepts({"e": "\U0001f600"})


def test_a_ref_into_a_place_the_walk_does_not_reach_is_refused() -> None:
    with pytest.raises(UnknownSchemaPlace):
        ecma_schema({"x-hidden": {"pattern": "^a$"}, "$ref": "#/x-hidden"})
    with pytest.raises(UnknownSchemaPlace):
        ecma_schema({"properties": {"a": True}, "$ref": "#/properties"})
    translated = ecma_schema({"definitions": {"d": {"pattern": "^a$"}}, "$ref": "#/definitions/d",
                              "const": {"pattern": "^a$"}})
    assert translated["definitions"]["d"]["pattern"] != "^a$"
    assert translated["const"] == {"pattern": "^a$"}  # data, not a schema: untouched


def test_reference_validator_reads_nested_and_defined_regexes() -> None:
    schema = {"$schema": DRAFT, "$defs": {"d": {"patternProperties": {"^k$": False}}},
              "properties": {"o": {"$ref": "#/$defs/d"}},
              "unevaluatedProperties": False, "patternProperties": {"^u$": True}}
    validator = reference_validator(schema)
    assert validator.is_valid({"o": {"k\n": 1}, "u": 1})
    assert not validator.is_valid({"o": {"k": 1}})
    assert not validator.is_valid({"u\n": 1})  # not `^u$`: unevaluated
