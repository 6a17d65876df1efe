"""The call ledger: one row per (tenant, call_id), from reservation to outcome.

Every method either does what it says atomically or raises StoreUnavailable; callers
deny on StoreUnavailable. Several sidecar processes may share one ledger.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from toolauthz.usage.charges import Charge

if TYPE_CHECKING:
    from toolauthz.audit.records import AuditEvent
    from toolauthz.store.approvals import ApprovalRecord

OUTCOMES = ("completed", "failed", "cancelled", "outcome_unknown")
# The decisions that hold a share of a run's budget (`max_calls_per_run`) when recorded:
# an ALLOW, and a call waiting for approval, which may still run. A rejected or expired
# approval gives its share back; a denial never takes one. Counting only approved calls
# would let a run open any number of approvals while under its limit and have them all
# approved later, each one executed.
BUDGETED_DECISIONS = ("ALLOW", "APPROVAL_REQUIRED")


@dataclass(frozen=True)
class CallEntry:
    tenant: str
    call_id: str
    request_id: str
    tool: str
    digest: str
    principal: str
    created_at: float
    # Filled when the decision is made; empty while the call is being decided.
    decision: str = ""
    decision_id: str = ""
    policy_version: str = ""
    reasons: tuple[str, ...] = ()
    errors: tuple[tuple[str, str], ...] = ()  # (code, message)
    approval_id: str = ""
    verified_jti: str = ""
    verified_at: float | None = None
    outcome: str = ""
    outcome_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # Who asked for the call, as its listener proved them (AuditEvent.caller); "" on a
    # row recorded before callers were recorded, which no caller owns.
    caller: str = ""
    # What the call charges to usage meters if it is allowed or waits for approval;
    # stored beside the row, never read back into it.
    charges: tuple[Charge, ...] = ()

    @property
    def decided(self) -> bool:
        return bool(self.decision)

    @property
    def owner(self) -> CallOwner:
        return CallOwner(self.tenant, self.caller, self.principal, self.request_id)


@dataclass(frozen=True)
class CallOwner:
    """Whose a call is: the caller its listener proved, and the tenant, principal and run
    (request id) it was decided for. Only its owner verifies its token, reports its
    outcome, replays it or receives its approval's token. Without configured callers
    every caller of a plaintext listener is `unauthenticated`, and a call belongs to its
    principal and run alone."""

    tenant: str
    caller: str
    principal: str
    request_id: str

    def differences(self, other: CallOwner) -> list[str]:
        """The names of the fields in which `other` is not this owner."""
        return [name for name in ("tenant", "caller", "principal", "request_id")
                if getattr(self, name) != getattr(other, name)]


@dataclass(frozen=True)
class Standing:
    """What a new call's decision is made on from the ledger: its run's counts (calls
    of the run and of its tool that hold a share of the run's budget) and the value of
    each meter it charges (`CallEntry.charges`, in their order) before it."""

    calls: int = 0
    tool_calls: int = 0
    usage: tuple[int, ...] = ()


@dataclass(frozen=True)
class Reservation:
    """Either the call was new (existing is None) and is now reserved, or it existed
    already (existing set). `moved`: the run's counts or the call's meters changed
    since the decision was made on them, and nothing was written; this is how they
    stand now."""

    existing: CallEntry | None
    moved: Standing | None = None


@dataclass(frozen=True)
class RecordedDecision:
    """The decision fields of a call, as the authorizer made them."""

    decision: str
    decision_id: str
    policy_version: str
    reasons: tuple[str, ...] = ()
    errors: tuple[tuple[str, str], ...] = ()  # (code, message)
    # The decision's audit record, committed in the same transaction as the row.
    audit: AuditEvent | None = None
    # For APPROVAL_REQUIRED: the pending approval, stored in that transaction too.
    approval: ApprovalRecord | None = None

    @property
    def uses_run_budget(self) -> bool:
        return self.decision in BUDGETED_DECISIONS


# -- the ledger's writes, as values, so that many requests' writes can share a commit --

@dataclass(frozen=True)
class ReserveCall:
    """Reserve `entry`'s call id, recording `decision` (None: undecided) if the call is
    new. The decision is a value made by the caller before the transaction, on the
    ledger as it stood (`standing`: the run's counts and the call's meters; see
    `CallLedger.standing`): if what is read inside the transaction differs, nothing is
    written and the result says so (`Reservation.moved`), for the caller to decide
    again. A decision therefore never commits on counts or meters that no longer hold,
    and storage never runs policy. A decision that holds a share of the run's budget
    also charges the entry's meters, in the same transaction."""

    entry: CallEntry
    decision: RecordedDecision | None = None
    standing: Standing | None = None
    # When its caller stops waiting (time.monotonic() seconds; None: never): the
    # transaction's statements are given up on then, not left running on the server.
    deadline: float | None = None


@dataclass(frozen=True)
class ConsumeToken:
    """`consume(...)` as an operation; its result is the code. With `owner`, only the
    call's owner consumes its token: anyone else gets ForbiddenError and changes nothing
    but the audit trail, where `refused` builds the refusal's record from the call's
    entry."""

    tenant: str
    call_id: str
    jti: str
    now: float
    audit: Callable[[str], AuditEvent] | None = None
    owner: CallOwner | None = None
    refused: Callable[[CallEntry], AuditEvent] | None = None


@dataclass(frozen=True)
class RecordOutcome:
    """`record_outcome(...)` as an operation; its result is the CallEntry with the
    outcome. With `owner`, only the call's owner (`CallOwner`) may report it: anyone
    else gets ForbiddenError and changes nothing but the audit trail, where `refused`
    builds the refusal's record from the call's entry. `audit` builds the
    outcome's record from the updated entry, committed with it. The outcome already
    recorded, reported again (same status, error code and output digest), returns the
    entry as it is and writes nothing."""

    tenant: str
    call_id: str
    status: str
    error_code: str
    output_digest: str
    now: float
    owner: CallOwner | None = None
    audit: Callable[[CallEntry], AuditEvent] | None = None
    refused: Callable[[CallEntry], AuditEvent] | None = None


@dataclass(frozen=True)
class AppendAudit:
    """An audit record with no ledger write of its own (a denial of unusable input, a
    failed verification), committed with the other operations; its result is None."""

    event: AuditEvent


LedgerOp = ReserveCall | ConsumeToken | RecordOutcome | AppendAudit


def only_result(results: Sequence[Any]) -> Any:
    """The one result of `apply([op])`, raised if it is an exception."""
    (result,) = results
    if isinstance(result, BaseException):
        raise result
    return result


class CallLedger(Protocol):
    def apply(self, ops: Sequence[LedgerOp]) -> list[Any]:
        """Runs the operations in order, each with the meaning of the method it names,
        sharing transactions (and their fsync) as the backend sees fit, and returns each
        one's result, or the exception it failed with instead of raising it: an operation
        that fails writes nothing but the audit record of its refusal, if it has one, and
        leaves the others alone; a transaction that fails
        gives each of its operations a StoreUnavailable of its own."""

    def reserve(self, entry: CallEntry, decision: RecordedDecision | None = None,
                standing: Standing | None = None) -> Reservation:
        """Atomically: if (tenant, call_id) exists return it; else, if the run's counts
        and the entry's meters still stand as `standing` (when given), insert the entry
        with `decision`, its charges, its approval and its audit record, committed
        together or not at all. A reservation locks its call, its run and its meters, so
        what it reads in the transaction is what the commit leaves behind."""

    def standing(self, entries: Sequence[CallEntry]) -> list[Standing]:
        """How each entry's run and meters stand now (one read, outside any write
        transaction)."""

    def expected_standing(self, entries: Sequence[CallEntry]) -> list[Standing]:
        """What a decision is first made on: `standing`, or how the backend expects it
        to be without a read where the transaction that records the decision checks it
        (`UnitOfWork.foreseen_standing`)."""

    def get(self, tenant: str, call_id: str) -> CallEntry | None: ...

    def consume(self, tenant: str, call_id: str, jti: str, now: float,
                audit: Callable[[str], AuditEvent] | None = None) -> str:
        """Single use, atomically: 'ok' the first time any token of this call is
        presented; 'already_used' after; 'unknown_call' if the call is not recorded;
        'call_closed' if an outcome was reported before it was ever verified. With
        `audit`, the event it builds from that answer is appended to the audit trail in
        the same transaction."""

    def record_outcome(self, tenant: str, call_id: str, status: str, error_code: str,
                       output_digest: str, now: float) -> CallEntry:
        """The one terminal outcome; the same outcome again returns the entry unchanged.
        Raises NotFoundError, or ConflictError for another outcome. (As an operation,
        RecordOutcome, it also checks the caller and commits the audit record.)"""

    def close(self) -> None: ...
