"""toolauthz/canonical.py writes exactly rfc8785's bytes: orjson inside the proven domain,
rfc8785 itself outside it.

The proof has four parts: every code point escapes alike (exhaustive); the float rule
holds on the RFC's number table and on generated floats; generated values inside the
domain give identical bytes from orjson alone; and any value at all gives rfc8785's
bytes (or its exception) through `canonical_json`. The RFC 8785 test vectors
(cyberphone/json-canonicalization testdata, the RFC's Appendix B numbers) are below.
"""

from __future__ import annotations

import json
import math
import struct

import orjson
import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from toolauthz.canonical import _in_domain, canonical_json, read_back

MAX_SAFE = 2**53 - 1


def _orjson(value: object) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


# -- strings and keys: exhaustive ------------------------------------------------------

def _all_code_points() -> list[str]:
    return [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]


def test_every_code_point_escapes_alike() -> None:
    chars = _all_code_points()
    # Escaping is per character, so a chunk differs iff one of its characters does.
    for i in range(0, len(chars), 512):
        chunk = "".join(chars[i:i + 512])
        assert _orjson(chunk) == rfc8785.dumps(chunk), hex(ord(chars[i]))
    for c in range(0x20):  # and each control alone: its short or \u00xx form
        assert _orjson(chr(c)) == rfc8785.dumps(chr(c))


def test_bmp_keys_sort_alike_and_astral_keys_leave_the_domain() -> None:
    bmp = [chr(c) for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF]
    keys = {k: i for i, k in enumerate(reversed(bmp))}
    assert _in_domain(keys, 0)
    assert _orjson(keys) == rfc8785.dumps(keys)
    # Where the two orders part: UTF-16 puts U+1F600 (D83D DE00) before U+FFFD.
    astral = {"\ufffd": 1, "\U0001f600": 2}
    assert _orjson(astral) != rfc8785.dumps(astral)
    assert not _in_domain(astral, 0)
    assert canonical_json(astral) == rfc8785.dumps(astral)


def test_a_lone_surrogate_raises_what_rfc8785_raises() -> None:
    with pytest.raises(rfc8785.CanonicalizationError):
        canonical_json({"a": "\ud800"})
    with pytest.raises(UnicodeEncodeError):
        canonical_json({"\udfff": 1})


# -- numbers ---------------------------------------------------------------------------

# RFC 8785 Appendix B: IEEE 754 bit patterns and their JCS text (None: not representable).
APPENDIX_B = [
    ("0000000000000000", "0"), ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"), ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"), ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"), ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("7fffffffffffffff", None), ("7ff0000000000000", None), ("fff0000000000000", None),
    ("44b52d02c7e14af5", "9.999999999999997e+22"), ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"), ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"), ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"), ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"), ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
    ("4340000000000001", "9007199254740994"), ("4340000000000002", "9007199254740996"),
]


def _double(bits: str) -> float:
    value: float = struct.unpack(">d", bytes.fromhex(bits))[0]
    return value


@pytest.mark.parametrize(("bits", "text"), APPENDIX_B, ids=[b for b, _ in APPENDIX_B])
def test_appendix_b_numbers(bits: str, text: str | None) -> None:
    value = _double(bits)
    if text is None:
        with pytest.raises(rfc8785.FloatDomainError):
            canonical_json([value])
        return
    assert canonical_json([value]) == f"[{text}]".encode()
    if _in_domain(value, 0):  # the float rule admits it: orjson alone must agree
        assert _orjson(value) == text.encode()


def test_the_float_rule_admits_exactly_the_plain_non_integral_floats() -> None:
    admitted = [0.5, -0.5, 1e-4, 1764601234.567891, 4503599627370495.5, -0.0001]
    refused = [1.0, -0.0, 0.0, 2.0**52, 1e16, 9.99e-5, 5e-324, math.inf, -math.inf, math.nan, 1e300]
    assert all(_in_domain(f, 0) for f in admitted)
    assert not any(_in_domain(f, 0) for f in refused)
    for f in admitted:
        assert _orjson(f) == rfc8785.dumps(f)


@settings(max_examples=1000)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_floats_in_the_domain_write_alike(value: float) -> None:
    if _in_domain(value, 0):
        assert _orjson(value) == rfc8785.dumps(value)
    assert canonical_json(value) == rfc8785.dumps(value)


