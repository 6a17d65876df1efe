"""What an approver is shown beside a request, to decide in seconds: its arguments as
the tool's display hints render them, the literals the asking policy compares them
with, and the requester's last calls of the same tool.

The comparison is best effort, from the policy's Cedar EST: every `context.input.<path>
<op> <integer>` (or the literal on the left) of its `when`/`unless` conditions whose
field the approver may see. Anything else a condition says (an entity attribute, a
computed value) is not shown: the page says "the policy compares", never "the policy
decides".
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from toolauthz.bundle import Bundle
from toolauthz.display.hints import labelled, shown_usage, shown_value
from toolauthz.store.approvals import ApprovalRecord

_OPS = {"<": "<", "<=": "≤", ">": ">", ">=": "≥", "==": "=", "!=": "≠"}
_FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}
MAX_THRESHOLDS = 8


@dataclass(frozen=True)
class Threshold:
    label: str
    op: str
    literal: str  # as the hint renders it
    value: str  # this request's value, as shown
    holds: bool  # whether this request's value satisfies the comparison


def arguments(record: ApprovalRecord, bundle: Bundle) -> list[tuple[str, str]]:
    """The allow-listed arguments as (label, shown value)."""
    return list(labelled(record.fields, bundle.display_of(record.tool)).items())


def usage(record: ApprovalRecord, bundle: Bundle) -> list[tuple[str, str]]:
    """The usage meters the call was decided on, as (meter, shown value)."""
    return list(shown_usage(record.usage, bundle.usage_hints_of(record.tool)).items())


def thresholds(record: ApprovalRecord, bundle: Bundle) -> list[Threshold]:
    info = bundle.policies.get(record.policy_id)
    if info is None:
        return []
    hints = bundle.display_of(record.tool)
    out: list[Threshold] = []
    for condition in info.est.get("conditions", []) or []:
        for pointer, op, literal in _comparisons(condition.get("body")):
            if pointer not in record.fields or len(out) >= MAX_THRESHOLDS:
                continue
            value, hint = record.fields[pointer], hints.get(pointer)
            holds = _compare(value, op, literal)
            if condition.get("kind") == "unless" and holds is not None:
                holds = not holds
            out.append(Threshold(hint.label if hint and hint.label else pointer, _OPS[op],
                                 shown_value(literal, hint), shown_value(value, hint), bool(holds)))
    return out


def _comparisons(node: Any) -> Iterator[tuple[str, str, int]]:
    """(pointer, op, integer literal) of each comparison of an input field with a literal."""
    if not isinstance(node, dict):
        return
    for key, inner in node.items():
        if key in _OPS and isinstance(inner, dict):
            left, right = inner.get("left"), inner.get("right")
            pointer, literal = _input_pointer(left), _literal(right)
            if pointer is not None and literal is not None:
                yield pointer, key, literal
            else:
                pointer, literal = _input_pointer(right), _literal(left)
                if pointer is not None and literal is not None:
                    yield pointer, _FLIPPED[key], literal
        if isinstance(inner, dict):
            yield from _comparisons(inner)
        elif isinstance(inner, list):
            for item in inner:
                yield from _comparisons(item)


def _input_pointer(node: Any) -> str | None:
    """`/a/b` for the EST of `context.input.a.b`, else None."""
    path: list[str] = []
    while isinstance(node, dict) and "." in node:
        access = node["."]
        if not isinstance(access, dict) or not isinstance(access.get("attr"), str):
            return None
        path.append(access["attr"])
        node = access.get("left")
    if node != {"Var": "context"} or len(path) < 2 or path[-1] != "input":
        return None
    fields = list(reversed(path[:-1]))
    return "/" + "/".join(f.replace("~", "~0").replace("/", "~1") for f in fields)


def _literal(node: Any) -> int | None:
    value = node.get("Value") if isinstance(node, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _compare(value: Any, op: str, literal: int) -> bool | None:
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    return {"<": value < literal, "<=": value <= literal, ">": value > literal, ">=": value >= literal,
            "==": value == literal, "!=": value != literal}[op]
