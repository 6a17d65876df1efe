"""The audit log: appends, queries and failures on every backend (the `log` fixture);
the SQLite file's own properties (plain columns, index plans, several processes)."""

from __future__ import annotations

import multiprocessing
import sqlite3
from dataclasses import fields as dataclass_fields
from pathlib import Path

import pyseto
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from toolauthz.audit import GENESIS_HASH, AuditEvent, AuditQuery, ChainHead, chain_of, heads_root, verify_chain
from toolauthz.audit.records import DEFAULT_CHAINS
from toolauthz.errors import StoreUnavailable
from toolauthz.store import SqliteAuditLog
from toolauthz.store.sqlite.audit_sql import build_query

T0 = 1_800_000_000.0


def public_key():
    pem = Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return pyseto.Key.new(4, "public", pem)


def event(i: int, **overrides) -> AuditEvent:
    values = dict(
        kind="authorize", time=T0 + i, decision_id=f"d-{i}", request_id=f"r-{i}",
        call_id=f"c-{i}", tenant="acme", principal='User::"alice"', tool="refund",
        resource='Order::"o-1"', result="ALLOW", digest="ab" * 32, policy_version="v1")
    return AuditEvent(**{**values, **overrides})


@pytest.fixture
def log(store):
    """The audit log of a fresh store of each backend."""
    return store.audit_log


@pytest.fixture
def sqlite_log(tmp_path):
    log = SqliteAuditLog(tmp_path / "audit.db")
    yield log
    log.close()


def test_append_numbers_and_chains_records(log):
    # Two records of one call (one chain, whatever the number of chains), then another call's.
    first = log.append([event(1), event(2, call_id="c-1")])
    second = log.append([event(3, call_id="c-1"), event(4)])
    records = first + second
    assert [r.seq for r in records] == [1, 2, 3, 4]
    assert [r.chain_seq for r in records[:3]] == [1, 2, 3] and len({r.chain for r in records[:3]}) == 1
    assert records[0].prev_hash == GENESIS_HASH
    assert records[1].prev_hash == records[0].hash and records[2].prev_hash == records[1].hash
    assert all(r.chain == chain_of(r.event, DEFAULT_CHAINS) for r in records)
    assert list(log.iter_records()) == records
    assert sorted(log.iter_chains(), key=lambda r: r.seq) == records
    used = {h.chain: h for h in log.heads() if h.seq}
    assert used[records[2].chain] == ChainHead(records[2].chain, 3, records[2].hash)
    assert sum(h.seq for h in used.values()) == 4
    assert log.head() == (4, heads_root(log.heads()))
    assert log.append([]) == []


def test_records_read_back_equal_what_was_written(log):
    written = log.append([event(1, reasons=("p1", "p2"), error_codes=("e",),
                                fields={"amount": 1.0, "note": "é"},
                                detail={"unverified_outcome": True})])
    (read,) = log.query(AuditQuery(), limit=10)
    assert read == written[0]
    assert read.event.fields == {"amount": 1, "note": "é"}  # canonical: 1.0 is 1


def test_iter_records_pages_through_a_long_log(log):
    log.append([event(i) for i in range(1, 2501)])
    assert [r.seq for r in log.iter_records()] == list(range(1, 2501))
    assert [r.seq for r in log.iter_records(from_seq=2400)] == list(range(2400, 2501))
    assert verify_chain(log.iter_records(), [], public_key()) == []


def test_columns_are_plain_and_readable_without_this_code(sqlite_log):
    sqlite_log.append([event(1, reasons=("p1",), fields={"amount": 5})])
    conn = sqlite3.connect(sqlite_log.path)
    conn.row_factory = sqlite3.Row
    row = conn.execute("SELECT * FROM audit_record").fetchone()
    conn.close()
    event_names = [f.name for f in dataclass_fields(AuditEvent)]
    assert row.keys() == ["seq", *event_names, "prev_hash", "hash", "chain", "chain_seq"]
    assert (row["reasons"], row["fields"], row["detail"]) == ('["p1"]', '{"amount":5}', "{}")
    assert isinstance(row["time"], float) and row["principal"] == 'User::"alice"'


def test_records_cannot_be_changed_through_sql_by_mistake(sqlite_log):
    sqlite_log.append([event(1)])
    conn = sqlite3.connect(sqlite_log.path)
    for sql in ("UPDATE audit_record SET result = 'DENY'", "DELETE FROM audit_record"):
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            conn.execute(sql)
    conn.close()


