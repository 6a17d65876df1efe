"""RFC 8785 (JCS) canonical JSON, written by orjson where that is proven the same bytes.

`rfc8785` is the reference: pure Python, about 50 µs for a call digest and 120 µs for an
audit body. orjson with sorted keys writes the same bytes for every value inside the
domain `_in_domain` checks, and is used only there; anything else goes to `rfc8785`,
which also raises the errors callers know. tests/test_canonical.py is the proof
(exhaustive over characters, differential property tests, the RFC's test vectors).

Why the domain is what it is:
- keys: JCS sorts by UTF-16 code units, orjson by code points; the two orders agree
  within the BMP, so every key must be in the BMP;
- integers: JCS refuses those beyond ±(2^53-1), orjson writes them;
- floats: JCS writes ECMAScript's Number-to-String, which `rfc8785` builds from
  Python's shortest `repr` and equals it exactly for finite non-integral numbers from
  1e-4 up (no exponent, no trailing `.0`); orjson writes the same shortest digits. An
  integral float (`1.0`, JCS `1`) or a smaller one (exponent notation) is outside;
- types: only dict (str keys), list, tuple, str, int, float, bool and None, exactly
  (a subclass may serialize differently);
- depth: orjson stops at 255 levels; anything deeper than `_MAX_DEPTH` is outside;
- strings are the same for every code point; a lone surrogate makes orjson raise,
  and then `rfc8785` raises its own error.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import rfc8785

__all__ = ["canonical_json", "read_back"]

_MAX_SAFE_INT = 2**53 - 1
_MIN_PLAIN_FLOAT = 1e-4  # below this, repr (and so JCS) switches to exponent notation
_MAX_PLAIN_FLOAT = 1e16  # at and above, likewise; every float past 2^52 is integral anyway
_MAX_DEPTH = 128
_BMP_END = "\uffff"


def canonical_json(value: object) -> bytes:
    """The RFC 8785 bytes of `value`, with rfc8785's errors (CanonicalizationError and
    its subclasses; UnicodeEncodeError for a key holding a lone surrogate)."""
    fast = _orjson_bytes(value)
    return fast if fast is not None else _reference_bytes(value)


def read_back(value: object) -> Any:
    """`value` as `json.loads` reads it back from its canonical bytes (1.0 becomes 1, a
    tuple a list), with canonical_json's errors. Inside the domain orjson reads, in a
    third of the time: there it gives what `json.loads` gives (tests/test_canonical.py).
    Outside it may not: `295147905179352830000`, the JCS text of the float 2^68, is an
    int to `json.loads` and a float to orjson."""
    fast = _orjson_bytes(value)
    return orjson.loads(fast) if fast is not None else json.loads(_reference_bytes(value))


def _orjson_bytes(value: object) -> bytes | None:
    if _in_domain(value, 0):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:
            pass  # a lone surrogate: rfc8785 names it
    return None


def _reference_bytes(value: object) -> bytes:
    return rfc8785.dumps(value)  # type: ignore[arg-type]  # rfc8785 types its input narrowly


def _in_domain(value: object, depth: int) -> bool:
    """One walk over `value`: True only if orjson is proven to write JCS bytes for it."""
    if type(value) is str or type(value) is bool or value is None:
        return True
    if type(value) is int:
        return -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT
    if type(value) is dict:
        if depth >= _MAX_DEPTH:
            return False
        for key, item in value.items():
            if type(key) is not str or not (key.isascii() or max(key) <= _BMP_END):
                return False
            if type(item) is not str and not _in_domain(item, depth + 1):
                return False
        return True
    if type(value) is list or type(value) is tuple:
        if depth >= _MAX_DEPTH:
            return False
        return all(type(item) is str or _in_domain(item, depth + 1) for item in value)
    if type(value) is float:
        # NaN fails both comparisons, infinity the second.
        return _MIN_PLAIN_FLOAT <= abs(value) < _MAX_PLAIN_FLOAT and not value.is_integer()
    return False
