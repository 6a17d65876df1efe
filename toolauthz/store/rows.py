"""Ledger and approval rows as values, for every backend: the columns are selected in
the order of the dataclasses' fields, lists and mappings stored as JSON text, the kept
call input and entities as bytes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from toolauthz.store.approvals import ApprovalRecord
from toolauthz.store.ledger import CallEntry, RecordedDecision

# The columns `call_of` and `approval_of` read, in their order.
CALL_COLUMNS = ("tenant, call_id, request_id, tool, digest, principal, created_at, decision, decision_id, "
                "policy_version, reasons, errors, approval_id, verified_jti, verified_at, outcome, outcome_at, "
                "extra, caller")
APPROVAL_COLUMNS = (
    "approval_id, tenant, call_id, request_id, requester_type, requester_id, tool, resource, group_name, "
    "policy_id, digest, short_code, decision_id, policy_version, created_at, expires_at, fields, status, "
    "decided_at, approver, reason, token, token_jti, token_expires_at, call_input, call_entities, run_calls, "
    "run_tool_calls, approved_version, usage_seen")
# The columns a new call's row is inserted with, in the order of `call_values`.
CALL_INSERT_COLUMNS = ("tenant", "call_id", "request_id", "tool", "digest", "principal", "created_at", "decision",
                       "decision_id", "policy_version", "reasons", "errors", "approval_id", "caller")


def insert_call_sql(mark: str) -> str:
    """The INSERT of a new call's row, with the backend's placeholder `mark`."""
    marks = ", ".join([mark] * len(CALL_INSERT_COLUMNS))
    return f"INSERT INTO calls ({', '.join(CALL_INSERT_COLUMNS)}) VALUES ({marks})"


def consume_token_sql(mark: str) -> tuple[str, str]:
    """Consuming a token, with the backend's placeholder `mark`: the INSERT of its jti
    (nothing if it was consumed before) and the UPDATE of its call's row (nothing if the
    call was verified before); the token is consumed only if both wrote a row."""
    insert = (f"INSERT INTO consumed_tokens (jti, tenant, call_id, consumed_at) VALUES ({mark}, {mark}, {mark}, "
              f"{mark}) ON CONFLICT DO NOTHING")
    update = (f"UPDATE calls SET verified_jti = {mark}, verified_at = {mark} WHERE tenant = {mark} AND call_id = "
              f"{mark} AND verified_jti = ''")
    return insert, update


def call_values(entry: CallEntry, decided: RecordedDecision) -> tuple[Any, ...]:
    """A new call's row, as `call_of` reads it back."""
    return (entry.tenant, entry.call_id, entry.request_id, entry.tool, entry.digest, entry.principal,
            entry.created_at, decided.decision, decided.decision_id, decided.policy_version,
            json.dumps(list(decided.reasons)), json.dumps([list(e) for e in decided.errors]),
            decided.approval.approval_id if decided.approval is not None else "", entry.caller)


def call_of(row: Sequence[Any]) -> CallEntry:
    (tenant, call_id, request_id, tool, digest, principal, created_at, decision, decision_id, version,
     reasons, errors, approval_id, verified_jti, verified_at, outcome, outcome_at, extra, caller) = row
    return CallEntry(tenant, call_id, request_id, tool, digest, principal, created_at, decision, decision_id,
                     version, tuple(json.loads(reasons)), tuple(tuple(e) for e in json.loads(errors)),
                     approval_id, verified_jti, verified_at, outcome, outcome_at, json.loads(extra), caller)


def insert_approval_sql(mark: str) -> str:
    """The INSERT of a new approval's row, with the backend's placeholder `mark`."""
    return f"INSERT INTO approvals ({APPROVAL_COLUMNS}) VALUES ({', '.join([mark] * 30)})"


def approval_values(r: ApprovalRecord) -> tuple[Any, ...]:
    """A new approval's row, as `approval_of` reads it back."""
    return (r.approval_id, r.tenant, r.call_id, r.request_id, r.requester_type, r.requester_id, r.tool,
            r.resource, r.group, r.policy_id, r.digest, r.short_code, r.decision_id, r.policy_version,
            r.created_at, r.expires_at, json.dumps(r.fields), r.status, r.decided_at, r.approver,
            r.reason, r.token, r.token_jti, r.token_expires_at, r.call_input, r.call_entities,
            r.run_calls, r.run_tool_calls, r.approved_version, json.dumps(r.usage, sort_keys=True))


def approval_of(row: Sequence[Any]) -> ApprovalRecord:
    values = list(row)
    values[16] = json.loads(values[16])
    values[24], values[25] = bytes(values[24]), bytes(values[25])
    values[29] = {str(k): int(v) for k, v in json.loads(values[29]).items()}
    return ApprovalRecord(*values)
