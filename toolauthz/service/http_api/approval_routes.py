"""The routes a runtime without gRPC needs to finish a call that waits for a person:
read an approval, wait for it to be decided, and read one call's audit story.

    POST /v1/approval        {approval_id, context?}                 mirrors GetApproval
    POST /v1/approval/wait   {approval_id, context?, wait_seconds?}  mirrors WatchApproval
    POST /v1/call-story      {tenant, call_id}                       QueryDecisions, one call

Each admits its caller exactly as its gRPC twin: the RPC's roles (app.py, before the body
is read), the tenant the body names, then the approval's tenant and its call's owner
(service/ownership.py, one audit record per refused read). The token is in the answer
only for the caller that owns the call, with the call's tenant, principal and run in
`context`.

A wait is a long poll: it answers as soon as the approval is decided or expires, or at
the end of `wait_seconds` with the approval as it is then. It holds one of the watch
places of service/watching.py (per caller and in the process, shared with gRPC's
WatchApproval) from before it reads the store, so a flood of waits is refused at once
with 429 and never reaches the store; `approvals.max_watches` is below the HTTP API's
`max_concurrent_rpcs`, so open waits always leave places for decisions. A client that
disconnects ends its wait and frees its place.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from toolauthz.approvals import ApprovalDesk
from toolauthz.audit.store import AuditLog, AuditQuery
from toolauthz.audit.timeline import build_timeline
from toolauthz.model import TrustedContext
from toolauthz.service.access import About, Gate
from toolauthz.service.http_api.approval_json import approval_json, story_json
from toolauthz.service.http_api.envelope import approval_id_of, call_story_of, viewer_of, wait_seconds_of
from toolauthz.service.http_api.handlers import Body
from toolauthz.service.observe import Observation
from toolauthz.service.ownership import admit_approval_reader
from toolauthz.service.roles import Rpc
from toolauthz.service.watching import LoopNotifier, WatchLimits, watch_records
from toolauthz.store.approvals import ApprovalRecord
from toolauthz.store.ledger import CallOwner

__all__ = ["MAX_STORY_RECORDS", "HttpApprovals"]

# The records one story answer holds; a call has a handful (a decision, its approval, a
# verification, an outcome), so more means refused attempts, and the first ones tell it.
MAX_STORY_RECORDS = 1000


class HttpApprovals:
    """The approval and audit-story routes; `gate` resolves the caller the connection's
    listener proved (app.py)."""

    def __init__(self, desk: ApprovalDesk, watches: WatchLimits, audit_log: AuditLog, gate: Gate):
        self._desk = desk
        self._watches = watches
        self._log = audit_log
        self._gate = gate
        self._notifier: LoopNotifier | None = None

    async def _admit(self, request: Request, body: Body, rpc: Rpc) -> tuple[str, CallOwner | None]:
        """The approval id, and whom its token may go to on this request."""
        approval_id, viewer = approval_id_of(body), viewer_of(body)
        access = await self._gate.admit_async(request, rpc, _about(approval_id, viewer))
        owner = await asyncio.get_running_loop().run_in_executor(
            None, admit_approval_reader, self._gate, self._desk, access, rpc, approval_id, viewer)
        return approval_id, owner

    def _json(self, record: ApprovalRecord) -> JSONResponse:
        bundle = self._desk.bundles.current
        return JSONResponse(approval_json(record, bundle.display_of(record.tool), bundle.usage_hints_of(record.tool)))

    async def get_approval(self, request: Request, body: Body, seen: Observation) -> Response:
        approval_id, owner = await self._admit(request, body, "GetApproval")
        record = await asyncio.get_running_loop().run_in_executor(None, self._desk.get, approval_id, owner)
        return self._json(record)

    async def wait_approval(self, request: Request, body: Body, seen: Observation) -> Response:
        wait_seconds = wait_seconds_of(body)
        approval_id, viewer = approval_id_of(body), viewer_of(body)
        access = await self._gate.admit_async(request, "WatchApproval", _about(approval_id, viewer))
        slot = self._watches.admit(access.caller.id)  # before any read: a flood is refused here
        try:
            owner = await asyncio.get_running_loop().run_in_executor(
                None, admit_approval_reader, self._gate, self._desk, access, "WatchApproval", approval_id, viewer)
            async with _until_disconnect(request) as gone:
                waiting = asyncio.create_task(self._wait(approval_id, owner, wait_seconds))
                await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not waiting.done():  # the client went away: nobody to answer
                    waiting.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await waiting
                    return Response(status_code=499)
                record = waiting.result()
        finally:
            slot.release()
        seen.annotate(result=record.status)
        return self._json(record)

    async def _wait(self, approval_id: str, owner: CallOwner | None, wait_seconds: float) -> ApprovalRecord:
        """The approval once decided or expired, or as it is after `wait_seconds`."""
        records = watch_records(self._desk, self._loop_notifier(), approval_id, owner)
        async with contextlib.aclosing(records):
            last = await anext(records)  # now, whatever the wait: the answer is never empty
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_seconds):
                    async for record in records:  # ends once decided or expired
                        last = record
        return last

    def _loop_notifier(self) -> LoopNotifier:
        """The notifier of the running loop: the listener's handlers all run on one loop."""
        loop = asyncio.get_running_loop()
        if self._notifier is None or self._notifier.loop is not loop:
            self._notifier = LoopNotifier(self._desk, loop)
        return self._notifier

    async def call_story(self, request: Request, body: Body, seen: Observation) -> Response:
        tenant, call_id = call_story_of(body)
        await self._gate.admit_async(request, "QueryDecisions", About(tenant=tenant, call_id=call_id))
        query = functools.partial(self._log.query, AuditQuery(tenant=tenant, call_id=call_id),
                                  limit=MAX_STORY_RECORDS + 1)
        records = await asyncio.get_running_loop().run_in_executor(None, query)
        complete = len(records) <= MAX_STORY_RECORDS
        return JSONResponse(story_json(build_timeline(records[:MAX_STORY_RECORDS]), complete=complete))


def _about(approval_id: str, viewer: TrustedContext | None) -> About:
    if viewer is None:
        return About(approval_id=approval_id)
    return About(viewer.tenant, str(viewer.principal), request_id=viewer.request_id, approval_id=approval_id)


@contextlib.asynccontextmanager
async def _until_disconnect(request: Request) -> AsyncIterator[asyncio.Task[None]]:
    """A task that ends when the client disconnects (the body was read whole already, so
    the next message of the request is its disconnect)."""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.create_task(watch())
    try:
        yield watcher
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
