"""gRPC handlers of toolauthz.v1.Audit."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import re

from toolauthz.audit.records import AuditRecord
from toolauthz.audit.store import MAX_PAGE, AuditLog, AuditQuery, checked_query
from toolauthz.errors import RequestError
from toolauthz.proto.toolauthz.v1 import audit_pb2 as aupb
from toolauthz.proto.toolauthz.v1 import audit_pb2_grpc as aupb_grpc
from toolauthz.service.access import About, Gate
from toolauthz.service.common import status_mapped, timestamp


def record_message(r: AuditRecord) -> aupb.AuditRecord:
    e = r.event
    return aupb.AuditRecord(
        seq=r.seq, time=timestamp(e.time), kind=e.kind, decision_id=e.decision_id, request_id=e.request_id,
        call_id=e.call_id, tenant=e.tenant, principal=e.principal, tool=e.tool, resource=e.resource,
        result=e.result, reasons=list(e.reasons), error_codes=list(e.error_codes), digest=e.digest,
        policy_version=e.policy_version, jti=e.jti, approval_id=e.approval_id, approver=e.approver,
        fields_json=json.dumps(e.fields, sort_keys=True), detail_json=json.dumps(e.detail, sort_keys=True), hash=r.hash,
        caller=e.caller)


def query_of(request: aupb.QueryDecisionsRequest) -> AuditQuery:
    def text(value: str) -> str | None:
        return value or None

    def when(field: str) -> float | None:
        return getattr(request, field).ToNanoseconds() / 1e9 if request.HasField(field) else None

    query = AuditQuery(tenant=text(request.tenant), principal=text(request.principal), tool=text(request.tool),
                       call_id=text(request.call_id), request_id=text(request.request_id),
                       result=text(request.result), kind=text(request.kind),
                       resource=text(request.resource), approver=text(request.approver),
                       approval_id=text(request.approval_id), decision_id=text(request.decision_id),
                       error_code=text(request.error_code), policy_id=text(request.policy_id),
                       policy_version=text(request.policy_version), caller=text(request.caller),
                       time_from=when("time_from"), time_to=when("time_to"))
    return checked_query(query)


_SEQ = re.compile(r"0|[1-9][0-9]{0,18}")  # ASCII digits only: str.isdigit also accepts "²"
MAX_SEQ = (1 << 63) - 1  # SQLite's INTEGER


def after_seq_of(page_token: str) -> int:
    """The seq a page token continues after. The token is the last received record's
    `seq` (a position, not a credential: any caller of this service may start anywhere),
    so it is only checked to be a seq: ASCII digits within SQLite's integer range."""
    if not page_token:
        return 0
    if not _SEQ.fullmatch(page_token) or int(page_token) > MAX_SEQ:
        raise RequestError("page_token must be the `seq` of the last record received")
    return int(page_token)


def visible_page(log: AuditLog, query: AuditQuery, tenants: frozenset[str] | None, *, limit: int,
                 after_seq: int) -> list[AuditRecord]:
    """A page of the records `query` matches among `tenants` (None: every tenant): one
    query per tenant when several are visible, merged in seq order. Each query reads at
    most `limit` records after `after_seq`, so the merge's first `limit` are the page."""
    if query.tenant is not None or tenants is None:
        return log.query(query, limit=limit, after_seq=after_seq)
    merged = [r for tenant in sorted(tenants)
              for r in log.query(dataclasses.replace(query, tenant=tenant), limit=limit, after_seq=after_seq)]
    return sorted(merged, key=lambda r: r.seq)[:limit]


class AuditService(aupb_grpc.AuditServicer):
    def __init__(self, log: AuditLog, *, gate: Gate):
        self._log = log
        self._gate = gate

    @status_mapped
    async def QueryDecisions(self, request: aupb.QueryDecisionsRequest, context):
        # A coroutine, not a plain generator: grpc.aio never closes a plain generator
        # whose client went away, and its thread would wait forever.
        access = await self._gate.admit_async(context, "QueryDecisions", About(tenant=request.tenant))
        limit = min(request.limit or 100, MAX_PAGE)
        after = after_seq_of(request.page_token)
        # No tenant asked: only the caller's tenants are searched.
        query = functools.partial(visible_page, self._log, query_of(request), access.tenants, limit=limit,
                                  after_seq=after)
        for record in await asyncio.get_running_loop().run_in_executor(None, query):
            yield record_message(record)
