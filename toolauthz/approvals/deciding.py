"""Deciding one approval: who may (the ID token's person, their home tenant, never the
requester, then Cedar's `approve`), whether the policies loaded now still let the call
run, which token it yields, and what the audit trail keeps of each step, refusals too."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NoReturn

from toolauthz.approvals.listeners import Listeners
from toolauthz.approvals.redecide import still_allowed
from toolauthz.audit.records import AuditEvent
from toolauthz.audit.sink import AuditSink
from toolauthz.bundle import Bundle, BundleHolder
from toolauthz.call_record import CallRecord
from toolauthz.clock import Clock
from toolauthz.display.escape import shown
from toolauthz.engine import ApprovalSubject, approver_refusal, may_approve
from toolauthz.errors import ForbiddenError, NotFoundError, PreconditionError, RequestError
from toolauthz.identity.approvers import CROSS_TENANT_APPROVER, ApproverProof, OtherTenantsPerson
from toolauthz.identity.oidc import IdTokenRefused, IdTokenVerifier, ProvenPerson
from toolauthz.model import Decision, ErrorDetail, Principal, TrustedContext
from toolauthz.store.approvals import APPROVED, PENDING, REJECTED, ApprovalRecord, ApprovalStore
from toolauthz.tokens import CallClaims, IssuedToken, TokenIssuer

APPROVE, REJECT = "APPROVE", "REJECT"


def approval_token(issuer: TokenIssuer, record: ApprovalRecord, approver: str, policy_version: str) -> IssuedToken:
    """The token an approved call runs with: bound to the call's digest, naming its approver."""
    claims = CallClaims(record.tenant, record.requester_type, record.requester_id, record.tool, record.call_id)
    return issuer.issue(claims, record.digest, decision_id=record.decision_id,
                        policy_version=policy_version, approval_id=record.approval_id, approver=approver)


