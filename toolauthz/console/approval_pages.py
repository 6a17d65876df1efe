"""The approver's pages: the inbox, one approval (with what helps decide it), and the
decision, which goes through the same desk call as gRPC DecideApproval."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.responses import RedirectResponse, Response

from toolauthz.approvals import APPROVE, REJECT
from toolauthz.audit.store import AuditQuery
from toolauthz.console.approval_view import arguments, thresholds, usage
from toolauthz.console.signin import Person
from toolauthz.console.visit import PageHost, Visit, signed_in
from toolauthz.display.hints import labelled
from toolauthz.engine import ApprovalSubject, approver_verdict
from toolauthz.errors import ForbiddenError, NotFoundError, RequestError
from toolauthz.model import Decision, Principal, TrustedContext
from toolauthz.service.failures import failure_of
from toolauthz.service.observe import approval_decided
from toolauthz.store.approvals import PENDING, ApprovalRecord

MAX_REASON = 500
INBOX_LIMIT = 200
RECENT_LIMIT = 25
RECENT_CALLS = 10  # the requester's last calls of the tool, on an approval's page


class ApprovalPages(PageHost):
    def may_decide(self, person: Person, record: ApprovalRecord) -> bool:
        """The approver check of DecideApproval (engine.may_approve), for the inbox: the
        person's tenant, not their own call, and a permit of `Action::"approve"` with the
        bundle's groups (or, signed in with an ID token, the token's, as the desk reads them)."""
        subject = ApprovalSubject(record.approval_id, record.tenant, record.tool, record.group, record.requester)
        approver = TrustedContext(person.tenant, person.principal, "")
        groups = person.groups if person.via == "oidc" else None
        requester = Principal(record.requester_type, record.requester_id)
        try:
            return approver_verdict(self.deps.desk.bundles.current, approver, subject, requester,
                                    groups).decision is Decision.ALLOW
        except RequestError:
            return False

    async def inbox(self, visit: Visit) -> Response:
        person = signed_in(visit)
        desk = self.deps.desk

        def read() -> tuple[list[ApprovalRecord], list[ApprovalRecord]]:
            pending = desk.list(tenant=person.tenant, status=PENDING, limit=INBOX_LIMIT)
            recent = [r for r in desk.list(tenant=person.tenant, limit=INBOX_LIMIT) if r.status != PENDING]
            return ([r for r in pending if self.may_decide(person, r)],
                    [r for r in recent if self.may_decide(person, r)][:RECENT_LIMIT])

        pending, recent = await run_in_threadpool(read)
        bundle = desk.bundles.current
        return self.render(visit, "inbox.html", {"pending": [(a, arguments(a, bundle)) for a in pending],
                                                 "recent": recent})

    async def _visible_approval(self, visit: Visit) -> ApprovalRecord:
        person = signed_in(visit)
        approval_id = visit.request.path_params["approval_id"]
        record = await run_in_threadpool(self.deps.desk.get, approval_id)
        if record.tenant != person.tenant:
            raise NotFoundError("no such approval")  # another tenant's: not even its existence is told
        if not (self.may_decide(person, record) or self.is_auditor(person)
                or record.requester == person.uid):
            raise ForbiddenError("you may not decide this approval")
        return record

    async def approval(self, visit: Visit, error: str = "", status: int = 200) -> Response:
        record = await self._visible_approval(visit)
        person = signed_in(visit)
        bundle = self.deps.desk.bundles.current
        query = AuditQuery(tenant=record.tenant, principal=record.requester, tool=record.tool, kind="authorize",
                           newest_first=True)
        found = await run_in_threadpool(self.deps.audit_log.query, query, limit=RECENT_CALLS + 1)
        hints = bundle.display_of(record.tool)
        history = [(r.event, labelled(r.event.fields, hints)) for r in found
                   if r.event.call_id != record.call_id][:RECENT_CALLS]
        return self.render(visit, "approval.html", {
            "a": record, "error": error, "now": self.deps.desk.clock.now(),
            "can_decide": record.status == PENDING and self.may_decide(person, record),
            "arguments": arguments(record, bundle), "thresholds": thresholds(record, bundle),
            "usage": usage(record, bundle),
            "history": history}, status)

    async def decide(self, visit: Visit) -> Response:
        """The same desk call as gRPC DecideApproval, so the same refusals (expired, not
        an approver, another tenant, already decided, policy_changed) with the same audit
        records; a decision pokes the desk's watchers, so a waiting Guard gets its token."""
        person = signed_in(visit)
        assert visit.form is not None
        approval_id = visit.request.path_params["approval_id"]
        verdict, reason = str(visit.form.get("verdict", "")), str(visit.form.get("reason", ""))
        try:
            if verdict not in (APPROVE, REJECT):
                raise RequestError("verdict must be APPROVE or REJECT")
            if len(reason) > MAX_REASON:
                raise RequestError(f"the reason is longer than {MAX_REASON} characters")
            approver = TrustedContext(person.tenant, person.principal, "")
            record = await run_in_threadpool(lambda: self.deps.desk.decide(
                approval_id, approver, verdict, reason, caller=f"console:{person.via}", id_token=person.id_token))
            approval_decided(record.status, "console")
        except Exception as exc:  # noqa: BLE001 - shown on the approval's page, with its status
            failure = failure_of(exc, "console decide")
            try:
                return await self.approval(visit, failure.message, failure.status.http_status)
            except NotFoundError as hidden:  # another tenant's: its existence is not told (the desk audited it)
                failure = failure_of(hidden, "console decide")
            except ForbiddenError:  # a page they may not see: the desk's answer alone
                pass
            return self.render(visit, "error.html", {"message": failure.message}, failure.status.http_status)
        return RedirectResponse(f"/approvals/{approval_id}", 303)
