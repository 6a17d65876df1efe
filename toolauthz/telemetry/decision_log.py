"""The decision log, in the style of OPA's: one INFO line per Authorize decision on the
logger `toolauthz.decision`, off by default (`decision_log.enabled`).

A line holds the decision id, the tenant, principal, request and call ids, the tool, the
result, the reasons (determining policies), the error codes, the policy version, the
latency, the caller (the authenticated client, when the sidecar knows it) and the
transport. It never holds an argument value, except those the operator allow-lists per
tool (`decision_log.arguments: {issue_refund: [amount_cents]}`): a top-level argument
named there is copied as the call gave it. The log format (toolauthz/server/logs.py)
escapes every value; in JSON each is a field of its own.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

log = logging.getLogger("toolauthz.decision")

_allowed_arguments: dict[str, frozenset[str]] = {}
# Where each decision's event also goes, encoded as JSON (the server's HTTP shipper,
# toolauthz/server/decision_shipping.py): a function that must never block.
_ship: list[Callable[[bytes], None]] = []


def configure(arguments: Mapping[str, Iterable[str]], ship: Callable[[bytes], None] | None = None) -> None:
    """The argument names each tool may log (this process), none by default; and where
    the events are shipped, if anywhere."""
    _allowed_arguments.clear()
    _allowed_arguments.update({tool: frozenset(names) for tool, names in arguments.items() if names})
    _ship.clear()
    if ship is not None:
        _ship.append(ship)


def enabled() -> bool:
    return log.isEnabledFor(logging.INFO)


def record(*, decision_id: str, tenant: str, principal: str, request_id: str, call_id: str, tool: str,
           result: str, reasons: Iterable[str], errors: Iterable[str], policy_version: str, seconds: float,
           caller: str, transport: str, replayed: bool, input_json: bytes = b"") -> None:
    """One decision's line, and its shipped event (nothing when both are off)."""
    if not _ship and not enabled():
        return
    fields: dict[str, Any] = {
        "decision_id": decision_id, "tenant": tenant, "principal": principal, "request_id": request_id,
        "call_id": call_id, "tool": tool, "result": result, "reasons": list(reasons), "errors": list(errors),
        "policy_version": policy_version, "latency_ms": round(seconds * 1000, 3), "caller": caller,
        "transport": transport, "replayed": replayed}
    allowed = _allowed_arguments.get(tool)
    if allowed:
        fields["arguments"] = _allowed(input_json, allowed)
    if _ship:
        event = {"timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds"), **fields}
        _ship[0](json.dumps(event, separators=(",", ":")).encode())
    if not enabled():
        return
    log.info("decision %s %s tool=%s tenant=%s reasons=%s version=%s %.1fms caller=%s", decision_id, result, tool,
             tenant, ",".join(fields["reasons"]) or "-", policy_version, seconds * 1000, caller or "-",
             extra=fields)


def _allowed(input_json: bytes, names: frozenset[str]) -> dict[str, Any]:
    """The allow-listed top-level arguments; none when the input is not a JSON object
    (the decision says why)."""
    try:
        arguments = json.loads(input_json)
    except (ValueError, UnicodeDecodeError):
        return {}
    if not isinstance(arguments, dict):
        return {}
    return {name: arguments[name] for name in sorted(names) if name in arguments}
