"""gRPC handlers of toolauthz.v1.Approvals."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping

from toolauthz.approvals import APPROVE, REJECT, ApprovalDesk
from toolauthz.display.hints import DisplayHint, labelled, shown_usage
from toolauthz.errors import RequestError
from toolauthz.model import TrustedContext
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.service.access import About, Gate
from toolauthz.service.callers import caller_of
from toolauthz.service.common import status_mapped, timestamp, trusted_context
from toolauthz.service.observe import approval_decided, grpc_transport
from toolauthz.service.ownership import admit_approval_reader
from toolauthz.service.roles import Access, Rpc
from toolauthz.service.watching import LoopNotifier, WatchLimits, watch_records
from toolauthz.store.approvals import ApprovalRecord
from toolauthz.store.ledger import CallOwner

_STATUS = {"pending": apb.PENDING, "approved": apb.APPROVED, "rejected": apb.REJECTED, "expired": apb.EXPIRED}
_STATUS_NAMES = {v: k for k, v in _STATUS.items()}
_VERDICTS = {apb.APPROVE: APPROVE, apb.REJECT: REJECT}
MAX_LIST = 1000


def approval_message(r: ApprovalRecord, hints: Mapping[str, DisplayHint] | None = None,
                     usage_hints: Mapping[str, DisplayHint | None] | None = None) -> apb.Approval:
    """The approval as the service shows it; `hints`: the tool's display hints,
    `usage_hints`: its meters' (`Bundle.usage_hints_of`)."""
    msg = apb.Approval(
        approval_id=r.approval_id, status=_STATUS[r.status], tenant=r.tenant,
        requester=pb.Principal(type=r.requester_type, id=r.requester_id), tool=r.tool, resource=r.resource,
        group=r.group, policy_id=r.policy_id, call_id=r.call_id, request_id=r.request_id, digest=r.digest,
        short_code=r.short_code, arguments_json=json.dumps(r.fields, sort_keys=True),
        created_at=timestamp(r.created_at), expires_at=timestamp(r.expires_at), reason=r.reason, token=r.token,
        shown_fields=[apb.ShownField(label=label, value=value)
                      for label, value in labelled(r.fields, hints or {}).items()],
        usage=[apb.ShownField(label=name, value=value)
               for name, value in shown_usage(r.usage, usage_hints or {}).items()])
    if r.decided_at is not None:
        msg.decided_at.CopyFrom(timestamp(r.decided_at))
    if r.approver:
        kind, _, rest = r.approver.partition("::")
        msg.approver.CopyFrom(pb.Principal(type=kind, id=rest[1:-1]))
    if r.token_expires_at is not None and r.token:
        msg.token_expires_at.CopyFrom(timestamp(r.token_expires_at))
    return msg


def _viewer(request: apb.GetApprovalRequest) -> TrustedContext | None:
    return trusted_context(request.context) if request.HasField("context") and request.context.tenant else None


