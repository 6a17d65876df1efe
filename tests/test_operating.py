"""Operating a sidecar: /metrics and GetStatus over all workers, traces, JSON logs, drain."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
import threading
import time
import urllib.request

import grpc
import pytest
from conftest import hold_ledger_writes, make_request, verify_request
from grpc_health.v1 import health_pb2, health_pb2_grpc
from test_workers import START_TIMEOUT, Workers

from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.server.config import DATABASE_FILE
from toolauthz.server.logs import JsonFormatter
from toolauthz.store import SqliteAuditLog
from toolauthz.telemetry import tracing

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_REUSEPORT is Linux")


def wait_for(condition, what: str, timeout: float = START_TIMEOUT):
    """Poll `condition` until it returns something truthy (the other workers publish
    their status and metrics on their own threads)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the Prometheus text, 0 when absent."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        metric, _, value = line.rpartition(" ")
        got = dict(re.findall(r'(\w+)="([^"]*)"', metric))
        if metric.split("{")[0] == name and got == labels:
            return float(value)
    return 0.0


# -- metrics and status, two workers -------------------------------------------------------

@linux_only
def test_metrics_and_status_cover_every_worker(bundle_dir, tmp_path, monkeypatch):
    run_root = tmp_path / "tmp"
    run_root.mkdir()
    monkeypatch.setenv("TMPDIR", str(run_root))  # where the parent makes its run directory
    data = tmp_path / "data"
    config = tmp_path / "toolauthz.yaml"
    config.write_text(json.dumps({"bundle": str(bundle_dir), "listen": "127.0.0.1:0", "data_dir": str(data),
                                  "generate_missing_keys": True, "metrics_listen": "127.0.0.1:0",
                                  "log_format": "json", "drain_grace_seconds": 5}))
    workers = Workers("--config", str(config), "--workers", "2")
    try:
        pids = workers.wait_serving()
        serving = next(x for x in workers.out if "serving" in x)
        port = int(re.search(r"on 127\.0\.0\.1:(\d+),", serving).group(1))
        metrics_url = re.search(r"metrics on (http://[^\s\"]+)", workers.await_line("metrics on")).group(1)
        assert [p.name for p in run_root.iterdir()][0].startswith("toolauthz-run-")

        # One channel is one connection, held by one worker: find a channel per worker.
        by_worker: dict[int, pb_grpc.ToolAuthorizerStub] = {}
        channels = []
        while len(by_worker) < 2:
            assert len(channels) < 64, "the kernel never spread connections over both workers"
            channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
            channels.append(channel)
            stub = pb_grpc.ToolAuthorizerStub(channel)
            by_worker.setdefault(stub.GetStatus(pb.GetStatusRequest(), timeout=10).answered_by_pid, stub)
        assert set(by_worker) == set(pids)
        first, second = (by_worker[pid] for pid in pids)

        for i in range(4):
            assert first.Authorize(make_request(call_id=f"a_{i}", request_id=f"r{i}"), timeout=10).decision == pb.ALLOW
        request = make_request(call_id="b_0", request_id="rb")
        allowed = second.Authorize(request, timeout=10)
        assert allowed.decision == pb.ALLOW
        assert second.Verify(verify_request(request, allowed.token), timeout=10).code == "ok"
        # A tool name the catalog lacks is counted as `unknown`, never under the model's string.
        odd = second.Authorize(make_request(tool="drop_tables\nnow", call_id="b_1", request_id="rb"), timeout=10)
        assert odd.decision == pb.DENY

        text = wait_for(lambda: (t := scrape(metrics_url)) and
                        sample(t, "toolauthz_decisions_total", tool="issue_refund", result="allow",
                                          transport="grpc") == 5 and t,
                        "the decisions of both workers in /metrics")
        assert sample(text, "toolauthz_decisions_total", tool="unknown", result="deny", transport="grpc") == 1
        assert sample(text, "toolauthz_verifications_total", code="ok", transport="grpc") == 1
        assert sample(text, "toolauthz_rpc_duration_seconds_count", rpc="Authorize", transport="grpc") == 6
        assert sample(text, "toolauthz_policy_info", version=allowed.policy_version) == 1
        assert sample(text, "toolauthz_audit_write_duration_seconds_count") >= 1
        assert "drop_tables" not in text and "a_0" not in text and "alice" not in text and "acme" not in text

        # Every worker answers for all of them, whichever takes the call.
        def both_report_seven():
            answers = [stub.GetStatus(pb.GetStatusRequest(), timeout=10) for stub in (first, second)]
            return answers if all(a.decisions == 7 for a in answers) else None  # 6 Authorize + 1 Verify

        answers = wait_for(both_report_seven, "every worker's decisions in GetStatus")
        for answer in answers:
            assert {w.pid: w.decisions for w in answer.workers} == {pids[0]: 4, pids[1]: 3}
            assert answer.policy_version == allowed.policy_version
        assert {a.answered_by_pid for a in answers} == set(pids)
        for channel in channels:
            channel.close()

        workers.proc.send_signal(signal.SIGTERM)
        assert workers.wait(60) == 0, "\n".join(workers.err)
    finally:
        workers.kill()
    assert list(run_root.iterdir()) == []  # the run directory is removed at exit
    # Every line the workers and the parent logged is one JSON object.
    logged = [json.loads(line) for line in workers.err if line.strip()]
    assert any(line["message"].startswith("draining") and line["worker"] in (0, 1) for line in logged)
    audit = SqliteAuditLog(str(data / DATABASE_FILE))
    try:
        count, _head = audit.head()
        assert audit.checkpoints()[-1].count == count  # the drains' final checkpoint
    finally:
        audit.close()


