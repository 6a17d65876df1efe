"""The SQLite audit tables: schema, tuned queries, rows.

The columns are plain (TEXT, REAL, JSON text), so an auditor can read the file with the
sqlite3 command-line tool and recompute the chain without this code.
"""

from __future__ import annotations

import math
from typing import Any

from toolauthz.audit.records import KINDS
from toolauthz.audit.store import AuditQuery
from toolauthz.store.audit_rows import COLUMNS as _COLUMNS
from toolauthz.store.audit_rows import EQUALITY_FILTERS as _EQUALITY_FILTERS
from toolauthz.store.audit_rows import EVENT_COLUMNS as _EVENT_COLUMNS
from toolauthz.store.audit_rows import JSON_COLUMNS as _JSON_COLUMNS
from toolauthz.store.audit_rows import filter_clauses, order_by

SELECT = f"SELECT {', '.join(_COLUMNS)} FROM audit_record"
INSERT = (f"INSERT INTO audit_record ({', '.join(_COLUMNS)}) "
          f"VALUES ({', '.join('?' * len(_COLUMNS))})")


def audit_columns_added_later(present: set[str]) -> list[str]:
    """The AuditEvent fields an existing `audit_record` table (with columns `present`)
    has no column for: fields added since it was created, all plain text."""
    return [name for name in _EVENT_COLUMNS if present and name not in present]


def audit_schema() -> str:
    def column(name: str) -> str:
        if name == "time":
            return "time REAL NOT NULL"
        if name == "kind":
            return f"kind TEXT NOT NULL CHECK (kind IN ({', '.join(map(repr, KINDS))}))"
        if name in _JSON_COLUMNS:
            return f"{name} TEXT NOT NULL CHECK (json_valid({name}))"
        return f"{name} TEXT NOT NULL"

    # seq is the rowid, and every SQLite index ends with the rowid: an index on (x)
    # is really (x, seq), so `x = ? AND seq > ? ORDER BY seq LIMIT n` reads n index
    # entries and never sorts, however many rows match. A time window is read from
    # (tenant, time) or (time) and its matches sorted by seq: fast for the windows an
    # auditor asks for (an hour, a day); a whole-log export is `iter_records`' job.
    indexes = [("tenant_time", "tenant, time"), ("time", "time")]
    indexes += [(name, name) for name in _EQUALITY_FILTERS]
    return "\n".join([
        "CREATE TABLE IF NOT EXISTS audit_record (",
        "    seq INTEGER PRIMARY KEY CHECK (seq >= 1),",
        *(f"    {column(name)}," for name in _EVENT_COLUMNS),
        "    prev_hash TEXT NOT NULL,",
        "    hash TEXT NOT NULL,",
        "    chain TEXT NOT NULL,",
        "    chain_seq INTEGER NOT NULL CHECK (chain_seq >= 1)",
        ") STRICT;",
        *(f"CREATE INDEX IF NOT EXISTS audit_record_{name} ON audit_record ({cols});"
          for name, cols in indexes),
        # Stops mistakes, not attackers (they can drop a trigger): the chain does that.
        *(f"CREATE TRIGGER IF NOT EXISTS audit_record_no_{op} BEFORE {op.upper()} ON "
          f"audit_record BEGIN SELECT RAISE(ABORT, 'audit records are append-only'); END;"
          for op in ("update", "delete")),
        "CREATE TABLE IF NOT EXISTS audit_checkpoint (",
        "    id INTEGER PRIMARY KEY,",
        "    count INTEGER NOT NULL,",
        "    head_hash TEXT NOT NULL,",
        "    time REAL NOT NULL,",
        "    kid TEXT NOT NULL,",
        "    token TEXT NOT NULL,",
        "    heads TEXT NOT NULL DEFAULT ''",
        ") STRICT;",
        CHAINS_SCHEMA,
        _PLANNER_STATS,
    ])


