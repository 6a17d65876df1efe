"""What every console page works with: its dependencies, the request as the boundary
resolved it (console/app.py `Console._page`), and the small helpers the pages share."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse

from toolauthz.approvals import ApprovalDesk
from toolauthz.audit.store import AuditLog
from toolauthz.console.signin import Person
from toolauthz.errors import ForbiddenError
from toolauthz.service.status import SidecarStatus
from toolauthz.store.deliveries import Delivery


@dataclass(frozen=True)
class ConsoleDeps:
    """What the console reads and acts through: the same desk and audit log as gRPC."""

    desk: ApprovalDesk
    audit_log: AuditLog
    audit_public_key: Any  # pyseto public key of the audit checkpoints
    status: Callable[[], SidecarStatus]
    # The notifications that could not be delivered (none when notifications are off).
    dead_letters: Callable[[], list[Delivery]] = lambda: []


@dataclass
class Visit:
    """One request as the boundary resolved it."""

    request: Request
    session: dict[str, Any]
    person: Person | None
    form: FormData | None = None
    notice: str = ""  # a sign-in refused: shown on the sign-in page


def signed_in(visit: Visit) -> Person:
    if visit.person is None:
        raise ForbiddenError("sign in first")
    return visit.person


def iso(epoch: float | None) -> str:
    if epoch is None:
        return ""
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def json_text(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


class PageHost:
    """What the page mixins (approval_pages.py, audit_pages.py) use of the Console."""

    deps: ConsoleDeps

    def render(self, visit: Visit | None, template: str, values: dict[str, Any], status: int = 200) -> HTMLResponse:
        raise NotImplementedError

    def is_auditor(self, person: Person | None) -> bool:
        raise NotImplementedError
