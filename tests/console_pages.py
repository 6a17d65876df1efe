"""Helpers of the console tests: a console over a real sidecar, a browser-like client,
sign-in and the CSRF token a page carries."""

from __future__ import annotations

import json
import re

from conftest import order_entity
from starlette.testclient import TestClient

from toolauthz.authorizer import AuthorizeResult
from toolauthz.console import Console
from toolauthz.model import Decision, Principal, ProposedCall, TrustedContext
from toolauthz.server.config import ConsoleSettings
from toolauthz.server.sidecar import Sidecar
from toolauthz.server.web import console_of

CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
LARGE = {"order_id": "ord_1", "amount_cents": 6000}


def console_for(sidecar: Sidecar, listen: str = "127.0.0.1:0", **console: object) -> Console:
    """The console `serve` would build with these settings (port 0: nothing is bound)."""
    sidecar.settings = sidecar.settings.model_copy(update={"console_listen": listen,
                                                           "console": ConsoleSettings(**console)})
    return console_of(sidecar)


def browser(console: Console, peer: str = "127.0.0.1", host: str = "localhost") -> TestClient:
    """A client as a browser on `peer` would be: https (the cookie is Secure), no redirects followed."""
    return TestClient(console.app, base_url=f"https://{host}", client=(peer, 50000), follow_redirects=False)


def csrf_of(html: str) -> str:
    found = CSRF.search(html)
    assert found, "the page carries no CSRF token"
    return found.group(1)


def sign_in(client: TestClient, principal: str, tenant: str = "acme", groups: str = "") -> None:
    """The development sign-in, as a person fills its form."""
    token = csrf_of(client.get("/signin").text)
    answer = client.post("/signin", data={"csrf_token": token, "principal": principal, "tenant": tenant,
                                          "groups": groups})
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == "/inbox"


def post_form(client: TestClient, page: str, action: str, **fields: str):
    """Submit the form of `page` to `action` with the page's CSRF token."""
    token = csrf_of(client.get(page).text)
    return client.post(action, data={"csrf_token": token, **fields})


def propose(sidecar: Sidecar, *, call_id: str = "toolu_1", args: dict | None = None, principal: str = "alice",
            tenant: str = "acme") -> tuple[TrustedContext, AuthorizeResult]:
    """A call that needs approval, decided by the sidecar's authorizer."""
    args = args or LARGE
    entities = [order_entity(args["order_id"], principal, tenant=tenant if tenant != "acme" else None)]
    ctx = TrustedContext(tenant, Principal("User", principal), f"run-{call_id}", json.dumps(entities).encode())
    result = sidecar.authorizer.authorize(ctx, ProposedCall(call_id, "issue_refund", json.dumps(args).encode()))
    assert result.decision is Decision.APPROVAL_REQUIRED, result
    return ctx, result
