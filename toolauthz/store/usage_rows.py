"""The usage meters' charges, as rows: one per call and meter it charges, written in the
transaction that records the call (`rules.reserve`) and summed over the meter's sliding
window for the next decision.

A charge counts while its hold lasts: an allowed call's forever (`hold_until` NULL);
a call waiting for approval's until its approval could no longer be granted
(`APPROVAL_HOLD_GRACE` past its expiry: replicas' clocks differ, and an approval granted
by a clock a little behind must not meet a budget already given back). An approval
granted makes the hold permanent, one rejected or a call cancelled before it ran gives
it back. Rows outlive the calls' own (`store prune`): only a charge older than any
window can be is removed, so pruning never refunds a budget; and a call id pruned and used
again charges beside its old charges (the key holds the time), never over them. Only
a charge still on hold (a pending approval's) is ever settled by an approval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from toolauthz.store.backend_rows import BackendRows
from toolauthz.store.ledger import CallEntry, Standing
from toolauthz.usage.charges import MAX_WINDOW_SECONDS, Charge

USAGE_TABLE = "usage_charges"
APPROVAL_HOLD_GRACE = 60.0  # seconds a pending approval's charges outlast its expiry

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {USAGE_TABLE} (
    tenant TEXT NOT NULL,
    call_id TEXT NOT NULL,
    meter TEXT NOT NULL,
    meter_key TEXT NOT NULL,
    charged_at DOUBLE PRECISION NOT NULL,
    amount BIGINT NOT NULL,
    window_seconds BIGINT NOT NULL,
    hold_until DOUBLE PRECISION,
    PRIMARY KEY (tenant, call_id, meter, charged_at)
);
CREATE INDEX IF NOT EXISTS {USAGE_TABLE}_by_key ON {USAGE_TABLE} (tenant, meter, meter_key, charged_at);
"""

# A charge that counts at time t: charged after t - window, and held at t.
_COUNTS = "charged_at > {m} AND (hold_until IS NULL OR hold_until >= {m})"


@dataclass(frozen=True)
class UsageSql:
    """The statements, with the backend's placeholder."""

    value: str
    insert: str
    approved: str
    released_by_approval: str
    released: str
    prune: str

    @classmethod
    def with_mark(cls, m: str) -> UsageSql:
        return cls(
            value=(f"SELECT coalesce(sum(amount), 0) FROM {USAGE_TABLE} WHERE tenant = {m} AND meter = {m} "
                   f"AND meter_key = {m} AND " + _COUNTS.format(m=m)),
            insert=(f"INSERT INTO {USAGE_TABLE} (tenant, call_id, meter, meter_key, charged_at, amount, "
                    f"window_seconds, hold_until) VALUES ({m}, {m}, {m}, {m}, {m}, {m}, {m}, {m})"),
            approved=(f"UPDATE {USAGE_TABLE} SET hold_until = NULL WHERE hold_until IS NOT NULL AND "
                      f"(tenant, call_id) IN (SELECT tenant, call_id FROM approvals WHERE approval_id = {m})"),
            released_by_approval=(f"DELETE FROM {USAGE_TABLE} WHERE hold_until IS NOT NULL AND (tenant, call_id) IN "
                                  f"(SELECT tenant, call_id FROM approvals WHERE approval_id = {m})"),
            released=f"DELETE FROM {USAGE_TABLE} WHERE tenant = {m} AND call_id = {m} AND charged_at = {m}",
            prune=f"DELETE FROM {USAGE_TABLE} WHERE charged_at < {m}",
        )


def value_params(tenant: str, charge: Charge, now: float) -> tuple[Any, ...]:
    return tenant, charge.meter, charge.key, now - charge.window, now


class UsageRows(BackendRows):
    """The charges' reads and writes over a backend's `_rows` and `_send` (a mixin of
    each backend's transaction, which sets `_usage_sql`)."""

    _usage_sql: UsageSql

    def meter_values(self, entry: CallEntry) -> tuple[int, ...]:
        """The value of each of entry's meters (`CallEntry.charges`) at entry.created_at:
        the charges that count then, under the charge's meter and key in its tenant."""
        return tuple(int(self._rows(self._usage_sql.value, value_params(entry.tenant, charge, entry.created_at))[0][0])
                     for charge in entry.charges)

    def meter_values_of(self, entries: Sequence[CallEntry]) -> list[tuple[int, ...]]:
        return [self.meter_values(entry) for entry in entries]

    def run_counts_of(self, entries: Sequence[CallEntry]) -> list[tuple[int, int]]:
        raise NotImplementedError

    def standing_of(self, entries: Sequence[CallEntry]) -> list[Standing]:
        """How each entry's run and meters stand (`Standing`): its run counts and meters."""
        counts = self.run_counts_of(entries)
        metered = [entry for entry in entries if entry.charges]
        values = iter(self.meter_values_of(metered) if metered else [])
        return [Standing(*run, next(values) if entry.charges else ())
                for entry, run in zip(entries, counts, strict=True)]

    def insert_charges(self, entry: CallEntry, hold_until: float | None) -> None:
        for charge in entry.charges:
            self._send(self._usage_sql.insert, (entry.tenant, entry.call_id, charge.meter, charge.key,
                                                entry.created_at, charge.amount, charge.window, hold_until))

    def settle_charges(self, approval_id: str, approved: bool) -> None:
        """An approval decided: its call's charges held for good, or given back."""
        sql = self._usage_sql.approved if approved else self._usage_sql.released_by_approval
        self._send(sql, (approval_id,))

    def release_charges(self, entry: CallEntry) -> None:
        """The charges of entry's call (of this use of its id: a pruned id may be used again)."""
        self._send(self._usage_sql.released, (entry.tenant, entry.call_id, entry.created_at))

    def prune_charges(self, before: float) -> None:
        """The charges no window could count after `before`: made more than the longest
        window a meter may have before it. Not their own window: a reload may lengthen it,
        and a charge pruned that the new window counts would refund the budget."""
        self._send(self._usage_sql.prune, (before - MAX_WINDOW_SECONDS,))