class ApprovalsService(apb_grpc.ApprovalsServicer):
    def __init__(self, desk: ApprovalDesk, watches: WatchLimits, *, gate: Gate):
        self._desk = desk
        self._watches = watches
        self._gate = gate
        self._loop_notifier: LoopNotifier | None = None

    def _hints(self, record: ApprovalRecord) -> tuple[Mapping[str, DisplayHint], dict[str, DisplayHint | None]]:
        bundle = self._desk.bundles.current
        return bundle.display_of(record.tool), bundle.usage_hints_of(record.tool)

    @status_mapped
    def ListApprovals(self, request: apb.ListApprovalsRequest, context) -> apb.ListApprovalsResponse:
        access = self._gate.admit(context, "ListApprovals", About(tenant=request.tenant))
        status = _STATUS_NAMES.get(request.status, "")
        limit = min(request.limit or 100, MAX_LIST)
        # No tenant asked: the caller's tenants only, newest first as the store lists them.
        tenants = [request.tenant] if request.tenant or access.tenants is None else sorted(access.tenants)
        records = [r for tenant in tenants
                   for r in self._desk.list(tenant=tenant, status=status, group=request.group, limit=limit)]
        records.sort(key=lambda r: r.approval_id, reverse=True)
        return apb.ListApprovalsResponse(approvals=[approval_message(r, *self._hints(r)) for r in records[:limit]])

    @status_mapped
    def GetApproval(self, request: apb.GetApprovalRequest, context) -> apb.Approval:
        record = self._get(request, context, "GetApproval")
        return approval_message(record, *self._hints(record))

    def _get(self, request: apb.GetApprovalRequest, context, rpc: Rpc) -> ApprovalRecord:
        viewer = _viewer(request)
        access = self._gate.admit(context, rpc, _about_viewer(request, viewer))
        return self._desk.get(request.approval_id, self._admit_reader(access, request, viewer, rpc))

    @status_mapped
    def DecideApproval(self, request: apb.DecideApprovalRequest, context) -> apb.Approval:
        approver = trusted_context(request.approver)
        access = self._gate.admit(context, "DecideApproval", About(
            approver.tenant, str(approver.principal) if approver.principal.id else "",
            approval_id=request.approval_id))
        verdict = _VERDICTS.get(request.verdict)
        if verdict is None:
            raise RequestError("verdict must be APPROVE or REJECT")
        record = self._desk.decide(request.approval_id, approver, verdict, request.reason,
                                   caller=access.caller.id, id_token=request.id_token)
        approval_decided(record.status, grpc_transport(context.invocation_metadata()))
        return approval_message(self._desk.hide_token(record), *self._hints(record))

    async def _admit_watch(self, request: apb.GetApprovalRequest, context) -> CallOwner | None:
        """WatchApproval's role, tenant and ownership checks (the approval is read, and a
        refusal waits for its audit record, off the event loop): whom the token may go to."""
        viewer = _viewer(request)
        access = await self._gate.admit_async(context, "WatchApproval", _about_viewer(request, viewer))
        return await asyncio.get_running_loop().run_in_executor(
            None, self._admit_reader, access, request, viewer, "WatchApproval")

    def _admit_reader(self, access: Access, request: apb.GetApprovalRequest, viewer: TrustedContext | None,
                      rpc: Rpc) -> CallOwner | None:
        """The approval's tenant, then its call's owner (service/ownership.py): whom the
        token may go to."""
        return admit_approval_reader(self._gate, self._desk, access, rpc, request.approval_id, viewer)

    @status_mapped
    async def WatchApproval(self, request: apb.GetApprovalRequest, context):
        # A coroutine, cancelled when the client goes away; its waiting holds no thread
        # (toolauthz/service/watching.py). The slot is given back when the call ends, for
        # whatever reason, even if grpc never resumes this generator to close it.
        owner = await self._admit_watch(request, context)
        slot = self._watches.admit(caller_of(context).id)
        context.add_done_callback(lambda _context: slot.release())
        records = watch_records(self._desk, self._notifier(), request.approval_id, owner)
        try:
            async with contextlib.aclosing(records):
                async for record in records:
                    yield approval_message(record, *self._hints(record))
        finally:
            slot.release()

    def _notifier(self) -> LoopNotifier:
        """The notifier of the running loop: a server's handlers all run on its one loop."""
        loop = asyncio.get_running_loop()
        if self._loop_notifier is None or self._loop_notifier.loop is not loop:
            self._loop_notifier = LoopNotifier(self._desk, loop)
        return self._loop_notifier


def _about_viewer(request: apb.GetApprovalRequest, viewer: TrustedContext | None) -> About:
    if viewer is None:
        return About(approval_id=request.approval_id)
    return About(viewer.tenant, str(viewer.principal), request_id=viewer.request_id, approval_id=request.approval_id)
