"""The hash chain and its verification: every kind of tampering is found and named.

Tampering is done the way an attacker with the file would do it: raw SQL on the SQLite
database, after dropping the append-only triggers.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import replace

import pyseto
import pytest
import rfc8785
from conftest import key_pair

from toolauthz.audit import (
    GENESIS_HASH,
    AuditEvent,
    AuditRecord,
    ChainHead,
    CheckpointError,
    canonical_body,
    record_hash,
    sign_checkpoint,
    sign_heads,
    verify_chain,
    verify_checkpoint,
)
from toolauthz.audit.checkpoint import PURPOSE
from toolauthz.audit.merkle import heads_json
from toolauthz.audit.records import chain
from toolauthz.canonical import _in_domain
from toolauthz.store import SqliteAuditLog

T0 = 1_800_000_000.0


AUDIT_KEY, AUDIT_PUB = key_pair()


def event(i: int) -> AuditEvent:
    return AuditEvent(
        kind="authorize", time=T0 + i, decision_id=f"d-{i}", request_id=f"r-{i}",
        call_id=f"c-{i}", tenant="acme", principal='User::"alice"', tool="refund",
        resource='Order::"o-1"', result="ALLOW", reasons=("policy0",), digest="ab" * 32,
        policy_version="v1", fields={"amount": i}, detail={"shadow": ["allow"]})


@pytest.fixture
def store(tmp_path):
    """Ten records in one chain (seq and chain_seq agree) and a checkpoint over them."""
    log = SqliteAuditLog(tmp_path / "audit.db", chains=1)
    log.append([event(i) for i in range(1, 11)])
    cp = sign_heads(log.heads(), T0 + 11, AUDIT_KEY, "audit-1")
    log.add_checkpoint(cp.token, cp)
    yield log
    log.close()


def tamper(log: SqliteAuditLog, *statements: str, params=()) -> None:
    conn = sqlite3.connect(log.path)
    conn.execute("DROP TRIGGER audit_record_no_update")
    conn.execute("DROP TRIGGER audit_record_no_delete")
    for sql in statements:
        conn.execute(sql, params)
    conn.commit()
    conn.close()


def findings(log: SqliteAuditLog) -> list[tuple[int, str]]:
    return [(f.seq, f.kind) for f in verify_chain(log.iter_records(), log.checkpoints(), AUDIT_PUB)]


def test_record_hash_is_domain_separated_sha256_over_prev_and_body():
    body = canonical_body(1, event(1))
    expected = hashlib.sha256(b"toolauthz/audit/v1\n" + GENESIS_HASH.encode() + b"\n" + body)
    assert record_hash(GENESIS_HASH, body) == expected.hexdigest()


def test_canonical_body_covers_every_field_but_the_hashes():
    with_caller = replace(event(1), caller="spiffe://acme.example/agent")
    body = rfc8785.dumps({**{k: v for k, v in vars(with_caller).items()},
                          "reasons": ["policy0"], "error_codes": [], "seq": 7})
    assert canonical_body(7, with_caller) == body
    assert b"prev_hash" not in body and b'"hash"' not in body and b'"time":1800000001' in body


def test_an_empty_caller_is_left_out_of_the_body_as_records_older_than_the_field_were_hashed():
    # The body every record was hashed with before `caller` existed: all the other fields.
    old_body = rfc8785.dumps({**{k: v for k, v in vars(event(1)).items() if k != "caller"},
                              "reasons": ["policy0"], "error_codes": [], "seq": 7})
    assert canonical_body(7, event(1)) == old_body
    assert canonical_body(7, replace(event(1), caller="x")) != old_body
    # The hash the version before `caller` existed gave this record (computed with it).
    assert record_hash(GENESIS_HASH, canonical_body(1, event(1))) == \
        "1f7f022e5bd070e7fe6ed75610d655ca8089b151d5ce681e2f453a97a54e5907"


def test_untouched_store_has_no_findings(store):
    assert findings(store) == []


def test_edited_field_is_named(store):
    tamper(store, "UPDATE audit_record SET result = 'DENY' WHERE seq = 3")
    assert findings(store) == [(3, "edited")]


def test_edited_json_field_is_named(store):
    tamper(store, """UPDATE audit_record SET fields = '{"amount":1000000}' WHERE seq = 4""")
    assert findings(store) == [(4, "edited")]


def test_row_that_breaks_validation_still_loads_and_is_named(store):
    tamper(store, "PRAGMA ignore_check_constraints = ON",
           "UPDATE audit_record SET kind = 'bogus', reasons = 'not json' WHERE seq = 6")
    assert findings(store) == [(6, "edited")]


def test_record_edited_and_rehashed_alone_is_named_by_the_next_link(store):
    tamper(store, "UPDATE audit_record SET result = 'DENY' WHERE seq = 3")
    third = next(store.iter_records(3))
    tamper_hash = record_hash(third.prev_hash, third.body())
    conn = sqlite3.connect(store.path)
    conn.execute("UPDATE audit_record SET hash = ? WHERE seq = 3", (tamper_hash,))
    conn.commit()
    conn.close()
    assert findings(store) == [(3, "edited")]


def test_deleted_record_is_named(store):
    tamper(store, "DELETE FROM audit_record WHERE seq = 5")
    result = verify_chain(store.iter_records(), store.checkpoints(), AUDIT_PUB)
    assert [(f.seq, f.last_seq, f.kind) for f in result] == [(5, 5, "deleted")]


def test_deleted_range_is_named(store):
    tamper(store, "DELETE FROM audit_record WHERE seq BETWEEN 4 AND 6")
    result = verify_chain(store.iter_records(), store.checkpoints(), AUDIT_PUB)
    assert [(f.seq, f.last_seq, f.kind) for f in result] == [(4, 6, "deleted")]


def test_swapped_records_are_named(store):
    tamper(store, "UPDATE audit_record SET seq = 1000, chain_seq = 1000 WHERE seq = 3",
           "UPDATE audit_record SET seq = 3, chain_seq = 3 WHERE seq = 7",
           "UPDATE audit_record SET seq = 7, chain_seq = 7 WHERE seq = 1000")
    assert findings(store) == [(3, "reordered"), (7, "reordered")]


def test_records_out_of_seq_order_are_named():
    records = chain([event(i) for i in range(1, 6)], 0, GENESIS_HASH)
    shuffled = [records[0], records[1], records[3], records[2], records[4]]
    assert [(f.seq, f.kind) for f in verify_chain(shuffled, [], AUDIT_PUB)] == [(3, "reordered")]


def test_truncated_log_is_named(store):
    tamper(store, "DELETE FROM audit_record WHERE seq > 7")
    result = verify_chain(store.iter_records(), store.checkpoints(), AUDIT_PUB)
    assert [(f.seq, f.last_seq, f.kind) for f in result] == [(8, 10, "truncated")]


def test_rewritten_tail_is_caught_only_by_the_checkpoint(store):
    second = list(store.iter_records())[1]
    early = sign_heads([ChainHead("0", 2, second.hash)], T0 + 2, AUDIT_KEY, "audit-1")
    store.add_checkpoint(early.token, early)
    # Edit record 3, then re-hash it and every later record: the chain is consistent.
    tamper(store, "UPDATE audit_record SET result = 'DENY' WHERE seq = 3")
    prev, updates = second.hash, []
    for r in store.iter_records(3):
        updates.append((prev, record_hash(prev, r.body()), r.seq))
        prev = updates[-1][1]
    conn = sqlite3.connect(store.path)
    conn.executemany("UPDATE audit_record SET prev_hash = ?, hash = ? WHERE seq = ?", updates)
    conn.commit()
    conn.close()

    assert verify_chain(store.iter_records(), [], AUDIT_PUB) == []
    result = verify_chain(store.iter_records(), store.checkpoints(), AUDIT_PUB)
    assert [(f.seq, f.kind) for f in result] == [(10, "checkpoint_mismatch")]
    assert "3..10" in result[0].message


def test_forged_checkpoint_signature_is_named(store):
    attacker_key, _ = key_pair()
    # The attacker truncates the log and signs a checkpoint that matches the shorter log.
    tamper(store, "DELETE FROM audit_record WHERE seq > 7")
    seventh = list(store.iter_records())[-1]
    forged = sign_heads([ChainHead("0", 7, seventh.hash)], T0 + 12, attacker_key, "audit-1")
    conn = sqlite3.connect(store.path)
    conn.execute("UPDATE audit_checkpoint SET count = ?, head_hash = ?, token = ?, heads = ?",
                 (forged.count, forged.head_hash, forged.token, heads_json(forged.heads)))
    conn.commit()
    conn.close()
    assert findings(store) == [(7, "bad_checkpoint_signature")]


def test_bit_flipped_checkpoint_signature_is_named(store):
    token = store.checkpoints()[0].token
    flipped = token[:-20] + ("A" if token[-20] != "A" else "B") + token[-19:]
    tamper(store, "UPDATE audit_checkpoint SET token = ?", params=(flipped,))
    assert findings(store) == [(10, "bad_checkpoint_signature")]


def test_stored_checkpoint_columns_are_not_trusted(store):
    # Lowering the count column does not hide a truncation: only the token counts.
    tamper(store, "DELETE FROM audit_record WHERE seq > 7",
           "UPDATE audit_checkpoint SET count = 7")
    assert findings(store) == [(8, "truncated")]


def test_verification_streams_a_generator():
    def records():
        prev = GENESIS_HASH
        for seq in range(1, 5001):
            body = canonical_body(seq, event(seq))
            record = AuditRecord(seq, event(seq), prev, record_hash(prev, body))
            prev = record.hash
            yield record

    assert verify_chain(records(), [], AUDIT_PUB) == []


def test_findings_are_capped():
    records = chain([event(i) for i in range(1, 101)], 0, GENESIS_HASH)
    broken = [AuditRecord(r.seq, r.event, r.prev_hash, "0" * 64) for r in records]
    assert len(verify_chain(broken, [], AUDIT_PUB, max_findings=10)) == 10


def test_checkpoint_round_trip():
    cp = sign_checkpoint(3, "ab" * 32, T0, AUDIT_KEY, "audit-1")
    assert verify_checkpoint(cp.token, AUDIT_PUB) == cp
    other_key, other_pub = key_pair()
    assert verify_checkpoint(cp.token, [other_pub, AUDIT_PUB]).kid == "audit-1"


def test_checkpoint_does_not_verify_with_another_key():
    _, other_pub = key_pair()
    cp = sign_checkpoint(3, "ab" * 32, T0, AUDIT_KEY, "audit-1")
    with pytest.raises(CheckpointError):
        verify_checkpoint(cp.token, other_pub)


def test_a_token_signed_for_another_purpose_is_not_a_checkpoint():
    payload = rfc8785.dumps({"count": 3, "head_hash": "ab" * 32, "time": T0})
    token = pyseto.encode(AUDIT_KEY, payload, footer=b'{"kid":"audit-1"}',
                          implicit_assertion=b"toolauthz/token/v1").decode()
    with pytest.raises(CheckpointError):
        verify_checkpoint(token, AUDIT_PUB)
    assert PURPOSE == b"toolauthz/audit-checkpoint/v1"


@pytest.mark.parametrize("token", ["", "v4.public.", "v4.local.abc", "not a token"])
def test_malformed_checkpoint_tokens_raise(token):
    with pytest.raises(CheckpointError):
        verify_checkpoint(token, AUDIT_PUB)


def test_event_rejects_values_that_cannot_be_hashed():
    with pytest.raises(ValueError):
        AuditEvent(kind="nope", time=T0)
    with pytest.raises(ValueError):
        AuditEvent(kind="verify", time=float("nan"))
    with pytest.raises(ValueError):
        AuditEvent(kind="verify", time=T0, fields={"n": 2**60})
    with pytest.raises(ValueError, match="surrogate"):
        AuditEvent(kind="verify", time=T0, tenant="\ud800")
    with pytest.raises(TypeError):
        AuditEvent(kind="verify", time=T0, tenant=None)
    with pytest.raises(TypeError):
        AuditEvent(kind="verify", time=T0, reasons=(1,))


def test_event_is_a_copy_of_what_the_caller_passed():
    fields = {"amount": 1.0, "items": (1, 2)}
    event = AuditEvent(kind="verify", time=1, fields=fields, reasons=["p"])
    fields["amount"] = 99
    assert event.fields == {"amount": 1, "items": [1, 2]}
    assert event.reasons == ("p",) and event.time == 1.0


def test_public_names():
    import toolauthz.audit

    assert sorted(toolauthz.audit.__all__) == sorted([
        "GENESIS_HASH", "KINDS", "LEGACY_CHAIN", "AuditEvent", "AuditLog", "AuditQuery", "AuditRecord",
        "ChainHead", "Checkpoint", "CheckpointError", "Finding", "canonical_body", "chain_of", "heads_root",
        "record_hash", "sign_checkpoint", "sign_heads", "verify_chain", "verify_checkpoint"])
    assert all(hasattr(toolauthz.audit, name) for name in toolauthz.audit.__all__)


def test_a_record_inside_the_fast_encoders_domain_hashes_as_it_always_has():
    # A fractional time, a float, non-ASCII text and a control character: canonical.py
    # writes this body with orjson, and it must be the bytes rfc8785 gave (hash computed
    # with rfc8785 before canonical.py existed).
    e = AuditEvent(kind="authorize", time=1_800_000_001.25, decision_id="d-1", request_id="r-1",
                   call_id="c-1", tenant="acme", principal='User::"alice"', tool="refund",
                   resource='Order::"o-1"', result="ALLOW", reasons=("policy0",), digest="ab" * 32,
                   policy_version="v1", fields={"/amount": 12.5, "/note": "caf\u00e9 \u65e5\u672c\n", "/n": -7},
                   detail={"shadow": ["allow"]}, caller="spiffe://acme.example/agent")
    body = canonical_body(3, e)
    assert _in_domain(json.loads(body), 0)
    assert body == rfc8785.dumps(json.loads(body))
    assert record_hash(GENESIS_HASH, body) == "d1cda564008b4317c57dbeff082f8f92684ca38787c80eb13a68139b4b029c1d"
