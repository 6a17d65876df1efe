"""What the audit trail stores, and how each record is hashed into the chain.

A record's hash covers the previous record's hash and the RFC 8785 canonical JSON of
every field (seq and time included), so changing, removing or moving any record breaks
the chain from that point on (RFC 6962 uses a Merkle tree; a chain is enough here
because the log is only ever verified from the start, never by inclusion proofs).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any

from sidecar.canonical import canonical_json, read_back

KINDS = ("authorize", "verify", "approval", "outcome", "bundle")  # bundle: a reload refused or loaded
GENESIS_HASH = "0" * 64
_DOMAIN = b"toolauthz/audit/v1\n"


def _canonical_copy(value: dict[str, Any], name: str) -> dict[str, Any]:
    # Round-trip through canonical JSON now, so that the record hashed at append time is
    # exactly the one read back from storage (1.0 becomes 1, tuples become lists), and a
    # value that cannot be canonicalized fails at the caller, not inside a shared batch.
    if not isinstance(value, dict):
        raise TypeError(f"audit `{name}` must be a dict")
    if not value:
        return {}  # the usual `detail`: nothing to normalize
    try:
        normalized: dict[str, Any] = read_back(value)
        return normalized
    except ValueError as exc:  # CanonicalizationError, or a lone surrogate
        raise ValueError(f"audit `{name}` is not canonical JSON: {exc}") from None


@dataclass(frozen=True)
class AuditEvent:
    """What a caller submits. There is deliberately no field for the tool's arguments:
    only `fields` (those the catalog allow-lists) and the digest can ever be stored."""

    kind: str
    time: float
    decision_id: str = ""
    request_id: str = ""
    call_id: str = ""
    tenant: str = ""
    principal: str = ""
    tool: str = ""
    resource: str = ""
    result: str = ""
    reasons: tuple[str, ...] = ()
    error_codes: tuple[str, ...] = ()
    digest: str = ""
    policy_version: str = ""
    jti: str = ""
    approval_id: str = ""
    approver: str = ""
    fields: dict[str, Any] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)
    # Who called the sidecar, as its transport proved it (a certificate's URI SAN, a
    # socket's configured identity) or "unauthenticated" in development mode: the
    # principal is whom the call is for, the caller is who asked.
    caller: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown audit kind `{self.kind}`")
        if isinstance(self.time, bool) or not math.isfinite(self.time):
            raise ValueError("audit time must be a finite number of seconds")
        set_ = object.__setattr__  # frozen: normalize once, here
        set_(self, "time", float(self.time))
        for name in ("reasons", "error_codes"):
            set_(self, name, tuple(getattr(self, name)))
        strings = [getattr(self, name) for name in _TEXT_FIELDS]
        for value in strings + [*self.reasons, *self.error_codes]:
            if not isinstance(value, str):
                raise TypeError("audit text fields must be strings")
            try:
                value.encode("utf-8")  # a lone surrogate cannot be hashed: refuse it here
            except UnicodeEncodeError:
                raise ValueError("audit text fields must not hold lone surrogates") from None
        set_(self, "fields", _canonical_copy(self.fields, "fields"))
        set_(self, "detail", _canonical_copy(self.detail, "detail"))

    @classmethod
    def from_storage(cls, **values: Any) -> AuditEvent:
        """Rebuild a stored event without validating it: a tampered row must still load
        so that verification can name it; the chain says whether the values are genuine."""
        event = object.__new__(cls)
        for f in dataclass_fields(cls):
            # A row written before a field existed holds none: it reads as that field's
            # default, which `canonical_body` leaves out, so the row still verifies.
            object.__setattr__(event, f.name, values[f.name] if f.name in values else _DEFAULTS[f.name])
        return event


_FIELDS = tuple(f.name for f in dataclass_fields(AuditEvent))
# Fields added after the first records were chained: left out of the canonical body while
# empty, so that every record hashed before they existed hashes the same today.
_LATER_FIELDS = ("caller",)
_DEFAULTS: dict[str, Any] = {name: "" for name in _LATER_FIELDS}
_TEXT_FIELDS = tuple(f.name for f in dataclass_fields(AuditEvent) if f.type == "str")


@dataclass(frozen=True)
class AuditRecord:
    """An event as committed: its place in the log and its link in the chain."""

    seq: int
    event: AuditEvent
    prev_hash: str
    hash: str

    def body(self) -> bytes:
        return canonical_body(self.seq, self.event)


def canonical_body(seq: int, event: AuditEvent) -> bytes:
    """RFC 8785 JSON of every event field plus seq (the hashes are not part of it); a
    field of `_LATER_FIELDS` only when it is set."""
    body: dict[str, Any] = {name: getattr(event, name) for name in _FIELDS
                            if name not in _LATER_FIELDS or getattr(event, name) != ""}
    body["reasons"] = list(event.reasons)
    body["error_codes"] = list(event.error_codes)
    body["seq"] = seq
    return canonical_json(body)


def record_hash(prev_hash: str, body: bytes) -> str:
    return hashlib.sha256(_DOMAIN + prev_hash.encode("ascii") + b"\n" + body).hexdigest()


def chain(events: list[AuditEvent], head_seq: int, head_hash: str) -> list[AuditRecord]:
    """Number and link `events` after the given head; backends call this inside the
    transaction that read the head, so concurrent appenders cannot fork the chain."""
    records = []
    for event in events:
        head_seq += 1
        head_hash_next = record_hash(head_hash, canonical_body(head_seq, event))
        records.append(AuditRecord(head_seq, event, head_hash, head_hash_next))
        head_hash = head_hash_next
    return records
