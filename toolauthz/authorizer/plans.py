"""A request made ready up to its one ledger write (`Plan`), and the answers plans finish with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, NoReturn, TypeVar

from toolauthz.model import Decision, ErrorDetail
from toolauthz.store.ledger import CallEntry, LedgerOp, RecordedDecision, Standing
from toolauthz.tokens import IssuedToken

T = TypeVar("T")


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


@dataclass(frozen=True)
class Plan(Generic[T]):
    """A request made ready up to its one ledger write: `op` (None: nothing to write),
    and `finish`, which turns that write's result into the answer (writing more itself
    only on the rare paths: replays, approvals). Many plans' writes can share a commit."""

    op: LedgerOp | None
    finish: Callable[[Any], T]
    # A new call's reservation, with its decision made on the run's counts and the
    # call's meters (`writes.py`).
    deciding: Deciding | None = None
    trace: Any = None  # the request's tracing context (toolauthz/telemetry/tracing.py), None when off
    # When the caller stops waiting (time.monotonic() seconds; None: never): the store
    # gives up on the decision's statements then (`ReserveCall.deadline`).
    deadline: float | None = None


@dataclass(frozen=True)
class Deciding:
    """`decide(standing)`: the decision on the run's counts and the call's meters, as a
    value the ledger records with `entry` only if they still stand so."""

    entry: CallEntry
    decide: Callable[[Standing], RecordedDecision]


def refuse(exc: Exception, _written: object) -> NoReturn:
    """A refused request's answer once its audit record is written: the refusal."""
    raise exc
