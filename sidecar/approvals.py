"""Human approval: a second principal approves the exact call, and only that call.

An approval is bound to the call's digest; approving it yields a token for that digest
and nothing else. Who may approve is decided by Cedar (`Action::"approve"` on
`Approval::"<id>"`); two rules hold whatever the policies say: a requester never approves
their own call, and an approver from another tenant is refused.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import cedarpy
from ulid import ULID

from sidecar.audit.records import AuditEvent
from sidecar.audit.sink import AuditSink
from sidecar.bundle import BundleHolder
from sidecar.bundle.cedar_schema import APPROVE_ACTION
from sidecar.clock import Clock
from sidecar.display import shown
from sidecar.engine import PreparedCall, trusted_entities
from sidecar.errors import ForbiddenError, NotFoundError, PreconditionError, RequestError
from sidecar.model import TrustedContext, Verdict
from sidecar.store.approvals import APPROVED, PENDING, REJECTED, ApprovalRecord, ApprovalStore
from sidecar.tokens import CallClaims, IssuedToken, TokenIssuer

APPROVE, REJECT = "APPROVE", "REJECT"
TERMINAL = (APPROVED, REJECTED, "expired")
MAX_WATCH_WAIT = 1.0  # seconds between looks at the store, for changes made by other processes


def short_code(digest: str) -> str:
    """Eight base32 characters of the digest, for a person to compare by eye."""
    code = base64.b32encode(bytes.fromhex(digest[:10])).decode()
    return f"{code[:4]}-{code[4:]}"


@dataclass
class ApprovalDesk:
    bundles: BundleHolder
    store: ApprovalStore
    issuer: TokenIssuer
    audit: AuditSink
    clock: Clock
    ttl_seconds: float = 900.0

    def __post_init__(self) -> None:
        self._changed = threading.Condition()
        self._generation = 0  # bumped on every poke, so a watcher never misses one

    def new_record(self, ctx: TrustedContext, call_id: str, prepared: PreparedCall, verdict: Verdict, *,
                   decision_id: str, policy_version: str, fields: dict) -> ApprovalRecord:
        """The pending approval of a call, not yet stored: the call ledger stores it in the
        transaction that records the decision asking for it (and its audit record)."""
        now = self.clock.now()
        record = ApprovalRecord(
            approval_id=str(ULID.from_timestamp(now)), tenant=ctx.tenant, call_id=call_id,
            request_id=ctx.request_id, requester_type=ctx.principal.type, requester_id=ctx.principal.id,
            tool=prepared.slice.tool.name, resource=prepared.resource, group=verdict.approval_group,
            policy_id=verdict.approval_policy, digest=prepared.digest, short_code=short_code(prepared.digest),
            decision_id=decision_id, policy_version=policy_version, created_at=now,
            expires_at=now + self.ttl_seconds, fields=fields)
        return record

    def get(self, approval_id: str, viewer: TrustedContext | None = None) -> ApprovalRecord:
        record = self.store.get(approval_id)
        if record is None:
            raise NotFoundError(f"no approval `{shown(approval_id)}`")
        return self._as_seen_by(record.as_of(self.clock.now()), viewer)

    def list(self, *, tenant: str = "", status: str = "", group: str = "", limit: int = 100) -> list[ApprovalRecord]:
        records = self.store.list(tenant=tenant, status=status, group=group, now=self.clock.now(), limit=limit)
        return [self._as_seen_by(r, None) for r in records]

    @staticmethod
    def _as_seen_by(record: ApprovalRecord, viewer: TrustedContext | None) -> ApprovalRecord:
        """The token goes to the requester alone."""
        is_requester = viewer is not None and (viewer.tenant, viewer.principal.type, viewer.principal.id) == \
            (record.tenant, record.requester_type, record.requester_id)
        return record if is_requester else ApprovalDesk.hide_token(record)

    @staticmethod
    def hide_token(record: ApprovalRecord) -> ApprovalRecord:
        return replace(record, token="", token_jti="", token_expires_at=None)

    def token_for_replay(self, approval_id: str, window: float) -> IssuedToken | None:
        """A fresh token for an approved call that has not been executed yet (the first
        one may have expired while the runtime waited), within `window` of the approval."""
        record = self.store.get(approval_id)
        if record is None or record.status != APPROVED or self.clock.now() - record.decided_at > window:
            return None
        return self._issue(record, record.approver)

    def _issue(self, record: ApprovalRecord, approver: str) -> IssuedToken:
        claims = CallClaims(record.tenant, record.requester_type, record.requester_id, record.tool, record.call_id)
        return self.issuer.issue(claims, record.digest, decision_id=record.decision_id,
                                 policy_version=record.policy_version, approval_id=record.approval_id, approver=approver)

    def decide(self, approval_id: str, approver: TrustedContext, verdict: str, reason: str = "") -> ApprovalRecord:
        approver.check()
        if verdict not in (APPROVE, REJECT):
            raise RequestError("verdict must be APPROVE or REJECT")
        now = self.clock.now()
        record = self.store.get(approval_id)
        if record is None:
            raise NotFoundError(f"no approval `{shown(approval_id)}`")
        who = str(approver.principal)
        base = dict(kind="approval", time=now, decision_id=record.decision_id, request_id=record.request_id,
                    call_id=record.call_id, tenant=record.tenant, principal=who, tool=record.tool,
                    resource=record.resource, digest=record.digest, policy_version=record.policy_version,
                    approval_id=approval_id, approver=who)

        def refuse(exc: Exception, code: str):
            self.audit.write(AuditEvent(result="refused", error_codes=(code,), **base))
            raise exc

        if approver.tenant != record.tenant:
            refuse(ForbiddenError("the approver is not in the tenant of the call"), "cross_tenant")
        if (approver.principal.type, approver.principal.id) == (record.requester_type, record.requester_id):
            refuse(ForbiddenError("a requester never approves their own call"), "self_approval")
        current = record.as_of(now)
        if current.status == APPROVED and verdict == APPROVE:
            return self.hide_token(current)  # a second click: the same approval, the same single token
        if current.status != PENDING:
            refuse(PreconditionError(f"the approval is {current.status}"), f"approval_{current.status}")
        if not self._permitted(record, approver):
            refuse(ForbiddenError(f"`{who}` may not approve this call"), "approver_not_permitted")

        token = self._issue(record, who) if verdict == APPROVE else None

        def record_of(won: bool) -> AuditEvent:
            # Committed with the approval's change, before the token can leave the process;
            # a click that lost the race is recorded as such, its token never handed out.
            if won:
                return AuditEvent(result=verdict, jti=token.jti if token else "", detail={"reason": reason[:500]},
                                  **base)
            return AuditEvent(result="superseded", jti=token.jti if token else "", **base)

        won = self.store.decide(approval_id, status=APPROVED if token else REJECTED, approver=who, reason=reason[:500],
                                now=now, token=token.token if token else "", token_jti=token.jti if token else "",
                                token_expires_at=token.expires_at if token else None, audit=record_of)
        if not won:
            final = self.get(approval_id)
            if final.status == APPROVED and verdict == APPROVE:
                return final
            raise PreconditionError(f"the approval is {final.status}")
        self.poke()
        return self.get(approval_id)

    def _permitted(self, record: ApprovalRecord, approver: TrustedContext) -> bool:
        bundle = self.bundles.current
        if bundle.approve is None:
            return False
        approval = {"uid": {"type": "Approval", "id": record.approval_id},
                    "attrs": {"tool": record.tool, "group": record.group, "tenant": record.tenant,
                              "requester": record.requester},
                    "parents": [{"type": "Tenant", "id": record.tenant}]}
        entities = trusted_entities(bundle, approver.tenant, approver.entities_json,
                                    [(approver.principal.type, approver.principal.id)], [approval],
                                    reach=bundle.approve_reach)
        request = {"principal": {"type": approver.principal.type, "id": approver.principal.id},
                   "action": {"type": "Action", "id": APPROVE_ACTION},
                   "resource": {"type": "Approval", "id": record.approval_id}, "context": {}}
        return cedarpy.is_authorized(request, bundle.approve, entities).decision == cedarpy.Decision.Allow

    def poke(self) -> None:
        """Wake every watcher (a decision was made, or the clock moved in a test)."""
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def watch(self, approval_id: str, viewer: TrustedContext | None,
              is_active: Callable[[], bool]) -> Iterator[ApprovalRecord]:
        last = None
        while is_active():
            with self._changed:
                generation = self._generation
            record = self.get(approval_id, viewer)
            if record != last:
                yield record
                last = record
            if record.status in TERMINAL:
                return
            until_expiry = max(0.0, record.expires_at - self.clock.now())
            with self._changed:
                if self._generation == generation:
                    self._changed.wait(min(MAX_WATCH_WAIT, until_expiry + 0.001))
