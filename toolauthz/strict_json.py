"""Strict parsing of the model's tool arguments (see docs: security.md, "Inputs").

`json.loads` keeps the last duplicate key, accepts NaN and Infinity, and returns exact
big integers that other runtimes round: each lets the sidecar and the tool see different
arguments. We keep the stdlib C parser and enforce the rules through its hooks.

Valid input takes the fast path: hooks that raise on the first problem but know no
location. Only when something is wrong do we parse again with hooks that leave markers
and walk the tree to name the JSON pointer, so the hot path never pays for the walk.
Messages are shown to the model: they may name keys, never string values.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from functools import partial
from itertools import accumulate

from toolauthz.errors import InputError

__all__ = ["nests_deeper_than", "parse_strict_json"]

_SAFE_INT = 2**53 - 1
# A longer literal is out of range without calling int(), which is slow on huge digit
# strings and raises ValueError past sys.get_int_max_str_digits().
_SAFE_INT_DIGITS = len(str(_SAFE_INT))
_BOM = b"\xef\xbb\xbf"

# A JSON string, or an unterminated one running to the end; unambiguous (each byte
# matches one way), so linear even on hostile input like `"\"\"\"...`.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKET_SIGN = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 / -1 as signed bytes

# Lone surrogates can only arrive as \uD800-\uDFFF escapes (strict UTF-8 decoding rejects
# raw ones), so the tree walk runs only when such an escape is present.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# Key characters we never put raw into a message: controls, backticks, surrogates, bidi.
_UNSHOWABLE = re.compile(
    "[\x00-\x1f\x7f-\x9f`\ud800-\udfff\u200b-\u200f\u202a-\u202e\u2066-\u2069]"
)


def parse_strict_json(data: bytes | bytearray | memoryview, *, max_bytes: int, max_depth: int = 64) -> object:
    """Parse `data` as strict JSON into plain Python objects, or raise InputError."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("parse_strict_json needs bytes")  # a caller bug, not bad input
    data = bytes(data)
    try:
        return _parse(data, max_bytes, max_depth)
    except InputError:
        raise
    except Exception:  # noqa: BLE001 - belt and braces: anything unforeseen is still a clean deny
        raise InputError("invalid_input", "input could not be parsed") from None


def _parse(data: bytes, max_bytes: int, max_depth: int) -> object:
    if len(data) > max_bytes:
        raise InputError("invalid_input", f"input is larger than {max_bytes} bytes")
    if data.startswith(_BOM):
        raise InputError("invalid_input", "input starts with a UTF-8 byte order mark")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("invalid_input", "input is not valid UTF-8") from None
    if _too_deep(data, max_depth):
        raise InputError("invalid_input", f"input nests deeper than {max_depth} levels")
    try:
        value = _decode(_FAST, text)
        if not _SURROGATE_ESCAPE.search(data):
            return value
    except _Violation:
        # The fast path stopped at the first problem, so a later syntax error may remain.
        value = _decode(_MARKING, text)
    problem = _find_problem(value)
    if problem:
        raise InputError("invalid_input", problem)
    return value


def _decode(decoder: json.JSONDecoder, text: str) -> object:
    try:
        return decoder.decode(text)
    except json.JSONDecodeError as e:  # its text names the problem and place, never a value
        what = e.msg.removesuffix(" at")
        what = what[:1].lower() + what[1:]
        where = f"line {e.lineno} column {e.colno}"
        raise InputError("invalid_input", f"input is not valid JSON: {what} at {where}") from None


def nests_deeper_than(data: bytes, max_depth: int) -> bool:
    """True if the JSON text `data` nests brackets deeper than `max_depth`: a bound to
    check before handing a document to a recursive parser."""
    return _too_deep(bytes(data), max_depth)


def _too_deep(data: bytes, max_depth: int) -> bool:
    """True if brackets outside strings nest deeper than max_depth, without recursion."""
    # Depth cannot exceed the number of openers: usual inputs stop here after two counts.
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return False
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKET)
    if brackets.count(b"[") + brackets.count(b"{") <= max_depth:
        return False
    # Running sum of +1/-1 computed in C. Unbalanced input may make this overestimate,
    # never underestimate, the depth the parser reaches before it fails.
    signs = memoryview(brackets.translate(_BRACKET_SIGN)).cast("b")
    return max(accumulate(signs), default=0) > max_depth


