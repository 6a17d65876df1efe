"""HTTP request bodies: strict JSON, with chosen members kept as the bytes received.

The call digest is computed over the model's arguments exactly as the runtime sent them,
so the HTTP API cannot parse a body and serialise `call.input` again: `1.0`, `1e2` and
key order would be lost, and the digest would be of text nobody sent. Instead this walks
the body with the stdlib JSON scanner, which reports where each value ends, and keeps
the members named in `raw` (e.g. `("call", "input")`; `ANY_ITEM` stands for every
element of an array, as in `("calls", ANY_ITEM, "call", "input")`) as `RawJson`, the
exact bytes of their span. Those bytes then take the path gRPC's `input_json` takes (strict parsing,
schema, digest), so the same call gives the same decision and digest on both transports.

A route declares its body's `BodyShape`, and the walk enforces it while it scans, before
it reads what it refuses: an object at a path of `members` is walked member by member and
an unknown name is refused at its key, before its value is scanned (so a 4 MB unknown
member costs nothing); an array at a path of `max_items` is refused at the first item
past its bound (so a batch of 44,000 calls is refused at call 65, not after all of them).

What is refused here, as a RequestError (INVALID_ARGUMENT):
  * a body that is not JSON: invalid UTF-8, a byte order mark, a syntax error, NaN or
    Infinity anywhere, anything after the top-level object, nesting over `max_depth`;
  * in every member but the raw ones, what `strict_json` refuses: duplicate keys, -0,
    integers beyond ±(2^53-1), lone surrogates.
A raw member only has to be JSON syntax; what the strict rules say about it is the
authorizer's answer (a DENY with `invalid_input` for the model's arguments), as on gRPC.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from toolauthz.display.escape import shown
from toolauthz.errors import InputError, RequestError
from toolauthz.strict_json import nests_deeper_than, parse_strict_json

__all__ = ["ANY_ITEM", "BodyShape", "JsonPath", "RawJson", "parse_body"]

# Member names, and array indexes; in the paths given as `raw`, ANY_ITEM matches any index.
JsonPath = tuple[str | int, ...]
ANY_ITEM = -1

_BOM = b"\xef\xbb\xbf"
_WHITESPACE = re.compile(r"[ \t\n\r]*")


@dataclass(frozen=True)
class RawJson:
    """A member's value exactly as received: the UTF-8 bytes of its span in the body."""

    data: bytes


@dataclass(frozen=True)
class BodyShape:
    """What a body may hold, checked during the scan. Paths use ANY_ITEM for array items.

    `raw`: the members kept as RawJson. `members`: for an object at each path, the names
    it may hold. `max_items`: for an array at each path, how many items it may hold and
    the message that refuses one more."""

    raw: frozenset[JsonPath] = frozenset()
    members: Mapping[JsonPath, tuple[str, ...]] = field(default_factory=dict)
    max_items: Mapping[JsonPath, tuple[int, str]] = field(default_factory=dict)


def parse_body(body: bytes, shape: BodyShape, *, max_depth: int) -> dict[str, object]:
    """The body's top-level object as plain values, with each member whose path is in
    `shape.raw` given as RawJson. Raises RequestError."""
    if body.startswith(_BOM):
        raise RequestError("the request body starts with a UTF-8 byte order mark")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestError("the request body is not valid UTF-8") from None
    if nests_deeper_than(body, max_depth):
        raise RequestError(f"the request body nests deeper than {max_depth} levels")
    start = _skip_whitespace(text, 0)
    if text[start:start + 1] != "{":
        raise RequestError("the request body must be a JSON object")
    members, end = _Walk(text, shape).object_at(start, ())
    if _skip_whitespace(text, end) != len(text):
        raise _not_json(text, end, "extra data after the JSON object")
    return members


def _shape_of(path: JsonPath) -> JsonPath:
    return tuple(ANY_ITEM if isinstance(p, int) else p for p in path)