# -- traces ----------------------------------------------------------------------------------

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"


@pytest.mark.parametrize("calls_before", [0, 8], ids=["on the pump", "inline, on the loop"])
def test_one_authorize_is_a_span_tree_of_its_steps_in_the_callers_trace(spans, stub, sidecar, calls_before):
    for i in range(calls_before):  # lone calls: after 8 of them the pump decides the next on the loop
        stub.Authorize(make_request(call_id=f"before_{i}", request_id=f"before-{i}"), timeout=10)
    request = make_request()
    response = stub.Authorize(request, timeout=10,
                              metadata=[("traceparent", f"00-{TRACE_ID}-{PARENT_SPAN}-01")])
    assert response.decision == pb.ALLOW
    assert sidecar.pump.inlined == (1 if calls_before else 0)
    finished = spans.get_finished_spans()
    rpc = next(s for s in finished if s.name == "toolauthz.Authorize" and
               format(s.context.trace_id, "032x") == TRACE_ID)
    assert format(rpc.context.trace_id, "032x") == TRACE_ID
    assert format(rpc.parent.span_id, "016x") == PARENT_SPAN
    assert rpc.attributes["toolauthz.decision_id"] == response.decision_id
    assert rpc.attributes["toolauthz.tool"] == "issue_refund"
    assert rpc.attributes["toolauthz.result"] == "allow"
    children = {s.name: s for s in finished if s.parent is not None and s.parent.span_id == rpc.context.span_id}
    assert set(children) == {"validate", "evaluate", "sign", "store"}
    assert all(s.context.trace_id == rpc.context.trace_id for s in children.values())
    # No argument value, principal or tenant in any attribute.
    values = {str(v) for s in finished for v in (s.attributes or {}).values()}
    assert not values & {"ord_1", "1500", "alice", "acme", "toolu_1", "run-1"}


def test_the_sdk_sends_the_current_trace_context(spans, server):
    from opentelemetry import trace

    from toolauthz.client import AuthzClient

    _srv, port = server
    caller = trace.get_tracer("runtime", tracer_provider=_provider_of(spans))
    with caller.start_as_current_span("agent step") as step, AuthzClient(f"127.0.0.1:{port}") as client:
        request = make_request(call_id="toolu_sdk")
        client.authorize(request.context, request.call)
    rpc = next(s for s in spans.get_finished_spans() if s.name == "toolauthz.Authorize")
    assert rpc.context.trace_id == step.get_span_context().trace_id
    assert rpc.parent.span_id == step.get_span_context().span_id


def _provider_of(exporter):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def test_no_spans_once_tracing_is_off(spans, stub):
    tracing.use_tracer_provider(None)
    assert not tracing.enabled() and tracing.current() is None
    assert stub.Authorize(make_request(), timeout=10,
                          metadata=[("traceparent", f"00-{TRACE_ID}-{PARENT_SPAN}-01")]).decision == pb.ALLOW
    assert spans.get_finished_spans() == ()


