"""A write transaction whose reads are predicted (foresight.py) and checked by the
database in the same pipeline as the writes and the COMMIT: one round trip for a batch
of reservations.

In order, all sent before any answer is awaited: BEGIN; the row keys' advisory locks;
the checks that the calls are new and that the runs' counts and the meters' values are
as predicted; the calls, charges and approvals; the chains' heads locked and checked;
the audit records (their cursor drawn in the INSERT, under the heads' locks) and the new
heads; COMMIT. A check that fails raises `toolauthz_expect`'s error, the pipeline skips
everything after it (the COMMIT included: nothing was written), and the unit runs the
batch again the long way, whose reads teach the foresight. The locks are so held for
the server's own work and the commit's fsync, not for a round trip.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any

import psycopg

from toolauthz.audit.records import AuditRecord
from toolauthz.store.audit_rows import COLUMNS, HEADS_SELECT, to_row
from toolauthz.store.ledger import CallEntry
from toolauthz.store.postgres.foresight import Foresight
from toolauthz.store.postgres.read_ahead import (
    METER_ENTRIES,
    METER_VALUE,
    METER_VALUES_OF,
    RUN_COUNT,
    RUN_COUNTS_OF,
    RUN_ENTRIES,
    count_key,
    meter_values_params,
    run_counts_params,
    usage_keys,
    usage_meter,
)
from toolauthz.store.postgres.transaction import LOCKED_HEADS, PgTransaction

_CALLS_IN = "(tenant, call_id) IN (SELECT * FROM unnest(%s::text[], %s::text[]))"
_EXPECT_NEW = f"SELECT toolauthz_expect(NOT EXISTS (SELECT 1 FROM calls WHERE {_CALLS_IN}), 'a call id')"
_EXPECT_COUNTS = (
    "SELECT toolauthz_expect(coalesce(bool_and(k.calls = e.calls AND k.tool_calls = e.tool_calls), true), "
    f"'a run''s counts') FROM unnest({RUN_ENTRIES}, %s::bigint[], %s::bigint[]) "
    f"AS e(tenant, request_id, tool, created_at, calls, tool_calls) CROSS JOIN LATERAL ({RUN_COUNT}) k")
_EXPECT_METERS = (
    f"SELECT toolauthz_expect(coalesce(bool_and({METER_VALUE} = e.amount), true), 'a usage meter') "
    f"FROM unnest({METER_ENTRIES}, %s::bigint[]) AS e(tenant, meter, meter_key, since, at, amount)")
_EXPECT_HEADS = (
    "SELECT toolauthz_expect(count(*) = %s, 'an audit chain''s head') FROM audit_head h "
    "JOIN unnest(%s::text[], %s::bigint[], %s::text[]) AS e(chain, seq, hash) "
    "ON h.chain = e.chain AND h.seq = e.seq AND h.hash = e.hash")
# The record's cursor (`seq`) drawn in the INSERT, under its chain's head lock.
_INSERT_RECORD = (f"INSERT INTO audit_record ({', '.join(COLUMNS)}) "
                  f"VALUES (nextval('audit_record_seq'), {', '.join(['%s'] * (len(COLUMNS) - 1))})")


class ForeseenTransaction(PgTransaction):
    """PgTransaction with its reads predicted by `foresight` and checked in the pipeline."""

    def __init__(self, conn: psycopg.Connection[Any], chains: int, pipeline: psycopg.Pipeline,
                 foresight: Foresight, statement_ms: int = 0):
        super().__init__(conn, chains, pipeline, statement_ms)
        self._foresight = foresight
        self._server_seq = False  # the records' cursors are drawn by the INSERT
        self._every_head: psycopg.Cursor[Any] | None = None  # every chain's head, read unlocked first
        self._checks: list[tuple[str, psycopg.Cursor[Any]]] = []  # (what, its check), in pipeline order
        # What each read found, taught to the foresight after a failed check.
        self._lessons: list[Callable[[], None]] = []

    def _expect(self, what: str, sql: str, params: Sequence[Any]) -> None:
        self._checks.append((what, self._conn.execute(sql, params)))

    def read_ahead(self, calls: Sequence[tuple[str, str]], runs: Sequence[CallEntry]) -> None:
        # The reads first, then the checks: whichever check fails, the next try knows
        # every row this one predicted (`missed`). The heads are read unlocked here; the
        # end of the transaction locks and checks those it appends to.
        heads = self._every_head = self._conn.execute(HEADS_SELECT)
        self._lessons.append(lambda: self._foresight.learn_heads(heads.fetchall()))
        calls = [key for key in dict.fromkeys(calls) if key not in self._known.calls]
        runs = [entry for entry in runs if count_key(entry) not in self._known.counts]
        metered = [key for key in dict.fromkeys(usage_keys(runs)) if key not in self._known.usage]
        if runs:
            found = self._conn.execute(RUN_COUNTS_OF, run_counts_params(runs))
            self._lessons.append(lambda: self._foresight.learn_counts(runs, found.fetchall()))
        if metered:
            read = self._conn.execute(METER_VALUES_OF, meter_values_params(metered))
            self._lessons.append(lambda: self._foresight.learn_meters([usage_meter(k) for k in metered],
                                                                      read.fetchall()))
        if calls:
            self._expect("calls", _EXPECT_NEW, ([t for t, _ in calls], [c for _, c in calls]))
            self._known.calls.update(dict.fromkeys(calls))  # predicted: new
        if runs:
            predicted = [self._foresight.counts(entry) for entry in runs]
            self._expect("counts", _EXPECT_COUNTS, (*run_counts_params(runs), [a for a, _ in predicted],
                                                    [b for _, b in predicted]))
            for entry, counts in zip(runs, predicted, strict=True):
                self._known.counts[count_key(entry)] = counts
        if metered:
            values = [self._foresight.meter(usage_meter(key)) for key in metered]
            self._expect("meters", _EXPECT_METERS, (*meter_values_params(metered), values))
            for key, value in zip(metered, values, strict=True):
                self._known.usage[key] = value

    def _lock_heads(self, chains: list[str], count: int) -> tuple[dict[str, tuple[int, str]], list[int]]:
        predicted = self._foresight.heads(chains)
        if len(predicted) < len(chains):  # a head never seen: read under its lock (a round trip);
            heads, seqs = super()._lock_heads(chains, count)  # every other, read ahead, foreseen from now on
            if self._every_head is not None:
                self._foresight.learn_heads(self._every_head.fetchall())
            return heads, seqs
        locked = self._conn.execute(LOCKED_HEADS, (chains,))
        self._lessons.append(lambda: self._foresight.learn_heads(locked.fetchall()))
        self._expect("heads", _EXPECT_HEADS, (len(chains), chains, [predicted[c][0] for c in chains],
                                              [predicted[c][1] for c in chains]))
        self._server_seq = True
        return dict(predicted), [0] * count

    def missed(self) -> str:
        """After a failed check: teaches the foresight what the reads found (those that
        ran: all but the heads' locked read, if an earlier check failed), and returns
        what had moved ("calls", "counts", "meters" or "heads"): the first check without
        a result (those after it were skipped)."""
        for lesson in self._lessons:
            with suppress(psycopg.Error):
                lesson()
        for what, check in self._checks:
            try:
                check.fetchall()
            except psycopg.Error:
                return what
        return "unknown"

    def _insert_records(self, records: list[AuditRecord]) -> None:
        if not self._server_seq:
            super()._insert_records(records)
            return
        for record in records:
            self._conn.execute(_INSERT_RECORD, to_row(record)[1:])
