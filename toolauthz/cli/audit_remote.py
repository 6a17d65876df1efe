"""The audit log of a running sidecar, read over its Audit service (QueryDecisions), in
the shape of the local store's `AuditLog.query`: `toolauthz audit --server HOST:PORT`
then prints exactly what it prints for a local store."""

from __future__ import annotations

import dataclasses
import json

from toolauthz.audit import AuditQuery, AuditRecord
from toolauthz.audit.records import AuditEvent
from toolauthz.client import AuthzClient
from toolauthz.proto.toolauthz.v1 import audit_pb2 as aupb


class RemoteAuditLog:
    """Only `query`: verifying the chain needs the store itself (`audit verify`)."""

    def __init__(self, client: AuthzClient):
        self._client = client

    def query(self, filters: AuditQuery, *, limit: int, after_seq: int = 0) -> list[AuditRecord]:
        if filters.newest_first:
            raise ValueError("QueryDecisions pages oldest first only")
        wanted = {name: value for name, value in dataclasses.asdict(filters).items()
                  if value is not None and name != "newest_first"}
        page = self._client.query_decisions(limit=limit, page_token=str(after_seq) if after_seq else "", **wanted)
        return [record_of(message) for message in page]


def record_of(m: aupb.AuditRecord) -> AuditRecord:
    """An AuditRecord as the store holds it, from the service's message. `prev_hash` is
    not sent: only verification reads it, and that runs on the store."""
    event = AuditEvent.from_storage(
        kind=m.kind, time=m.time.ToNanoseconds() / 1e9, decision_id=m.decision_id, request_id=m.request_id,
        call_id=m.call_id, tenant=m.tenant, principal=m.principal, tool=m.tool, resource=m.resource,
        result=m.result, reasons=tuple(m.reasons), error_codes=tuple(m.error_codes), digest=m.digest,
        policy_version=m.policy_version, jti=m.jti, approval_id=m.approval_id, approver=m.approver,
        fields=json.loads(m.fields_json or "{}"), detail=json.loads(m.detail_json or "{}"), caller=m.caller)
    return AuditRecord(m.seq, event, "", m.hash)
