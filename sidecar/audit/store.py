"""The audit log interface that every storage backend implements (sidecar/store/).

Rules a backend must keep, whatever its storage:
- `append` is one transaction that reads the head, chains the events after it (with
  `records.chain`) and commits, serialized against every other appender, including other
  processes and replicas (SQLite: BEGIN IMMEDIATE; PostgreSQL: a row lock on a head row,
  or SERIALIZABLE). Either all events are committed or none.
- Every storage error surfaces as StoreUnavailable: the caller then denies.
- Records are never updated or deleted through this interface.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from sidecar.audit.checkpoint import Checkpoint
from sidecar.audit.records import AuditEvent, AuditRecord

MAX_PAGE = 10_000


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
    time_from: float | None = None
    time_to: float | None = None


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

    def head(self) -> tuple[int, str]:
        """(number of records, hash of the last one); (0, GENESIS_HASH) when empty."""

    def add_checkpoint(self, token: str, checkpoint: Checkpoint) -> None:
        """Store a signed checkpoint; `token` is what verification trusts."""

    def checkpoints(self) -> list[Checkpoint]:
        """Every stored checkpoint, by count, each with its token."""

    def close(self) -> None:
        """Release connections; later calls raise StoreUnavailable."""


def check_page(limit: int, after_seq: int) -> None:
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}")
    if after_seq < 0:
        raise ValueError("after_seq must not be negative")
