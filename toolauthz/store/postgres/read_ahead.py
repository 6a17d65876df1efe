"""What a PostgreSQL transaction remembers of the rows it read or wrote under its locks,
so that a batch of operations costs a few round trips rather than a few per operation.

`Transaction.read_ahead` reads every call, every run count and every meter value the
batch will ask for in three statements sent together; the rules then ask for them one by one and are answered
from here. Under the transaction's row-key locks no other writer changes these rows, so
what was read stays true but for this transaction's own writes, which update it: a call
inserted or given an outcome is remembered as written; a call whose token is consumed
is forgotten (read again if asked); a budgeted call inserted adds one to its run's
counts, and a call's charges add to the meter values they count in. That increment
may only overcount (an approval that had expired at another
call's time would not count there): a reservation then sees counts that moved and is
decided again, never admitted over its limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from toolauthz.store.ledger import CallEntry, RecordedDecision
from toolauthz.store.usage_rows import USAGE_TABLE

CallKey = tuple[str, str]  # tenant, call_id
CountKey = tuple[str, str, str, float]  # tenant, request_id, tool, created_at
UsageKey = tuple[str, str, str, float, int]  # tenant, meter, key, at, window

# One entry's run counts (`e`: tenant, request_id, tool, created_at), counted at its own
# time: a pending approval holds a share until it expires.
RUN_COUNT = (
    "SELECT count(*) AS calls, coalesce(sum(CASE WHEN c.tool = e.tool THEN 1 ELSE 0 END), 0) AS tool_calls "
    "FROM calls c WHERE c.tenant = e.tenant AND c.request_id = e.request_id AND (c.decision = 'ALLOW' OR EXISTS "
    "(SELECT 1 FROM approvals a WHERE a.approval_id = c.approval_id AND (a.status = 'approved' OR "
    "(a.status = 'pending' AND a.expires_at >= e.created_at))))")
RUN_ENTRIES = "%s::text[], %s::text[], %s::text[], %s::float8[]"
# The run counts of several entries in one statement.
RUN_COUNTS_OF = (f"SELECT k.calls, k.tool_calls FROM unnest({RUN_ENTRIES}) WITH ORDINALITY "
                 f"AS e(tenant, request_id, tool, created_at, i) CROSS JOIN LATERAL ({RUN_COUNT}) k ORDER BY e.i")

# One meter's value (`e`: tenant, meter, meter_key, since, at: usage_rows.py).
METER_VALUE = (
    f"coalesce((SELECT sum(u.amount) FROM {USAGE_TABLE} u WHERE u.tenant = e.tenant AND u.meter = e.meter "
    "AND u.meter_key = e.meter_key AND u.charged_at > e.since AND (u.hold_until IS NULL OR u.hold_until >= e.at)), 0)")
METER_ENTRIES = "%s::text[], %s::text[], %s::text[], %s::float8[], %s::float8[]"
# The value of several meters in one statement, each at its own time.
METER_VALUES_OF = (f"SELECT {METER_VALUE} FROM unnest({METER_ENTRIES}) "
                   "WITH ORDINALITY AS e(tenant, meter, meter_key, since, at, i) ORDER BY e.i")


def usage_keys(entries: Sequence[CallEntry]) -> list[UsageKey]:
    """Every meter value the entries' decisions read, in order."""
    return [(e.tenant, c.meter, c.key, e.created_at, c.window) for e in entries for c in e.charges]


def meter_values_params(keys: Sequence[UsageKey]) -> tuple[list[str], list[str], list[str], list[float], list[float]]:
    return ([k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys], [k[3] - k[4] for k in keys],
            [k[3] for k in keys])


def usage_meter(key: UsageKey) -> tuple[str, str, str, int]:
    """The meter a value is of, whatever the time it is read at: tenant, meter, key, window."""
    return key[0], key[1], key[2], key[4]


def count_key(entry: CallEntry) -> CountKey:
    return entry.tenant, entry.request_id, entry.tool, entry.created_at


def run_counts_params(entries: Sequence[CallEntry]) -> tuple[list[str], list[str], list[str], list[float]]:
    return ([e.tenant for e in entries], [e.request_id for e in entries], [e.tool for e in entries],
            [e.created_at for e in entries])


class ReadAhead:
    """The calls and run counts one transaction has read, kept true by its writes."""

    def __init__(self) -> None:
        self.calls: dict[CallKey, CallEntry | None] = {}
        self.counts: dict[CountKey, tuple[int, int]] = {}
        self.usage: dict[UsageKey, int] = {}

    def inserted(self, entry: CallEntry, decided: RecordedDecision) -> None:
        approval_id = decided.approval.approval_id if decided.approval is not None else ""
        self.calls[(entry.tenant, entry.call_id)] = replace(
            entry, decision=decided.decision, decision_id=decided.decision_id, policy_version=decided.policy_version,
            reasons=tuple(decided.reasons), errors=tuple(tuple(e) for e in decided.errors),  # type: ignore[misc]
            approval_id=approval_id, verified_jti="", verified_at=None, outcome="", outcome_at=None, extra={})
        if decided.uses_run_budget:
            for key, (calls, tool_calls) in list(self.counts.items()):
                if key[:2] == (entry.tenant, entry.request_id):
                    self.counts[key] = (calls + 1, tool_calls + (key[2] == entry.tool))

    def charged(self, entry: CallEntry) -> None:
        """entry's charges written: each meter value read that they count in grows
        (counted whatever their hold: an overcount only makes a decision be made again)."""
        for charge in entry.charges:
            for key in list(self.usage):
                if key[:3] == (entry.tenant, charge.meter, charge.key) and entry.created_at > key[3] - key[4]:
                    self.usage[key] += charge.amount

    def forget(self, tenant: str, call_id: str) -> None:
        self.calls.pop((tenant, call_id), None)
