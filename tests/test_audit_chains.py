"""The trail as several chains: which record goes where, the Merkle root one checkpoint
signs over every chain's head, verification of every chain (a dropped or truncated
chain, heads stored beside a checkpoint that are not the signed ones), and the
migration of a trail written as one chain, which still verifies record for record."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest
from conftest import key_pair

from toolauthz.audit import (
    GENESIS_HASH,
    AuditEvent,
    ChainHead,
    CheckpointError,
    chain_of,
    sign_checkpoint,
    sign_heads,
    verify_chain,
    verify_checkpoint,
)
from toolauthz.audit.merkle import heads_json, heads_root, merkle_root
from toolauthz.audit.records import LEGACY_CHAIN, chain
from toolauthz.store import SqliteAuditLog
from toolauthz.store.audit_rows import COLUMNS, to_row
from toolauthz.store.open import open_store

T0 = 1_800_000_000.0
KEY, PUB = key_pair()

# RFC 6962 Merkle Tree Hashes of the first n of these leaves: the reference vectors of
# certificate-transparency's merkle_tree_test.
LEAVES = [b"", b"\x00", b"\x10", b"\x20\x21", b"\x30\x31", b"\x40\x41\x42\x43",
          b"\x50\x51\x52\x53\x54\x55\x56\x57", bytes(range(0x60, 0x70))]
ROOTS = ["e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
         "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
         "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
         "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
         "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
         "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
         "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
         "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
         "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"]


def event(i: int, tenant: str = "acme") -> AuditEvent:
    return AuditEvent(kind="authorize", time=T0 + i, call_id=f"c-{i}", tenant=tenant, result="ALLOW",
                      decision_id=f"d-{i}")


def test_the_merkle_root_is_rfc_6962s():
    assert [merkle_root(LEAVES[:n]).hex() for n in range(len(ROOTS))] == ROOTS


def test_a_record_goes_to_one_of_the_configured_chains_whoever_names_the_tenant():
    names = {chain_of(AuditEvent(kind="authorize", time=T0, tenant=f"tenant-{i}", call_id="c"), 4)
             for i in range(200)}
    assert names == {"0", "1", "2", "3"}  # bounded by the operator's number, not the tenants
    one_call = {chain_of(AuditEvent(kind=kind, time=T0, tenant="acme", call_id="c-1"), 16)
                for kind in ("authorize", "verify", "outcome")}
    assert len(one_call) == 1  # a call's story stays in one chain


def test_the_root_commits_every_head_in_name_order():
    heads = [ChainHead("1", 3, "ab" * 32), ChainHead("0", 2, "cd" * 32)]
    assert heads_root(heads) == heads_root(list(reversed(heads)))
    assert heads_root(heads) != heads_root([heads[0], ChainHead("0", 1, "cd" * 32)])
    cp = sign_heads(heads, T0, KEY, "audit-1")
    assert (cp.count, cp.version) == (5, 2)
    assert verify_checkpoint(cp.token, PUB, heads) == cp
    with pytest.raises(CheckpointError, match="not the ones it signs"):
        verify_checkpoint(cp.token, PUB, [heads[0]])  # a chain left out
    with pytest.raises(CheckpointError, match="not the ones it signs"):
        verify_checkpoint(cp.token, PUB, [heads[0], ChainHead("0", 2, "ef" * 32)])
    with pytest.raises(CheckpointError):
        sign_heads([heads[0], heads[0]], T0, KEY, "audit-1")  # one head per chain


@pytest.fixture
def trail(tmp_path):
    """Forty records over four chains, and a checkpoint over every head."""
    log = SqliteAuditLog(tmp_path / "audit.db", chains=4)
    log.append([event(i, tenant=f"t{i % 5}") for i in range(1, 41)])
    cp = sign_heads(log.heads(), T0 + 50, KEY, "audit-1")
    log.add_checkpoint(cp.token, cp)
    yield log
    log.close()


def tamper(log: SqliteAuditLog, *statements: tuple[str, tuple]) -> None:
    conn = sqlite3.connect(log.path)
    conn.execute("DROP TRIGGER audit_record_no_update")
    conn.execute("DROP TRIGGER audit_record_no_delete")
    for sql, params in statements:
        conn.execute(sql, params)
    conn.commit()
    conn.close()


def findings(log: SqliteAuditLog, heads=None) -> list[tuple[str, int, str]]:
    stored = log.heads() if heads is None else heads
    return [(f.chain, f.seq, f.kind) for f in verify_chain(log.iter_chains(), log.checkpoints(), PUB, heads=stored)]


def test_every_chain_verifies_chain_by_chain_and_in_seq_order(trail):
    assert len([h for h in trail.heads() if h.seq]) == 4
    assert findings(trail) == []
    assert verify_chain(trail.iter_records(), trail.checkpoints(), PUB, heads=trail.heads()) == []


def test_a_dropped_chain_is_named(trail):
    tamper(trail, ("DELETE FROM audit_record WHERE chain = '2'", ()), ("DELETE FROM audit_head WHERE chain = '2'", ()))
    (dropped,) = findings(trail)
    assert dropped[0] == "2" and dropped[2] == "dropped"


def test_a_truncated_chain_is_named_by_the_checkpoint_and_by_its_stored_head(trail):
    last = max(h.seq for h in trail.heads() if h.chain == "1")
    tamper(trail, ("DELETE FROM audit_record WHERE chain = '1' AND chain_seq = ?", (last,)))
    assert findings(trail) == [("1", last, "truncated")]
    # Without the checkpoints, the head the store keeps still says how long the chain was.
    assert [(f.chain, f.kind) for f in verify_chain(trail.iter_chains(), [], PUB, heads=trail.heads())] == \
        [("1", "truncated")]


def test_heads_stored_beside_a_checkpoint_are_trusted_only_if_they_hash_to_its_root(trail):
    (cp,) = trail.checkpoints()
    lowered = [ChainHead(h.chain, h.seq - 1 if h.chain == "3" else h.seq, h.hash) for h in cp.heads]
    tamper(trail, ("UPDATE audit_checkpoint SET heads = ?", (heads_json(lowered),)))
    assert [kind for _, _, kind in findings(trail)] == ["bad_checkpoint_signature"]


def test_an_edit_in_one_chain_names_that_chain_only(trail):
    tamper(trail, ("UPDATE audit_record SET result = 'DENY' WHERE chain = '0' AND chain_seq = 2", ()))
    assert findings(trail) == [("0", 2, "edited")]


def legacy_rows(count: int) -> tuple[list, str]:
    """A trail written as one chain: the records, and a checkpoint of its first format."""
    records = chain([event(i, tenant=f"t{i % 3}") for i in range(1, count + 1)], 0, GENESIS_HASH)
    assert all(r.chain == LEGACY_CHAIN and r.chain_seq == r.seq for r in records)
    return records, sign_checkpoint(count, records[-1].hash, T0 + 100, KEY, "audit-1").token


def test_a_sqlite_trail_of_one_chain_is_migrated_and_still_verifies(tmp_path):
    path = tmp_path / "old.db"
    SqliteAuditLog(path).close()
    records, token = legacy_rows(12)
    # The file as version 1 wrote it: no chains, no heads, seq the one chain's place.
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript("DROP INDEX audit_record_chain; DROP TABLE audit_head; "
                       "ALTER TABLE audit_record DROP COLUMN chain; ALTER TABLE audit_record DROP COLUMN chain_seq; "
                       "ALTER TABLE audit_checkpoint DROP COLUMN heads; PRAGMA user_version = 1;")
    old_columns = COLUMNS[:-2]
    marks = ", ".join("?" * len(old_columns))
    conn.executemany(f"INSERT INTO audit_record ({', '.join(old_columns)}) VALUES ({marks})",
                     [to_row(r)[:-2] for r in records])
    conn.execute("INSERT INTO audit_checkpoint (count, head_hash, time, kid, token) VALUES (12, ?, 1, 'audit-1', ?)",
                 (records[-1].hash, token))
    conn.close()

    log = SqliteAuditLog(path, chains=4)  # opening migrates
    try:
        assert [r.hash for r in log.iter_records()] == [r.hash for r in records]
        assert ChainHead(LEGACY_CHAIN, 12, records[-1].hash) in log.heads()
        new = log.append([event(i) for i in range(13, 20)])
        assert [r.seq for r in new] == list(range(13, 20)) and all(r.chain != LEGACY_CHAIN for r in new)
        cp = sign_heads(log.heads(), T0 + 200, KEY, "audit-1")
        log.add_checkpoint(cp.token, cp)
        assert findings(log) == []  # the old checkpoint pins the legacy chain, the new one every chain
        tamper(log, ("UPDATE audit_record SET result = 'DENY' WHERE seq = 5", ()))
        assert findings(log) == [(LEGACY_CHAIN, 5, "edited")]
    finally:
        log.close()


def test_a_postgresql_trail_of_one_chain_is_migrated_and_still_verifies(postgres_url):
    from toolauthz.store.postgres import migrate
    from toolauthz.store.postgres.schema import MIGRATIONS, SCHEMA_VERSION, event_columns

    records, token = legacy_rows(12)
    old_columns = COLUMNS[:-2]
    with psycopg.connect(postgres_url, autocommit=True) as conn, conn.transaction():  # version 1, as it was
        conn.execute("CREATE TABLE toolauthz_schema (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO toolauthz_schema (version) VALUES (1)")
        conn.execute(MIGRATIONS[0][1])
        for statement in event_columns():
            conn.execute(statement)
        with conn.cursor() as cursor:
            cursor.executemany(f"INSERT INTO audit_record ({', '.join(old_columns)}) "
                               f"VALUES ({', '.join(['%s'] * len(old_columns))})", [to_row(r)[:-2] for r in records])
        conn.execute("INSERT INTO audit_checkpoint (count, head_hash, time, kid, token) VALUES (12, %s, 1, 'k', %s)",
                     (records[-1].hash, token))
    assert (migrate(postgres_url).before, migrate(postgres_url).before) == (1, SCHEMA_VERSION)
    with open_store(postgres_url, chains=4) as store:
        log = store.audit_log
        assert [r.hash for r in log.iter_records()] == [r.hash for r in records]
        new = log.append([event(i) for i in range(13, 20)])
        assert [r.seq for r in new] == list(range(13, 20))  # the cursor goes on after the old records
        cp = sign_heads(log.heads(), T0 + 200, KEY, "audit-1")
        log.add_checkpoint(cp.token, cp)
        assert verify_chain(log.iter_chains(), log.checkpoints(), PUB, heads=log.heads()) == []
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # a replica still running version 1 code
        with pytest.raises(psycopg.errors.NotNullViolation):
            conn.execute(f"INSERT INTO audit_record ({', '.join(old_columns)}) "
                         f"VALUES ({', '.join(['%s'] * len(old_columns))})", (99, *to_row(records[0])[1:-2]))
