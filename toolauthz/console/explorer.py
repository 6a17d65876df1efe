"""The audit explorer's filters: a page's query string made into an AuditQuery, or a
RequestError that the page shows (400) naming what was wrong and what is allowed.

The tenant is never a filter: it is the signed-in person's, always (`query_of` sets it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from toolauthz.audit.store import AuditQuery, checked_query
from toolauthz.display.escape import shown
from toolauthz.errors import RequestError

# The page's field name -> the AuditQuery field; each a text input of the filter form.
FILTERS: dict[str, str] = {
    "resource": "resource", "approver": "approver", "approval_id": "approval_id", "decision_id": "decision_id",
    "policy": "policy_id", "error_code": "error_code", "policy_version": "policy_version", "caller": "caller",
    "tool": "tool", "principal": "principal", "result": "result", "kind": "kind", "call_id": "call_id",
    "request_id": "request_id"}
TIMES = ("since", "until")
PAGING = ("after_seq", "limit", "order")
# The filter form, grouped as a person asks: who, what, when, with what outcome; the
# common filters of each group first. (name, placeholder) pairs; `since`/`until` are times.
FILTER_GROUPS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("Who", (("principal", 'User::"alice"'), ("approver", 'User::"bob"'), ("caller", "spiffe://…"))),
    ("What", (("tool", "issue_refund"), ("resource", 'Order::"ord_777"'), ("call_id", ""), ("request_id", ""),
              ("approval_id", ""), ("decision_id", ""))),
    ("When", (("since", "2026-05-01T00:00:00Z"), ("until", ""))),
    ("Outcome", (("result", "ALLOW"), ("kind", "authorize"), ("error_code", ""), ("policy", ""),
                 ("policy_version", ""))),
)
ORDERS = ("newest", "oldest")
DEFAULT_LIMIT = 50
MAX_LIMIT = 500
MAX_VALUE = 1024
_QUOTED = re.compile(r'[A-Za-z_][A-Za-z0-9_]*::".*"', re.DOTALL)
_BARE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)::(.*)", re.DOTALL)


@dataclass(frozen=True)
class ExplorerQuery:
    query: AuditQuery
    after_seq: int
    limit: int
    values: dict[str, str]  # the fields as given, to fill the form again
    newest_first: bool = True


def query_of(params: Mapping[str, str], tenant: str) -> ExplorerQuery:
    unknown = sorted(set(params) - set(FILTERS) - set(TIMES) - set(PAGING))
    if unknown:
        raise RequestError(f"unknown filter `{shown(unknown[0])}`; filters are "
                           f"{', '.join([*FILTERS, *TIMES])}")
    values = {name: params[name].strip() for name in (*FILTERS, *TIMES, *PAGING) if params.get(name, "").strip()}
    for name, value in values.items():
        if len(value) > MAX_VALUE:
            raise RequestError(f"`{name}` is longer than {MAX_VALUE} characters")
    filters = {FILTERS[name]: values[name] for name in FILTERS if name in values}
    for name in ("principal", "approver"):
        if name in filters:
            filters[name] = _uid(filters[name], name)
    if "resource" in filters:
        filters["resource"] = _uid(filters["resource"], "resource")
    order = values.get("order", "newest")
    if order not in ORDERS:
        raise RequestError(f"`order` is newest or oldest, not `{shown(order)}`")
    query = checked_query(AuditQuery(tenant=tenant, time_from=_time(values.get("since"), "since"),
                                     time_to=_time(values.get("until"), "until"), newest_first=order == "newest",
                                     **filters))
    return ExplorerQuery(query, _number(values.get("after_seq"), "after_seq", 0, 0, 2**62),
                         _number(values.get("limit"), "limit", DEFAULT_LIMIT, 1, MAX_LIMIT), values,
                         order == "newest")


def _uid(text: str, what: str) -> str:
    """`Order::"ord_1"` as records hold it; `Order::ord_1` is read as that too."""
    if _QUOTED.fullmatch(text):
        return text
    bare = _BARE.fullmatch(text)
    if bare and '"' not in bare.group(2) and bare.group(2):
        return f'{bare.group(1)}::"{bare.group(2)}"'
    raise RequestError(f'{what} must look like `Type::"id"` or `Type::id` (e.g. Order::ord_777), '
                       f"not `{shown(text)}`")


def _time(text: str | None, what: str) -> float | None:
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise RequestError(f"`{what}` must be an ISO 8601 time such as 2026-05-01T12:00:00Z, "
                           f"not `{shown(text)}`") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _number(text: str | None, what: str, default: int, low: int, high: int) -> int:
    if text is None:
        return default
    # isdigit alone takes `²` (which int refuses) and other scripts' digits (which it reads)
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        raise RequestError(f"`{what}` must be a whole number from {low} to {high}, not `{shown(text)}`")
    return int(text)
