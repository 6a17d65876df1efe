"""What the audit trail stores, and how each record is hashed into its chain.

The trail is a few hash chains, not one, so that writers of different chains never wait
for each other (`chain_of` says which record goes where; docs/architecture.md). A
record's hash covers the previous record of its chain's hash and the RFC 8785 canonical
JSON of every field, of its place in its chain (`chain_seq`, hashed as "seq") and of the
chain's name, so changing, removing or moving any record breaks its chain from that
point on. A signed checkpoint commits every chain's head at once (`merkle.py`).

The records written before the trail had several chains form the chain named "" (the
legacy chain, frozen): their `chain_seq` is their `seq`, and their body has no chain
name, exactly as they were hashed then. `seq` itself is the log's cursor (paging, order
of a listing): unique, and increasing along each chain, but not hashed, since records
of different chains commit concurrently.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any

from toolauthz.canonical import canonical_json, read_back

KINDS = ("authorize", "verify", "approval", "outcome", "bundle")  # bundle: a reload refused or loaded
# The tenant of records that belong to the sidecar, not to a caller's tenant: `bundle`
# records (loaded at start-up or reload, refused, a rollback allowed) and refusals of
# callers that named no tenant. No tenant name can equal it: a tenant starts with
# [A-Za-z0-9] (toolauthz/model.py).
SYSTEM_TENANT = "_system"
GENESIS_HASH = "0" * 64
LEGACY_CHAIN = ""  # the records chained before the trail had several chains
DEFAULT_CHAINS = 16  # chains a new record is spread over (`audit_chains`)
MAX_CHAINS = 1024
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
    """An event as committed: its place in the log (`seq`), its chain and its place and
    link in that chain. `chain_seq` 0 means `seq` (a record of the legacy chain)."""

    seq: int
    event: AuditEvent
    prev_hash: str
    hash: str
    chain: str = LEGACY_CHAIN
    chain_seq: int = 0

    def __post_init__(self) -> None:
        if not self.chain_seq:
            object.__setattr__(self, "chain_seq", self.seq)

    def body(self) -> bytes:
        return canonical_body(self.chain_seq, self.event, self.chain)


def canonical_body(seq: int, event: AuditEvent, chain_name: str = LEGACY_CHAIN) -> bytes:
    """RFC 8785 JSON of every event field, the record's place in its chain as "seq" and
    the chain's name as "chain" (the hashes are not part of it); a field of
    `_LATER_FIELDS`, and the chain's name, only when set: so a record of the legacy
    chain hashes as it did before there were chains."""
    body: dict[str, Any] = {name: getattr(event, name) for name in _FIELDS
                            if name not in _LATER_FIELDS or getattr(event, name) != ""}
    body["reasons"] = list(event.reasons)
    body["error_codes"] = list(event.error_codes)
    body["seq"] = seq
    if chain_name != LEGACY_CHAIN:
        body["chain"] = chain_name
    return canonical_json(body)


def record_hash(prev_hash: str, body: bytes) -> str:
    return hashlib.sha256(_DOMAIN + prev_hash.encode("ascii") + b"\n" + body).hexdigest()


def chain(events: Sequence[AuditEvent], head_seq: int, head_hash: str, chain_name: str = LEGACY_CHAIN, *,
          first_seq: int = 0) -> list[AuditRecord]:
    """Number and link `events` after the head (`head_seq`, `head_hash`) of chain
    `chain_name`; backends call this inside the transaction that locked the head, so
    concurrent appenders cannot fork the chain. `first_seq`: the log's cursor of the
    first record (0: the chain's own numbering, as the legacy chain had)."""
    records = []
    for i, event in enumerate(events):
        head_seq += 1
        head_hash_next = record_hash(head_hash, canonical_body(head_seq, event, chain_name))
        records.append(AuditRecord(first_seq + i if first_seq else head_seq, event, head_hash, head_hash_next,
                                   chain_name, head_seq))
        head_hash = head_hash_next
    return records


def chain_of(event: AuditEvent, chains: int) -> str:
    """The chain a new record goes to: one of `chains` names ("0" .. "chains-1"), by a
    hash of its tenant and call id. A call's records share a chain, so its story is in
    one chain's order; the number of chains is the operator's, never the callers' (a
    chain per tenant would let whoever names tenants grow every checkpoint)."""
    digest = hashlib.blake2b(event.tenant.encode("utf-8", "surrogatepass") + b"\x00" +
                             event.call_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return str(int.from_bytes(digest, "big") % chains)