@settings(max_examples=1000)
@given(st.integers(min_value=-4, max_value=51), st.integers(min_value=1, max_value=2**53 - 1), st.booleans())
def test_floats_across_the_admitted_exponents_write_alike(exponent: int, mantissa: int, negative: bool) -> None:
    value = math.ldexp(mantissa, exponent - 52) * (-1 if negative else 1)  # every binade the rule admits
    if _in_domain(value, 0):
        assert _orjson(value) == rfc8785.dumps(value)


def test_integers_at_the_safe_bounds() -> None:
    for n in (MAX_SAFE, -MAX_SAFE, 0, True, False):
        assert _in_domain(n, 0)
        assert canonical_json(n) == rfc8785.dumps(n)
    for n in (MAX_SAFE + 1, -MAX_SAFE - 1, 2**64):
        assert not _in_domain(n, 0)  # orjson would write them; JCS refuses
        with pytest.raises(rfc8785.IntegerDomainError):
            canonical_json({"n": n})


# -- the cyberphone test vectors -------------------------------------------------------

# (input as JSON text, RFC 8785 output, whether it lies inside the domain)
CYBERPHONE = {
    "arrays": ('[56,{"d":true,"10":null,"1":[]}]', '[56,{"1":[],"10":null,"d":true}]', True),
    "french": ('{"peach":"This sorting order","p\\u00e9ch\\u00e9":"is wrong according to French",'
               '"p\\u00eache":"but canonicalization MUST","sin":"ignore locale"}',
               '{"peach":"This sorting order","p\u00e9ch\u00e9":"is wrong according to French",'
               '"p\u00eache":"but canonicalization MUST","sin":"ignore locale"}', True),
    "structures": ('{"1":{"f":{"f":"hi","F":5},"\\n":56.0},"10":{},"":"empty","a":{},'
                   '"111":[{"e":"yes","E":"no"}],"A":{}}',
                   '{"":"empty","1":{"\\n":56,"f":{"F":5,"f":"hi"}},"10":{},"111":[{"E":"no","e":"yes"}],'
                   '"A":{},"a":{}}', False),  # 56.0 is an integral float
    "unicode": ('{"Unnormalized Unicode":"A\\u030a"}', '{"Unnormalized Unicode":"A\u030a"}', True),
    "values": ('{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],'
               '"string":"\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/","literals":[null,true,false]}',
               '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
               '"string":"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}', False),  # 1e+30, 1e-27
    "values_in_domain": ('{"numbers":[333333333.33333329,4.50,2e-3],"literals":[null,true,false]}',
                         '{"literals":[null,true,false],"numbers":[333333333.3333333,4.5,0.002]}', True),
    "weird": ('{"\\u20ac":"Euro Sign","\\r":"Carriage Return","\\u000a":"Newline","1":"One",'
              '"\\u0080":"Control\\u007f","\\ud83d\\ude02":"Smiley","\\u00f6":"Latin Small Letter O With Diaeresis",'
              '"\\ufb33":"Hebrew Letter Dalet With Dagesh","</script>":"Browser Challenge"}',
              '{"\\n":"Newline","\\r":"Carriage Return","1":"One","</script>":"Browser Challenge",'
              '"\u0080":"Control\u007f","\u00f6":"Latin Small Letter O With Diaeresis","\u20ac":"Euro Sign",'
              '"\U0001f602":"Smiley","\ufb33":"Hebrew Letter Dalet With Dagesh"}', False),  # an astral key
    "weird_in_domain": ('{"\\u20ac":"Euro Sign","\\r":"CR","\\u0080":"Control\\u007f","\\ufb33":"Dalet",'
                        '"</script>":"Browser Challenge","v":"\\ud83d\\ude02"}',
                        '{"\\r":"CR","</script>":"Browser Challenge","v":"\U0001f602","\u0080":"Control\u007f",'
                        '"\u20ac":"Euro Sign","\ufb33":"Dalet"}', True),  # astral only as a value
}


@pytest.mark.parametrize("name", sorted(CYBERPHONE))
def test_cyberphone_vectors(name: str) -> None:
    text, expected, inside = CYBERPHONE[name]
    value = json.loads(text)
    assert _in_domain(value, 0) is inside
    assert canonical_json(value) == expected.encode("utf-8")
    if inside:
        assert _orjson(value) == expected.encode("utf-8")