@dataclass
class ApprovalDecider:
    bundles: BundleHolder
    store: ApprovalStore
    issuer: TokenIssuer
    audit: AuditSink
    clock: Clock
    proof: ApproverProof
    listeners: Listeners
    # The approval as anyone but its call's owner sees it (the desk's `get`).
    read: Callable[[str], ApprovalRecord]
    id_tokens: IdTokenVerifier | None = None

    def decide(self, approval_id: str, approver: TrustedContext, verdict: str, reason: str = "", *,
               caller: str = "", id_token: str = "") -> ApprovalRecord:
        """`approver`: the deciding person as the approval tool names them; with an
        identity provider configured (`id_tokens`), the person is the one `id_token`
        proves, with the groups it carries, and the tool's principal may only repeat it.
        `caller`: who asked, as the transport proved it (audited)."""
        self._check_envelope(approver)
        if verdict not in (APPROVE, REJECT):
            raise RequestError("verdict must be APPROVE or REJECT")
        if "\x00" in reason:  # PostgreSQL text holds none: the store would refuse it as a failure of its own
            raise RequestError("the reason must not contain a NUL character")
        now = self.clock.now()
        record = self.store.get(approval_id)
        if record is None:
            raise NotFoundError(f"no approval `{shown(approval_id)}`")
        who = str(approver.principal) if approver.principal.id else ""
        base = CallRecord("approval", record.tenant, who, record.request_id, record.call_id, record.tool,
                          decision_id=record.decision_id, policy_version=record.policy_version,
                          resource=record.resource, digest=record.digest, approval_id=approval_id, approver=who,
                          caller=caller)

        def refuse(exc: Exception, code: str, detail: dict[str, str] | None = None) -> NoReturn:
            self.audit.write(base.event(now, "refused", error_codes=(code,), detail=detail))
            raise exc

        person = None
        if self.id_tokens is not None:
            try:
                person = self.proof.from_token(approver, id_token)
            except IdTokenRefused as exc:
                refuse(exc, exc.code, {"reason": exc.reason})
            except OtherTenantsPerson as exc:
                refuse(exc, CROSS_TENANT_APPROVER)
            except ForbiddenError as exc:
                refuse(exc, "approver_mismatch")
            except RequestError as exc:
                refuse(exc, "invalid_entities")
            approver = replace(approver, principal=person.principal)
            who = str(person.principal)
            base = replace(base, principal=who, approver=who)
        else:
            try:
                self.proof.check_home_tenant(approver.principal, approver.tenant)
            except OtherTenantsPerson as exc:
                refuse(exc, CROSS_TENANT_APPROVER)

        rule = approver_refusal(approver, record.tenant, Principal(record.requester_type, record.requester_id))
        if rule is not None:
            refuse(ForbiddenError(rule.message), rule.code)
        current = record.as_of(now)
        if current.status == APPROVED and verdict == APPROVE:
            return self.read(approval_id)  # a second click: the same approval, the same single token
        if current.status != PENDING:
            refuse(PreconditionError(f"the approval is {current.status}"), f"approval_{current.status}")
        bundle = self.bundles.current  # one bundle for the approver's check, the call's and the token
        try:
            permitted = self._permitted(bundle, record, approver, person)
        except RequestError as exc:  # the approver's entities break a rule: refused, and audited as such
            refuse(exc, "invalid_entities")
        if not permitted:
            refuse(ForbiddenError(f"`{who}` may not approve this call"), "approver_not_permitted")
        if verdict == APPROVE:
            refusal = still_allowed(bundle, record)
            if refusal is not None:
                self._end_as_changed(record, refusal, now, replace(base, policy_version=bundle.version))

        token = approval_token(self.issuer, record, who, bundle.version) if verdict == APPROVE else None

        def record_of(won: bool) -> AuditEvent:
            # Committed with the approval's change, before the token can leave the process;
            # a click that lost the race is recorded as such, its token never handed out.
            if won:
                detail: dict[str, object] = {"reason": reason[:500]}
                if person is not None:
                    detail["id_token_groups"] = list(person.groups)
                return base.event(now, verdict, jti=token.jti if token else "", detail=detail)
            return base.event(now, "superseded", jti=token.jti if token else "")

        won = self.store.decide(approval_id, status=APPROVED if token else REJECTED, approver=who, reason=reason[:500],
                                now=now, token=token.token if token else "", token_jti=token.jti if token else "",
                                token_expires_at=token.expires_at if token else None,
                                approved_version=bundle.version if token else "", audit=record_of)
        if not won:
            final = self.read(approval_id)
            if final.status == APPROVED and verdict == APPROVE:
                return final
            raise PreconditionError(f"the approval is {final.status}")
        self.listeners.tell(approval_id)
        return self.read(approval_id)

    def _check_envelope(self, approver: TrustedContext) -> None:
        """A person approving is in no model run: the request id is optional. With an
        identity provider the principal comes from the ID token, so the request may leave
        it out; what it does say must still be well formed."""
        if self.id_tokens is None or approver.principal.type or approver.principal.id:
            approver.check(require_request_id=False)
        else:
            stand_in = Principal(self.id_tokens.settings.principal_type, "id-token")
            replace(approver, principal=stand_in).check(require_request_id=False)

    @staticmethod
    def _permitted(bundle: Bundle, record: ApprovalRecord, approver: TrustedContext,
                   person: ProvenPerson | None) -> bool:
        subject = ApprovalSubject(record.approval_id, record.tenant, record.tool, record.group, record.requester)
        groups = person.groups if person is not None else None
        return may_approve(bundle, approver, subject, groups).decision is Decision.ALLOW

    def _end_as_changed(self, record: ApprovalRecord, refusal: ErrorDetail, now: float,
                        base: CallRecord) -> NoReturn:
        """The approval of a call the policies loaded now refuse ends as rejected, with the
        reason on record and in the audit trail; the caller gets FAILED_PRECONDITION."""
        reason = f"{refusal.code}: {refusal.message}"

        def record_of(won: bool) -> AuditEvent:
            return base.event(now, "refused" if won else "superseded", error_codes=(refusal.code,),
                              detail={"reason": reason})

        won = self.store.decide(record.approval_id, status=REJECTED, approver="", reason=reason, now=now,
                                audit=record_of)
        if won:
            self.listeners.tell(record.approval_id)
            raise PreconditionError(refusal.message, code=refusal.code)
        raise PreconditionError(f"the approval is {self.read(record.approval_id).status}")
