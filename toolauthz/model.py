"""Plain request and decision types shared by the engine, the authorizer and the service.

Names a runtime sends are checked against documented allow-lists (ASCII only, so no
Unicode look-alikes can name another tenant or principal).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any

from toolauthz.errors import RequestError

TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
PRINCIPAL_TYPE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
PRINCIPAL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,255}\Z")
CALL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,255}\Z")
# A tool's name: MCP's tool-name characters (SEP-986), ASCII only, so no look-alike,
# control or zero-width character can make two names look alike; case counts, and a
# catalog refuses two names that differ only in case (bundle/catalog.py).
TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}\Z")
REQUEST_ID = CALL_ID
MAX_ENTITIES_BYTES = 1 << 20


class Decision(enum.Enum):
    ALLOW = "ALLOW"
    DENY = "DENY"
    APPROVAL_REQUIRED = "APPROVAL_REQUIRED"


@dataclass(frozen=True)
class Principal:
    type: str
    id: str

    def __str__(self) -> str:
        return f'{self.type}::"{self.id}"'


@dataclass(frozen=True)
class TrustedContext:
    """From the runtime's authenticated session, never from model output."""

    tenant: str
    principal: Principal
    request_id: str
    entities_json: bytes = b""

    def check(self, *, require_request_id: bool = True) -> None:
        """`require_request_id=False` for a person acting outside any model run (an
        approver): an empty request_id is then accepted, a malformed one never."""
        _require(self.tenant, TENANT, "tenant")
        _require(self.principal.type, PRINCIPAL_TYPE, "principal type")
        _require(self.principal.id, PRINCIPAL_ID, "principal id")
        if self.request_id or require_request_id:
            _require(self.request_id, REQUEST_ID, "request_id")
        if len(self.entities_json) > MAX_ENTITIES_BYTES:
            raise RequestError(f"entities_json is larger than {MAX_ENTITIES_BYTES} bytes")


@dataclass(frozen=True)
class ProposedCall:
    """What the model proposed: untrusted, except call_id which the provider assigned."""

    call_id: str
    name: str
    input_json: bytes

    def check(self) -> None:
        _require(self.call_id, CALL_ID, "call_id")
        if not self.name:
            raise RequestError("missing tool name")


def _require(value: str, pattern: re.Pattern[str], what: str) -> None:
    if not value:
        raise RequestError(f"missing {what}")
    if not pattern.fullmatch(value):
        raise RequestError(f"{what} must match `{pattern.pattern}`")


@dataclass(frozen=True)
class ErrorDetail:
    code: str
    message: str  # safe to show to the model


@dataclass(frozen=True)
class Verdict:
    """What the policies said about one call (no token, no storage yet)."""

    decision: Decision
    reasons: tuple[str, ...] = ()
    errors: tuple[ErrorDetail, ...] = ()
    approval_group: str = ""
    approval_policy: str = ""
    detail: dict[str, Any] = field(default_factory=dict)  # operator-only diagnostics for the audit


def deny(code: str, message: str, **detail: Any) -> Verdict:
    return Verdict(Decision.DENY, errors=(ErrorDetail(code, message),), detail=detail)
