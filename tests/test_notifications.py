"""Approval notifications (toolauthz/notify/): a receiver the test runs verifies every
Standard Webhooks signature and counts each event; approvals come from real Authorize
calls. The clock is frozen at the real time, so signature timestamps are current."""

from __future__ import annotations

import base64
import datetime
import hmac
import http.server
import json
import os
import threading
import time

import pytest
from conftest import make_request
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook

from toolauthz.clock import FrozenClock
from toolauthz.display.hints import labelled
from toolauthz.notify import Notifier, NotifierOptions, SlackSink, WebhookSink, slack_message
from toolauthz.notify.sinks import check_url
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.server.config import Settings
from toolauthz.server.notifications import read_secret
from toolauthz.store.deliveries import DEAD, DELIVERED
from toolauthz.store.open import open_store

SECRET = "whsec_" + base64.b64encode(b"a test secret of thirty-two byte").decode()
LARGE = {"order_id": "ord_1", "amount_cents": 6000, "reason": "parcel lost; card 4111-1111"}


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock(float(int(time.time())))


def verified(verifier: Webhook, body: bytes, headers, now: float) -> bool:
    """Webhook.verify's checks, with the test's clock for the timestamp tolerance (five
    minutes): the same signature, computed by the library, compared in constant time."""
    stamp = int(headers["webhook-timestamp"])
    if abs(stamp - now) > 300:
        return False
    expected = verifier.sign(headers["webhook-id"], datetime.datetime.fromtimestamp(stamp, datetime.UTC),
                             body.decode())
    return any(hmac.compare_digest(expected, given) for given in headers["webhook-signature"].split(" "))


