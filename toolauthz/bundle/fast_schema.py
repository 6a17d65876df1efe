"""jsonschema-rs for a tool's input schema, where it is proven to decide as `jsonschema`.

`jsonschema` (with every regex read as ECMA-262, bundle/ecma_regex.py) is the reference:
it checks every schema against the metaschema and writes every error message.
jsonschema-rs answers "valid or not" about fifty times faster, and is used for a schema
only when every keyword in it is one the differential test (tests/test_fast_schema.py)
covers and every regex (`pattern`, `patternProperties` names) is in the subset below,
which jsonschema-rs is given spelled to match as ECMA-262 does (`_rust_pattern`). A `format` is asserted by calling back
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

from toolauthz.display.escape import shown

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
_NOT_A_LINE_TERMINATOR = "[^\n\r\u2028\u2029]"  # ECMA-262's `.`
_LITERAL = r"[A-Za-z0-9_:/@,=%'\"<>;!# ]|\\[.\-+*?()\[\]{}|^$\\/]"
_CLASS_ATOM = rf"(?:{_LITERAL}|\.)"
_TOKEN = re.compile(
    rf"(?P<atom>{_LITERAL}|\.|\[\^?-?(?:{_CLASS_ATOM}(?:-{_CLASS_ATOM})?)+-?\])"
    r"|(?P<close>\))|(?P<open>\((?:\?:)?)|(?P<other>[|^$])"
    r"|(?P<quantifier>(?:[*+?]|\{[0-9]{1,4}(?:,[0-9]{0,4})?\})\??)")


def _pattern_in_subset(pattern: str) -> bool:
    return _rust_pattern(pattern) is not None


def _rust_pattern(pattern: str) -> str | None:
    """`pattern` (ECMA-262) spelled for Rust's `regex` to match alike, or None outside
    the subset. Rust's `.` matches \\r, U+2028 and U+2029, ECMA's no line terminator:
    it becomes the class ECMA means. (Rust's `$` without the multiline flag is already
    ECMA's, the end of the input.)"""
    position, repeatable, out = 0, False, []
    while position < len(pattern):
        token = _TOKEN.match(pattern, position)
        if token is None:
            return None
        if token.lastgroup == "quantifier" and not repeatable:
            return None
        repeatable = token.lastgroup in ("atom", "close")
        out.append(_NOT_A_LINE_TERMINATOR if token.group() == "." else token.group())
        position = token.end()
    return "".join(out)


def fast_validator(schema: dict[str, Any], format_checker: FormatChecker) -> tuple[Any, str]:
    """A jsonschema-rs validator for `schema` and "", or None and the reason it stays
    with `jsonschema`. `schema` has passed the metaschema check, and each of its formats
    is one `format_checker` asserts."""
    formats: set[str] = set()
    try:
        rust_schema = _proven(schema, formats, root=True)
    except _Unproven as unproven:
        return None, unproven.reason
    try:
        validator = jsonschema_rs.Draft202012Validator(
            rust_schema, offline=True, pattern_options=jsonschema_rs.RegexOptions(),
            validate_formats=True, formats={name: functools.partial(_conforms, format_checker, name)
                                            for name in formats})
    except Exception as exc:  # noqa: BLE001 - any refusal just keeps the reference validator
        return None, f"jsonschema-rs refused the schema ({type(exc).__name__})"
    return validator, ""


def _conforms(format_checker: FormatChecker, name: str, instance: str) -> bool:
    return format_checker.conforms(instance, name)


class _Unproven(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _proven(node: Any, formats: set[str], *, root: bool = False) -> Any:
    """`node` (a schema) as jsonschema-rs is given it, its regexes spelled for Rust;
    _Unproven when it is outside what the differential test proves."""
    if isinstance(node, bool):
        return node
    if not isinstance(node, dict):
        raise _Unproven("a schema that is not an object")
    out: dict[str, Any] = {}
    for key, value in node.items():
        out[key] = value
        if key in _VALUE_KEYWORDS:
            if _holds_unsafe_int(value):
                raise _Unproven(f"an integer beyond ±(2^53-1) in `{key}`")
        elif key in _ROOT_ONLY:
            if not root:
                raise _Unproven(f"`{key}` below the root")
            if key == "$defs":
                out[key] = _proven_map(value, formats, key)
        elif key == "format":
            if not isinstance(value, str):
                raise _Unproven("a `format` that is not a string")
            formats.add(value)
        elif key == "pattern":
            out[key] = _rust_pattern(value) if isinstance(value, str) else None
            if out[key] is None:
                raise _Unproven("a `pattern` outside the regex subset both engines read alike")
        elif key == "patternProperties":
            rust_names = {name: _rust_pattern(name) for name in value} if isinstance(value, dict) else {}
            if None in rust_names.values():
                raise _Unproven("a `patternProperties` pattern outside the regex subset both engines read alike")
            out[key] = {rust_names[name]: sub for name, sub in _proven_map(value, formats, key).items()}
        elif key == "$ref":
            if not isinstance(value, str) or not _LOCAL_REF.match(value):
                raise _Unproven("a `$ref` that is not to `#/$defs/<name>`")
        elif key in _ONE_SCHEMA:
            out[key] = _proven(value, formats)
        elif key in _SCHEMA_LISTS:
            if not isinstance(value, list):
                raise _Unproven(f"`{key}` is not a list")
            out[key] = [_proven(sub, formats) for sub in value]
        elif key in _SCHEMA_MAPS:
            out[key] = _proven_map(value, formats, key)
        else:
            raise _Unproven(f"the keyword `{shown(key)}`")
    return out


def _proven_map(value: Any, formats: set[str], key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Unproven(f"`{key}` is not an object")
    return {name: _proven(sub, formats) for name, sub in value.items()}


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
