"""The authorizer: the engine's verdict plus the call ledger, tokens and the audit trail.

Fail closed: any error between the verdict and the response means no token. The audit
record of every answer is committed before the answer is returned; a decision's record
and a verification's record commit in the same transaction as their ledger write.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, NoReturn, TypeVar

from ulid import ULID

from sidecar.approvals import ApprovalDesk
from sidecar.audit.records import AuditEvent
from sidecar.audit.sink import AuditSink
from sidecar.bundle import Bundle, BundleHolder
from sidecar.bundle.catalog import MAX_INPUT_BYTES_CEILING, resolve_pointer
from sidecar.call_record import CallRecord
from sidecar.clock import Clock
from sidecar.decided_by import decided_by
from sidecar.digest import InputLimits, digest_call
from sidecar.display import display
from sidecar.engine import PreparedCall, RunCounts, evaluate, prepare, request_entities, supplied_entities
from sidecar.errors import InputError, RequestError, StoreUnavailable
from sidecar.model import Decision, ErrorDetail, ProposedCall, TrustedContext, Verdict, deny
from sidecar.retainer import Retainer
from sidecar.store.approvals import ApprovalRecord
from sidecar.store.ledger import (
    OUTCOMES,
    AppendAudit,
    CallEntry,
    CallLedger,
    ConsumeToken,
    LedgerOp,
    OutcomeCaller,
    RecordedDecision,
    RecordOutcome,
    Reservation,
    ReserveCall,
    only_result,
)
from sidecar.telemetry import metrics, tracing
from sidecar.tokens import CallClaims, IssuedToken, TokenIssuer, TokenVerifier

T = TypeVar("T")
# The refusals a runtime may report (`plan_report_refusal`): each one a check the runtime
# makes before Authorize, which the sidecar cannot make itself.
REPORTABLE_REFUSALS = frozenset({"tool_changed"})
MAX_REFUSAL_DETAIL_CHARS = 512
# Tries at recording a decision whose run's counts moved meanwhile (see `_write_all`).
_MAX_ROUNDS = 16


@dataclass(frozen=True)
class AuthorizeResult:
    decision: Decision
    decision_id: str
    policy_version: str
    reasons: tuple[str, ...] = ()
    errors: tuple[ErrorDetail, ...] = ()
    digest: str = ""
    token: IssuedToken | None = None
    approval_id: str = ""
    replayed: bool = False
    approval_expires_at: float | None = None  # on APPROVAL_REQUIRED: when its approval expires


@dataclass(frozen=True)
class VerifyResult:
    valid: bool
    code: str
    decision_id: str = ""


@dataclass(frozen=True)
class OutcomeResult:
    decision_id: str
    unverified: bool


@dataclass
class Authorizer:
    bundles: BundleHolder
    ledger: CallLedger
    issuer: TokenIssuer
    verifier: TokenVerifier
    audit: AuditSink
    clock: Clock
    approvals: ApprovalDesk | None = None
    # A replayed call gets a fresh token only this long after its decision (or approval),
    # and for a plain ALLOW only under the same policy version: an old decision must not
    # become executable again days later, under policies that may have changed since.
    reissue_window: float = 300.0
    retainer: Retainer | None = None  # keeps the inputs of tools with `audit.retain_input`
    _shadow_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _shadow: Counter = field(default_factory=Counter, repr=False)

    def shadow_effects(self) -> dict[str, int]:
        with self._shadow_lock:
            return dict(self._shadow)

    def _count_shadow(self, bundle: Bundle, verdict: Verdict) -> None:
        shadow = verdict.detail.get("shadow")
        if shadow:
            ids = [pid for pid in shadow["reasons"] if pid in bundle.policies and bundle.policies[pid].shadow]
            with self._shadow_lock:
                self._shadow.update(ids or ["(unattributed)"])
            for pid in ids or ["(unattributed)"]:
                metrics.SHADOW_DISAGREEMENTS.labels(policy=pid).inc()

    def new_id(self) -> str:
        return str(ULID.from_timestamp(self.clock.now()))

    # -- running plans -----------------------------------------------------------------

    def run(self, plan: Plan[T]) -> T:
        """One request's plan: its write, then its answer (or the exception)."""
        return only_result(self.run_many([plan]))

    def run_many(self, plans: Sequence[Plan]) -> list:
        """Many requests' plans, their writes sharing the ledger's commits; each one's
        answer or the exception it failed with, in order, so that one bad request never
        fails the others."""
        written = self._write_all(plans)
        answers: list = []
        for plan, result in zip(plans, written, strict=True):
            try:
                if isinstance(result, BaseException):
                    raise result
                answers.append(plan.finish(result))
            except Exception as exc:  # noqa: BLE001 - this request's failure, answered to it alone
                answers.append(exc)
        return answers

    def _write_all(self, plans: Sequence[Plan]) -> list[Any]:
        """Each plan's write result (None without a write), or the exception it failed with.

        A new call's decision is made here, before the ledger's transaction, on the run's
        counts as read now plus the budget taken by the reservations ahead of it in this
        batch; the ledger records it only if the counts it reads in the transaction are
        the same, and otherwise answers with the counts that hold, to be decided on again
        in the next round. So Cedar and the token's signature stay out of the write lock
        (every replica's writes queue on it), storage never runs policy, and no decision
        commits on counts that no longer hold. Each round that moves a call's counts
        means another transaction reserved a call of its run: a round never fails
        without someone's progress, and after `_MAX_ROUNDS` the call is refused as
        unavailable (fail closed)."""
        results: list[Any] = [None] * len(plans)
        pending = [i for i, plan in enumerate(plans) if plan.op is not None or plan.deciding is not None]
        counts = self._first_counts(plans)
        for _ in range(_MAX_ROUNDS):
            placed, ops = self._round_ops(plans, pending, counts, results)
            try:
                with _store_spans(plans), metrics.timed(metrics.AUDIT_WRITE_SECONDS):
                    out = list(self.ledger.apply(ops)) if ops else []
            except StoreUnavailable as exc:
                metrics.AUDIT_WRITE_FAILURES.inc()
                out = [StoreUnavailable.caused_by(exc) for _ in ops]
            pending = []
            for i, result in zip(placed, out, strict=True):
                if isinstance(result, Reservation) and result.moved is not None:
                    counts[i] = result.moved
                    pending.append(i)
                else:
                    results[i] = result
            if not pending:
                return results
        for i in pending:
            results[i] = StoreUnavailable("the run's calls kept changing while this call was decided; retry")
        return results

    def _first_counts(self, plans: Sequence[Plan]) -> dict[int, tuple[int, int]]:
        deciding = [(i, plan.deciding.entry) for i, plan in enumerate(plans) if plan.deciding is not None]
        if not deciding:
            return {}
        try:
            read = self.ledger.run_counts([entry for _, entry in deciding])
        except StoreUnavailable:
            read = [(0, 0)] * len(deciding)  # a guess: the transaction reads them (or fails the batch)
        return {i: counts for (i, _), counts in zip(deciding, read, strict=True)}

    @staticmethod
    def _round_ops(plans: Sequence[Plan], pending: list[int], counts: dict[int, tuple[int, int]],
                   results: list[Any]) -> tuple[list[int], list[LedgerOp]]:
        """The writes of one round: the plans' own, and each pending decision made on its
        run's counts plus the reservations ahead of it in this round."""
        placed: list[int] = []
        ops: list[LedgerOp] = []
        ahead: Counter[tuple[str, ...]] = Counter()
        calls_seen: set[tuple[str, str]] = set()
        for i in pending:
            plan = plans[i]
            if plan.deciding is None:
                assert plan.op is not None
                placed.append(i)
                ops.append(plan.op)
                continue
            entry = plan.deciding.entry
            run = (entry.tenant, entry.request_id)
            run_counts = (counts[i][0] + ahead[run], counts[i][1] + ahead[(*run, entry.tool)])
            try:
                decision = plan.deciding.decide(run_counts)
            except Exception as exc:  # noqa: BLE001 - this call's failure alone: nothing of it is written
                results[i] = exc
                continue
            first = (entry.tenant, entry.call_id) not in calls_seen
            calls_seen.add((entry.tenant, entry.call_id))
            if first and decision.uses_run_budget:  # a second one of this call finds the first
                ahead[run] += 1
                ahead[(*run, entry.tool)] += 1
            placed.append(i)
            ops.append(ReserveCall(entry, decision, run_counts))
        return placed, ops

    # -- Authorize ---------------------------------------------------------------------

    def authorize(self, ctx: TrustedContext, call: ProposedCall,
                  still_wanted: Callable[[], bool] = lambda: True, *, caller: str = "") -> AuthorizeResult:
        """`still_wanted` is asked right before a token would be minted: a client that
        cancelled or whose deadline passed gets none (a retry replays the decision)."""
        return self.run(self.plan_authorize(ctx, call, still_wanted, caller=caller))

    def plan_authorize(self, ctx: TrustedContext, call: ProposedCall,
                       still_wanted: Callable[[], bool] = lambda: True, *, caller: str = "") -> Plan[AuthorizeResult]:
        """Everything of `authorize` up to its ledger write: checks, validation and the
        decision's inputs. The decision itself is made by `run_many`, on the run's counts.
        `caller`: who asked, as the transport proved it; only its audit records read it."""
        ctx.check()
        call.check()
        trace = tracing.current()
        bundle = self.bundles.current
        record = replace(CallRecord.of("authorize", ctx, call.call_id, call.name, caller),
                         decision_id=self.new_id(), policy_version=bundle.version)
        try:
            with tracing.step("validate", trace):
                prepared = prepare(bundle, ctx, call)
        except InputError as exc:
            verdict = deny(exc.code, exc.message)
            return Plan(AppendAudit(self._event(record, verdict)),
                        lambda _: AuthorizeResult(Decision.DENY, record.decision_id, bundle.version,
                                                  errors=verdict.errors), trace=trace)

        record = replace(record, resource=prepared.resource, digest=prepared.digest, fields=self._fields(prepared))
        try:
            supplied = supplied_entities(ctx.entities_json)
            entities = request_entities(bundle, ctx, prepared, supplied)
        except RequestError as exc:  # refused before anything but its audit record is stored
            refusal = record.event(self.clock.now(), "refused", error_codes=("invalid_entities",),
                                   detail={"error": str(exc)[:500]})
            return Plan(AppendAudit(refusal), functools.partial(_refuse, exc), trace=trace)
        tool = prepared.slice.tool.name
        decided = {"decided_by": decided_by(bundle, ctx, prepared, supplied)}

        def draft(counts: tuple[int, int]) -> _Draft:
            with tracing.step("evaluate", trace, {"toolauthz.tool": tool}):
                verdict = evaluate(bundle, ctx, prepared, RunCounts(*counts), entities)
            wanted = verdict.decision is not Decision.ALLOW or still_wanted()
            token = None
            if verdict.decision is Decision.ALLOW and wanted:
                with tracing.step("sign", trace):
                    token = self._issue(ctx, call.call_id, prepared, record.decision_id, bundle.version)
            return _Draft(counts, verdict, token, gone=not wanted)

        state = _DecisionState()

        def decide(counts: tuple[int, int]) -> RecordedDecision:
            # Called before each try at the ledger's transaction: Cedar, the signature and
            # the audit event are made again only if the counts differ from the last try.
            # The row, the token's jti, the approval a policy asks for and the audit
            # record commit together.
            previous = state.draft
            current = previous
            if current is None or current.counts != counts:
                current = draft(counts)
            elif current.token is not None and not still_wanted():
                current = _Draft(current.counts, current.verdict, None, gone=True)
            if current is not previous or state.recorded is None:
                state.draft = current
                state.recorded = self._recorded(ctx, prepared, current, record, state, decided)
            return state.recorded

        def finish(reservation: Reservation) -> AuthorizeResult:
            if reservation.existing is not None:
                return self._replay(record, ctx, prepared, reservation.existing, still_wanted)
            latest = state.latest()
            verdict, token = latest.verdict, latest.token
            if token is not None and not still_wanted():
                # Gone while the decision was being stored: the token minted for it (its
                # jti is in the record) is handed to no one; a retry replays the decision.
                token = None
            self._count_shadow(bundle, verdict)
            if self.retainer is not None:
                self.retainer.retain(ctx, call.call_id, prepared, RunCounts(*latest.counts), bundle.version)
            approval = state.approval if verdict.decision is Decision.APPROVAL_REQUIRED else None
            return AuthorizeResult(verdict.decision, record.decision_id, bundle.version, verdict.reasons,
                                   verdict.errors, prepared.digest, token, approval.approval_id if approval else "",
                                   approval_expires_at=approval.expires_at if approval else None)

        entry = CallEntry(ctx.tenant, call.call_id, ctx.request_id, tool, prepared.digest, record.principal,
                          self.clock.now())
        return Plan(None, finish, Deciding(entry, decide), trace=trace)

    def _recorded(self, ctx: TrustedContext, prepared: PreparedCall, draft: _Draft, record: CallRecord,
                  state: _DecisionState, decided: Mapping[str, Any]) -> RecordedDecision:
        """What the ledger stores of a draft: the row's decision, the approval it opens
        (made once per call, kept in `state`) and its audit event."""
        verdict = draft.verdict
        approval = None
        if verdict.decision is Decision.APPROVAL_REQUIRED:
            if state.approval is None:
                state.approval = self._new_approval(ctx, prepared, verdict, record, RunCounts(*draft.counts))
            approval = state.approval
        event = self._event(replace(record, approval_id=approval.approval_id if approval else ""), verdict,
                            jti=draft.token.jti if draft.token else "",
                            detail={**decided, "client_gone": True} if draft.gone else decided)
        return RecordedDecision(verdict.decision.value, record.decision_id, record.policy_version,
                                verdict.reasons, _error_pairs(verdict), approval=approval, audit=event)

    def _new_approval(self, ctx: TrustedContext, prepared: PreparedCall, verdict: Verdict,
                      record: CallRecord, run: RunCounts) -> ApprovalRecord:
        if self.approvals is None:
            raise RuntimeError("a policy asks for approval but no approval desk is configured")
        return self.approvals.new_record(ctx, record.call_id, prepared, verdict, decision_id=record.decision_id,
                                         policy_version=record.policy_version, fields=dict(record.fields), run=run)

    def _replay(self, record: CallRecord, ctx: TrustedContext, prepared: PreparedCall, entry: CallEntry,
                still_wanted: Callable[[], bool]) -> AuthorizeResult:
        version = record.policy_version
        if entry.digest != prepared.digest:
            verdict = deny("call_id_reused", "this call id was already used for a different call")
            self._record(record, verdict, detail={"original_decision_id": entry.decision_id})
            return AuthorizeResult(Decision.DENY, record.decision_id, version, errors=verdict.errors,
                                   digest=prepared.digest)
        if not entry.decided:
            verdict = deny("call_in_progress", "this call is still being decided; retry shortly")
            self._record(record, verdict)
            return AuthorizeResult(Decision.DENY, record.decision_id, version, errors=verdict.errors,
                                   digest=prepared.digest)
        decision = Decision(entry.decision)
        errors = tuple(ErrorDetail(c, m) for c, m in entry.errors)
        # A token only while the call has not been executed: Verify consumes per call.
        token = None
        fresh = self.clock.now() - entry.created_at <= self.reissue_window
        if not still_wanted() or entry.verified_jti or entry.outcome:
            pass  # nobody to hand a token to, or the call was executed or has ended
        elif decision is Decision.ALLOW:
            if fresh and entry.policy_version == version:
                token = self._issue(ctx, entry.call_id, prepared, entry.decision_id, entry.policy_version)
            else:
                errors += (ErrorDetail("reissue_refused", "this call was decided too long ago or under other "
                                       "policies; propose it again with a new call id"),)
        elif decision is Decision.APPROVAL_REQUIRED and self.approvals:
            # Re-decided under the policies loaded now if they are not those that approved it.
            approval = self.approvals.on_replay(entry.approval_id, self.reissue_window, ctx, prepared)
            token = approval.token if approval else None
            if token is not None:
                decision = Decision.ALLOW  # approved by a second principal: now it may run
            elif approval is not None and approval.refusal is not None:
                decision, errors = Decision.DENY, errors + (approval.refusal,)
        approval_expires_at = self.approvals.expiry(entry.approval_id) \
            if decision is Decision.APPROVAL_REQUIRED and self.approvals else None
        verdict = Verdict(decision, entry.reasons, errors)
        original = replace(record, decision_id=entry.decision_id, policy_version=entry.policy_version,
                           approval_id=entry.approval_id)
        self._record(original, verdict, jti=token.jti if token else "", detail={"replayed": True})
        return AuthorizeResult(decision, entry.decision_id, entry.policy_version, entry.reasons, errors,
                               prepared.digest, token, entry.approval_id, replayed=True,
                               approval_expires_at=approval_expires_at)

    def _issue(self, ctx: TrustedContext, call_id: str, prepared: PreparedCall, decision_id: str,
               version: str) -> IssuedToken:
        claims = CallClaims(ctx.tenant, ctx.principal.type, ctx.principal.id, prepared.slice.tool.name, call_id)
        return self.issuer.issue(claims, prepared.digest, decision_id=decision_id, policy_version=version)

    # -- Verify ------------------------------------------------------------------------

    def verify(self, token: str, ctx: TrustedContext, call: ProposedCall, *, caller: str = "") -> VerifyResult:
        return self.run(self.plan_verify(token, ctx, call, caller=caller))

    def plan_verify(self, token: str, ctx: TrustedContext, call: ProposedCall, *,
                    caller: str = "") -> Plan[VerifyResult]:
        ctx.check()
        call.check()
        trace = tracing.current()
        try:
            with tracing.step("validate", trace):
                digest = digest_call(ctx, call, self._verify_limits(call.name)).digest
        except InputError:
            digest = ""  # Authorize refuses such input: no token was ever issued for it
        expected = CallClaims(ctx.tenant, ctx.principal.type, ctx.principal.id, call.name, call.call_id)
        if digest:
            with tracing.step("check_token", trace):
                checked = self.verifier.verify(token, digest, expected)
            code, jti, decision_id = checked.code, checked.jti or "", checked.decision_id or ""
        else:
            code, jti, decision_id = "bad_signature", "", ""
        record = replace(CallRecord.of("verify", ctx, call.call_id, call.name, caller), decision_id=decision_id,
                         digest=digest)

        def event(result: str) -> AuditEvent:
            return record.event(self.clock.now(), result, jti=jti)

        if code == "ok":  # single use and its record: one transaction
            return Plan(ConsumeToken(ctx.tenant, call.call_id, jti, self.clock.now(), audit=event),
                        lambda consumed: VerifyResult(consumed == "ok", consumed, decision_id), trace=trace)
        return Plan(AppendAudit(event(code)), lambda _: VerifyResult(False, code, decision_id), trace=trace)

    def _verify_limits(self, tool_name: str) -> InputLimits:
        """The limits Authorize parses a call of `tool_name` with. A tool the loaded
        bundle no longer has may still hold a token issued under an older one, so its
        input is read up to the largest `max_input_bytes` any bundle may set: input
        beyond that was never authorized under any bundle."""
        tool_slice = self.bundles.current.tools.get(tool_name)
        return InputLimits(tool_slice.tool.max_input_bytes if tool_slice is not None else MAX_INPUT_BYTES_CEILING)

    # -- ReportOutcome -----------------------------------------------------------------

    def report_outcome(self, ctx: TrustedContext, call_id: str, status: str, error_code: str = "",
                       output_digest: str = "", *, caller: str = "") -> OutcomeResult:
        return self.run(self.plan_report_outcome(ctx, call_id, status, error_code, output_digest, caller=caller))

    def plan_report_outcome(self, ctx: TrustedContext, call_id: str, status: str, error_code: str = "",
                            output_digest: str = "", *, caller: str = "") -> Plan[OutcomeResult]:
        """The outcome and its audit record commit together: a call never shows an outcome
        the audit trail lacks. Only the principal and run (request id) the call was decided
        for may report it: anyone else gets ForbiddenError, recorded in the audit trail,
        and changes nothing. The identical report again is answered as the first was and
        recorded once; another outcome after the first is a ConflictError."""
        ctx.check()
        ProposedCall(call_id, "-", b"").check()
        if status not in OUTCOMES:
            raise InputError("invalid_outcome", f"outcome must be one of {', '.join(OUTCOMES)}")
        claimant = CallRecord.of("outcome", ctx, call_id, "", caller)

        def accepted(entry: CallEntry) -> AuditEvent:
            detail: dict[str, Any] = {"error_code": error_code, "output_digest": output_digest}
            if not entry.verified_jti:
                detail["flags"] = ["unverified_outcome"]
            return CallRecord.of_entry("outcome", entry, caller).event(self.clock.now(), status,
                                                                      jti=entry.verified_jti, detail=detail)

        def refused(entry: CallEntry) -> AuditEvent:
            # Named as the caller claimed to be, with the call it tried to close.
            mismatch = [name for name, theirs, ours in (("principal", entry.principal, claimant.principal),
                                                          ("request_id", entry.request_id, claimant.request_id))
                        if theirs != ours]
            shown = replace(claimant, tool=entry.tool, decision_id=entry.decision_id)
            return shown.event(self.clock.now(), "refused", error_codes=("not_call_owner",),
                               detail={"outcome": status, "mismatch": mismatch})

        op = RecordOutcome(ctx.tenant, call_id, status, error_code, output_digest, self.clock.now(),
                           caller=OutcomeCaller(claimant.principal, claimant.request_id), audit=accepted,
                           refused=refused)
        return Plan(op, lambda entry: OutcomeResult(entry.decision_id, unverified=not entry.verified_jti),
                    trace=tracing.current())

    # -- ReportRefusal -----------------------------------------------------------------

    def report_refusal(self, ctx: TrustedContext, call_id: str, tool: str, code: str, detail: str = "", *,
                       caller: str = "") -> str:
        return self.run(self.plan_report_refusal(ctx, call_id, tool, code, detail, caller=caller))

    def plan_report_refusal(self, ctx: TrustedContext, call_id: str, tool: str, code: str, detail: str = "", *,
                            caller: str = "") -> Plan[str]:
        """A call the runtime refused before asking Authorize, as one audit record of kind
        `authorize`, result `refused`; the answer is the record's id. The call gets no
        ledger row: the same call id proposed later is decided as any new call. The
        runtime controls every value here, so the code is allow-listed, the tool is named
        as given only when the catalog has it, and the detail is bounded and escaped."""
        ctx.check()
        ProposedCall(call_id, tool, b"").check()
        if code not in REPORTABLE_REFUSALS:
            raise RequestError(f"code must be one of {', '.join(sorted(REPORTABLE_REFUSALS))}")
        if len(detail) > MAX_REFUSAL_DETAIL_CHARS:
            raise RequestError(f"detail must be at most {MAX_REFUSAL_DETAIL_CHARS} characters")
        bundle = self.bundles.current
        catalogued = tool in bundle.tools
        # A name the catalog lacks is any string the runtime chose: cut short, then escaped.
        shown_tool = tool if catalogued else display(tool[:64])
        record = replace(CallRecord.of("authorize", ctx, call_id, tool, caller), tool=shown_tool,
                         decision_id=self.new_id(), policy_version=bundle.version)
        event = record.event(self.clock.now(), "refused", error_codes=(code,),
                             detail={"reported_by": "runtime", "detail": display(detail),
                                     "catalogued_tool": catalogued})
        return Plan(AppendAudit(event), lambda _: record.decision_id, trace=tracing.current())

    # -- audit helpers -----------------------------------------------------------------

    def _fields(self, prepared: PreparedCall) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for pointer in prepared.slice.tool.audit_fields:
            found, value = resolve_pointer(prepared.input, pointer)
            if found:
                out[pointer] = value
        return out

    def _record(self, record: CallRecord, verdict: Verdict, *, jti: str = "",
                detail: Mapping[str, Any] | None = None) -> None:
        self._write(self._event(record, verdict, jti=jti, detail=detail))

    def _event(self, record: CallRecord, verdict: Verdict, *, jti: str = "",
               detail: Mapping[str, Any] | None = None) -> AuditEvent:
        return record.event(self.clock.now(), verdict.decision.value, reasons=verdict.reasons,
                            error_codes=tuple(e.code for e in verdict.errors), jti=jti,
                            detail={**verdict.detail, **(detail or {})})

    def _write(self, event: AuditEvent) -> None:
        self.audit.write(event)  # raises StoreUnavailable: the caller sends no token


