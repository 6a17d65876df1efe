"""Audit records as table rows, for every backend: one column per AuditEvent field, the
lists and mappings as JSON text, so that an auditor can recompute the chain from the
table with any SQL client and no code of ours."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import fields as dataclass_fields
from typing import Any

from toolauthz.audit.checkpoint import Checkpoint
from toolauthz.audit.merkle import heads_from_json, heads_json
from toolauthz.audit.records import AuditEvent, AuditRecord
from toolauthz.audit.store import AuditQuery

EVENT_COLUMNS = tuple(f.name for f in dataclass_fields(AuditEvent))
JSON_COLUMNS = ("reasons", "error_codes", "fields", "detail")
COLUMNS = ("seq", *EVENT_COLUMNS, "prev_hash", "hash", "chain", "chain_seq")
CHECKPOINT_SELECT = "SELECT count, head_hash, time, kid, token, heads FROM audit_checkpoint"
HEADS_SELECT = "SELECT chain, seq, hash FROM audit_head ORDER BY chain"
# The chains that hold records (a chain without its head row still shows) and those with a head.
CHAIN_NAMES = "SELECT DISTINCT chain FROM audit_record UNION SELECT chain FROM audit_head"
CHECKPOINTS_IN_ORDER = f"{CHECKPOINT_SELECT} ORDER BY count, id"
LAST_CHECKPOINT = f"{CHECKPOINT_SELECT} ORDER BY count DESC, id DESC LIMIT 1"
# AuditQuery fields matched by equality on the column of the same name: each has an index.
EQUALITY_FILTERS = ("tenant", "principal", "tool", "call_id", "request_id", "result", "kind", "resource",
                    "approver", "approval_id", "decision_id")
# Matched by equality without an index of their own: few distinct values (a policy version, a
# caller identity), asked together with a tenant or a time window, which an index narrows.
UNINDEXED_FILTERS = ("policy_version", "caller")
# AuditQuery fields matched against one element of a JSON list column.
LIST_FILTERS = (("error_code", "error_codes"), ("policy_id", "reasons"))


def checkpoint_of(row: Sequence[Any]) -> Checkpoint:
    """A stored checkpoint: its columns, and the chain heads stored beside a checkpoint of
    every chain (JSON [[chain, seq, hash], ...]); none of it trusted before the token
    verifies (`verify_checkpoint`)."""
    count, head_hash, time, kid, token, heads = row
    return Checkpoint(count, head_hash, time, kid, token, heads_from_json(heads), 2 if heads else 1)


def heads_text(checkpoint: Checkpoint) -> str:
    """The heads column of a checkpoint: empty for one of the legacy chain."""
    return "" if checkpoint.version == 1 else heads_json(checkpoint.heads)


def to_row(record: AuditRecord) -> tuple[Any, ...]:
    event = record.event
    values = [getattr(event, name) for name in EVENT_COLUMNS]
    for i, name in enumerate(EVENT_COLUMNS):
        if name in JSON_COLUMNS:
            # Plain JSON is enough here: the hash covers the canonical body recomputed
            # from the values, and these values (already canonical copies) read back equal.
            values[i] = _json_text(values[i])
    return (record.seq, *values, record.prev_hash, record.hash, record.chain, record.chain_seq)


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True,
                      allow_nan=False)


def from_row(row: Sequence[Any]) -> AuditRecord:
    values = dict(zip(COLUMNS, row, strict=True))
    for name in JSON_COLUMNS:
        try:
            value = json.loads(values[name])
        except (TypeError, ValueError):
            continue  # a tampered cell: keep the raw text, the hash will not match it
        values[name] = tuple(value) if name in ("reasons", "error_codes") and \
            isinstance(value, list) else value
    seq, prev_hash, hash_ = values.pop("seq"), values.pop("prev_hash"), values.pop("hash")
    chain, chain_seq = values.pop("chain"), values.pop("chain_seq")
    return AuditRecord(seq, AuditEvent.from_storage(**values), prev_hash, hash_, chain, chain_seq)


def order_by(filters: AuditQuery) -> str:
    return "ORDER BY seq DESC" if filters.newest_first else "ORDER BY seq"


def filter_clauses(filters: AuditQuery, after_seq: int, *, mark: str,
                   has_element: Callable[[str], str]) -> tuple[list[str], list[object]]:
    """The WHERE clauses and values that every backend shares for a query: the page's
    start, the equality filters and the list filters. `mark` is the placeholder, and
    `has_element(column)` the backend's test that a JSON list column holds a value.
    Column names come from the fixed lists above; values are always bound. Each backend
    adds its own time window."""
    if filters.newest_first:
        clauses = [f"seq < {mark}"]
        params: list[object] = [after_seq if after_seq > 0 else 2**62]
    else:
        clauses = [f"seq > {mark}"]
        params = [after_seq]
    for name in (*EQUALITY_FILTERS, *UNINDEXED_FILTERS):
        value = getattr(filters, name)
        if value is not None:
            clauses.append(f"{name} = {mark}")
            params.append(value)
    for name, column in LIST_FILTERS:
        value = getattr(filters, name)
        if value is not None:
            clauses.append(has_element(column))
            params.append(value)
    return clauses, params