class Receiver:
    """An HTTP endpoint on port 0 that verifies signatures and records what it got."""

    def __init__(self, clock, secret: str = SECRET):
        self.clock = clock
        self.verifier = Webhook(secret)
        self.events: list[dict] = []  # verified webhook bodies
        self.ids: list[str] = []
        self.raw: list[dict] = []  # every JSON body, verified or not
        self.refused = 0
        self.answers: list[int] = []  # statuses to answer next (then 204)
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    status = receiver.answers.pop(0) if receiver.answers else 204
                    receiver.raw.append(json.loads(body))
                    if "webhook-id" in self.headers:
                        if not verified(receiver.verifier, body, self.headers, receiver.clock.now()):
                            receiver.refused += 1
                            status = 401
                        elif status == 204:
                            receiver.events.append(json.loads(body))
                            receiver.ids.append(self.headers["webhook-id"])
                self.send_response(status)
                if status == 302:
                    self.send_header("Location", "http://127.0.0.1:9/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(clock):
    r = Receiver(clock)
    yield r
    r.close()


def fields_of(sidecar):
    def of(record):
        return labelled(record.fields, sidecar.bundles.current.tools[record.tool].tool.display)
    return of


def notifier(sidecar, clock, sinks, **options):
    opts = NotifierOptions(console_url="https://console.acme.example", **options)
    return Notifier(sidecar.store.unit, sinks, clock, fields_of(sidecar), opts)


def pending(stub, call_id="toolu_1", args=None):
    response = stub.Authorize(make_request(args=args or LARGE, call_id=call_id, request_id=f"run-{call_id}"))
    assert response.decision == pb.APPROVAL_REQUIRED
    return response


def decide(channel, approval_id, verdict=apb.APPROVE):
    return apb_grpc.ApprovalsStub(channel).DecideApproval(apb.DecideApprovalRequest(
        approval_id=approval_id, verdict=verdict, reason="checked <b>it</b>",
        approver=pb.TrustedContext(tenant="acme", principal=pb.Principal(type="User", id="bob"))))


def kinds(receiver):
    return [(e["type"], e["data"]["approval_id"]) for e in receiver.events]


@pytest.mark.both_stores
def test_each_event_is_signed_sent_once_and_says_only_what_approvers_may_see(stub, channel, sidecar, clock, receiver):
    first = pending(stub)
    n = notifier(sidecar, clock, [WebhookSink("hooks", receiver.url, SECRET)])
    assert n.run_once() == 1 and n.run_once() == 0  # a second pass sends nothing again
    assert kinds(receiver) == [("approval.created", first.approval_id)] and receiver.refused == 0
    data = receiver.events[0]["data"]
    assert data["fields"] == {"Amount": "60.00 EUR", "Order": "ord_1"}  # the display hints; no reason
    assert data["short_code"] and data["url"] == f"https://console.acme.example/approvals/{first.approval_id}"
    text = json.dumps(receiver.events)
    assert "4111" not in text and first.digest not in text and "v4.public" not in text
    assert receiver.ids == [f"{first.approval_id}.created"]

    decide(channel, first.approval_id)
    assert n.run_once() == 1
    assert kinds(receiver)[-1] == ("approval.decided", first.approval_id)
    decided = receiver.events[-1]["data"]
    assert (decided["status"], decided["approver"]) == ("approved", 'User::"bob"')


@pytest.mark.both_stores
def test_expiring_is_sent_before_expiry_and_created_is_skipped_once_decided(stub, channel, sidecar, clock, receiver):
    quiet = pending(stub, "t1")
    decided_first = pending(stub, "t2", {**LARGE, "amount_cents": 7000})
    decide(channel, decided_first.approval_id, apb.REJECT)
    n = notifier(sidecar, clock, [WebhookSink("hooks", receiver.url, SECRET)], warning_seconds=120)
    n.run_once()
    assert sorted(kinds(receiver)) == sorted([("approval.created", quiet.approval_id),
                                              ("approval.decided", decided_first.approval_id)])
    with sidecar.store.unit.reading() as reads:
        skipped = {d.event_id for d in reads.list_deliveries("skipped", 10)}
    assert skipped == {f"{decided_first.approval_id}.created"}
    clock.advance(900 - 121)
    assert n.run_once() == 0
    clock.advance(2)
    n.run_once()
    assert kinds(receiver)[-1] == ("approval.expiring", quiet.approval_id)
    clock.advance(200)  # expired without a decision: a decided event, status expired
    n.run_once()
    assert kinds(receiver)[-1] == ("approval.decided", quiet.approval_id)
    assert receiver.events[-1]["data"]["status"] == "expired"
    assert len(receiver.ids) == len(set(receiver.ids)) == 4


def test_failures_are_retried_with_backoff_then_dead_and_dead_letters_are_bounded(stub, sidecar, clock, receiver):
    n = notifier(sidecar, clock, [WebhookSink("hooks", receiver.url, SECRET)], max_attempts=3, keep_dead=1)
    first = pending(stub, "t1")
    receiver.answers = [500, 429]
    n.run_once()
    assert n.run_once() == 0  # the retry waits for its backoff (1 s)
    clock.advance(1)
    assert n.run_once() == 1  # 429: again, after 2 s
    clock.advance(2)
    assert n.run_once() == 1 and kinds(receiver) == [("approval.created", first.approval_id)]
    with sidecar.store.unit.reading() as reads:
        delivered = reads.list_deliveries(DELIVERED, 10)
    assert [(d.event_id, d.attempts) for d in delivered] == [(f"{first.approval_id}.created", 3)]

    pending(stub, "t2", {**LARGE, "amount_cents": 7000})
    pending(stub, "t3", {**LARGE, "amount_cents": 8000})
    receiver.answers = [400, 302]  # final answers: dead at once (a redirect is never followed)
    n.run_once()
    with sidecar.store.unit.reading() as reads:
        dead = reads.list_deliveries(DEAD, 10)
    assert sorted(d.last_error for d in dead) == ["HTTP 302", "HTTP 400"]
    n._prune(clock.now())
    with sidecar.store.unit.reading() as reads:
        assert len(reads.list_deliveries(DEAD, 10)) == 1  # keep_dead


def test_a_restarted_sender_sends_nothing_twice_and_a_dead_senders_claim_is_taken_over(stub, sidecar, clock,
                                                                                     receiver):
    sink = WebhookSink("hooks", receiver.url, SECRET)
    a = notifier(sidecar, clock, [sink])
    one = pending(stub, "t1")
    a.run_once()
    a.close()
    two = pending(stub, "t2", {**LARGE, "amount_cents": 7000})
    b = notifier(sidecar, clock, [sink])  # the process restarted: a new notifier, the same store
    b.run_once()
    b.run_once()
    assert kinds(receiver) == [("approval.created", one.approval_id), ("approval.created", two.approval_id)]

    three = pending(stub, "t3", {**LARGE, "amount_cents": 8000})
    dying = notifier(sidecar, clock, [sink])
    dying._claim_new(sidecar.store.approvals.list(now=clock.now(), limit=10), clock.now())  # claimed, never sent
    c = notifier(sidecar, clock, [sink])
    assert c.run_once() == 0  # the claim's lease still holds
    clock.advance(31)
    assert c.run_once() == 1
    assert kinds(receiver)[-1] == ("approval.created", three.approval_id)
    assert len(receiver.ids) == len(set(receiver.ids)) == 3


@pytest.mark.parametrize("backend", ["postgresql"])
def test_three_replicas_send_each_event_exactly_once(stub, sidecar, clock, receiver, backend):
    approvals = [pending(stub, f"t{i}", {**LARGE, "amount_cents": 6000 + i}) for i in range(12)]
    replicas = [open_store(sidecar.settings.store_url) for _ in range(3)]
    sink = WebhookSink("hooks", receiver.url, SECRET)
    senders = [Notifier(store.unit, [sink], clock, fields_of(sidecar), NotifierOptions()) for store in replicas]
    start = threading.Barrier(3)

    def run(sender):
        start.wait(10)
        for _ in range(3):
            sender.run_once()

    threads = [threading.Thread(target=run, args=(s,)) for s in senders]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for store in replicas:
        store.close()
    assert sorted(receiver.ids) == sorted(f"{a.approval_id}.created" for a in approvals)
    assert receiver.refused == 0


def test_a_receiver_refuses_a_forged_or_stale_signature(clock):
    verifier = Webhook(SECRET)
    body = b'{"type":"approval.created"}'
    stamp = str(int(clock.now()))
    good = verifier.sign("a1.created", datetime.datetime.fromtimestamp(int(stamp), datetime.UTC), body.decode())
    headers = {"webhook-id": "a1.created", "webhook-timestamp": stamp, "webhook-signature": good}
    assert verified(verifier, body, headers, clock.now())
    assert not verified(verifier, body + b" ", headers, clock.now())
    assert not verified(verifier, body, {**headers, "webhook-id": "a2.created"}, clock.now())
    assert not verified(verifier, body, headers, clock.now() + 301)
    other = Webhook("whsec_" + base64.b64encode(b"another secret, thirty-two bytes").decode())
    assert not verified(other, body, headers, clock.now())
    Webhook(SECRET).verify(body, headers)  # the library's own check agrees (at real time)


def test_slack_message_escapes_what_a_model_or_runtime_wrote_and_links_the_console(stub, sidecar, clock,
                                                                                 receiver):
    hostile = {"order_id": "ord_x", "amount_cents": 6000}
    response = stub.Authorize(make_request(args=hostile, call_id="t1", entities=[
        {"uid": {"type": "Order", "id": "ord_x"}, "attrs": {"owner": {"__entity": {"type": "User", "id": "alice"}},
                                                            "refundable_cents": 9000}, "parents": []}]))
    assert response.decision == pb.APPROVAL_REQUIRED
    n = notifier(sidecar, clock, [SlackSink("chat", receiver.url)])
    n.run_once()
    message = receiver.raw[0]["text"]
    assert f"<https://console.acme.example/approvals/{response.approval_id}|Review in the console>" in message
    body = {"type": "approval.decided", "data": {
        "tool": "issue_refund", "resource": 'Order::"<!channel> <http://evil|click>\n*bold*"',
        "requester": 'User::"alice"', "group": "finance", "tenant": "acme", "short_code": "ABCD-1234",
        "fields": {"Model's reason": "<@U123> & more"}, "status": "rejected", "approver": 'User::"bob"',
        "reason": "no <script>", "expires_at": "", "url": ""}}
    text = slack_message(body)["text"]
    assert "<!channel>" not in text and "<http://evil" not in text and "<@U123>" not in text
    assert "&lt;!channel&gt;" in text and "␊*bold*" in text and "&amp; more" in text
    assert "`no &lt;script&gt;`" in text
    # Quotes are shown as they are: Slack has no backslash escape, so none is written.
    assert '`User::"alice"`' in text and "\\" not in text


def _outside_code_spans(text: str) -> str:
    """What Slack would format: the text with every code span taken out."""
    parts = text.split("`")
    assert len(parts) % 2 == 1, "an unclosed code span"
    return "".join(parts[0::2])


@given(st.text(max_size=40), st.text(max_size=40), st.text(max_size=40))
def test_slack_message_keeps_every_supplied_string_inside_its_own_code_span(resource, label, reason):
    body = {"type": "approval.decided", "data": {
        "tool": "issue_refund", "resource": resource, "requester": resource, "group": "finance",
        "tenant": "acme", "short_code": "ABCD-1234", "fields": {label: reason}, "status": reason,
        "approver": reason, "reason": reason, "expires_at": "", "url": ""}}
    text = slack_message(body)["text"]
    # The spans pair up however many backticks the values held, and what stays outside
    # them is the sidecar's own words: no supplied markup, link, mention or newline.
    outside = _outside_code_spans(text)
    for own in ("*Approval decided*", "*Approval rejected*", "*Approval approved*", "*Approval expired*",
                " on ", "requested by ", " for group ", "(tenant ", "), code ", ": ", " by ", "\n"):
        outside = outside.replace(own, "")
    assert set(outside) <= set(" "), outside
    assert text.count("\n") == 3  # four lines, whatever the values held
    # No escape syntax is added: the backslashes are the values' own.
    assert text.count("\\") == 2 * resource.count("\\") + label.count("\\") + 4 * reason.count("\\")


def test_sinks_refuse_plain_http_off_loopback_and_unsafe_secret_files(tmp_path):
    with pytest.raises(ValueError, match="https"):
        check_url("http://hooks.example/x")
    with pytest.raises(ValueError, match="https"):
        check_url("ftp://hooks.example/x")
    assert check_url("https://hooks.example/x") and check_url("http://127.0.0.1:8/x")
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    os.chmod(secret, 0o644)
    with pytest.raises(Exception, match="readable by others"):
        read_secret(secret)
    os.chmod(secret, 0o600)
    assert read_secret(secret) == SECRET
    secret.write_text("hunter2")
    with pytest.raises(Exception, match="whsec_"):
        read_secret(secret)


def test_the_configured_notifier_is_built_with_the_sidecar(tmp_path, bundle_dir, receiver):
    from toolauthz.server.build import build_sidecar

    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    os.chmod(secret, 0o600)
    settings = Settings(bundle=bundle_dir, data_dir=tmp_path / "data", listen="127.0.0.1:0", reload_poll_seconds=0,
                        notifications={"sinks": [{"name": "hooks", "kind": "webhook", "url": receiver.url,
                                                  "secret_file": str(secret)}]})
    car = build_sidecar(settings, clock=FrozenClock(time.time()))
    try:
        assert car.notifier is not None and car.notifier.run_once() == 0
    finally:
        car.close()
    with pytest.raises(ValueError, match="secret_file"):
        Settings(notifications={"sinks": [{"name": "hooks", "kind": "webhook", "url": receiver.url}]})
