"""Calls owned by their caller, on the approvals' side: who may read an approval, and who
receives its token.

A call belongs to the caller its listener proved and to the tenant, principal and run it
was decided for (toolauthz/store/ledger.py `CallOwner`); the ledger enforces that for
Verify, ReportOutcome and replays, in the transaction that would change the call. An
approval is about a call, so:

    approver role in the approval's tenant   reads it, never its token
    anyone else (the runtime role)           only its own call's approval, by caller;
                                             the token only with the call's whole owner
                                             in `context` (tenant, principal, run)

Anything else is PERMISSION_DENIED (`not_call_owner`), with one audit record naming the
caller and the owner's fields it got wrong (never their values).
"""

from __future__ import annotations

from toolauthz.approvals import ApprovalDesk
from toolauthz.audit.records import AuditEvent
from toolauthz.call_record import NOT_CALL_OWNER
from toolauthz.model import TrustedContext
from toolauthz.service.access import About, Gate
from toolauthz.service.roles import Access, CallerRefused, Rpc
from toolauthz.store.approvals import ApprovalRecord
from toolauthz.store.ledger import CallOwner


def admit_approval_reader(gate: Gate, desk: ApprovalDesk, access: Access, rpc: Rpc, approval_id: str,
                          viewer: TrustedContext | None) -> CallOwner | None:
    """The approval's tenant, then its call's owner: whom the token of `approval_id` may
    go to on this request (None: nobody). Blocks on the store: call it off the event
    loop. Raises NotFoundError, or CallerRefused (audited when past the tenant check)."""
    record = desk.get(approval_id)
    gate.admit_tenant(access, rpc, About(record.tenant, approval_id=approval_id))
    return admit_reader(gate, desk, access, rpc, record, viewer)


def admit_reader(gate: Gate, desk: ApprovalDesk, access: Access, rpc: Rpc, record: ApprovalRecord,
                 viewer: TrustedContext | None) -> CallOwner | None:
    """Whom `record`'s token may go to on this request (None: nobody), once its caller
    may read it at all; raises CallerRefused, audited, when it may not."""
    asks_token = viewer is not None and access.has("runtime", viewer.tenant)
    if not asks_token and access.has("approver", record.tenant):
        return None
    owner = desk.call_owner(record)
    if viewer is not None and asks_token:
        claimant = CallOwner(viewer.tenant, access.caller.id, str(viewer.principal), viewer.request_id)
        mismatch = owner.differences(claimant) if owner is not None else ["caller"]
    else:
        claimant = None
        mismatch = [] if owner is not None and owner.caller == access.caller.id else ["caller"]
    if not mismatch:
        return claimant
    refused_record(gate, access, rpc, record, viewer, mismatch)
    raise CallerRefused("the approval is of a call that belongs to another caller, principal or run", NOT_CALL_OWNER)


def refused_record(gate: Gate, access: Access, rpc: Rpc, record: ApprovalRecord, viewer: TrustedContext | None,
                   mismatch: list[str]) -> None:
    """The one audit record of a refused read: per request, since its caller is one the
    tenant admitted (unlike the refusals at the gate)."""
    gate.audit.write(AuditEvent(
        kind="approval", time=gate.clock.now(), tenant=record.tenant,
        principal=str(viewer.principal) if viewer is not None else "", call_id=record.call_id,
        request_id=viewer.request_id if viewer is not None else "", tool=record.tool,
        approval_id=record.approval_id, decision_id=record.decision_id, result="refused",
        error_codes=(NOT_CALL_OWNER,), detail={"rpc": rpc, "mismatch": mismatch}, caller=access.caller.id))
