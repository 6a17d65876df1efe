"""The console's Starlette application: the pages, and the boundary every request crosses.

Every route goes through `Console._page`, which, in this order: refuses a `Host` a DNS
name could have been rebound to (on a loopback listener, only loopback names are
answered), reads the signed session, refuses a POST another site sent (`Sec-Fetch-Site`),
reads its form up to MAX_FORM_BYTES and checks its CSRF token (403 before any work),
finds the signed-in person (sidecar/console/signin.py) and their role, runs the
page, maps any error through the one table of service/failures.py to a page with that
status, and writes the session cookie back (`HttpOnly`, `Secure`, `SameSite=Strict`).
Every response, static files included, carries the security headers of `SECURITY_HEADERS`.

The store and the approval desk block: their calls run in Starlette's thread pool, never
on the event loop, which the console shares with the gRPC server and the HTTP API.
"""

from __future__ import annotations

import json
import logging
import pathlib
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sidecar.approvals import APPROVE, REJECT, ApprovalDesk
from sidecar.audit.records import KINDS
from sidecar.audit.store import MAX_PAGE, RESULTS, AuditLog, AuditQuery
from sidecar.audit.timeline import build_timeline
from sidecar.audit.verify import verify_chain
from sidecar.console.explorer import FILTERS, query_of
from sidecar.console.session import COOKIE, CSRF_FIELD, Sessions, csrf_ok
from sidecar.console.signin import Authenticator, Person, SignInRefused
from sidecar.display import display, display_uid
from sidecar.engine import ApprovalSubject, approver_verdict
from sidecar.errors import ForbiddenError, NotFoundError, RequestError, ResourceExhaustedError
from sidecar.model import Decision, Principal, TrustedContext
from sidecar.service.failures import failure_of
from sidecar.service.loopback import loopback_host_header
from sidecar.service.status import SidecarStatus
from sidecar.store.approvals import PENDING, ApprovalRecord

log = logging.getLogger("toolauthz.console")

HERE = pathlib.Path(__file__).resolve().parent
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode("ascii")),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
)
MAX_REASON = 500
# The largest form is the OIDC sign-in's: an ID token (sidecar/oidc.py MAX_ID_TOKEN_BYTES) and the CSRF token.
MAX_FORM_BYTES = 32 * 1024
INBOX_LIMIT = 200
RECENT_LIMIT = 25


@dataclass(frozen=True)
class ConsoleDeps:
    """What the console reads and acts through: the same desk and audit log as gRPC."""

    desk: ApprovalDesk
    audit_log: AuditLog
    audit_public_key: Any  # pyseto public key of the audit checkpoints
    status: Callable[[], SidecarStatus]


@dataclass
class Visit:
    """One request as the boundary resolved it."""

    request: Request
    session: dict[str, Any]
    person: Person | None
    form: FormData | None = None
    notice: str = ""  # a sign-in refused: shown on the sign-in page


Handler = Callable[["Console", Visit], Awaitable[Response]]