def test_secrets_outside_the_allow_list_are_never_stored(sqlite_log):
    arguments = {"amount": 12, "card_number": "4111-1111-SECRET-TOKEN"}
    allow_list = ["amount"]  # what the tool's catalog entry names
    # There is no field for the arguments: only allow-listed fields can be passed on.
    assert "arguments" not in {f.name for f in dataclass_fields(AuditEvent)}
    assert "input" not in {f.name for f in dataclass_fields(AuditEvent)}
    sqlite_log.append([event(1, fields={k: arguments[k] for k in allow_list})])
    sqlite_log.close()
    conn = sqlite3.connect(sqlite_log.path)
    row = conn.execute("SELECT * FROM audit_record").fetchone()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    assert '{"amount":12}' in row
    assert not any("SECRET" in str(value) for value in row)
    raw = b"".join(p.read_bytes() for p in Path(sqlite_log.path).parent.iterdir())
    assert b"SECRET" not in raw and b"card_number" not in raw


FILTERS = {
    "tenant": ("globex", "audit_record_tenant"),
    "principal": ('User::"bob"', "audit_record_principal"),
    "tool": ("delete_user", "audit_record_tool"),
    "call_id": ("c-7", "audit_record_call_id"),
    "request_id": ("r-7", "audit_record_request_id"),
    "result": ("DENY", "audit_record_result"),
    "kind": ("outcome", "audit_record_kind"),
    "resource": ('Order::"o-2"', "audit_record_resource"),
    "approver": ('User::"carol"', "audit_record_approver"),
    "approval_id": ("ap-9", "audit_record_approval_id"),
    "decision_id": ("d-7", "audit_record_decision_id"),
}
UNINDEXED = {"policy_version": "v2", "caller": "spiffe://acme/agent"}


def _fill_mixed(log):
    """30 records; every third one differs from the default in every filterable field."""
    log.append([
        event(i, tenant="globex", principal='User::"bob"', tool="delete_user", result="DENY", kind="outcome",
              resource='Order::"o-2"', approver='User::"carol"', approval_id="ap-9", policy_version="v2",
              caller="spiffe://acme/agent", reasons=("forbid-large", "p-7"), error_codes=("e-1", "not_call_owner"))
        if i % 3 == 0 else event(i, reasons=("permit-small",), error_codes=("e-1",))
        for i in range(1, 31)])
    return log


@pytest.fixture
def mixed(log):
    return _fill_mixed(log)


@pytest.fixture
def mixed_sqlite(sqlite_log):
    return _fill_mixed(sqlite_log)


@pytest.mark.parametrize("name", FILTERS)
def test_each_filter_selects_its_records(mixed, name):
    value, _ = FILTERS[name]
    got = mixed.query(AuditQuery(**{name: value}), limit=100)
    assert got and all(getattr(r.event, name) == value for r in got)
    expected = [r for r in mixed.iter_records() if getattr(r.event, name) == value]
    assert got == expected


@pytest.mark.parametrize("name", FILTERS)
def test_each_filter_reads_an_index_in_seq_order(mixed_sqlite, name):
    value, index = FILTERS[name]
    sql, params = build_query(AuditQuery(**{name: value}), 0, 100)
    plan = plan_of(mixed_sqlite, sql, params)
    assert f"USING INDEX {index} ({name}=? AND rowid>?)" in plan
    assert "SCAN" not in plan and "TEMP B-TREE" not in plan  # no full scan, no sort


@pytest.mark.parametrize("query, index", [
    (AuditQuery(tenant="acme", time_from=T0, time_to=T0 + 5), "audit_record_tenant_time"),
    (AuditQuery(tenant="acme", time_from=T0), "audit_record_tenant_time"),
    (AuditQuery(time_from=T0, time_to=T0 + 5), "audit_record_time"),
    (AuditQuery(time_to=T0 + 5), "audit_record_time"),
    (AuditQuery(tenant="acme", call_id="c-1", time_from=T0), "audit_record_call_id"),
])
def test_time_windows_read_an_index(mixed_sqlite, query, index):
    plan = plan_of(mixed_sqlite, *build_query(query, 0, 100))
    assert f"USING INDEX {index} " in plan and "SCAN" not in plan


def plan_of(log: SqliteAuditLog, sql: str, params) -> str:
    conn = sqlite3.connect(log.path)
    plan = " | ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))
    conn.close()
    return plan


@pytest.mark.parametrize("name", UNINDEXED)
def test_each_unindexed_filter_selects_its_records(mixed, name):
    value = UNINDEXED[name]
    got = mixed.query(AuditQuery(**{name: value}), limit=100)
    assert [r.seq for r in got] == list(range(3, 31, 3))


