"""Tool schemas of JSON Schema draft-07 and 2019-09, as the 2020-12 schemas that decide alike.

MCP servers emit draft-07 (zod-to-json-schema, pydantic v1) and 2019-09 as well as MCP's
default 2020-12. The catalog checks such a schema against its own dialect's metaschema,
then translates it here to 2020-12, and everything downstream (the reference validator
and its ECMA-262 regexes, the fast path, the Cedar types, resource pins) reads 2020-12
only. tests/test_schema_dialects.py proves, per construct, that the original under its
own dialect and the translation under 2020-12 accept the same instances.

Where the dialects differ, keyword by keyword:

* `items: [A, B]` with `additionalItems: C` (a tuple, then the rest) becomes
  `prefixItems: [A, B]` with `items: C`; `items: S` beside `additionalItems` (ignored
  there) becomes `items: S` alone;
* `definitions` becomes `$defs`, and `$ref: #/definitions/x` becomes `#/$defs/x`;
* draft-07's `dependencies` becomes `dependentRequired` (a list of names) and
  `dependentSchemas` (a schema);
* draft-07 ignores a `$ref`'s siblings: annotations (title, description...) are kept,
  any other sibling is refused (it would be asserted in 2020-12 and not in draft-07).

Refused, with the reason, because no translation would decide alike or the construct
changes what a reference means: a draft-07 schema that uses a keyword draft-07 does not
have (it would be ignored there and asserted in 2020-12: `prefixItems`, `$defs`-style
`dependentRequired`, `unevaluated*`, `minContains`...); 2019-09's `$recursiveRef` and
`$recursiveAnchor`; `$id` and `$anchor` (they move references); a `$ref` that is not a
local JSON pointer, or one that walks through a renamed keyword; `$schema` below the root.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DRAFT_07", "DRAFT_2019_09", "DRAFT_2020_12", "DIALECTS", "NotTranslatable", "to_2020_12"]

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
DRAFT_2019_09 = "https://json-schema.org/draft/2019-09/schema"
DRAFT_07 = "http://json-schema.org/draft-07/schema"
# Each dialect's URI as schemas spell it (with and without the empty fragment).
DIALECTS = {DRAFT_2020_12: DRAFT_2020_12, DRAFT_2020_12 + "#": DRAFT_2020_12,
            DRAFT_2019_09: DRAFT_2019_09, DRAFT_2019_09 + "#": DRAFT_2019_09,
            DRAFT_07: DRAFT_07, DRAFT_07 + "#": DRAFT_07}

_ANNOTATIONS = frozenset({"title", "description", "$comment", "default", "examples", "readOnly", "writeOnly",
                          "deprecated"})
_ONE_SCHEMA = frozenset({"additionalProperties", "propertyNames", "contains", "not", "if", "then", "else",
                         "unevaluatedItems", "unevaluatedProperties", "contentSchema"})
_SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf"})
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "dependentSchemas", "$defs"})
# Keywords a dialect does not have: ignored there, asserted (or meant otherwise) in 2020-12.
_NOT_IN = {
    DRAFT_07: frozenset({"prefixItems", "dependentRequired", "dependentSchemas", "unevaluatedItems",
                         "unevaluatedProperties", "minContains", "maxContains", "$dynamicRef", "$dynamicAnchor",
                         "$recursiveRef", "$recursiveAnchor", "$anchor", "$id", "contentSchema"}),
    DRAFT_2019_09: frozenset({"prefixItems", "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor",
                              "$anchor", "$id", "dependencies"}),
}
_RENAMED = frozenset({"items", "additionalItems", "definitions", "dependencies"})


class NotTranslatable(ValueError):
    """The schema uses a construct this module does not translate; the message names where."""


def to_2020_12(schema: dict[str, Any], dialect: str) -> dict[str, Any]:
    """The 2020-12 schema that decides as `schema` does under `dialect` (a DIALECTS
    value); `schema` itself when the dialect is 2020-12. `schema` has passed its own
    dialect's metaschema check."""
    if dialect == DRAFT_2020_12:
        return schema
    if "definitions" in schema and "$defs" in schema:
        raise NotTranslatable("`definitions` and `$defs` side by side: one place for definitions, please")
    translated: dict[str, Any] = _node(schema, dialect, "")
    translated["$schema"] = DRAFT_2020_12
    return translated


def _node(node: Any, dialect: str, where: str) -> Any:
    if isinstance(node, bool) or not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    if "$ref" in node:
        out["$ref"] = _ref(node["$ref"], f"{where}/$ref")
        if dialect == DRAFT_07:  # draft-07 ignores a `$ref`'s siblings: only annotations may stay
            others = sorted(k for k in node if k != "$ref" and k not in _ANNOTATIONS and not (k == "$schema"
                                                                                              and where == ""))
            if others:
                raise NotTranslatable(f"`{where or '/'}`: draft-07 ignores `{others[0]}` beside `$ref` (2020-12 "
                                      "would apply it); put both in an `allOf`, or drop it")
    for key, value in node.items():
        place = f"{where}/{key}"
        if key in _NOT_IN[dialect]:
            raise NotTranslatable(f"`{place}`: `{key}` is not read as 2020-12 reads it in this schema's dialect")
        if key == "$schema":
            if where:
                raise NotTranslatable(f"`{place}`: `$schema` below the root")
        elif key == "$ref":
            continue
        elif key == "items":
            if isinstance(value, list):
                out["prefixItems"] = [_node(sub, dialect, f"{place}/{i}") for i, sub in enumerate(value)]
                if "additionalItems" in node:
                    out["items"] = _node(node["additionalItems"], dialect, f"{where}/additionalItems")
            else:
                out["items"] = _node(value, dialect, place)
        elif key == "additionalItems":
            continue  # read with `items` (ignored without a tuple)
        elif key == "definitions":
            out["$defs"] = _map(value, dialect, place)
        elif key == "dependencies":
            _dependencies(value, dialect, place, out)
        elif key in _ONE_SCHEMA:
            out[key] = _node(value, dialect, place)
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_node(sub, dialect, f"{place}/{i}") for i, sub in enumerate(value)]
        elif key in _SCHEMA_MAPS:
            out[key] = _map(value, dialect, place)
        else:
            out[key] = value
    return out


def _map(value: Any, dialect: str, where: str) -> Any:
    if not isinstance(value, dict):
        return value
    return {name: _node(sub, dialect, f"{where}/{name}") for name, sub in value.items()}


def _dependencies(value: Any, dialect: str, where: str, out: dict[str, Any]) -> None:
    if not isinstance(value, dict):
        raise NotTranslatable(f"`{where}` must map property names to lists or schemas")
    required = {name: dep for name, dep in value.items() if isinstance(dep, list)}
    schemas = {name: _node(dep, dialect, f"{where}/{name}") for name, dep in value.items()
               if not isinstance(dep, list)}
    if required:
        out["dependentRequired"] = required
    if schemas:
        out["dependentSchemas"] = schemas


def _ref(ref: Any, where: str) -> str:
    """`#`, or a local JSON pointer, with `definitions` at its start renamed `$defs`."""
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        raise NotTranslatable(f"`{where}`: only a local `$ref` (`#/...`) is translated")
    tokens = ref[2:].split("/") if ref != "#" else []
    if tokens[:1] == ["definitions"]:
        tokens[0] = "$defs"
    if any(token in _RENAMED for token in tokens):  # conservative: a property named `items` counts too
        raise NotTranslatable(f"`{where}`: `{ref[:200]}` walks through a keyword the translation renames")
    return "#/" + "/".join(tokens) if tokens else "#"
