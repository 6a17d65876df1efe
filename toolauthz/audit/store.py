"""The audit log interface that every storage backend implements (toolauthz/store/).

Rules a backend must keep, whatever its storage:
- `append` is one transaction that locks the heads of the chains its events go to
  (`records.chain_of`), chains each event after its chain's head and commits,
  serialized against every other appender to those chains, including other processes
  and replicas (SQLite: BEGIN IMMEDIATE; PostgreSQL: a row lock on each head row).
  Either all events are committed or none.
- Every storage error surfaces as StoreUnavailable: the caller then denies.
- Records are never updated or deleted through this interface.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from toolauthz.audit.checkpoint import Checkpoint
from toolauthz.audit.merkle import ChainHead
from toolauthz.audit.records import KINDS, AuditEvent, AuditRecord
from toolauthz.display.escape import shown
from toolauthz.errors import RequestError
from toolauthz.model import PRINCIPAL_ID, PRINCIPAL_TYPE

MAX_PAGE = 10_000

# Every `result` a record holds: a decision (ALLOW, DENY, APPROVAL_REQUIRED), an approver's
# verdict (APPROVE, REJECT), a refusal or a lost race (refused, superseded), a verify code,
# an outcome. tests/test_audit_filters.py checks this against the modules that write them.
RESULTS = ("ALLOW", "DENY", "APPROVAL_REQUIRED", "APPROVE", "REJECT", "refused", "superseded",
           "ok", "already_used", "malformed", "unknown_key", "bad_signature", "expired",
           "not_yet_valid", "wrong_audience", "claims_mismatch",
           "completed", "failed", "cancelled", "outcome_unknown", "loaded")
# No two results differ only in case, so `allow` can only mean ALLOW.
_RESULT_OF = {result.lower(): result for result in RESULTS}
_KIND_OF = {kind.lower(): kind for kind in KINDS}
_UID = re.compile(r'(.*?)::"(.*)"', re.DOTALL)


@dataclass(frozen=True)
class AuditQuery:
    """Filters joined by AND; None means "any". Times are `time_from <= time < time_to`."""

    tenant: str | None = None
    principal: str | None = None
    tool: str | None = None
    call_id: str | None = None
    request_id: str | None = None
    result: str | None = None
    kind: str | None = None
    resource: str | None = None
    approver: str | None = None
    approval_id: str | None = None
    decision_id: str | None = None
    policy_version: str | None = None
    caller: str | None = None
    error_code: str | None = None  # one of the record's error codes
    policy_id: str | None = None  # one of the record's reasons: the policies that decided it
    time_from: float | None = None
    time_to: float | None = None
    # Newest first: `after_seq` is then the last (lowest) seq of the page before, 0 for
    # the first page, and a page holds the records just below it.
    newest_first: bool = False


def checked_result(text: str) -> str:
    """`text` as records spell it (`allow` is ALLOW); RequestError naming the allowed values."""
    return _one_of(text, _RESULT_OF, RESULTS, "result")


def checked_kind(text: str) -> str:
    return _one_of(text, _KIND_OF, KINDS, "kind")


def checked_uid(text: str, what: str = "principal") -> str:
    """A principal as records hold it, `Type::"id"`; anything else can match no record."""
    uid = _UID.fullmatch(text)
    if uid is None or not PRINCIPAL_TYPE.fullmatch(uid.group(1)) or not PRINCIPAL_ID.fullmatch(uid.group(2)):
        raise RequestError(f'{what} must be a Cedar uid such as `User::"alice"`, not `{shown(text[:300])}`')
    return text


def _one_of(text: str, known: dict[str, str], allowed: Sequence[str], what: str) -> str:
    try:
        return known[text.lower()]
    except KeyError:
        raise RequestError(f"{what} must be one of {', '.join(allowed)}, not `{shown(text[:100])}`") from None


def checked_query(query: AuditQuery) -> AuditQuery:
    """`query` with its values spelled as records hold them. A value no record can hold
    is a RequestError, so that a typo is an answer rather than an empty result."""
    return dataclasses.replace(
        query,
        result=None if query.result is None else checked_result(query.result),
        kind=None if query.kind is None else checked_kind(query.kind),
        principal=None if query.principal is None else checked_uid(query.principal),
        approver=None if query.approver is None else checked_uid(query.approver, "approver"))


class AuditLog(Protocol):
    def append(self, events: Sequence[AuditEvent]) -> list[AuditRecord]:
        """Commit `events` atomically, in order, at the end of the chain."""

    def query(
        self, filters: AuditQuery, *, limit: int, after_seq: int = 0
    ) -> list[AuditRecord]:
        """At most `limit` (1..MAX_PAGE) matching records with seq > after_seq, by seq;
        pass the last seq returned as `after_seq` to get the next page."""

    def iter_records(self, from_seq: int = 1) -> Iterator[AuditRecord]:
        """Every record from `from_seq` on, by seq, without holding them all in memory."""

    def iter_chains(self) -> Iterator[AuditRecord]:
        """Every record, chain by chain, each chain in its order (what verification
        reads: no record committing meanwhile can be skipped)."""

    def heads(self) -> list[ChainHead]:
        """Every chain's stored head, by name."""

    def head(self) -> tuple[int, str]:
        """(number of records, Merkle root over every chain's head: `merkle.heads_root`)."""

    def add_checkpoint(self, token: str, checkpoint: Checkpoint) -> None:
        """Store a signed checkpoint; `token` is what verification trusts."""

    def checkpoints(self) -> list[Checkpoint]:
        """Every stored checkpoint, by count, each with its token."""

    def last_checkpoint(self) -> Checkpoint | None:
        """The stored checkpoint of the highest count, without reading the others (one
        is signed a minute while calls come)."""

    def close(self) -> None:
        """Release connections; later calls raise StoreUnavailable."""


def check_page(limit: int, after_seq: int) -> None:
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}")
    if after_seq < 0:
        raise ValueError("after_seq must not be negative")