def _iso(epoch: float | None) -> str:
    if epoch is None:
        return ""
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def templates() -> jinja2.Environment:
    """Autoescape on for every template: a value is HTML-escaped wherever it lands. The
    `text` and `uid` filters first make control characters (ANSI escapes, newlines, bidi
    overrides) visible as `display` does in a terminal."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    env.filters["text"] = lambda value: display(str(value), quotes=False)
    env.filters["uid"] = lambda value: display_uid(str(value))
    env.filters["iso"] = _iso
    env.filters["json"] = lambda value: display(_json(value), quotes=False)
    return env


def security_headers(app: ASGIApp) -> ASGIApp:
    async def with_headers(scope: Scope, receive: Receive, send: Send) -> None:
        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in SECURITY_HEADERS}
                kept = [(n, v) for n, v in message.get("headers", []) if n.lower() not in names]
                message["headers"] = [*kept, *SECURITY_HEADERS]
            await send(message)
        await app(scope, receive, sending)
    return with_headers


class Console:
    def __init__(self, deps: ConsoleDeps, authenticator: Authenticator, sessions: Sessions, *,
                 auditor_groups: tuple[str, ...], loopback: bool):
        self.deps = deps
        self.authenticator = authenticator
        self.sessions = sessions
        self.auditor_groups = auditor_groups
        self.loopback = loopback
        self.env = templates()
        self._verifying = threading.Lock()
        self._last_verify: dict[str, Any] | None = None
        routes: list[Route | Mount] = [
            Route("/", self._page(Console.home), methods=["GET"]),
            Route("/signin", self._page(Console.signin_page, public=True), methods=["GET"]),
            Route("/signin", self._page(Console.signin, public=True), methods=["POST"]),
            Route("/signout", self._page(Console.signout, public=True), methods=["POST"]),
            Route("/inbox", self._page(Console.inbox), methods=["GET"]),
            Route("/approvals/{approval_id}", self._page(Console.approval), methods=["GET"]),
            Route("/approvals/{approval_id}/decide", self._page(Console.decide), methods=["POST"]),
            Route("/audit", self._page(Console.explorer, auditor=True), methods=["GET"]),
            Route("/audit/call", self._page(Console.timeline, auditor=True), methods=["GET"]),
            # A POST with the CSRF token: it reads every record, so no other site may start it.
            Route("/audit/verify", self._page(Console.verify, auditor=True), methods=["POST"]),
            Route("/status", self._page(Console.status, auditor=True), methods=["GET"]),
            Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
        ]
        self.app: ASGIApp = security_headers(Starlette(routes=routes, exception_handlers={
            HTTPException: self._http_exception}))

    # -- the boundary -----------------------------------------------------------------

    def _page(self, handler: Handler, *, public: bool = False, auditor: bool = False) -> Callable[
            [Request], Awaitable[Response]]:
        async def answer(request: Request) -> Response:
            if self.loopback and not loopback_host_header(request.headers.get("host", "")):
                return self.render(None, "error.html", {"message": "this console answers requests for a "
                                                        "loopback host only"}, 403)
            now = self.deps.desk.clock.now()
            cookie = request.cookies.get(COOKIE)
            session = self.sessions.load(cookie, now)
            visit = Visit(request, session, None)
            try:
                if request.method == "POST":
                    # Behind a proxy the person may be proven by the proxy's own cookie, sent
                    # with any site's form: a browser says whose form it is (absent: not a browser).
                    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
                        raise ForbiddenError("a form another site submitted is refused")
                    visit.form = await _form(request)
                    if not csrf_ok(session, visit.form.get(CSRF_FIELD)):
                        raise ForbiddenError("the form's CSRF token is missing or wrong: reload the page and "
                                             "try again")
                try:
                    visit.person = self.authenticator.person(
                        _headers(request), request.client.host if request.client else "", session)
                except SignInRefused as exc:
                    visit.notice = str(exc)
                    if not public:
                        raise ForbiddenError(str(exc)) from None
                if not public and visit.person is None:
                    if request.method == "GET":
                        return self._with_session(RedirectResponse("/signin", 303), visit)
                    raise ForbiddenError("sign in first")
                if auditor and not self.is_auditor(visit.person):
                    raise ForbiddenError("the audit pages are for auditors (console.auditor_groups)")
                response = await handler(self, visit)
            except HTTPException as exc:  # Starlette's own refusals, e.g. a form with too many fields
                response = self.render(visit, "error.html", {"message": str(exc.detail)}, exc.status_code)
            except Exception as exc:  # noqa: BLE001 - the boundary: every error becomes a page
                failure = failure_of(exc, f"console {request.url.path}")
                response = self.render(visit, "error.html", {"message": failure.message},
                                       failure.status.http_status)
            return self._with_session(response, visit)

        answer.__name__ = handler.__name__
        return answer

    def _with_session(self, response: Response, visit: Visit) -> Response:
        response.set_cookie(COOKIE, self.sessions.dump(visit.session), max_age=int(self.sessions.max_age_seconds),
                            path="/", secure=True, httponly=True, samesite="strict")
        return response

    async def _http_exception(self, request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        message = "no such page" if status == 404 else str(getattr(exc, "detail", "error"))
        return self.render(None, "error.html", {"message": message}, status)

    def render(self, visit: Visit | None, template: str, values: dict[str, Any], status: int = 200) -> HTMLResponse:
        person = visit.person if visit is not None else None
        page = self.env.get_template(template).render(
            person=person, auditor=self.is_auditor(person), dev=self.authenticator.kind == "dev",
            csrf=visit.session.get("csrf", "") if visit is not None else "", csrf_field=CSRF_FIELD, **values)
        return HTMLResponse(page, status_code=status)

    def is_auditor(self, person: Person | None) -> bool:
        return person is not None and person.in_any(self.auditor_groups)

    # -- sign-in ----------------------------------------------------------------------

    async def home(self, visit: Visit) -> Response:
        return RedirectResponse("/inbox", 303)

    async def signin_page(self, visit: Visit, message: str = "", status: int = 200) -> Response:
        return self.render(visit, "signin.html", {"kind": self.authenticator.kind,
                                                  "message": message or visit.notice}, status)

    async def signin(self, visit: Visit) -> Response:
        assert visit.form is not None
        form = {k: v for k, v in visit.form.items() if isinstance(v, str)}
        try:
            kept = self.authenticator.sign_in(form)
        except SignInRefused as exc:
            return await self.signin_page(visit, str(exc), 403)
        visit.session = self.sessions.fresh(self.deps.desk.clock.now(), **kept)
        return RedirectResponse("/inbox", 303)

    async def signout(self, visit: Visit) -> Response:
        visit.session = self.sessions.fresh(self.deps.desk.clock.now())
        return RedirectResponse("/signin", 303)

    # -- approvals --------------------------------------------------------------------

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
        person = _signed_in(visit)
        desk = self.deps.desk

        def read() -> tuple[list[ApprovalRecord], list[ApprovalRecord]]:
            pending = desk.list(tenant=person.tenant, status=PENDING, limit=INBOX_LIMIT)
            recent = [r for r in desk.list(tenant=person.tenant, limit=INBOX_LIMIT) if r.status != PENDING]
            return ([r for r in pending if self.may_decide(person, r)],
                    [r for r in recent if self.may_decide(person, r)][:RECENT_LIMIT])

        pending, recent = await run_in_threadpool(read)
        return self.render(visit, "inbox.html", {"pending": pending, "recent": recent})

    async def _visible_approval(self, visit: Visit) -> ApprovalRecord:
        person = _signed_in(visit)
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
        person = _signed_in(visit)
        return self.render(visit, "approval.html", {
            "a": record, "error": error, "now": self.deps.desk.clock.now(),
            "can_decide": record.status == PENDING and self.may_decide(person, record),
            "arguments": [(name, _json(value)) for name, value in sorted(record.fields.items())]}, status)

    async def decide(self, visit: Visit) -> Response:
        """The same desk call as gRPC DecideApproval, so the same refusals (expired, not
        an approver, another tenant, already decided, policy_changed) with the same audit
        records; a decision pokes the desk's watchers, so a waiting Guard gets its token."""
        person = _signed_in(visit)
        assert visit.form is not None
        approval_id = visit.request.path_params["approval_id"]
        verdict, reason = str(visit.form.get("verdict", "")), str(visit.form.get("reason", ""))
        try:
            if verdict not in (APPROVE, REJECT):
                raise RequestError("verdict must be APPROVE or REJECT")
            if len(reason) > MAX_REASON:
                raise RequestError(f"the reason is longer than {MAX_REASON} characters")
            approver = TrustedContext(person.tenant, person.principal, "")
            await run_in_threadpool(lambda: self.deps.desk.decide(
                approval_id, approver, verdict, reason, caller=f"console:{person.via}", id_token=person.id_token))
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

    # -- audit ------------------------------------------------------------------------

    async def explorer(self, visit: Visit) -> Response:
        person = _signed_in(visit)
        params = {k: v for k, v in visit.request.query_params.items()}
        values = {"filters": FILTERS, "results": RESULTS, "kinds": KINDS}
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
        person = _signed_in(visit)
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
                count, head = log_.head()
                findings = verify_chain(log_.iter_records(), log_.checkpoints(), key, max_findings=20)
                return {"ok": not findings, "count": count, "head": head, "findings": findings,
                        "at": self.deps.desk.clock.now()}

            self._last_verify = await run_in_threadpool(run)
        finally:
            self._verifying.release()
        return self.render(visit, "verify.html", {"v": self._last_verify})

    async def status(self, visit: Visit) -> Response:
        status = await run_in_threadpool(self.deps.status)
        return self.render(visit, "status.html", {"st": status})