# -- generated values --------------------------------------------------------------------

_BMP_TEXT = st.text(st.characters(max_codepoint=0xFFFF, exclude_categories=("Cs",)), max_size=8)
_ANY_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=8)
_PLAIN_FLOATS = st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: _in_domain(f, 0))
_DOMAIN_SCALARS = (st.none() | st.booleans() | st.integers(-MAX_SAFE, MAX_SAFE) | _ANY_TEXT | _PLAIN_FLOATS)
DOMAIN_VALUES = st.recursive(
    _DOMAIN_SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(_BMP_TEXT, inner, max_size=5),
    max_leaves=40,
)
_ANY_SCALARS = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
                | st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2)
                | st.sampled_from([1.0, -0.0, 1e21, 1e-7, 2**53, -(2**53), 2**64]))
ANY_VALUES = st.recursive(
    _ANY_SCALARS,
    lambda inner: (st.lists(inner, max_size=5) | st.tuples(inner, inner)
                   | st.dictionaries(st.text(max_size=4) | _ANY_TEXT, inner, max_size=5)),
    max_leaves=30,
)


@settings(max_examples=500)
@given(DOMAIN_VALUES)
def test_inside_the_domain_orjson_writes_rfc8785s_bytes(value: object) -> None:
    assert _in_domain(value, 0)
    assert _orjson(value) == rfc8785.dumps(value)  # type: ignore[arg-type]


def _outcome(write: object, value: object) -> tuple[str, object]:
    try:
        return "bytes", write(value)  # type: ignore[operator]
    except (ValueError, TypeError) as exc:  # CanonicalizationError is a ValueError
        return "error", type(exc)


@settings(max_examples=500)
@given(ANY_VALUES)
def test_any_value_gets_rfc8785s_bytes_or_its_error(value: object) -> None:
    assert _outcome(canonical_json, value) == _outcome(rfc8785.dumps, value)


def test_what_orjson_would_write_differently_is_outside() -> None:
    for value in ({"a": 1.0}, [2**53], {1: "x"}, [math.nan], [1e21], [1e-7], {"\U0001f600": 1}):
        assert not _in_domain(value, 0)
        assert _outcome(canonical_json, value) == _outcome(rfc8785.dumps, value)


def test_subclasses_and_other_types_are_outside() -> None:
    class Key(str):
        pass

    class Mapping(dict):  # type: ignore[type-arg]
        pass

    for value in ({Key("k"): 1}, Mapping(a=1), b"bytes", {"a": {1, 2}}, object()):
        assert not _in_domain(value, 0)


def test_nesting_past_the_depth_bound_falls_back() -> None:
    deep: object = "x"
    for _ in range(200):  # orjson refuses past 255 levels; the domain ends well before
        deep = [deep]
    assert not _in_domain(deep, 0)
    assert canonical_json(deep) == rfc8785.dumps(deep)  # type: ignore[arg-type]


# -- reading canonical bytes back --------------------------------------------------------

def _typed(value: object) -> object:
    """`value` with every scalar tagged by its type, so that 1 and 1.0 and True differ."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)


@settings(max_examples=500)
@given(ANY_VALUES)
def test_read_back_is_what_json_loads_reads_from_the_canonical_bytes(value: object) -> None:
    kind, written = _outcome(rfc8785.dumps, value)
    if kind == "error":
        assert _outcome(read_back, value) == (kind, written)
        return
    assert _typed(read_back(value)) == _typed(json.loads(written))  # type: ignore[arg-type]


def test_read_back_of_the_appendix_b_numbers() -> None:
    for bits, text in APPENDIX_B:
        if text is not None:
            assert _typed(read_back([_double(bits)])) == _typed(json.loads(f"[{text}]"))


def test_outside_the_domain_orjson_would_read_back_differently() -> None:
    text = rfc8785.dumps(2.0**68)  # an integral float past 2^64
    assert text == b"295147905179352830000"
    assert isinstance(json.loads(text), int) and isinstance(orjson.loads(text), float)
    assert isinstance(read_back(2.0**68), int)  # so read_back does not use orjson there
