"""A PostgreSQL transaction: the backend's reads and writes on one connection, in
psycopg's pipeline mode inside a write transaction (statements queued with the COMMIT
where no answer is needed), in autocommit for reads. Row keys are taken as advisory
locks (`lock_id`), the audit chains' heads as row locks (`SELECT ... FOR UPDATE`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import psycopg

from toolauthz.audit.checkpoint import Checkpoint
from toolauthz.audit.merkle import ChainHead
from toolauthz.audit.records import DEFAULT_CHAINS, AuditRecord
from toolauthz.audit.store import AuditQuery
from toolauthz.store.approvals import ApprovalRecord, approvals_filter
from toolauthz.store.audit_rows import (
    CHAIN_NAMES,
    CHECKPOINTS_IN_ORDER,
    COLUMNS,
    HEADS_SELECT,
    LAST_CHECKPOINT,
    checkpoint_of,
    filter_clauses,
    from_row,
    heads_text,
    order_by,
    to_row,
)
from toolauthz.store.bundle_floor import FloorRows, FloorSql
from toolauthz.store.chains import ChainedAppends
from toolauthz.store.deliveries import DeliveryRows, DeliverySql
from toolauthz.store.ledger import CallEntry, RecordedDecision, Standing
from toolauthz.store.postgres.read_ahead import (
    METER_VALUES_OF,
    RUN_COUNTS_OF,
    ReadAhead,
    count_key,
    meter_values_params,
    run_counts_params,
    usage_keys,
)
from toolauthz.store.rows import (
    APPROVAL_COLUMNS,
    CALL_COLUMNS,
    approval_of,
    approval_values,
    call_of,
    call_values,
    consume_token_sql,
    insert_approval_sql,
    insert_call_sql,
)
from toolauthz.store.unit import ApprovalVerdict
from toolauthz.store.usage_rows import UsageRows, UsageSql

_INSERT_CALL = insert_call_sql("%s")
_INSERT_APPROVAL = insert_approval_sql("%s")
_CONSUME_TOKEN, _MARK_VERIFIED = consume_token_sql("%s")
_AUDIT_SELECT = f"SELECT {', '.join(COLUMNS)} FROM audit_record"
_AUDIT_INSERT = (f"INSERT INTO audit_record ({', '.join(COLUMNS)}) "
                 f"VALUES ({', '.join(['%s'] * len(COLUMNS))})")
_RUN_COUNTS = (
    "SELECT count(*), coalesce(sum(CASE WHEN tool = %s THEN 1 ELSE 0 END), 0) FROM calls c "
    "WHERE tenant = %s AND request_id = %s AND (decision = 'ALLOW' OR EXISTS (SELECT 1 FROM approvals a "
    "WHERE a.approval_id = c.approval_id AND (a.status = 'approved' OR (a.status = 'pending' "
    "AND a.expires_at >= %s))))")
# The chains' heads, locked in name order (every appender takes them so: no cycle).
LOCKED_HEADS = "SELECT chain, seq, hash FROM audit_head WHERE chain = ANY(%s) ORDER BY chain FOR UPDATE"
# Those, then a cursor per record drawn under them (the second branch of UNION ALL runs
# after the first has returned every row).
_LOCK_HEADS = (f"WITH locked AS ({LOCKED_HEADS}) SELECT chain, seq, hash FROM locked UNION ALL "
               "SELECT NULL, nextval('audit_record_seq'), NULL FROM generate_series(1, %s)")
_SET_HEAD = "UPDATE audit_head SET seq = %s, hash = %s WHERE chain = %s"
# Row keys as advisory lock keys, taken in the order given (sorted by the caller).
_LOCK_KEYS = "SELECT pg_advisory_xact_lock(k) FROM unnest(%s::bigint[]) AS k"
# Calls that ended: their outcome was reported, or they were denied (never executable).
_ENDED = ("SELECT tenant, call_id, approval_id FROM calls WHERE (outcome != '' AND outcome_at < %s) "
          "OR (decision = 'DENY' AND created_at < %s) LIMIT %s")
APPROVAL_CHANNEL = "toolauthz_approval"
MIN_STATEMENT_MS = 100  # the shortest bound a caller's deadline sets (`bound`)


class PgTransaction(ChainedAppends, DeliveryRows, UsageRows, FloorRows):
    """The backend's reads and writes on one connection (inside a transaction, or in
    autocommit for reads)."""

    _delivery_sql = DeliverySql.with_mark("%s")
    _usage_sql = UsageSql.with_mark("%s")
    _floor_sql = FloorSql.with_mark("%s")

    def __init__(self, conn: psycopg.Connection[Any], chains: int = DEFAULT_CHAINS,
                 pipeline: psycopg.Pipeline | None = None, statement_ms: int = 0):
        super().__init__(chains)
        self._conn = conn
        self._statement_ms = statement_ms  # the unit's bound on a statement (0: none)
        # In a write transaction: statements whose results are not read are sent with the
        # next one that is (pipeline mode), and what the batch reads is read ahead.
        self._pipeline = pipeline
        self._known = ReadAhead()
        self.heads_written: dict[str, tuple[int, str]] = {}  # the chains' heads this transaction left

    def _sync(self) -> None:
        """In pipeline mode, a statement's row count is known once its result came back:
        wait for it (one round trip) where the count is the answer."""
        if self._pipeline is not None:
            self._pipeline.sync()

    def _rows(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        return self._all(sql, params)

    def _write(self, sql: str, params: Sequence[Any]) -> int:
        written = self._conn.execute(sql, params)
        self._sync()  # in pipeline mode, the count is known once the result came back
        return int(written.rowcount)

    def _send(self, sql: str, params: Sequence[Any]) -> None:
        self._conn.execute(sql, params)  # in pipeline mode: queued, its result checked at the commit

    def _one(self, sql: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self._conn.execute(sql, params).fetchone()
        return row

    def _all(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = self._conn.execute(sql, params).fetchall()
        return rows

    def get_call(self, tenant: str, call_id: str) -> CallEntry | None:
        if (tenant, call_id) in self._known.calls:
            return self._known.calls[(tenant, call_id)]
        row = self._one(f"SELECT {CALL_COLUMNS} FROM calls WHERE tenant = %s AND call_id = %s", (tenant, call_id))
        return call_of(row) if row is not None else None

    def run_counts(self, entry: CallEntry) -> tuple[int, int]:
        known = self._known.counts.get(count_key(entry))
        if known is not None:
            return known
        row = self._one(_RUN_COUNTS, (entry.tool, entry.tenant, entry.request_id, entry.created_at))
        assert row is not None  # an aggregate always has a row
        return int(row[0]), int(row[1])

    def run_counts_of(self, entries: Sequence[CallEntry]) -> list[tuple[int, int]]:
        if not entries:
            return []
        return [(int(a), int(b)) for a, b in self._all(RUN_COUNTS_OF, run_counts_params(entries))]

    def meter_values(self, entry: CallEntry) -> tuple[int, ...]:
        keys = usage_keys([entry])
        if all(key in self._known.usage for key in keys):
            return tuple(self._known.usage[key] for key in keys)
        return super().meter_values(entry)

    def meter_values_of(self, entries: Sequence[CallEntry]) -> list[tuple[int, ...]]:
        keys = usage_keys(entries)
        values = iter([int(v) for (v,) in self._all(METER_VALUES_OF, meter_values_params(keys))] if keys else [])
        return [tuple(next(values) for _ in entry.charges) for entry in entries]

    def standing_of(self, entries: Sequence[CallEntry]) -> list[Standing]:
        if self._pipeline is not None or not any(entry.charges for entry in entries):
            return super().standing_of(entries)
        keys = usage_keys(entries)
        with self._conn.pipeline():  # both reads sent together: one round trip
            counts = self._conn.execute(RUN_COUNTS_OF, run_counts_params(entries))
            found = self._conn.execute(METER_VALUES_OF, meter_values_params(keys))
            runs, values = counts.fetchall(), iter([int(v) for (v,) in found.fetchall()])
        return [Standing(int(a), int(b), tuple(next(values) for _ in entry.charges))
                for entry, (a, b) in zip(entries, runs, strict=True)]

    def insert_charges(self, entry: CallEntry, hold_until: float | None) -> None:
        super().insert_charges(entry, hold_until)
        self._known.charged(entry)

    def read_ahead(self, calls: Sequence[tuple[str, str]], runs: Sequence[CallEntry]) -> None:
        calls = [key for key in dict.fromkeys(calls) if key not in self._known.calls]
        if calls:
            found = self._conn.execute(
                f"SELECT {CALL_COLUMNS} FROM calls WHERE (tenant, call_id) IN "
                "(SELECT * FROM unnest(%s::text[], %s::text[]))", ([t for t, _ in calls], [c for _, c in calls]))
        metered = [key for key in dict.fromkeys(usage_keys(runs)) if key not in self._known.usage]
        if metered:
            values = self._conn.execute(METER_VALUES_OF, meter_values_params(metered))
        if runs:
            counts = self._conn.execute(RUN_COUNTS_OF, run_counts_params(runs))
        if calls:
            self._known.calls.update(dict.fromkeys(calls))
            for row in found.fetchall():
                entry = call_of(row)
                self._known.calls[(entry.tenant, entry.call_id)] = entry
        if runs:
            for entry, (a, b) in zip(runs, counts.fetchall(), strict=True):
                self._known.counts[count_key(entry)] = (int(a), int(b))
        if metered:
            for key, (value,) in zip(metered, values.fetchall(), strict=True):
                self._known.usage[key] = int(value)

    def get_approval(self, approval_id: str) -> ApprovalRecord | None:
        row = self._one(f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE approval_id = %s", (approval_id,))
        return approval_of(row) if row else None

    def count_pending_approvals(self, now: float) -> int:
        row = self._one("SELECT count(*) FROM approvals WHERE status = 'pending' AND expires_at >= %s", (now,))
        return int(row[0]) if row is not None else 0

    def list_approvals(self, *, tenant: str, status: str, group: str, now: float,
                       limit: int) -> list[ApprovalRecord]:
        where, args = approvals_filter(tenant=tenant, status=status, group=group, now=now, mark="%s")
        sql = f"SELECT {APPROVAL_COLUMNS} FROM approvals {where} ORDER BY approval_id DESC LIMIT %s"
        return [approval_of(r) for r in self._all(sql, (*args, limit))]

    def audit_query(self, filters: AuditQuery, *, limit: int, after_seq: int) -> list[AuditRecord]:
        # The list columns hold JSON text: `?` is jsonb's "has this element".
        clauses, params = filter_clauses(filters, after_seq, mark="%s",
                                         has_element=lambda column: f"{column}::jsonb ? %s")
        if filters.time_from is not None:
            clauses.append("time >= %s")
            params.append(filters.time_from)
        if filters.time_to is not None:
            clauses.append("time < %s")
            params.append(filters.time_to)
        sql = f"{_AUDIT_SELECT} WHERE {' AND '.join(clauses)} {order_by(filters)} LIMIT %s"
        return [from_row(row) for row in self._all(sql, (*params, limit))]

    def audit_page(self, after_seq: int, limit: int) -> list[AuditRecord]:
        return [from_row(row) for row in self._all(f"{_AUDIT_SELECT} WHERE seq > %s ORDER BY seq LIMIT %s",
                                                   (after_seq, limit))]

    def audit_chain_page(self, chain: str, after: int, limit: int) -> list[AuditRecord]:
        return [from_row(row) for row in self._all(
            f"{_AUDIT_SELECT} WHERE chain = %s AND chain_seq > %s ORDER BY chain_seq LIMIT %s", (chain, after, limit))]

    def audit_chain_names(self) -> list[str]:
        return [str(row[0]) for row in self._all(CHAIN_NAMES, ())]

    def audit_heads(self) -> list[ChainHead]:
        return [ChainHead(str(c), int(n), str(h)) for c, n, h in self._all(HEADS_SELECT, ())]

    def checkpoints(self) -> list[Checkpoint]:
        return [checkpoint_of(row) for row in self._all(CHECKPOINTS_IN_ORDER, ())]

    def last_checkpoint(self) -> Checkpoint | None:
        row = self._one(LAST_CHECKPOINT, ())
        return checkpoint_of(row) if row else None

    # -- writes --

    def bound(self, seconds: float) -> None:
        # Never above the unit's own bound (`hang_seconds`), never so short that a call
        # about to be answered is cut for the round trip it needs.
        ms = max(MIN_STATEMENT_MS, int(seconds * 1000))
        if self._statement_ms:
            ms = min(ms, self._statement_ms)
        self._conn.execute("SELECT set_config('statement_timeout', %s, true)", (str(ms),))

    def lock(self, keys: Sequence[str]) -> None:
        if keys:
            self._conn.execute(_LOCK_KEYS, (sorted({lock_id(key) for key in keys}),))

    def insert_call(self, entry: CallEntry, decided: RecordedDecision) -> None:
        self._conn.execute(_INSERT_CALL, call_values(entry, decided))
        self._known.inserted(entry, decided)

    def consume_token(self, tenant: str, call_id: str, jti: str, now: float) -> bool:
        self._known.forget(tenant, call_id)
        inserted = self._conn.execute(_CONSUME_TOKEN, (jti, tenant, call_id, now))
        updated = self._conn.execute(_MARK_VERIFIED, (jti, now, tenant, call_id))
        self._sync()
        return bool(inserted.rowcount and updated.rowcount)

    def set_outcome(self, entry: CallEntry) -> None:
        self._known.calls[(entry.tenant, entry.call_id)] = entry
        self._conn.execute(
            "UPDATE calls SET outcome = %s, outcome_at = %s, extra = %s WHERE tenant = %s AND call_id = %s",
            (entry.outcome, entry.outcome_at, json.dumps(entry.extra), entry.tenant, entry.call_id))

    def create_approval(self, r: ApprovalRecord) -> None:
        self._conn.execute(_INSERT_APPROVAL, approval_values(r))

    def decide_approval(self, v: ApprovalVerdict) -> bool:
        decided = self._conn.execute(
            "UPDATE approvals SET status = %s, approver = %s, reason = %s, decided_at = %s, token = %s, "
            "token_jti = %s, token_expires_at = %s, approved_version = %s, call_input = '', call_entities = '' "
            "WHERE approval_id = %s AND status = 'pending' AND expires_at >= %s",
            (v.status, v.approver, v.reason, v.now, v.token, v.token_jti, v.token_expires_at, v.approved_version,
             v.approval_id, v.now))
        self._sync()
        return decided.rowcount == 1

    def erase_expired_inputs(self, now: float) -> None:
        # Rows another transaction holds (deciding or erasing them) are left to it: waiting
        # for them here could close a cycle with the rows that transaction waits for.
        self._conn.execute(
            "UPDATE approvals SET call_input = '', call_entities = '' WHERE approval_id IN (SELECT approval_id "
            "FROM approvals WHERE status = 'pending' AND expires_at < %s AND (call_input != '' OR "
            "call_entities != '') FOR UPDATE SKIP LOCKED)", (now,))

    def _lock_heads(self, chains: list[str], count: int) -> tuple[dict[str, tuple[int, str]], list[int]]:
        heads: dict[str, tuple[int, str]] = {}
        seqs: list[int] = []
        for name, seq, hash_ in self._all(_LOCK_HEADS, (chains, count)):
            if name is None:
                seqs.append(int(seq))
            else:
                heads[str(name)] = (int(seq), str(hash_))
        return heads, seqs

    def _write_records(self, records: list[AuditRecord], heads: list[ChainHead]) -> None:
        # One statement each, queued in the pipeline with the COMMIT: executemany would
        # wait for its results (a round trip) while the chains' heads are locked.
        self._insert_records(records)
        for head in heads:
            self._conn.execute(_SET_HEAD, (head.seq, head.hash, head.chain))
        self.heads_written = {head.chain: (head.seq, head.hash) for head in heads}

    def _insert_records(self, records: list[AuditRecord]) -> None:
        for record in records:
            self._conn.execute(_AUDIT_INSERT, to_row(record))

    def learned(self) -> tuple[dict[Any, tuple[int, int]], dict[Any, int], dict[str, tuple[int, str]]]:
        """What this transaction read and wrote of the rows a decision reads: the runs'
        counts and meters' values as they stand after it, and the chains' heads it left
        (store/postgres/foresight.py)."""
        return self._known.counts, self._known.usage, self.heads_written

    def ended_calls(self, before: float, limit: int) -> list[tuple[str, str, str]]:
        return [(str(t), str(c), str(a)) for t, c, a in self._all(_ENDED, (before, before, limit))]

    def delete_calls(self, calls: Sequence[tuple[str, str, str]]) -> None:
        for tenant, call_id, _ in calls:
            self._known.forget(tenant, call_id)
        with self._conn.cursor() as cursor:
            cursor.executemany("DELETE FROM consumed_tokens WHERE tenant = %s AND call_id = %s",
                               [(t, c) for t, c, _ in calls])
            cursor.executemany("DELETE FROM approvals WHERE approval_id = %s", [(a,) for _, _, a in calls if a])
            cursor.executemany("DELETE FROM calls WHERE tenant = %s AND call_id = %s", [(t, c) for t, c, _ in calls])

    def notify_approval(self, approval_id: str) -> None:
        self._conn.execute("SELECT pg_notify(%s, %s)", (APPROVAL_CHANNEL, approval_id))

    def add_checkpoint(self, token: str, checkpoint: Checkpoint) -> None:
        self._conn.execute("INSERT INTO audit_checkpoint (count, head_hash, time, kid, token, heads) "
                           "VALUES (%s, %s, %s, %s, %s, %s)",
                           (checkpoint.count, checkpoint.head_hash, checkpoint.time, checkpoint.kid, token,
                            heads_text(checkpoint)))


def lock_id(key: str) -> int:
    """A row key as a 64-bit advisory lock id. Two keys that share one only wait for each
    other needlessly, never the opposite."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big",
                          signed=True)