@dataclass(frozen=True)
class Plan(Generic[T]):
    """A request made ready up to its one ledger write: `op` (None: nothing to write),
    and `finish`, which turns that write's result into the answer (writing more itself
    only on the rare paths: replays, approvals). Many plans' writes can share a commit."""

    op: LedgerOp | None
    finish: Callable[[Any], T]
    # A new call's reservation, with its decision made on the run's counts (`run_many`).
    deciding: Deciding | None = None
    trace: Any = None  # the request's tracing context (sidecar/telemetry/tracing.py), None when off


@dataclass(frozen=True)
class Deciding:
    """`decide(counts)`: the decision on the run's counts (calls, tool_calls), as a value
    the ledger records with `entry` only if those counts still hold."""

    entry: CallEntry
    decide: Callable[[tuple[int, int]], RecordedDecision]


@dataclass(frozen=True)
class _Draft:
    """A decision made on the run's counts `counts`, with its token if one is due;
    `gone`: an ALLOW whose client no longer wants it (no token)."""

    counts: tuple[int, int]
    verdict: Verdict
    token: IssuedToken | None
    gone: bool = False


@dataclass
class _DecisionState:
    """What one Authorize's `decide` made so far: it is called once per try at the
    ledger's transaction, and the call opens at most one approval."""

    draft: _Draft | None = None
    recorded: RecordedDecision | None = None  # what the ledger stores of `draft`
    approval: ApprovalRecord | None = None

    def latest(self) -> _Draft:
        if self.draft is None:
            raise RuntimeError("the ledger recorded a new call without asking for its decision")
        return self.draft


@contextlib.contextmanager
def _store_spans(plans: Sequence[Plan]) -> Iterator[None]:
    """A `store` span for each traced request of a batch: their writes share one
    transaction, so each span covers that whole commit."""
    traced = [plan.trace for plan in plans
              if plan.trace is not None and (plan.op is not None or plan.deciding is not None)]
    if not traced:
        yield
        return
    with contextlib.ExitStack() as spans:
        for parent in traced:
            spans.enter_context(tracing.step("store", parent, {"toolauthz.batch_size": len(plans)}))
        yield


def _refuse(exc: Exception, _written: object) -> NoReturn:
    """A refused request's answer once its audit record is written: the refusal."""
    raise exc


def _error_pairs(verdict: Verdict) -> tuple[tuple[str, str], ...]:
    """A verdict's errors as the ledger stores them."""
    return tuple((e.code, e.message) for e in verdict.errors)