# -- JSON logs ---------------------------------------------------------------------------------

def test_a_json_log_line_keeps_every_value_exactly_and_on_one_line():
    hostile = 'ord"1\\\n\x1b[8m\u202e'
    record = logging.LogRecord("toolauthz.decision", logging.WARNING, __file__, 1, "refused %s", (hostile,), None)
    record.__dict__.update(decision_id="01J", request_id="run-1", call_id="toolu_1", tool="issue_refund",
                           result="deny")
    line = JsonFormatter(worker=1).format(record)
    assert "\n" not in line and "\x1b" not in line and line.isascii()
    parsed = json.loads(line)
    assert parsed["message"] == f"refused {hostile}"
    assert (parsed["level"], parsed["worker"], parsed["decision_id"], parsed["request_id"], parsed["call_id"],
            parsed["tool"], parsed["result"]) == ("WARNING", 1, "01J", "run-1", "toolu_1", "issue_refund", "deny")
    assert parsed["time"].endswith("+00:00")


def test_each_decision_logs_its_ids_never_its_arguments(stub, caplog):
    caplog.set_level(logging.DEBUG, logger="toolauthz.decision")
    response = stub.Authorize(make_request(call_id="toolu_log"), timeout=10)
    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records if r.name == "toolauthz.decision"]
    assert len(lines) == 1
    assert (lines[0]["decision_id"], lines[0]["call_id"], lines[0]["tool"], lines[0]["result"]) == \
        (response.decision_id, "toolu_log", "issue_refund", "allow")
    assert "ord_1" not in json.dumps(lines) and "1500" not in json.dumps(lines)


# -- drain -------------------------------------------------------------------------------------

def test_drain_finishes_the_call_in_flight_refuses_new_ones_and_signs_a_final_checkpoint(
        sidecar, monkeypatch, tmp_path):
    from toolauthz.server.build import create_server
    from toolauthz.server.serving import Serving
    from toolauthz.server.workers import drain

    sidecar.settings = sidecar.settings.model_copy(update={"drain_grace_seconds": 30})
    server, port = create_server(sidecar, "127.0.0.1:0")
    serving = Serving((server,), (f"127.0.0.1:{port}",))
    entered, release = hold_ledger_writes(monkeypatch, sidecar)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ToolAuthorizerStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        in_flight = stub.Authorize.future(make_request(call_id="toolu_held"), timeout=60)
        assert entered.wait(30)
        drained = threading.Thread(target=drain, args=(serving, sidecar))
        drained.start()

        def refused():
            try:
                health.Check(health_pb2.HealthCheckRequest(), timeout=5)
            except grpc.RpcError as exc:
                return exc.code() == grpc.StatusCode.UNAVAILABLE
            return False

        wait_for(refused, "the server to refuse new calls", timeout=30)
        with pytest.raises(grpc.RpcError) as new_call:
            stub.Authorize(make_request(call_id="toolu_late"), timeout=5)
        assert new_call.value.code() == grpc.StatusCode.UNAVAILABLE
        assert not in_flight.done()
        release.set()
        answer = in_flight.result(timeout=30)
    drained.join(60)
    assert not drained.is_alive()
    assert answer.decision == pb.ALLOW and answer.token
    assert sidecar.closed
    audit = SqliteAuditLog(str(sidecar.settings.database_path))
    try:
        count, _head = audit.head()
        calls = [r.event.call_id for r in audit.iter_records() if r.event.kind != "bundle"]
        assert calls == ["toolu_held"]  # the late call left no trace
        assert audit.checkpoints()[-1].count == count  # the final checkpoint covers it
    finally:
        audit.close()


def test_the_run_directory_is_removed_and_the_environment_restored():
    from toolauthz.server.observability import MULTIPROC_ENV, RunDirectory

    before = os.environ.get(MULTIPROC_ENV)
    run = RunDirectory.create()
    assert os.environ[MULTIPROC_ENV] == str(run.metrics) and run.status.is_dir()
    run.close()
    assert not run.path.exists() and os.environ.get(MULTIPROC_ENV) == before
