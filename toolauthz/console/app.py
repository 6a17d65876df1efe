"""The console's Starlette application: the pages, and the boundary every request crosses.

Every route goes through `Console._page`, which, in this order: refuses a `Host` a DNS
name could have been rebound to (on a loopback listener, only loopback names are
answered), reads the signed session, finds the signed-in person
(toolauthz/console/signin.py) and their role (a page for signed-in people refuses anyone
else before reading a byte of a form, and closes the connection rather than drain it),
refuses a POST another site sent (`Sec-Fetch-Site`), reads its form up to MAX_FORM_BYTES
and checks its CSRF token (403 before any work), runs the page, maps any error
through the one table of service/failures.py to a page with that status, and writes the
session cookie back (`HttpOnly`, `Secure`, `SameSite=Strict`).
Every response, static files included, carries the security headers of `SECURITY_HEADERS`.

The store and the approval desk block: their calls run in Starlette's thread pool, never
on the event loop, which the console shares with the gRPC server and the HTTP API.
"""

from __future__ import annotations

import logging
import pathlib
import re
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import jinja2
from markupsafe import Markup, escape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from toolauthz.console.approval_pages import ApprovalPages
from toolauthz.console.audit_pages import AuditPages
from toolauthz.console.session import COOKIE, CSRF_FIELD, Sessions, csrf_ok
from toolauthz.console.signin import Authenticator, Person, SignInRefused
from toolauthz.console.visit import ConsoleDeps, Visit, iso, json_text
from toolauthz.display.escape import display, display_uid
from toolauthz.errors import ForbiddenError
from toolauthz.service.failures import failure_of
from toolauthz.service.loopback import loopback_host_header

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
# The largest form is the OIDC sign-in's: an ID token (identity/oidc.py MAX_ID_TOKEN_BYTES) and the CSRF token.
MAX_FORM_BYTES = 32 * 1024
LONGEST_RUN = 24
_AFTER_SEPARATOR = re.compile(r'(?<=[:"_./@-])')


Handler = Callable[["Console", Visit], Awaitable[Response]]


def templates() -> jinja2.Environment:
    """Autoescape on for every template: a value is HTML-escaped wherever it lands. The
    `text` and `uid` filters first make control characters (ANSI escapes, newlines, bidi
    overrides) visible as `display` does in a terminal."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    env.filters["text"] = lambda value: display(str(value), quotes=False)
    env.filters["uid"] = lambda value: display_uid(str(value))
    env.filters["wuid"] = lambda value: wrap_at_separators(display_uid(str(value)))  # in table cells
    env.filters["id"] = lambda value: wrap_at_separators(display(str(value), quotes=False))
    env.filters["iso"] = iso
    env.filters["json"] = lambda value: display(json_text(value), quotes=False)
    return env


def wrap_at_separators(shown: str) -> Markup:
    """`shown` (already made visible by `display`) HTML-escaped, with a line-break
    opportunity after each separator of an id (`::`, quotes, `_`, `-`, `.`, `/`, `@`) and
    inside any run longer than LONGEST_RUN: an id wraps between its parts, never inside a
    word, and a hostile unbroken value still cannot widen the page."""
    pieces: list[Markup] = []
    for part in _AFTER_SEPARATOR.split(shown):
        runs = [part[i:i + LONGEST_RUN] for i in range(0, len(part), LONGEST_RUN)] or [""]
        pieces.append(Markup("<wbr>").join(escape(run) for run in runs))
    return Markup("<wbr>").join(pieces)


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


class Console(ApprovalPages, AuditPages):
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
                # Who is asking, from the cookie or the proxy's headers, before a byte of a
                # form is read: a page for signed-in people refuses anyone else unread.
                try:
                    # Off the event loop: proving a person may fetch an identity provider's keys.
                    visit.person = await run_in_threadpool(
                        self.authenticator.person, _headers(request),
                        request.client.host if request.client else "", session)
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
                if request.method == "POST":
                    # Behind a proxy the person may be proven by the proxy's own cookie, sent
                    # with any site's form: a browser says whose form it is (absent: not a browser).
                    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
                        raise ForbiddenError("a form another site submitted is refused")
                    visit.form = await _form(request)
                    if not csrf_ok(session, visit.form.get(CSRF_FIELD)):
                        raise ForbiddenError("the form's CSRF token is missing or wrong: reload the page and "
                                             "try again")
                response = await handler(self, visit)
            except HTTPException as exc:  # Starlette's own refusals, e.g. a form with too many fields
                response = self.render(visit, "error.html", {"message": str(exc.detail)}, exc.status_code)
            except Exception as exc:  # noqa: BLE001 - the boundary: every error becomes a page
                failure = failure_of(exc, f"console {request.url.path}")
                response = self.render(visit, "error.html", {"message": failure.message},
                                       failure.status.http_status)
            if request.method == "POST" and visit.form is None:
                response.headers["connection"] = "close"  # its form was left unread, not drained
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
            kept = await run_in_threadpool(self.authenticator.sign_in, form)
        except SignInRefused as exc:
            return await self.signin_page(visit, str(exc), 403)
        visit.session = self.sessions.fresh(self.deps.desk.clock.now(), **kept)
        return RedirectResponse("/inbox", 303)

    async def signout(self, visit: Visit) -> Response:
        visit.session = self.sessions.fresh(self.deps.desk.clock.now())
        return RedirectResponse("/signin", 303)


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
