"""The call digest: hand-written vectors, the docs' table, and sensitivity to every field.

The expected canonical texts below are written by hand, not produced by rfc8785, and the
digests were cross-checked with an independent JavaScript implementation.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import NamedTuple

import pytest

from toolauthz.canonical import _in_domain
from toolauthz.digest import DIGEST_DOMAIN, call_digest, canonical_json
from toolauthz.errors import InputError
from toolauthz.strict_json import parse_strict_json

DOC = Path(__file__).resolve().parent.parent / "docs" / "digest.md"


class Vector(NamedTuple):
    name: str
    tool: str
    principal_type: str
    principal_id: str
    tenant: str
    call_id: str
    sent: bytes  # the model's arguments as they arrive
    canonical: str  # exactly the bytes hashed after the prefix (as text)
    digest: str

    def fields(self) -> dict:
        return dict(
            tool=self.tool,
            principal_type=self.principal_type,
            principal_id=self.principal_id,
            tenant=self.tenant,
            call_id=self.call_id,
        )


VECTORS = [
    Vector(
        "ascii", "orders.refund", "user", "alice", "acme", "call-0001",
        b'{"order_id":"ord_123","amount_cents":1250,"reason":"damaged"}',
        '{"call_id":"call-0001",'
        '"input":{"amount_cents":1250,"order_id":"ord_123","reason":"damaged"},'
        '"principal":{"id":"alice","type":"user"},"tenant":"acme","tool":"orders.refund"}',
        "f27f4bdb21ee3ebf53c7a5897434a036013a3083f9b92140f4948354aaff7600",
    ),
    Vector(
        "non_ascii_keys", "geo.lookup", "user", "bob", "acme", "call-0002",
        '{"日本":"東京","é":"accent","z":1}'.encode(),
        # UTF-16 order: z (007A) < é (00E9) < 日 (65E5)
        '{"call_id":"call-0002","input":{"z":1,"é":"accent","日本":"東京"},'
        '"principal":{"id":"bob","type":"user"},"tenant":"acme","tool":"geo.lookup"}',
        "ea5ef174faf472e77a0c32ce6b533df65d0df6df955b94423af5befabc78daa5",
    ),
    Vector(
        "utf16_order", "geo.lookup", "user", "bob", "acme", "call-0003",
        rb'{"\ufffd":3,"\ud83d\ude00":2,"a":1}',
        # the emoji is D83D DE00 in UTF-16, so it sorts before U+FFFD
        '{"call_id":"call-0003","input":{"a":1,"\U0001f600":2,"\ufffd":3},'
        '"principal":{"id":"bob","type":"user"},"tenant":"acme","tool":"geo.lookup"}',
        "7b9db144fc4dcfe1a108ceca3303af545a634966ba390d0608e57fa1df4e2223",
    ),
    Vector(
        "numbers", "measurements.record", "service", "svc-lab", "globex", "call-0004",
        b'{"one":1.0,"big":1e21,"tiny":5e-324,"neg":-1.5,"zero":0,"e":1E2,"max":9007199254740991}',
        '{"call_id":"call-0004","input":{"big":1e+21,"e":100,"max":9007199254740991,"neg":-1.5,'
        '"one":1,"tiny":5e-324,"zero":0},"principal":{"id":"svc-lab","type":"service"},'
        '"tenant":"globex","tool":"measurements.record"}',
        "efe3eb1d48123deb61fca88c8a7fb6dc88fbbabbc828cf481ab9989f686da13d",
    ),
    Vector(
        "nested", "orders.create", "user", "alice", "acme", "call-0005",
        b'{"items":[{"sku":"A-1","qty":2},{"sku":"B-2","qty":1,"tags":["gift",null,true,false]}],'
        b'"meta":{"z":{},"a":[]}}',
        '{"call_id":"call-0005","input":{"items":[{"qty":2,"sku":"A-1"},'
        '{"qty":1,"sku":"B-2","tags":["gift",null,true,false]}],"meta":{"a":[],"z":{}}},'
        '"principal":{"id":"alice","type":"user"},"tenant":"acme","tool":"orders.create"}',
        "81c37da47c532f25338b7d061e8106a84403efb6da321181efd41974a90ab53f",
    ),
    Vector(
        "string_escapes", "notes.add", "user", "alice", "acme", "call-0006",
        rb'{"note":"a\"b\\c\nd\te\u0001f\u001Fg\/h\u00e9"}',
        # minimal escaping: lowercase \u001f, "/" and "é" written raw
        r'{"call_id":"call-0006","input":{"note":"a\"b\\c\nd\te\u0001f\u001fg/h' "\u00e9" r'"},'
        r'"principal":{"id":"alice","type":"user"},"tenant":"acme","tool":"notes.add"}',
        "58677c951d1d320a3ad5f9f107997937941794a5366cb39ec657d0e0b3b2489e",
    ),
    Vector(
        "nfc", "notes.add", "user", "alice", "acme", "call-0007",
        rb'{"name":"caf\u00e9"}',
        '{"call_id":"call-0007","input":{"name":"caf\u00e9"},'
        '"principal":{"id":"alice","type":"user"},"tenant":"acme","tool":"notes.add"}',
        "503f3eb013f53894cd91cdeb3e0cb62a7b9d0be6e279aa3e2c4b7718e352137b",
    ),
    Vector(
        "nfd", "notes.add", "user", "alice", "acme", "call-0007",
        rb'{"name":"cafe\u0301"}',  # same text as nfc to the eye; no normalization, on purpose
        '{"call_id":"call-0007","input":{"name":"cafe\u0301"},'
        '"principal":{"id":"alice","type":"user"},"tenant":"acme","tool":"notes.add"}',
        "36fccc339fa533c89449e3d3e27b3c34694919a9793ff77362f9805a8a400904",
    ),
]


def _input(v: Vector) -> object:
    return parse_strict_json(v.sent, max_bytes=65536)


def test_domain_prefix_bytes() -> None:
    assert DIGEST_DOMAIN == b"toolauthz/call/v1\n"
    assert DIGEST_DOMAIN.hex() == "746f6f6c617574687a2f63616c6c2f76310a"


@pytest.mark.parametrize("v", VECTORS, ids=[v.name for v in VECTORS])
def test_vector(v: Vector) -> None:
    value = _input(v)
    call = {"call_id": v.call_id, "input": value,
            "principal": {"type": v.principal_type, "id": v.principal_id},
            "tenant": v.tenant, "tool": v.tool}
    assert canonical_json(call) == v.canonical.encode("utf-8")
    # the literal digest is sha256 of the hand-written text, and call_digest agrees
    assert hashlib.sha256(DIGEST_DOMAIN + v.canonical.encode("utf-8")).hexdigest() == v.digest
    assert call_digest(input=value, **v.fields()) == v.digest


def test_the_vectors_cover_both_writers() -> None:
    # canonical.py writes inside its domain with orjson and outside it with rfc8785: the
    # pinned digests hold for both (utf16_order has an astral key, numbers has 1.0).
    inside = {v.name: _in_domain(_input(v), 0) for v in VECTORS}
    assert not inside["utf16_order"] and not inside["numbers"]
    assert inside["ascii"] and inside["non_ascii_keys"] and inside["string_escapes"] and inside["nested"]


def test_nfc_and_nfd_differ() -> None:
    by_name = {v.name: v for v in VECTORS}
    assert by_name["nfc"].digest != by_name["nfd"].digest


def _doc_rows() -> list[list[str]]:
    """Rows of the vector table in docs/digest.md, each cell stripped."""
    rows = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and re.fullmatch(r"`[0-9a-f]{64}`", cells[-1]):
            rows.append(cells)
    return rows


def _code(cell: str) -> str:
    assert cell.startswith("`") and cell.endswith("`")
    return cell[1:-1]


def test_doc_vectors_match_code() -> None:
    rows = _doc_rows()
    assert [r[0] for r in rows] == [v.name for v in VECTORS]  # the doc shows every vector
    for (name, fields_cell, sent, canonical, digest), v in zip(rows, VECTORS, strict=True):
        tool, ptype, pid, tenant, call_id = re.findall(r"`([^`]*)`", fields_cell)
        value = parse_strict_json(_code(sent).encode("utf-8"), max_bytes=65536)
        got = call_digest(tool=tool, input=value, principal_type=ptype, principal_id=pid,
                          tenant=tenant, call_id=call_id)
        assert got == _code(digest) == v.digest, name
        assert _code(canonical) == v.canonical, name


def test_int_and_float_spellings_share_a_digest() -> None:
    v = VECTORS[0]
    assert call_digest(input={"n": 1}, **v.fields()) == call_digest(input={"n": 1.0}, **v.fields())


_BASE = dict(
    tool="orders.refund",
    principal_type="user",
    principal_id="alice",
    tenant="acme",
    call_id="call-0001",
    input={"order_id": "ord_123", "amount_cents": 1250, "items": [1, 2]},
)


@pytest.mark.parametrize(
    "change",
    [
        {"tool": "orders.refunds"},
        {"principal_type": "service"},
        {"principal_id": "alicf"},
        {"tenant": "acme2"},
        {"call_id": "call-0002"},
        {"input": {"order_id": "ord_124", "amount_cents": 1250, "items": [1, 2]}},
        {"input": {"order_id": "ord_123", "amount_cents": 1251, "items": [1, 2]}},
        {"input": {"order_id": "ord_123", "amount_cents": 1250, "items": [2, 1]}},
        {"input": {"order_id": "ord_123", "amount_cents": "1250", "items": [1, 2]}},
        # moving a value between principal fields must not collide
        {"principal_type": "alice", "principal_id": "user"},
    ],
)
def test_any_single_change_changes_the_digest(change: dict) -> None:
    assert call_digest(**{**_BASE, **change}) != call_digest(**_BASE)


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),
        float("inf"),
        2**53,
        {"k": -(2**60)},
        ["\ud800"],
        {"\udc00": 1},
        {1: "a"},
        {"a": object()},
        {"a": b"bytes"},
    ],
)
def test_canonicalization_failures_are_input_errors(value: object) -> None:
    with pytest.raises(InputError) as info:
        canonical_json(value)
    assert info.value.code == "invalid_input"
    message = info.value.message
    assert "9007199254740992" not in message and "1152921504606846976" not in message


def test_deep_python_value_is_an_input_error() -> None:
    deep: list = []
    for _ in range(10_000):
        deep = [deep]
    with pytest.raises(InputError):
        call_digest(input=deep, **VECTORS[0].fields())


@pytest.mark.parametrize("field", ["tool", "principal_type", "principal_id", "tenant", "call_id"])
def test_non_string_fields_are_rejected(field: str) -> None:
    with pytest.raises(InputError) as info:
        call_digest(**{**_BASE, field: 1})
    assert f"`{field}`" in info.value.message
