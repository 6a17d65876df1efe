"""Where approval events go: a webhook signed per the Standard Webhooks specification,
or a Slack-compatible incoming webhook.

A sink's URL is HTTPS (plain HTTP only to a loopback address, for development), is
never followed through a redirect, and never appears in a log (an incoming-webhook URL is
itself a credential). A delivery is one POST with a deadline: 2xx delivered; 408, 429,
5xx and network errors are tried again later; any other answer is final (`dead`).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from standardwebhooks.webhooks import Webhook

from toolauthz.display.slack import slack_code

MAX_ANSWER_BYTES = 64 * 1024
_RETRY_STATUSES = frozenset({408, 429})
USER_AGENT = "toolauthz-notifier"


@dataclass(frozen=True)
class Sent:
    ok: bool
    retry: bool = False  # a failure worth trying again
    error: str = ""  # for operators: a status or an error class, never the URL or the body


class Sink(Protocol):
    name: str
    kind: str

    def deliver(self, event_id: str, body: dict[str, Any], timestamp: float) -> Sent: ...


def check_url(url: str) -> str:
    """The URL if a sink may post to it, else ValueError saying why (without the URL's
    path or query, which may hold a credential)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme == "https" and host:
        return url
    if parts.scheme == "http" and host:
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if loopback:
            return url
        raise ValueError(f"a sink URL must be https (plain http only to loopback), not http://{host}")
    raise ValueError("a sink URL must be an absolute https URL")


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 3xx is an answer like any other: not delivered, never followed


def post(url: str, data: bytes, headers: dict[str, str], *, timeout: float,
         context: ssl.SSLContext | None = None) -> Sent:
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": USER_AGENT,
                                              **headers})
    opener = urllib.request.build_opener(_NoRedirects(), urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(request, timeout=timeout) as answer:
            answer.read(MAX_ANSWER_BYTES)
            return Sent(True)
    except urllib.error.HTTPError as exc:
        status = exc.code
        retry = status in _RETRY_STATUSES or status >= 500
        return Sent(False, retry=retry, error=f"HTTP {status}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return Sent(False, retry=True, error=type(getattr(exc, "reason", exc)).__name__)


def _tls(ca_file: str | None) -> ssl.SSLContext | None:
    return ssl.create_default_context(cafile=ca_file) if ca_file else None


class WebhookSink:
    """POSTs the event's JSON with `webhook-id`, `webhook-timestamp` and
    `webhook-signature` (`v1,<base64 HMAC-SHA256 of id.timestamp.body>`), signed with
    the `whsec_` secret by the `standardwebhooks` library."""

    kind = "webhook"

    def __init__(self, name: str, url: str, secret: str, *, timeout: float = 5.0, ca_file: str | None = None):
        self.name = name
        self.url = check_url(url)
        self._signer = Webhook(secret)
        self._timeout = timeout
        self._tls = _tls(ca_file)

    def deliver(self, event_id: str, body: dict[str, Any], timestamp: float) -> Sent:
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
        when = datetime.datetime.fromtimestamp(int(timestamp), datetime.UTC)
        headers = {"webhook-id": event_id, "webhook-timestamp": str(int(timestamp)),
                   "webhook-signature": self._signer.sign(event_id, when, text)}
        return post(self.url, text.encode(), headers, timeout=self._timeout, context=self._tls)


class SlackSink:
    """A Slack-compatible incoming webhook: one message with a link to decide. Every
    model- or runtime-supplied string is written for Slack's grammar (`slack_message`),
    so it can carry no link, mention or markup of its own."""

    kind = "slack"

    def __init__(self, name: str, url: str, *, timeout: float = 5.0, ca_file: str | None = None):
        self.name = name
        self.url = check_url(url)
        self._timeout = timeout
        self._tls = _tls(ca_file)

    def deliver(self, event_id: str, body: dict[str, Any], timestamp: float) -> Sent:
        message = slack_message(body)
        return post(self.url, json.dumps(message).encode(), {}, timeout=self._timeout, context=self._tls)


_HEADLINES = {"approval.created": "Approval needed", "approval.expiring": "Approval expiring soon",
              "approval.decided": "Approval {status}"}
# The one word of a decided approval's headline, which stands in bold outside any code
# span: only these words, never the text a store or a sender handed over.
_STATUSES = frozenset({"approved", "rejected", "expired", "superseded", "cancelled"})


def slack_message(body: dict[str, Any]) -> dict[str, Any]:
    """The message's mrkdwn: the sidecar's own words, and every supplied value in a code
    span of its own (`display/slack.py`), so none can format, link or mention."""
    d = body["data"]
    status = d["status"] if d["status"] in _STATUSES else "decided"
    headline = _HEADLINES.get(body["type"], "Approval").format(status=status)
    lines = [f"*{headline}*: {slack_code(d['tool'])} on {slack_code(d['resource'])}",
             f"requested by {slack_code(d['requester'])} for group {slack_code(d['group'])} "
             f"(tenant {slack_code(d['tenant'])}), code {slack_code(d['short_code'])}"]
    lines += [f"{slack_code(label)}: {slack_code(value)}" for label, value in d["fields"].items()]
    if body["type"] == "approval.decided":
        who = f" by {slack_code(d['approver'])}" if d["approver"] else ""
        why = f": {slack_code(d['reason'])}" if d["reason"] else ""
        lines.append(f"{slack_code(d['status'])}{who}{why}")
    else:
        lines.append(f"expires {slack_code(d['expires_at'])}")
    if d["url"]:
        # The console's own URL (configured, with an id the sidecar minted): the one link.
        lines.append(f"<{slack_url(d['url'])}|Review in the console>")
    return {"text": "\n".join(lines)}


def slack_url(url: str) -> str:
    """A link target: `<`, `>` and `|` would end it or start its label."""
    return url.replace("&", "&amp;").replace("<", "%3C").replace(">", "%3E").replace("|", "%7C")