class _Walk:
    def __init__(self, text: str, shape: BodyShape):
        self._text = text
        self._raw = shape.raw
        self._members = shape.members
        self._max_items = shape.max_items
        # Objects and arrays on the way to a raw member, and those whose members or items
        # are bounded, are walked here, member by member; any other value is parsed whole.
        self._on_the_way = frozenset(
            path[:n] for path in (*shape.raw, *shape.members, *shape.max_items)
            for n in range(len(path) + (0 if path in shape.raw else 1)))

    def object_at(self, i: int, path: JsonPath) -> tuple[dict[str, object], int]:
        """The object starting at text[i] == "{", and the index after it."""
        text, members = self._text, dict[str, object]()
        names = self._members.get(_shape_of(path))
        i = _skip_whitespace(text, i + 1)
        if text.startswith("}", i):
            return members, i + 1
        while True:
            if not text.startswith('"', i):
                raise _not_json(text, i, "expecting property name enclosed in double quotes")
            try:
                key, i = _KEYS.raw_decode(text, i)  # a string, as text[i] is a quote
            except json.JSONDecodeError as exc:
                raise _not_json(text, exc.pos, exc.msg) from None
            if names is not None and key not in names:  # refused before its value is scanned
                raise RequestError(f"unknown member `{_pointer(path) if path else ''}/{shown(key)}`; "
                                   f"expected {', '.join(names)}")
            if key in members:
                raise RequestError(f"duplicate key `{shown(key)}` in the request body at "
                                   f"`{_pointer(path)}`")
            i = _skip_whitespace(text, i)
            if not text.startswith(":", i):
                raise _not_json(text, i, "expecting ':' delimiter")
            i = _skip_whitespace(text, i + 1)
            members[key], i = self._value_at(i, (*path, key))
            i = _skip_whitespace(text, i)
            if text.startswith(",", i):
                i = _skip_whitespace(text, i + 1)
            elif text.startswith("}", i):
                return members, i + 1
            else:
                raise _not_json(text, i, "expecting ',' delimiter")

    def _array_at(self, i: int, path: JsonPath) -> tuple[list[object], int]:
        """The array starting at text[i] == "[", and the index after it."""
        text, items = self._text, list[object]()
        bound = self._max_items.get(_shape_of(path))
        i = _skip_whitespace(text, i + 1)
        if text.startswith("]", i):
            return items, i + 1
        while True:
            if bound is not None and len(items) == bound[0]:  # refused before the item is scanned
                raise RequestError(bound[1])
            item, i = self._value_at(i, (*path, len(items)))
            items.append(item)
            i = _skip_whitespace(text, i)
            if text.startswith(",", i):
                i = _skip_whitespace(text, i + 1)
            elif text.startswith("]", i):
                return items, i + 1
            else:
                raise _not_json(text, i, "expecting ',' delimiter")

    def _value_at(self, i: int, path: JsonPath) -> tuple[object, int]:
        shape = _shape_of(path)
        if shape in self._on_the_way:
            if self._text.startswith("{", i):
                return self.object_at(i, path)
            if self._text.startswith("[", i):
                return self._array_at(i, path)
        end = _end_of_value(self._text, i)
        span = self._text[i:end].encode("utf-8")  # the received bytes: the body decoded strictly
        if shape in self._raw:
            return RawJson(span), end
        try:
            return parse_strict_json(span, max_bytes=len(span)), end
        except InputError as exc:
            raise RequestError(f"the request body at `{_pointer(path)}`: {exc.message}") from None


def _ignore(_value: object) -> None:
    return None


def _refuse_constant(name: str) -> object:
    # `name` is NaN, Infinity or -Infinity: a literal of the scanner, not caller text.
    raise RequestError(f"the request body is not valid JSON: `{name}` is not a JSON number")


# Finds where a value ends and checks its syntax, building nothing: no dict, no int
# conversion of a long digit string.
_SYNTAX = json.JSONDecoder(object_pairs_hook=_ignore, parse_int=_ignore, parse_float=_ignore,
                           parse_constant=_refuse_constant)


_KEYS = json.JSONDecoder()


def _end_of_value(text: str, i: int) -> int:
    try:
        _value, end = _SYNTAX.raw_decode(text, i)
    except json.JSONDecodeError as exc:
        raise _not_json(text, exc.pos, exc.msg) from None
    return int(end)


def _skip_whitespace(text: str, i: int) -> int:
    match = _WHITESPACE.match(text, i)
    return match.end() if match else i


def _not_json(text: str, position: int, what: str) -> RequestError:
    line = text.count("\n", 0, position) + 1
    column = position - (text.rfind("\n", 0, position) + 1) + 1
    what = what.removesuffix(" at")
    what = what[:1].lower() + what[1:]
    return RequestError(f"the request body is not valid JSON: {what} at line {line} column {column}")


def _pointer(path: JsonPath) -> str:
    return "/" + "/".join(str(p) if isinstance(p, int) else shown(p.replace("~", "~0").replace("/", "~1"))
                          for p in path)
