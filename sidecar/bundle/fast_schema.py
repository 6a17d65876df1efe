"""jsonschema-rs for a tool's input schema, where it is proven to decide as `jsonschema`.

`jsonschema` (with the catalog's ECMA `$` rule for `pattern`) is the reference: it
checks every schema against the metaschema and writes every error message. jsonschema-rs
answers "valid or not" about fifty times faster, and is used for a schema only when
every keyword in it is one the differential test (tests/test_fast_schema.py) covers and
every `pattern` is in the regex subset below. A `format` is asserted by calling back
`jsonschema`'s own format checker (each library's own checks differ: email, dates...), so
it answers alike by construction. Anything else keeps `jsonschema`, decided once when the
bundle loads; `fast_validator` says why.

Left to `jsonschema`, with the reason:
- `multipleOf`: floats are divided differently (0.3 is a multiple of 0.1 for one only);
- an integer beyond ±(2^53-1) anywhere in a keyword's value: jsonschema-rs compares it
  with a float input (which may be any size) in floats, jsonschema exactly, so the two
  part on `minimum: 2^64+1` against `1.8446744073709552e19`, and on `const` or `enum`;
- `unevaluated*`, `$dynamicRef`, `$id`, `$anchor`, `contentEncoding`..., a `$ref` other
  than `#/$defs/<name>`, `$defs` or `$schema` below the root: not covered by the test;
- a `pattern` outside the subset: Python's `re` and Rust's `regex` read `\\d`, `\\w`,
  `\\s`, `\\b`, flags, lookaround, `{,n}`, nested classes and class set operations
  (`&&`, `--`, `~~`) differently, or one of them refuses them.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import jsonschema_rs
from jsonschema import FormatChecker

from sidecar.display import shown

__all__ = ["fast_validator"]

# Keywords whose value is data, not a schema.
_VALUE_KEYWORDS = frozenset({
    "$comment", "title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly",
    "type", "enum", "const", "required", "dependentRequired",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "minLength", "maxLength", "minItems", "maxItems", "uniqueItems", "minProperties", "maxProperties",
    "minContains", "maxContains",
})
_ONE_SCHEMA = frozenset({"not", "items", "additionalProperties", "if", "then", "else", "contains", "propertyNames"})
_SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SCHEMA_MAPS = frozenset({"properties", "dependentSchemas"})
# The dialect and the definitions are read at the root only, where the test puts them; a
# reference names one of those definitions (no deeper pointer, no %-escapes).
_ROOT_ONLY = frozenset({"$schema", "$defs"})
_LOCAL_REF = re.compile(r"#/\$defs/[A-Za-z0-9_-]+\Z")
_MAX_SAFE_INT = 2**53 - 1  # every integer up to this is exactly a float, and an input's integer is no larger

# The regex subset read alike by Python's `re` (after the catalog's `$` rewrite) and
# Rust's `regex`: ASCII literals, escaped metacharacters, `.`, classes of those with
# ranges, groups, alternation, anchors, and one quantifier (greedy or lazy) after an
# atom, a class or a group. Not `\<` or `\>` (word boundaries in Rust), not `a++`
# (possessive in Python 3.11).
_LITERAL = r"[A-Za-z0-9_:/@,=%'\"<>;!# ]|\\[.\-+*?()\[\]{}|^$\\/]"
_CLASS_ATOM = rf"(?:{_LITERAL}|\.)"
_TOKEN = re.compile(
    rf"(?P<atom>{_LITERAL}|\.|\[\^?-?(?:{_CLASS_ATOM}(?:-{_CLASS_ATOM})?)+-?\])"
    r"|(?P<close>\))|(?P<open>\((?:\?:)?)|(?P<other>[|^$])"
    r"|(?P<quantifier>(?:[*+?]|\{[0-9]{1,4}(?:,[0-9]{0,4})?\})\??)")


def _pattern_in_subset(pattern: str) -> bool:
    position, repeatable = 0, False
    while position < len(pattern):
        token = _TOKEN.match(pattern, position)
        if token is None:
            return False
        if token.lastgroup == "quantifier" and not repeatable:
            return False
        repeatable = token.lastgroup in ("atom", "close")
        position = token.end()
    return True


def fast_validator(schema: dict[str, Any], format_checker: FormatChecker) -> tuple[Any, str]:
    """A jsonschema-rs validator for `schema` and "", or None and the reason it stays
    with `jsonschema`. `schema` has passed the metaschema check, and each of its formats
    is one `format_checker` asserts."""
    formats: set[str] = set()
    reason = _unproven(schema, formats, root=True)
    if reason:
        return None, reason
    try:
        validator = jsonschema_rs.Draft202012Validator(
            schema, offline=True, pattern_options=jsonschema_rs.RegexOptions(),
            validate_formats=True, formats={name: functools.partial(_conforms, format_checker, name)
                                            for name in formats})
    except Exception as exc:  # noqa: BLE001 - any refusal just keeps the reference validator
        return None, f"jsonschema-rs refused the schema ({type(exc).__name__})"
    return validator, ""


def _conforms(format_checker: FormatChecker, name: str, instance: str) -> bool:
    return format_checker.conforms(instance, name)


def _unproven(node: Any, formats: set[str], *, root: bool = False) -> str:
    """Why `node` (a schema) is outside what the differential test proves, or ""."""
    if isinstance(node, bool):
        return ""
    if not isinstance(node, dict):
        return "a schema that is not an object"
    for key, value in node.items():
        if key in _VALUE_KEYWORDS:
            if _holds_unsafe_int(value):
                return f"an integer beyond ±(2^53-1) in `{key}`"
            continue
        if key in _ROOT_ONLY:
            if not root:
                return f"`{key}` below the root"
            if key == "$defs":
                if not isinstance(value, dict):
                    return "`$defs` is not an object"
                for sub in value.values():
                    if reason := _unproven(sub, formats):
                        return reason
        elif key == "format":
            if not isinstance(value, str):
                return "a `format` that is not a string"
            formats.add(value)
        elif key == "pattern":
            if not isinstance(value, str) or not _pattern_in_subset(value):
                return "a `pattern` outside the regex subset both engines read alike"
        elif key == "patternProperties":
            if not isinstance(value, dict):
                return "`patternProperties` is not an object"
            for pattern, sub in value.items():
                if not _pattern_in_subset(pattern):
                    return "a `patternProperties` pattern outside the regex subset both engines read alike"
                if reason := _unproven(sub, formats):
                    return reason
        elif key == "$ref":
            if not isinstance(value, str) or not _LOCAL_REF.match(value):
                return "a `$ref` that is not to `#/$defs/<name>`"
        elif key in _ONE_SCHEMA:
            if reason := _unproven(value, formats):
                return reason
        elif key in _SCHEMA_LISTS:
            if not isinstance(value, list):
                return f"`{key}` is not a list"
            for sub in value:
                if reason := _unproven(sub, formats):
                    return reason
        elif key in _SCHEMA_MAPS:
            if not isinstance(value, dict):
                return f"`{key}` is not an object"
            for sub in value.values():
                if reason := _unproven(sub, formats):
                    return reason
        else:
            return f"the keyword `{shown(key)}`"
    return ""


def _holds_unsafe_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return not -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT
    if isinstance(value, list):
        return any(_holds_unsafe_int(item) for item in value)
    if isinstance(value, dict):
        return any(_holds_unsafe_int(item) for item in value.values())
    return False