@pytest.mark.parametrize("filters, seqs", [
    ({"error_code": "not_call_owner"}, list(range(3, 31, 3))),
    ({"error_code": "e-1"}, list(range(1, 31))),
    ({"error_code": "e-"}, []),  # an element, not a substring
    ({"error_code": '"e-1"'}, []),  # an element's value, not its JSON text
    ({"error_code": "%"}, []),
    ({"policy_id": "p-7"}, list(range(3, 31, 3))),
    ({"policy_id": "permit-small", "tenant": "acme", "time_to": T0 + 5}, [1, 2, 4]),
    ({"policy_id": "forbid-large", "error_code": "e-1", "approver": 'User::"carol"'}, list(range(3, 31, 3))),
])
def test_list_filters_match_one_element(mixed, filters, seqs):
    assert [r.seq for r in mixed.query(AuditQuery(**filters), limit=100)] == seqs


def test_filters_combine(mixed):
    got = mixed.query(AuditQuery(tenant="acme", result="ALLOW", kind="authorize",
                                 time_from=T0 + 10, time_to=T0 + 20), limit=100)
    assert [r.seq for r in got] == [10, 11, 13, 14, 16, 17, 19]


def test_time_range_is_half_open(mixed):
    got = mixed.query(AuditQuery(time_from=T0 + 5, time_to=T0 + 8), limit=100)
    assert [r.seq for r in got] == [5, 6, 7]
    assert [r.seq for r in mixed.query(AuditQuery(time_from=T0 + 28), limit=100)] == [28, 29, 30]
    assert [r.seq for r in mixed.query(AuditQuery(time_to=T0 + 3), limit=100)] == [1, 2]


def test_paging_by_after_seq(mixed):
    pages, after = [], 0
    while page := mixed.query(AuditQuery(tenant="acme"), limit=7, after_seq=after):
        pages.append([r.seq for r in page])
        after = page[-1].seq
    assert [len(p) for p in pages] == [7, 7, 6]
    assert sum(pages, []) == [i for i in range(1, 31) if i % 3]


@pytest.mark.parametrize("limit, after", [(0, 0), (10_001, 0), (10, -1)])
def test_bad_page_arguments(log, limit, after):
    with pytest.raises(ValueError):
        log.query(AuditQuery(), limit=limit, after_seq=after)


def test_locked_database_becomes_store_unavailable_and_commits_nothing(tmp_path):
    log = SqliteAuditLog(tmp_path / "audit.db", busy_timeout=0.05)
    blocker = sqlite3.connect(log.path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    with pytest.raises(StoreUnavailable, match="write failed: database is locked"):
        log.append([event(1), event(2)])
    blocker.execute("ROLLBACK")
    blocker.close()
    assert log.head()[0] == 0
    assert [r.seq for r in log.append([event(1)])] == [1]  # the connection recovers
    log.close()


def test_unopenable_path_is_store_unavailable(tmp_path):
    with pytest.raises(StoreUnavailable, match="open failed"):
        SqliteAuditLog(tmp_path / "missing-dir" / "audit.db")


def test_newer_schema_is_refused(tmp_path):
    SqliteAuditLog(tmp_path / "audit.db").close()
    conn = sqlite3.connect(tmp_path / "audit.db")
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(StoreUnavailable, match="newer"):
        SqliteAuditLog(tmp_path / "audit.db")


def test_closed_log_is_store_unavailable(log):
    log.close()
    log.close()  # idempotent
    for call in (lambda: log.append([event(1)]), log.head, log.checkpoints,
                 lambda: log.query(AuditQuery(), limit=1), lambda: list(log.iter_records())):
        with pytest.raises(StoreUnavailable, match="closed"):
            call()


def _append_from_process(path: str, worker: int, count: int, start) -> None:
    log = SqliteAuditLog(path, busy_timeout=30)
    try:
        start.wait(30)
        for i in range(count):
            log.append([event(i, call_id=f"w{worker}-{i}", tenant=f"tenant-{worker}")])
    finally:
        log.close()


def test_two_processes_append_to_one_chain(tmp_path):
    path = str(tmp_path / "audit.db")
    SqliteAuditLog(path).close()
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    workers = [ctx.Process(target=_append_from_process, args=(path, w, 200, start))
               for w in (1, 2)]
    for p in workers:
        p.start()
    start.set()
    for p in workers:
        p.join(120)
        assert p.exitcode == 0
    log = SqliteAuditLog(path)
    records = list(log.iter_records())
    assert [r.seq for r in records] == list(range(1, 401))
    assert verify_chain(records, [], public_key()) == []
    tenants = [r.event.tenant for r in records]
    assert tenants.count("tenant-1") == tenants.count("tenant-2") == 200
    log.close()
