"""The approval desk: opens the approval a call asks for, reads approvals as each reader
may see them (the token to the call's owner alone), answers a replayed call, and hands
a decision to the decider and its news to the listeners."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ulid import ULID

from toolauthz.approvals.deciding import ApprovalDecider, approval_token
from toolauthz.approvals.listeners import ChangeListener, Listeners
from toolauthz.approvals.redecide import redecide, refusal_of
from toolauthz.audit.sink import AuditSink
from toolauthz.bundle import BundleHolder
from toolauthz.bundle.catalog import resolve_pointer
from toolauthz.clock import Clock
from toolauthz.digest import canonical_json
from toolauthz.display.escape import shown
from toolauthz.engine import PreparedCall, RunCounts
from toolauthz.errors import NotFoundError
from toolauthz.identity.approvers import ApproverProof
from toolauthz.identity.oidc import IdTokenVerifier
from toolauthz.model import ErrorDetail, ProposedCall, TrustedContext, Verdict
from toolauthz.store.approvals import APPROVED, REJECTED, ApprovalRecord, ApprovalStore
from toolauthz.store.ledger import CallLedger, CallOwner
from toolauthz.tokens import IssuedToken, TokenIssuer

TERMINAL = (APPROVED, REJECTED, "expired")
# Seconds between a watch's looks at the store, for changes made by other processes
# (worker processes share the database, not their pokes).
MAX_WATCH_WAIT = 1.0


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
        self.listeners = Listeners()
        self.decider = ApprovalDecider(self.bundles, self.store, self.issuer, self.audit, self.clock, self.proof,
                                       self.listeners, read=self.get, id_tokens=self.id_tokens)

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
        return ApprovalRecord(
            approval_id=str(ULID.from_timestamp(now)), tenant=ctx.tenant, call_id=call_id,
            request_id=ctx.request_id, requester_type=ctx.principal.type, requester_id=ctx.principal.id,
            tool=prepared.slice.tool.name, resource=prepared.resource, group=verdict.approval_group,
            policy_id=verdict.approval_policy, digest=prepared.digest, short_code=short_code(prepared.digest),
            decision_id=decision_id, policy_version=policy_version, created_at=now,
            expires_at=now + self.ttl_seconds, fields=fields, call_input=canonical_json(prepared.input),
            call_entities=ctx.entities_json, run_calls=run.calls, run_tool_calls=run.tool_calls,
            usage=dict(usage or {}))

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
        seen = replace(record, call_input=b"", call_entities=b"")
        return seen if by_owner and current else self.hide_token(seen)

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
            refusal = refusal_of(redecide(bundle, ctx, call, record), record.group)
            if refusal is not None:
                return replace(replayed, refusal=refusal)
        return replace(replayed, token=approval_token(self.issuer, record, record.approver, bundle.version))

    def decide(self, approval_id: str, approver: TrustedContext, verdict: str, reason: str = "", *,
               caller: str = "", id_token: str = "") -> ApprovalRecord:
        """See `ApprovalDecider.decide`."""
        return self.decider.decide(approval_id, approver, verdict, reason, caller=caller, id_token=id_token)

    def subscribe(self, listener: ChangeListener) -> None:
        """`listener` hears of every change this desk makes (see `poke`)."""
        self.listeners.subscribe(listener)

    def unsubscribe(self, listener: ChangeListener) -> None:
        self.listeners.unsubscribe(listener)

    def poke(self, approval_id: str | None = None) -> None:
        """Tells every listener that `approval_id` changed (None: any approval may have,
        e.g. the clock moved in a test). Called after the change is committed, so a
        listener that reads the store then sees it."""
        self.listeners.tell(approval_id)
