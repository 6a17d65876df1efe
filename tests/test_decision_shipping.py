"""Decision logs shipped over HTTP: batches arrive gzip'd with only allow-listed
arguments; a stalled receiver never holds a decision, the buffer stays bounded and the
drops are counted; failures are retried with backoff and jitter, refusals are final."""

from __future__ import annotations

import gzip
import http.server
import json
import random
import socket
import threading

import pytest
from conftest import make_request
from prometheus_client import REGISTRY

from toolauthz.errors import ToolAuthzError
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.server.config import DecisionLogSettings
from toolauthz.server.config.observing import DecisionLogHttpSettings
from toolauthz.server.decision_shipping import DecisionShipper, Endpoint, configure_decision_log, read_headers
from toolauthz.telemetry import decision_log

WAIT = 30  # seconds a test waits for an event before it fails; never a pause


def counted(outcome: str) -> float:
    return REGISTRY.get_sample_value("toolauthz_decision_log_events_total", {"outcome": outcome}) or 0.0


@pytest.fixture(autouse=True)
def _no_shipping_after():
    yield
    configure_decision_log(DecisionLogSettings())


class Receiver:
    """A real HTTP receiver on port 0 that keeps each batch (decoded) and its headers."""

    def __init__(self, status: int = 200):
        self.batches: list[list[dict]] = []
        self.headers: list[dict[str, str]] = []
        self.arrived = threading.Event()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.headers.append(dict(self.headers))
                receiver.batches.append(json.loads(gzip.decompress(body)))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()
                receiver.arrived.set()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/v1/decisions"

    def events(self) -> list[dict]:
        return [event for batch in self.batches for event in batch]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class StalledReceiver:
    """Accepts connections and never answers (nor reads): a receiver that hangs."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.accepted = threading.Event()
        self.held: list[socket.socket] = []
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/"
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.held.append(connection)
            self.accepted.set()

    def close(self):
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self.listener.close()
        self.thread.join()
        for connection in self.held:
            connection.close()


def test_decisions_arrive_in_gzip_batches_with_only_allow_listed_arguments(stub, tmp_path):
    receiver = Receiver()
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    try:
        configure_decision_log(DecisionLogSettings(
            arguments={"issue_refund": ("amount_cents",)},
            http=DecisionLogHttpSettings(url=receiver.url, bearer_token_file=token, batch_max_events=1)))
        answer = stub.Authorize(make_request(call_id="toolu_ship"), timeout=10)
        assert receiver.arrived.wait(WAIT)
        [event] = receiver.events()
        assert (event["decision_id"], event["call_id"], event["result"]) == (answer.decision_id, "toolu_ship", "allow")
        assert event["arguments"] == {"amount_cents": 1500}  # order_id is not allow-listed
        assert "ord_1" not in json.dumps(event)
        assert receiver.headers[0]["Authorization"] == "Bearer s3cret-token"
        assert receiver.headers[0]["Content-Encoding"] == "gzip"
    finally:
        receiver.close()


def test_a_stalled_receiver_never_holds_a_decision_and_the_buffer_stays_bounded(stub):
    stalled = StalledReceiver()
    try:
        shipper = configure_decision_log(DecisionLogSettings(http=DecisionLogHttpSettings(
            url=stalled.url, batch_max_events=1, buffer_max_events=5, timeout_seconds=60, max_attempts=1)))
        assert shipper is not None
        shipper.offer(b'{"first":1}')  # the sender takes it and hangs in its POST
        assert stalled.accepted.wait(WAIT)
        dropped_before = counted("dropped_buffer_full")
        # With the sender stuck for a minute, forty decisions are all answered (each with a
        # deadline far below the sender's stall): the decision path never waits for it.
        for i in range(40):
            request = make_request(call_id=f"toolu_stall_{i}", request_id=f"run-{i}")
            assert stub.Authorize(request, timeout=10).decision == pb.ALLOW
        assert shipper.buffered()[0] == 5  # the bound holds
        assert counted("dropped_buffer_full") - dropped_before == 35
    finally:
        stalled.close()


def _shipper(post, **overrides) -> DecisionShipper:
    settings = DecisionLogHttpSettings(url="http://127.0.0.1:9/", batch_max_events=2, backoff_initial_seconds=0.001,
                                       backoff_max_seconds=0.004, **overrides)
    return DecisionShipper(settings, Endpoint.from_settings(settings), post=post, rng=random.Random(7))


def test_a_failing_batch_is_retried_with_backoff_then_delivered():
    answers = [503, 429, OSError("connection reset"), 200]
    done = threading.Event()
    bodies: list[bytes] = []

    def post(endpoint, body):
        bodies.append(body)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        if answer == 200:
            done.set()
        return answer

    shipped_before = counted("shipped")
    shipper = _shipper(post, max_attempts=5).start()
    shipper.offer(b'{"a":1}')
    shipper.offer(b'{"a":2}')
    assert done.wait(WAIT)
    shipper.close()
    assert len(bodies) == 4 and len(set(bodies)) == 1  # the same batch each time
    assert json.loads(gzip.decompress(bodies[0])) == [{"a": 1}, {"a": 2}]
    assert counted("shipped") - shipped_before == 2


def test_a_refused_batch_is_dropped_at_once_and_exhausted_retries_are_counted():
    calls: list[int] = []
    finished = threading.Event()

    def refuse(endpoint, body):
        calls.append(400)
        finished.set()
        return 400

    refused_before = counted("dropped_refused")
    shipper = _shipper(refuse).start()
    shipper.offer(b"{}")
    shipper.offer(b"{}")
    assert finished.wait(WAIT)
    shipper.close()
    assert calls == [400] and counted("dropped_refused") - refused_before == 2

    attempts: list[int] = []

    def unreachable(endpoint, body):
        attempts.append(1)
        if len(attempts) == 3:
            finished.set()
        raise OSError("connection refused")

    finished.clear()
    failed_before = counted("dropped_failed")
    shipper = _shipper(unreachable, max_attempts=3).start()
    shipper.offer(b"{}")
    shipper.offer(b"{}")
    assert finished.wait(WAIT)
    shipper.close()
    assert len(attempts) == 3 and counted("dropped_failed") - failed_before == 2


def test_an_oversized_event_is_dropped_not_buffered():
    shipper = _shipper(lambda endpoint, body: 200, buffer_max_bytes=1024)
    before = counted("dropped_buffer_full")
    shipper.offer(b"x" * 2000)
    assert shipper.buffered() == (0, 0)
    assert counted("dropped_buffer_full") - before == 1


@pytest.mark.parametrize("text", ["X-Tenant: acme\nInjected\r\nHost: evil", "Bad Name: v", "X-Empty:",
                                  "X-Ctl: a\x1bb"])
def test_a_headers_file_that_could_inject_a_header_is_refused(tmp_path, text):
    path = tmp_path / "headers"
    path.write_bytes(text.encode())
    with pytest.raises(ToolAuthzError, match=r"^decision_log\.http\.headers_file: line \d+ is not `Name: value`$"):
        read_headers(path)


def test_headers_are_read_from_a_file(tmp_path):
    path = tmp_path / "headers"
    path.write_text("# the receiver's tenant\nX-Tenant: acme\n\nX-Api-Key: k-123\n")
    assert read_headers(path) == {"X-Tenant": "acme", "X-Api-Key": "k-123"}


@pytest.mark.parametrize("url", ["http://198.51.100.7/decisions", "ftp://127.0.0.1/", "/relative"])
def test_plain_http_off_loopback_is_refused_at_start(url):
    with pytest.raises(ToolAuthzError, match=r"^decision_log\.http\.url: "):
        configure_decision_log(DecisionLogSettings(http=DecisionLogHttpSettings(url=url)))


def test_an_input_with_a_lone_surrogate_still_ships(tmp_path):
    """Arguments are copied as json.loads reads them; an escaped lone surrogate must not
    turn shipping into an exception on the decision path."""
    got: list[bytes] = []
    decision_log.configure({"t": ("a",)}, ship=got.append)
    decision_log.record(decision_id="d", tenant="acme", principal='User::"a"', request_id="r", call_id="c", tool="t",
                        result="deny", reasons=(), errors=("invalid_input",), policy_version="v", seconds=0.001,
                        caller="", transport="grpc", replayed=False, input_json=b'{"a": "\\ud800"}')
    assert json.loads(got[0])["arguments"] == {"a": "\ud800"}
