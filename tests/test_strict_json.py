"""Strict parsing of tool arguments: every rejection rule, hostile bytes, and normal input."""

from __future__ import annotations

import json
import random

import pytest

from toolauthz.digest import canonical_json
from toolauthz.errors import InputError
from toolauthz.strict_json import parse_strict_json

LIMIT = 65536
SECRET = "sk-live-7f3a9c"  # stands in for any secret a model might put in an argument


def parse(data: bytes, **kw) -> object:
    kw.setdefault("max_bytes", LIMIT)
    return parse_strict_json(data, **kw)


def rejection(data: bytes, **kw) -> str:
    """The message of the InputError `data` must raise, after checking its code and style."""
    with pytest.raises(InputError) as info:
        parse(data, **kw)
    err = info.value
    assert err.code == "invalid_input"
    assert err.message[:1].islower() and not err.message.endswith(".")
    assert "\n" not in err.message
    return err.message


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        # duplicate keys, compared after unescaping
        (b'{"amount":1,"amount":1000000}', "duplicate key `amount` in object at `/`"),
        (b'{"a":1,"\\u0061":2}', "duplicate key `a` in object at `/`"),
        (b'{"items":[{"sku":"x","sku":"y"}]}', "duplicate key `sku` in object at `/items/0`"),
        # NaN and infinities
        (b'{"x":NaN}', "`NaN` at `/x`"),
        (b'{"x":[Infinity]}', "`Infinity` at `/x/0`"),
        (b"-Infinity", "`-Infinity` at `/`"),
        # negative zero in every spelling, and a value that underflows to it
        (b'{"amount":-0}', "negative zero at `/amount`"),
        (b'{"amount":-0.0}', "negative zero at `/amount`"),
        (b'{"amount":-0e3}', "negative zero at `/amount`"),
        (b'{"amount":-0E-5}', "negative zero at `/amount`"),
        (b'{"amount":-1e-400}', "negative zero at `/amount`"),
        # integers that a double cannot hold exactly
        (
            b'{"amount_cents":9007199254740992}',
            "integer at `/amount_cents` is outside ±(2^53-1); send it as a string",
        ),
        (b'{"amount_cents":-9007199254740992}', "integer at `/amount_cents` is outside"),
        (b'{"items":[{"amount":9007199254740993}]}', "integer at `/items/0/amount` is outside"),
        (b'{"n":' + b"9" * 5000 + b"}", "integer at `/n` is outside"),  # past int()'s digit limit
        # overflow to infinity
        (b'{"x":1e400}', "number at `/x` is too large"),
        (b'{"x":-1.5e309}', "number at `/x` is too large"),
        # lone surrogates as escapes, in values and keys (raw ones are invalid UTF-8)
        (b'{"note":"\\ud800"}', "string at `/note` contains a lone surrogate"),
        (b'{"note":["ok","x\\udfff"]}', "string at `/note/1` contains a lone surrogate"),
        # a surrogate pair in the wrong order is two lone surrogates
        (b'{"note":"\\ude00\\ud83d"}', "string at `/note` contains a lone surrogate"),
        (b'{"a":{"\\ud800":1}}', "a key in the object at `/a` contains a lone surrogate"),
        (b'"\\uDBFF"', "string at `/` contains a lone surrogate"),
        # encoding
        (b'{"a":"\xed\xa0\x80"}', "input is not valid UTF-8"),  # raw UTF-8-encoded surrogate
        (b'{"a":"\xff"}', "input is not valid UTF-8"),
        (b'{"a":"\xc3"}', "input is not valid UTF-8"),  # truncated sequence
        (b'{"a":"\xc0\xaf"}', "input is not valid UTF-8"),  # overlong "/"
        (b"\xef\xbb\xbf{}", "byte order mark"),
        # plain syntax errors
        (b"", "input is not valid JSON: expecting value at line 1 column 1"),
        (b'{"a":1,}', "input is not valid JSON"),
        (b"{'a':1}", "input is not valid JSON"),
        (b'{"a":1} x', "input is not valid JSON: extra data"),
        (b'{"a":"tab\there"}', "input is not valid JSON: invalid control character"),
        (b"[01]", "input is not valid JSON"),
    ],
)
def test_rejects(data: bytes, expected: str) -> None:
    assert expected in rejection(data)


def test_pointer_escapes_and_shows_keys_safely() -> None:
    assert "`/a~1b~0c/0`" in rejection(b'{"a/b~c":[-0]}')
    # a key with a backtick or newline cannot break out of the message's backticks
    message = rejection(b'{"x`\\ny":NaN}')
    assert "`/x\\u0060\\u000ay`" in message


def test_violation_then_syntax_error_is_still_an_input_error() -> None:
    # the fast path stops at `-0`; the locating pass then meets the syntax error
    assert "expecting ',' delimiter" in rejection(b'{"a":-0 "b":1}')


def test_size_is_checked_first() -> None:
    assert parse(b'"' + b"a" * 98 + b'"', max_bytes=100) == "a" * 98
    # oversized and invalid in every other way: the size is what gets reported
    assert rejection(b"\xff" + b"[" * 100, max_bytes=100) == "input is larger than 100 bytes"
    assert rejection(b"[" * 70000) == "input is larger than 65536 bytes"