async def _form(request: Request) -> FormData:
    """The posted form, its body read only up to MAX_FORM_BYTES: the parser's caps per
    field and on the number of fields let an unbounded run of empty fields through, and
    this runs for anyone, before the CSRF check, on the loop the gRPC server shares."""
    too_large = HTTPException(413, f"the form is larger than {MAX_FORM_BYTES} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > MAX_FORM_BYTES:
        raise too_large
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM_BYTES:
                raise too_large
    except ClientDisconnect:  # gone before its form was whole: nothing to do, no one to answer
        raise HTTPException(400, "the client disconnected") from None

    async def replay() -> Message:
        return {"type": "http.request", "body": bytes(body), "more_body": False}

    return await Request(request.scope, replay).form(max_files=0, max_fields=32, max_part_size=MAX_FORM_BYTES)


def _headers(request: Request) -> dict[str, str]:
    """The request's headers by lower-case name. A header sent twice has its values
    joined by a NUL, which no sign-in value accepts and no stripping of whitespace
    removes (a newline was, beside an empty value): a second user, tenant or groups
    header (a client's, passed on by a proxy that appends) is refused, never silently
    preferred or merged."""
    joined: dict[str, str] = {}
    for name, value in request.headers.items():
        joined[name] = f"{joined[name]}\x00{value}" if name in joined else value
    return joined


def _signed_in(visit: Visit) -> Person:
    if visit.person is None:
        raise ForbiddenError("sign in first")
    return visit.person
