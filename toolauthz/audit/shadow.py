"""Shadow disagreements from the audit trail, so that they survive restarts.

Every decision a `@shadow` policy would have made otherwise keeps the difference in its
audit record (`detail.shadow`: the decision and reasons with the shadow policies). These
read it back: one line for a call's story (`audit show`), and the counts per shadow
policy over any window (`audit shadow`), from the records rather than a process's memory.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from toolauthz.audit.records import AuditRecord
from toolauthz.display.escape import display


def shadow_line(detail: dict[str, Any]) -> str | None:
    """`shadow: would DENY because p1, p2` for a decision a shadow policy disagreed with."""
    shadow = detail.get("shadow")
    if not isinstance(shadow, dict):
        return None
    reasons = [str(r) for r in shadow.get("reasons", []) if isinstance(r, str)]
    return f"shadow: would {display(str(shadow.get('decision', '?')))} because {display(', '.join(reasons) or '-')}"


def shadow_counts(records: Iterable[AuditRecord]) -> tuple[int, Counter[str]]:
    """(decisions read, disagreements per policy among the shadow evaluation's reasons).
    A disagreement whose reasons name no policy (a shadow forbid that could not be
    evaluated) counts as `(unattributed)`, as GetStatus counts it."""
    total, counts = 0, Counter[str]()
    for record in records:
        if record.event.kind != "authorize":
            continue
        total += 1
        shadow = record.event.detail.get("shadow")
        if isinstance(shadow, dict):
            reasons = [r for r in shadow.get("reasons", []) if isinstance(r, str) and r not in record.event.reasons]
            counts.update(reasons or ["(unattributed)"])
    return total, counts
