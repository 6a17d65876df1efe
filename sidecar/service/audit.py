"""gRPC handlers of toolauthz.v1.Audit."""

from __future__ import annotations

import asyncio
import functools
import json
import re

from sidecar.audit.records import AuditRecord
from sidecar.audit.store import MAX_PAGE, AuditLog, AuditQuery
from sidecar.errors import RequestError
from sidecar.proto.toolauthz.v1 import audit_pb2 as aupb
from sidecar.proto.toolauthz.v1 import audit_pb2_grpc as aupb_grpc
from sidecar.service.common import status_mapped, timestamp


def record_message(r: AuditRecord) -> aupb.AuditRecord:
    e = r.event
    return aupb.AuditRecord(
        seq=r.seq, time=timestamp(e.time), kind=e.kind, decision_id=e.decision_id, request_id=e.request_id,
        call_id=e.call_id, tenant=e.tenant, principal=e.principal, tool=e.tool, resource=e.resource,
        result=e.result, reasons=list(e.reasons), error_codes=list(e.error_codes), digest=e.digest,
        policy_version=e.policy_version, jti=e.jti, approval_id=e.approval_id, approver=e.approver,
        fields_json=json.dumps(e.fields, sort_keys=True), detail_json=json.dumps(e.detail, sort_keys=True), hash=r.hash)


def query_of(request: aupb.QueryDecisionsRequest) -> AuditQuery:
    def text(value: str) -> str | None:
        return value or None

    def when(field: str) -> float | None:
        return getattr(request, field).ToNanoseconds() / 1e9 if request.HasField(field) else None

    return AuditQuery(tenant=text(request.tenant), principal=text(request.principal), tool=text(request.tool),
                      call_id=text(request.call_id), request_id=text(request.request_id),
                      result=text(request.result), kind=text(request.kind),
                      time_from=when("time_from"), time_to=when("time_to"))


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


class AuditService(aupb_grpc.AuditServicer):
    def __init__(self, log: AuditLog):
        self._log = log

    @status_mapped
    async def QueryDecisions(self, request: aupb.QueryDecisionsRequest, context):
        # A coroutine, not a plain generator: grpc.aio never closes a plain generator
        # whose client went away, and its thread would wait forever.
        limit = min(request.limit or 100, MAX_PAGE)
        after = after_seq_of(request.page_token)
        query = functools.partial(self._log.query, query_of(request), limit=limit, after_seq=after)
        for record in await asyncio.get_running_loop().run_in_executor(None, query):
            yield record_message(record)
