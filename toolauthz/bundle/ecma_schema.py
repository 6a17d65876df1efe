"""Every regex of a JSON Schema read as ECMA-262: `ecma_schema` applies `python_pattern`
(bundle/ecma_regex.py) to every `pattern` and every `patternProperties` name in every
subschema, so that `jsonschema` (which calls `re.search` for `pattern`,
`patternProperties`, `additionalProperties` and `unevaluatedProperties` alike) reads them
all as ECMA-262; a `$ref` into a place the walk does not reach is refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from toolauthz.bundle.ecma_regex import NotEcmaRegex, UnknownSchemaPlace, python_pattern

__all__ = ["ONE_SCHEMA", "SCHEMA_LISTS", "SCHEMA_MAPS", "ecma_schema"]

# Draft 2020-12's keywords whose value is a schema, a list of schemas, or a map of them
# (`definitions`: the name older drafts gave `$defs`, still a common target of `$ref`).
ONE_SCHEMA = frozenset({"additionalProperties", "propertyNames", "items", "contains", "not", "if", "then", "else",
                        "unevaluatedItems", "unevaluatedProperties", "contentSchema"})
SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
SCHEMA_MAPS = frozenset({"properties", "patternProperties", "dependentSchemas", "$defs", "definitions"})


def ecma_schema(schema: Any) -> Any:
    """A copy of `schema` whose every regex is its `python_pattern`, for `jsonschema`.
    Raises NotEcmaRegex (the message names where), or UnknownSchemaPlace for a `$ref`
    into a place that is not a schema this walk reaches (its regexes would be left as
    they are)."""
    for where, ref in _refs(schema, ""):
        _check_ref_target(ref, where)
    return _rewritten(schema, "")


def _rewritten(node: Any, where: str) -> Any:
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        place = f"{where}/{_pointer_token(key)}"
        if key == "pattern" and isinstance(value, str):
            out[key] = _translated(value, place)
        elif key in ONE_SCHEMA:
            out[key] = _rewritten(value, place)
        elif key in SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_rewritten(sub, f"{place}/{i}") for i, sub in enumerate(value)]
        elif key in SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {(_translated(name, f"{place}/{_pointer_token(name)}") if key == "patternProperties" else name):
                        _rewritten(sub, f"{place}/{_pointer_token(name)}") for name, sub in value.items()}
        else:
            out[key] = value
    return out


def _translated(pattern: str, where: str) -> str:
    try:
        return python_pattern(pattern)
    except NotEcmaRegex as exc:
        raise NotEcmaRegex(f"`{where}`: {exc}") from None


def _pointer_token(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _refs(node: Any, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("$ref", "$dynamicRef") and isinstance(value, str):
                yield f"{where}/{key}", value
            elif key not in ("const", "enum", "default", "examples"):
                yield from _refs(value, f"{where}/{_pointer_token(key)}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _refs(value, f"{where}/{i}")


def _check_ref_target(ref: str, where: str) -> None:
    """A `$ref` whose fragment is a JSON pointer must walk schema keywords only."""
    _, _, fragment = ref.partition("#")
    if not fragment.startswith("/"):
        return  # the whole document, or an anchor: a schema's own place, which the walk reaches
    tokens = [t.replace("~1", "/").replace("~0", "~") for t in fragment.split("/")[1:]]
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token in ONE_SCHEMA:
            index += 1
        elif token in SCHEMA_LISTS or token in SCHEMA_MAPS:
            index += 2
        else:
            raise UnknownSchemaPlace(f"`{where}`: `{ref[:200]}` points into `{token[:64]}`, which is not a schema "
                                     "keyword; point at a schema (`#/$defs/<name>`, `#/properties/<name>`, ...)")
    if index > len(tokens):
        raise UnknownSchemaPlace(f"`{where}`: `{ref[:200]}` points at a keyword, not at a schema")
