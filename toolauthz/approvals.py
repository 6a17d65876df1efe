"""Human approval: a second principal approves the exact call, and only that call.

An approval is bound to the call's digest; approving it yields a token for that digest
and nothing else. Who may approve is decided by Cedar (`Action::"approve"` on
`Approval::"<id>"`, through the engine); two rules hold whatever the policies say: a
requester never approves their own call, and an approver from another tenant is refused
(toolauthz/identity/approvers.py: neither the tenant the request names nor an ID token makes a
person the bundle declares in another tenant an approver here).

A decision is only as good as the policies that made it: approving a call re-decides it
under the bundle loaded now (from the arguments and entities the approval keeps while it
is pending), and so does a replay that would hand out its token under another policy
version. A call the policies now deny, or now route to another group, gets no token
(`policy_changed`); one they now allow without approval is approved as asked.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import NoReturn, Protocol

from ulid import ULID

from toolauthz.audit.records import AuditEvent
from toolauthz.audit.sink import AuditSink
from toolauthz.bundle import Bundle, BundleHolder
from toolauthz.bundle.catalog import resolve_pointer
from toolauthz.call_record import CallRecord
from toolauthz.clock import Clock
from toolauthz.digest import canonical_json
from toolauthz.display.escape import shown
from toolauthz.engine import (
    ApprovalSubject,
    PreparedCall,
    RunCounts,
    approver_refusal,
    evaluate,
    may_approve,
    prepare,
    request_entities,
    supplied_entities,
)
from toolauthz.errors import ForbiddenError, InputError, NotFoundError, PreconditionError, RequestError
from toolauthz.identity.approvers import CROSS_TENANT_APPROVER, ApproverProof, OtherTenantsPerson
from toolauthz.identity.oidc import IdTokenRefused, IdTokenVerifier, ProvenPerson
from toolauthz.model import Decision, ErrorDetail, Principal, ProposedCall, TrustedContext, Verdict
from toolauthz.store.approvals import APPROVED, PENDING, REJECTED, ApprovalRecord, ApprovalStore
from toolauthz.store.ledger import CallLedger, CallOwner
from toolauthz.tokens import CallClaims, IssuedToken, TokenIssuer

APPROVE, REJECT = "APPROVE", "REJECT"
TERMINAL = (APPROVED, REJECTED, "expired")
# Seconds between a watch's looks at the store, for changes made by other processes
# (worker processes share the database, not their pokes).
MAX_WATCH_WAIT = 1.0
POLICY_CHANGED = "policy_changed"


@dataclass(frozen=True)
class ReplayedApproval:
    """What a replayed Authorize of a call gets from its approval: the approval's state,
    a fresh token if it was approved and may still run, or why it may not (`refusal`)."""

    status: str
    expires_at: float
    token: IssuedToken | None = None
    refusal: ErrorDetail | None = None


def short_code(digest: str) -> str:
    """Eight base32 characters of the digest, for a person to compare by eye."""
    code = base64.b32encode(bytes.fromhex(digest[:10])).decode()
    return f"{code[:4]}-{code[4:]}"


class ChangeListener(Protocol):
    """Hears that an approval changed: how watches wait without a thread each."""

    def changed(self, approval_id: str | None) -> None:
        """Called on the thread that made the change, after it is committed; must return
        at once (hand the news to wherever the watches wait). None: any approval may
        have changed."""


@dataclass
class ApprovalDesk:
    bundles: BundleHolder
    store: ApprovalStore
    issuer: TokenIssuer
    audit: AuditSink
    clock: Clock
    ttl_seconds: float = 900.0
    # With an identity provider, the person deciding is the one their ID token proves.
    id_tokens: IdTokenVerifier | None = None
    # The call ledger: an approval's token goes to the owner of its call alone.
    calls: CallLedger | None = None

    def __post_init__(self) -> None:
        self.proof = ApproverProof(self.bundles, self.id_tokens)
        self._listeners_lock = threading.Lock()
        self._listeners: tuple[ChangeListener, ...] = ()

    def new_record(self, ctx: TrustedContext, call_id: str, prepared: PreparedCall, verdict: Verdict, *,
                   decision_id: str, policy_version: str, fields: dict, run: RunCounts,
                   usage: Mapping[str, int] | None = None) -> ApprovalRecord:
        """The pending approval of a call, not yet stored: the call ledger stores it in the
        transaction that records the decision asking for it (and its audit record). It
        keeps what re-deciding the call needs (arguments, trusted entities, run counts)
        until it is decided or expires."""
        now = self.clock.now()
        tool = prepared.slice.tool
        for pointer in tool.approver_fields:  # `audit.record` came with `fields`; `display` `show: true` too
            if pointer not in fields:
                found, value = resolve_pointer(prepared.input, pointer)
                if found:
                    fields = {**fields, pointer: value}
        record = ApprovalRecord(
            approval_id=str(ULID.from_timestamp(now)), tenant=ctx.tenant, call_id=call_id,
            request_id=ctx.request_id, requester_type=ctx.principal.type, requester_id=ctx.principal.id,
            tool=prepared.slice.tool.name, resource=prepared.resource, group=verdict.approval_group,
            policy_id=verdict.approval_policy, digest=prepared.digest, short_code=short_code(prepared.digest),
            decision_id=decision_id, policy_version=policy_version, created_at=now,
            expires_at=now + self.ttl_seconds, fields=fields, call_input=canonical_json(prepared.input),
            call_entities=ctx.entities_json, run_calls=run.calls, run_tool_calls=run.tool_calls,
            usage=dict(usage or {}))
        return record

    def get(self, approval_id: str, owner: CallOwner | None = None) -> ApprovalRecord:
        """The approval; with its token only for `owner`, when that is the owner of its
        call (`call_owner`)."""
        record = self.store.get(approval_id)
        if record is None:
            raise NotFoundError(f"no approval `{shown(approval_id)}`")
        record = record.as_of(self.clock.now())
        return self._as_seen_by(record, owner is not None and owner == self.call_owner(record))

    def call_owner(self, record: ApprovalRecord) -> CallOwner | None:
        """Whose call `record` approves: the caller, principal and run its ledger row
        names (None: no ledger, or the call was pruned)."""
        entry = self.calls.get(record.tenant, record.call_id) if self.calls is not None else None
        return entry.owner if entry is not None else None

    def list(self, *, tenant: str = "", status: str = "", group: str = "", limit: int = 100) -> list[ApprovalRecord]:
        records = self.store.list(tenant=tenant, status=status, group=group, now=self.clock.now(), limit=limit)
        return [self._as_seen_by(r, False) for r in records]

    def _as_seen_by(self, record: ApprovalRecord, by_owner: bool) -> ApprovalRecord:
        """The token goes to the owner of the call alone, and only while the policies
        that approved it are loaded: under others, the runtime replays the call through
        Authorize, which re-decides it. The kept arguments never leave the desk."""
        current = bool(record.approved_version) and record.approved_version == self.bundles.current.version
        shown = replace(record, call_input=b"", call_entities=b"")
        return shown if by_owner and current else self.hide_token(shown)

    def expiry(self, approval_id: str) -> float | None:
        record = self.store.get(approval_id)
        return record.expires_at if record else None

    @staticmethod
    def hide_token(record: ApprovalRecord) -> ApprovalRecord:
        return replace(record, token="", token_jti="", token_expires_at=None)

    def on_replay(self, approval_id: str, window: float, ctx: TrustedContext,
                  prepared: PreparedCall) -> ReplayedApproval | None:
        """For a replayed Authorize of the call (`ctx`, `prepared`: the runtime's, whose
        digest matched): a fresh token for an approved call that has not been executed yet
        (the first one may have expired while the runtime waited), within `window` of the
        approval, and only if the policies loaded now still allow it under this approval."""
        record = self.store.get(approval_id)
        if record is None:
            return None
        now = self.clock.now()
        current = record.as_of(now)
        replayed = ReplayedApproval(current.status, current.expires_at)
        if current.status != APPROVED or record.decided_at is None or now - record.decided_at > window:
            return replayed
        bundle = self.bundles.current
        if bundle.version != record.approved_version:
            call = ProposedCall(record.call_id, record.tool, canonical_json(prepared.input))
            refusal = _refusal(_redecide(bundle, ctx, call, record), record.group)
            if refusal is not None:
                return replace(replayed, refusal=refusal)
        return replace(replayed, token=self._issue(record, record.approver, bundle.version))

    def _issue(self, record: ApprovalRecord, approver: str, policy_version: str) -> IssuedToken:
        claims = CallClaims(record.tenant, record.requester_type, record.requester_id, record.tool, record.call_id)
        return self.issuer.issue(claims, record.digest, decision_id=record.decision_id,
                                 policy_version=policy_version, approval_id=record.approval_id, approver=approver)

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
            return self.get(approval_id)  # a second click: the same approval, the same single token
        if current.status != PENDING:
            refuse(PreconditionError(f"the approval is {current.status}"), f"approval_{current.status}")
        bundle = self.bundles.deciding  # one bundle for the approver's check, the call's and the token
        try:
            permitted = self._permitted(bundle, record, approver, person)
        except RequestError as exc:  # the approver's entities break a rule: refused, and audited as such
            refuse(exc, "invalid_entities")
        if not permitted:
            refuse(ForbiddenError(f"`{who}` may not approve this call"), "approver_not_permitted")
        if verdict == APPROVE:
            refusal = self._still_allowed(bundle, record)
            if refusal is not None:
                self._end_as_changed(record, refusal, now, replace(base, policy_version=bundle.version))

        token = self._issue(record, who, bundle.version) if verdict == APPROVE else None

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
            final = self.get(approval_id)
            if final.status == APPROVED and verdict == APPROVE:
                return final
            raise PreconditionError(f"the approval is {final.status}")
        self.poke(approval_id)
        return self.get(approval_id)

    def _check_envelope(self, approver: TrustedContext) -> None:
        """A person approving is in no model run: the request id is optional. With an
        identity provider the principal comes from the ID token, so the request may leave
        it out; what it does say must still be well formed."""
        if self.id_tokens is None or approver.principal.type or approver.principal.id:
            approver.check(require_request_id=False)
        else:
            stand_in = Principal(self.id_tokens.settings.principal_type, "id-token")
            replace(approver, principal=stand_in).check(require_request_id=False)

    def _permitted(self, bundle: Bundle, record: ApprovalRecord, approver: TrustedContext,
                   person: ProvenPerson | None) -> bool:
        subject = ApprovalSubject(record.approval_id, record.tenant, record.tool, record.group, record.requester)
        groups = person.groups if person is not None else None
        return may_approve(bundle, approver, subject, groups).decision is Decision.ALLOW

    @staticmethod
    def _still_allowed(bundle: Bundle, record: ApprovalRecord) -> ErrorDetail | None:
        """None when the policies loaded now still let this approval stand for the call
        (the ones that opened it trivially do), else why not."""
        if bundle.version == record.policy_version:
            return None
        requester = TrustedContext(record.tenant, Principal(record.requester_type, record.requester_id),
                                   record.request_id, record.call_entities)
        call = ProposedCall(record.call_id, record.tool, record.call_input)
        fresh = _redecide(bundle, requester, call, record)
        return _refusal(fresh, record.group)

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
            self.poke(record.approval_id)
            raise PreconditionError(refusal.message, code=refusal.code)
        raise PreconditionError(f"the approval is {self.get(record.approval_id).status}")

    def subscribe(self, listener: ChangeListener) -> None:
        """`listener` hears of every change this desk makes (see `poke`)."""
        with self._listeners_lock:
            self._listeners = (*self._listeners, listener)

    def unsubscribe(self, listener: ChangeListener) -> None:
        with self._listeners_lock:
            self._listeners = tuple(kept for kept in self._listeners if kept is not listener)

    def poke(self, approval_id: str | None = None) -> None:
        """Tells every listener that `approval_id` changed (None: any approval may have,
        e.g. the clock moved in a test). Called after the change is committed, so a
        listener that reads the store then sees it."""
        for listener in self._listeners:  # a tuple replaced whole: safe to read unlocked
            listener.changed(approval_id)


def _redecide(bundle: Bundle, requester: TrustedContext, call: ProposedCall, record: ApprovalRecord) -> Verdict:
    """The call decided afresh by the engine under `bundle`, on the run counts and meter
    values it was first decided on (its share of both is held while it waits): a DENY
    for anything that no longer prepares (a tool gone, a schema narrowed, entities now
    refused) or no longer has the digest the approval is bound to."""
    run = RunCounts(record.run_calls, record.run_tool_calls)
    try:
        prepared = prepare(bundle, requester, call)
        if prepared.digest != record.digest:
            return Verdict(Decision.DENY, errors=(ErrorDetail("digest_mismatch", "the call is not the one approved"),))
        supplied = supplied_entities(requester.entities_json)
        return evaluate(bundle, requester, prepared, run, request_entities(bundle, requester, prepared, supplied),
                        record.usage)
    except (InputError, RequestError) as exc:
        code = exc.code if isinstance(exc, InputError) else "invalid_request"
        return Verdict(Decision.DENY, errors=(ErrorDetail(code, "the call can no longer be prepared"),))


def _refusal(fresh: Verdict, group: str) -> ErrorDetail | None:
    """Why an approval by `group` no longer makes the call `fresh` runnable, or None:
    it stands when the call is now allowed outright or still needs that same group."""
    if fresh.decision is Decision.ALLOW:
        return None
    if fresh.decision is Decision.APPROVAL_REQUIRED:
        if fresh.approval_group == group:
            return None
        return ErrorDetail(POLICY_CHANGED, f"the policies loaded now ask approval by `{fresh.approval_group}`, "
                                           "not this approval's group; propose the call again")
    return ErrorDetail(POLICY_CHANGED, "the policies loaded now deny this call")
