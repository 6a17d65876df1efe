"""The auditor's pages: the audit explorer, a call's timeline, the chain's verification
and the policy status (with undelivered notifications)."""

from __future__ import annotations

import threading
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from toolauthz.audit.merkle import heads_root, records_in
from toolauthz.audit.records import KINDS
from toolauthz.audit.shadow import shadow_counts
from toolauthz.audit.store import MAX_PAGE, RESULTS, AuditQuery
from toolauthz.audit.timeline import build_timeline
from toolauthz.audit.verify import verify_chain
from toolauthz.console.explorer import FILTER_GROUPS, query_of
from toolauthz.console.visit import PageHost, Visit, signed_in
from toolauthz.errors import NotFoundError, RequestError, ResourceExhaustedError

SHADOW_SCAN = 10_000  # the decisions the status page reads for its shadow counts, at most


class AuditPages(PageHost):
    _verifying: threading.Lock
    _last_verify: dict[str, Any] | None

    async def explorer(self, visit: Visit) -> Response:
        person = signed_in(visit)
        params = {k: v for k, v in visit.request.query_params.items()}
        values = {"groups": FILTER_GROUPS, "results": RESULTS, "kinds": KINDS}
        try:
            asked = query_of(params, person.tenant)
        except RequestError as exc:
            return self.render(visit, "audit.html", {**values, "error": str(exc), "records": [], "next_params": None,
                                                     "values": params, "chain": None}, 400)
        log_ = self.deps.audit_log

        def read() -> tuple[list[Any], dict[str, Any]]:
            records = log_.query(asked.query, limit=asked.limit + 1, after_seq=asked.after_seq)
            count, head = log_.head()
            return records, {"count": count, "head": head, "checkpoint": log_.last_checkpoint()}

        records, chain = await run_in_threadpool(read)
        more = len(records) > asked.limit
        records = records[:asked.limit]
        next_params = None
        if more:
            next_params = {**{k: v for k, v in asked.values.items() if k != "after_seq"},
                           "after_seq": str(records[-1].seq)}
        return self.render(visit, "audit.html", {**values, "error": "", "records": records, "next_params": next_params,
                                                 "values": asked.values, "chain": chain,
                                                 "verified": self._last_verify})

    async def timeline(self, visit: Visit) -> Response:
        person = signed_in(visit)
        call_id = visit.request.query_params.get("id", "")
        if not call_id or len(call_id) > 256:
            raise RequestError("name a call: /audit/call?id=CALL_ID")
        records = await run_in_threadpool(self.deps.audit_log.query, AuditQuery(tenant=person.tenant, call_id=call_id),
                                          limit=MAX_PAGE)
        if not records:
            raise NotFoundError("no audit records for this call in your tenant")
        story = build_timeline(records)
        return self.render(visit, "timeline.html", {"t": story, "s": story.summary, "call_id": call_id})

    async def verify(self, visit: Visit) -> Response:
        """The whole chain checked now, on demand (verify_chain reads every record: O(n)),
        one verification at a time; the explorer shows the last result and the head."""
        if not self._verifying.acquire(blocking=False):
            raise ResourceExhaustedError("a verification is running; try again when it has finished")
        try:
            log_, key = self.deps.audit_log, self.deps.audit_public_key

            def run() -> dict[str, Any]:
                heads = log_.heads()  # before the records: one appended meanwhile is past its head
                count, head = records_in(heads), heads_root(heads)
                findings = verify_chain(log_.iter_chains(), log_.checkpoints(), key, heads=heads, max_findings=20)
                return {"ok": not findings, "count": count, "head": head, "findings": findings,
                        "at": self.deps.desk.clock.now()}

            self._last_verify = await run_in_threadpool(run)
        finally:
            self._verifying.release()
        return self.render(visit, "verify.html", {"v": self._last_verify})

    async def status(self, visit: Visit) -> Response:
        person = signed_in(visit)
        status = await run_in_threadpool(self.deps.status)
        dead = await run_in_threadpool(self.deps.dead_letters)
        # Shadow disagreements from the audit trail (they survive restarts): the loaded
        # version's decisions in this tenant, the newest SHADOW_SCAN of them at most.
        query = AuditQuery(tenant=person.tenant, kind="authorize", policy_version=status.policy.version,
                           newest_first=True)
        records = await run_in_threadpool(self.deps.audit_log.query, query, limit=SHADOW_SCAN)
        read, shadow = shadow_counts(records)
        return self.render(visit, "status.html", {"st": status, "dead": dead, "shadow": dict(shadow),
                                                  "shadow_read": read, "shadow_capped": read >= SHADOW_SCAN})
