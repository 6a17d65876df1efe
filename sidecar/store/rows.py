"""Ledger and approval rows as values, for every backend: the columns are selected in
the order of the dataclasses' fields, lists and mappings stored as JSON text, the kept
call input and entities as bytes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sidecar.store.approvals import ApprovalRecord
from sidecar.store.ledger import CallEntry


def call_of(row: Sequence[Any]) -> CallEntry:
    (tenant, call_id, request_id, tool, digest, principal, created_at, decision, decision_id, version,
     reasons, errors, approval_id, verified_jti, verified_at, outcome, outcome_at, extra) = row
    return CallEntry(tenant, call_id, request_id, tool, digest, principal, created_at, decision, decision_id,
                     version, tuple(json.loads(reasons)), tuple(tuple(e) for e in json.loads(errors)),
                     approval_id, verified_jti, verified_at, outcome, outcome_at, json.loads(extra))


def approval_of(row: Sequence[Any]) -> ApprovalRecord:
    values = list(row)
    values[16] = json.loads(values[16])
    values[24], values[25] = bytes(values[24]), bytes(values[25])
    return ApprovalRecord(*values)