@pytest.mark.parametrize("opener, closer", [(b"[", b"]"), (b'{"a":', b"}")])
def test_depth_limit(opener: bytes, closer: bytes) -> None:
    assert parse(opener * 64 + b"1" + closer * 64) is not None
    assert rejection(opener * 65 + b"1" + closer * 65) == "input nests deeper than 64 levels"
    assert "deeper than 3 levels" in rejection(opener * 4 + b"1" + closer * 4, max_depth=3)


@pytest.mark.parametrize("data", [b"[" * 10_000, b"[" * 10_000 + b"]" * 10_000, b'{"a":' * 10_000])
def test_ten_thousand_deep(data: bytes) -> None:
    assert rejection(data) == "input nests deeper than 64 levels"


def test_depth_scan_ignores_brackets_in_strings() -> None:
    tricky = '["' + "[{" * 5000 + '", "\\"[[[[", "\\\\", [1]]'
    assert parse(tricky.encode()) == ["[{" * 5000, '"[[[[', "\\", [1]]


def test_recursion_is_never_an_escape_hatch() -> None:
    # Even a caller that raises max_depth past Python's recursion limit gets an InputError.
    with pytest.raises(InputError):
        parse(b"[" * 10_000 + b"]" * 10_000, max_depth=1_000_000)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b'{"order_id":"ord_1","amount_cents":1250}', {"order_id": "ord_1", "amount_cents": 1250}),
        (b"[9007199254740991,-9007199254740991]", [2**53 - 1, -(2**53 - 1)]),
        (b"[0, 0.0, 1.5, -2.25e-3, 1e308, 5e-324]", [0, 0.0, 1.5, -0.00225, 1e308, 5e-324]),
        (b"[9007199254740993.0]", [9007199254740992.0]),  # a float, rounded like any double
        (b"[1e-400]", [0.0]),  # underflow to +0 is ordinary double rounding
        ('{"é":"日本","😀":"ok"}'.encode(), {"é": "日本", "😀": "ok"}),
        (b'["\\ud83d\\ude00","\\u00e9"]', ["😀", "é"]),  # escaped surrogate pair is fine
        (b'["\\\\ud800"]', ["\\ud800"]),  # an escaped backslash, not a surrogate escape
        (b' \n\t{"a" : [ true , false , null ] }\r\n', {"a": [True, False, None]}),
        (b'""', ""),
        (b"{}", {}),
    ],
)
def test_accepts(data: bytes, expected: object) -> None:
    assert parse(data) == expected


def test_returns_plain_python_types() -> None:
    value = parse(b'{"a":[1,2.5,"s",true,null,{}]}')
    assert type(value) is dict and type(value["a"]) is list
    assert [type(v) for v in value["a"]] == [int, float, str, bool, type(None), dict]


def test_accepts_bytearray_and_memoryview() -> None:
    assert parse(bytearray(b"[1]")) == [1]
    assert parse(memoryview(b"[1]")) == [1]


@pytest.mark.parametrize(
    "template",
    [
        '{{"k":"{s}","k":1}}',
        '{{"k":"{s}","n":NaN}}',
        '{{"k":"{s}","n":-0}}',
        '{{"k":"{s}","n":9007199254740992}}',
        '{{"k":"{s}","n":1e999}}',
        '{{"k":"{s}\\ud800"}}',
        '{{"k":"{s}","n":[1,]}}',
        '{{"k":"{s}',
        '{{"k":"{s}" "n":1}}',
        '{{"k":"{s}\x01"}}',
        '{{"k":"{s}"}}\xff',
        '["{s}"' + "[" * 100,
    ],
)
def test_secret_values_never_appear_in_messages(template: str) -> None:
    data = template.format(s=SECRET).encode("utf-8", "surrogateescape")
    assert SECRET not in rejection(data)


_INSERTS = [b"[", b"{", b'"', b"\\", b"\\ud800", b"-0", b"1e999", b",", b"\xff", b"NaN"]


def _mutate(rng: random.Random, data: bytearray) -> bytes:
    for _ in range(rng.randint(1, 4)):
        pos = rng.randrange(len(data) + 1)
        op = rng.randrange(3)
        if op == 0 and data:
            del data[pos : pos + rng.randint(1, 3)]
        elif op == 1:
            data[pos:pos] = rng.choice(_INSERTS)
        elif data:
            data[min(pos, len(data) - 1)] = rng.randrange(256)
    return bytes(data)


_JSONISH = b'{}[]{}[]""""::,,\\\\-0123456789.eE+ \n\tnulltruefalseNaNInfinityu00d8ff'


def test_fuzz_only_values_or_input_errors() -> None:
    rng = random.Random(20240601)
    seeds = [
        json.dumps({"items": [{"sku": "a", "qty": 2, "price": 1.5}], "note": "é😀"}).encode(),
        b'{"a":[[[{"b":null}]]],"c":"\\u00e9\\ud83d\\ude00","d":-12.5e-3}',
    ]
    for i in range(6000):
        if i % 3 == 0:
            data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
        elif i % 3 == 1:  # bytes that often get past the UTF-8 check and into the parser
            data = bytes(rng.choice(_JSONISH) for _ in range(rng.randint(0, 64)))
        else:
            data = _mutate(rng, bytearray(rng.choice(seeds)))
        try:
            value = parse(data, max_bytes=256, max_depth=8)
        except InputError as e:
            assert e.code == "invalid_input"
            # the catch-all is a safety net: every rejection the fuzzer finds is deliberate
            assert e.message != "input could not be parsed", data
        else:
            canonical_json(value)  # whatever is accepted has a canonical form for the digest