# The chains' heads, and each chain's records in order (a file of schema version 1 gets
# them from `chains_migration` first).
CHAINS_SCHEMA = """CREATE TABLE IF NOT EXISTS audit_head (
    chain TEXT PRIMARY KEY,
    seq INTEGER NOT NULL CHECK (seq >= 0),
    hash TEXT NOT NULL
) STRICT;
CREATE UNIQUE INDEX IF NOT EXISTS audit_record_chain ON audit_record (chain, chain_seq);"""


def chains_migration(present: set[str]) -> list[str]:
    """Schema version 1 to 2 for an audit table with columns `present` (none: a new
    file): the one chain written so far becomes the legacy chain "" (chain_seq = seq,
    hashed as before), with its head; checkpoints get their heads column."""
    if not present or "chain" in present:
        return []
    return [
        "ALTER TABLE audit_record ADD COLUMN chain TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE audit_record ADD COLUMN chain_seq INTEGER NOT NULL DEFAULT 0",
        "DROP TRIGGER IF EXISTS audit_record_no_update",  # recreated by audit_schema, after
        "UPDATE audit_record SET chain_seq = seq",
        "ALTER TABLE audit_checkpoint ADD COLUMN heads TEXT NOT NULL DEFAULT ''",
        *CHAINS_SCHEMA.split(";\n"),
        "INSERT INTO audit_head (chain, seq, hash) SELECT '', seq, hash FROM audit_record ORDER BY seq DESC LIMIT 1",
    ]


# Fixed planner statistics for the shape the indexes are designed for (a million records,
# near-unique call and request ids, a few hundred records per principal, many per tenant,
# tool, kind and result). Measured statistics of a young or skewed log would pick other
# indexes as it grows; fixed ones keep every query's plan the same from the first record
# on (a technique the SQLite docs describe for sqlite_stat1). Statistics an operator
# gathers with ANALYZE are kept.
_STATS = {"tenant_time": "100000 1", "time": "1", "tenant": "100000", "principal": "100",
          "tool": "5000", "call_id": "2", "request_id": "2", "result": "300000",
          "kind": "300000", "resource": "100", "approver": "1000", "approval_id": "2",
          "decision_id": "5"}
_PLANNER_STATS = "\n".join([
    "ANALYZE sqlite_master;",  # creates sqlite_stat1 without scanning anything
    "INSERT INTO sqlite_stat1 (tbl, idx, stat) SELECT * FROM (VALUES",
    ",\n".join([f"    ('audit_record', 'audit_record_{name}', '1000000 {stat}')"
                for name, stat in _STATS.items()]
               + ["    ('audit_record', NULL, '1000000')"]),
    ") WHERE NOT EXISTS (SELECT 1 FROM sqlite_stat1 WHERE tbl = 'audit_record');",
    "ANALYZE sqlite_master;",  # reloads the statistics into this connection
])


def build_query(filters: AuditQuery, after_seq: int, limit: int) -> tuple[str, list[Any]]:
    """The SELECT for `query`; column names come from a fixed list, values are bound."""
    clauses, params = filter_clauses(filters, after_seq, mark="?", has_element=_has_element)
    if filters.time_from is not None or filters.time_to is not None:
        # Always both bounds: the planner then treats the window as narrow and reads it
        # from the (tenant, time) or (time) index, instead of walking seq from the start
        # of the log until it reaches, say, the last hour.
        clauses.append("time >= ? AND time < ?")
        params += [_or(filters.time_from, -math.inf), _or(filters.time_to, math.inf)]
    # The limit is inlined (a checked int): with `LIMIT ?` the planner cannot see that
    # a page is small and walks seq order rather than read a time window by its index.
    where = " AND ".join(clauses)
    return f"{SELECT} WHERE {where} {order_by(filters)} LIMIT {int(limit)}", params


def _has_element(column: str) -> str:
    # A cell that is not JSON (edited outside this code) matches nothing rather than
    # failing every query: `verify` is what names it.
    return (f"EXISTS (SELECT 1 FROM json_each(CASE WHEN json_valid({column}) THEN {column} ELSE '[]' END) "
            "WHERE value = ?)")


def _or(value: float | None, default: float) -> float:
    return default if value is None else value