# -- fast path: raise on the first problem ---------------------------------------------


class _Violation(Exception):
    """The fast path saw a problem; the marking pass will say where."""


def _check_int(s: str) -> tuple[int, str | None]:
    """The literal's value, and a message template if it must be rejected."""
    if s == "-0":  # the only negative-zero integer literal JSON allows
        return 0, "negative zero at {at} is not allowed; send 0"
    if len(s) - s.startswith("-") > _SAFE_INT_DIGITS:
        return 0, _OUT_OF_RANGE
    v = int(s)
    return v, (_OUT_OF_RANGE if abs(v) > _SAFE_INT else None)


_OUT_OF_RANGE = "integer at {at} is outside ±(2^53-1); send it as a string"


def _check_float(s: str) -> tuple[float, str | None]:
    f = float(s)
    if math.isinf(f):
        return f, "number at {at} is too large for a 64-bit float"
    if f == 0 and s.startswith("-"):  # -0.0, -0e3, and -1e-400 which underflows to -0
        return f, "negative zero at {at} is not allowed; send 0"
    return f, None


def _fast_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    d = dict(pairs)
    if len(d) != len(pairs):
        raise _Violation
    return d


def _fast_int(s: str) -> int:
    v, problem = _check_int(s)
    if problem:
        raise _Violation
    return v


def _fast_float(s: str) -> float:
    f, problem = _check_float(s)
    if problem:
        raise _Violation
    return f


def _reject_constant(name: str) -> object:
    raise _Violation


_FAST = json.JSONDecoder(
    object_pairs_hook=_fast_pairs,
    parse_int=_fast_int,
    parse_float=_fast_float,
    parse_constant=_reject_constant,
)


# -- slow path: mark problems, then walk to find where they are -------------------------


class _Bad:
    """Stands in for a rejected value; `describe(at)` gives the message."""

    __slots__ = ("describe",)

    def __init__(self, describe: Callable[[str], str]):
        self.describe = describe


def _duplicate_key(key: str, at: str) -> str:
    return f"duplicate key `{_show(key)}` in object at `{at}`"


def _marking_pairs(pairs: list[tuple[str, object]]) -> object:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return _Bad(partial(_duplicate_key, key))
        seen.add(key)
    return dict(pairs)


def _marking_number(check: Callable[[str], tuple[object, str | None]]) -> Callable[[str], object]:
    def hook(s: str) -> object:
        v, problem = check(s)
        return _Bad(lambda at: problem.format(at=f"`{at}`")) if problem else v

    return hook


def _marking_constant(name: str) -> object:
    # `name` is one of the literals NaN, Infinity, -Infinity: not a value from the model.
    return _Bad(lambda at: f"number `{name}` at `{at}` is not allowed; JSON has no NaN or Infinity")


_MARKING = json.JSONDecoder(
    object_pairs_hook=_marking_pairs,
    parse_int=_marking_number(_check_int),
    parse_float=_marking_number(_check_float),
    parse_constant=_marking_constant,
)


def _find_problem(value: object) -> str | None:
    """First problem in document order, located by JSON pointer (the root shown as `/`)."""
    stack: list[tuple[object, str]] = [(value, "")]  # explicit stack: no recursion
    while stack:
        v, at = stack.pop()
        if isinstance(v, _Bad):
            return v.describe(at or "/")
        if isinstance(v, dict):
            children = []
            for k, child in v.items():
                if _SURROGATE.search(k):
                    return f"a key in the object at `{at or '/'}` contains a lone surrogate"
                children.append((child, f"{at}/{_pointer_segment(k)}"))
            stack.extend(reversed(children))
        elif isinstance(v, list):
            stack.extend(reversed([(c, f"{at}/{i}") for i, c in enumerate(v)]))
        elif isinstance(v, str) and _SURROGATE.search(v):
            return f"string at `{at or '/'}` contains a lone surrogate"
    return None


def _pointer_segment(key: str) -> str:
    return _show(key.replace("~", "~0").replace("/", "~1"))


def _show(key: str, limit: int = 40) -> str:
    """A key made safe for a one-line message: escaped where unprintable, and shortened."""
    if len(key) > limit:
        key = key[:limit] + "…"
    return _UNSHOWABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", key)
