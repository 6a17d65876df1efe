"""Logs an operator can ship: with `--log-format json` every line a real `serve` prints,
on standard output and standard error, is one JSON object (2 workers, the HTTP API and
the console on, a decision log, a refused reload); `--log-level`; the decision log's
fields and its argument allow-list; the banner's store without a password; the default
worker count from the CPU quota."""

from __future__ import annotations

import http.client
import json
import logging
import pathlib
import queue
import signal
import subprocess
import sys
import threading

import grpc
import pytest
from conftest import ROOT, make_request

from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.server.config import Settings
from toolauthz.server.cpu import available_cpus, cgroup_quota
from toolauthz.server.logs import JsonFormatter, TextFormatter
from toolauthz.telemetry import decision_log

LINE_TIMEOUT = 60
HOSTILE_CALL_ID = "toolu_log"


class Serve:
    """`toolauthz serve` in a subprocess; every line of both streams kept, in order."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "toolauthz.cli", "serve", *args], cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[tuple[str, str]] = queue.Queue()
        self.seen: list[tuple[str, str]] = []
        self._readers = [threading.Thread(target=self._read, args=(name, stream), daemon=True)
                         for name, stream in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr))]
        for reader in self._readers:
            reader.start()

    def _read(self, name: str, stream) -> None:
        for line in stream:
            self.lines.put((name, line))
        self.lines.put((name, ""))

    def await_json(self, predicate) -> dict:
        """The next parsed line for which `predicate` holds (every line before it parsed too)."""
        while True:
            name, line = self.lines.get(timeout=LINE_TIMEOUT)
            assert line, f"{name} ended (exit {self.proc.poll()}) first:\n{''.join(x for _, x in self.seen)}"
            self.seen.append((name, line))
            parsed = json.loads(line)
            if predicate(parsed):
                return parsed

    def finish(self) -> list[tuple[str, str]]:
        self.proc.send_signal(signal.SIGTERM)
        try:
            assert self.proc.wait(timeout=60) == 0
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            for reader in self._readers:
                reader.join(30)
            self.proc.stdout.close()
            self.proc.stderr.close()
        while not self.lines.empty():
            name, line = self.lines.get_nowait()
            if line:
                self.seen.append((name, line))
        return self.seen


def test_every_line_of_a_json_serve_run_is_one_json_object(tmp_path, bundle_dir):
    config = tmp_path / "toolauthz.yaml"
    config.write_text(json.dumps({
        "bundle": str(bundle_dir), "data_dir": str(tmp_path / "data"), "listen": "127.0.0.1:0",
        "http_listen": "127.0.0.1:0", "console_listen": "127.0.0.1:0", "metrics_listen": "127.0.0.1:0",
        "generate_missing_keys": True, "reload_poll_seconds": 0,
        "decision_log": {"enabled": True, "arguments": {"issue_refund": ["amount_cents"]}}}))
    serve = Serve("--config", str(config), "--workers", "2", "--log-format", "json")
    try:
        serving = serve.await_json(lambda x: x["message"].startswith("toolauthz serving bundle"))
        assert serving["logger"] == "toolauthz.banner" and serving["workers"] == 2 and len(serving["pids"]) == 2
        assert serving["store"] == f"sqlite://{tmp_path / 'data' / 'toolauthz.db'}"
        console = serve.await_json(lambda x: "console_url" in x)["console_url"]
        port = int(serving["listen"][0].rsplit(":", 1)[1])
        http_port = int(serving["http_listen"][0].rsplit(":", 1)[1])

        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            answer = pb_grpc.ToolAuthorizerStub(channel).Authorize(make_request(call_id=HOSTILE_CALL_ID), timeout=30)
        assert answer.decision == pb.ALLOW
        decided = serve.await_json(lambda x: x["logger"] == "toolauthz.decision")
        assert (decided["decision_id"], decided["call_id"], decided["tool"], decided["result"], decided["tenant"],
                decided["transport"], decided["arguments"]) == \
            (answer.decision_id, HOSTILE_CALL_ID, "issue_refund", "allow", "acme", "grpc", {"amount_cents": 1500})
        assert decided["policy_version"] == answer.policy_version and decided["reasons"] == list(answer.reasons)
        assert "ord_1" not in json.dumps(decided)  # not allow-listed: never logged

        body = json.dumps({"context": {"tenant": "acme", "principal": {"type": "User", "id": "alice"},
                                       "request_id": "run-1"},
                           "call": {"call_id": "toolu_http", "name": "issue_refund",
                                    "input": {"order_id": "ord_1", "amount_cents": 1}}})
        connection = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)
        connection.request("POST", "/v1/authorize", body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200, response.read()
        response.read()
        connection.close()
        assert serve.await_json(lambda x: x.get("call_id") == "toolu_http")["transport"] == "http"
        host, console_port = console.removeprefix("http://").rstrip("/").rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(console_port), timeout=30)
        connection.request("GET", "/signin")
        assert connection.getresponse().status == 200
        connection.close()

        (bundle_dir / "broken.cedar").write_text("permit(principal, action, resource) when { nope };\nforbid(")
        for pid in serving["pids"]:
            import os
            os.kill(pid, signal.SIGHUP)
        refused = serve.await_json(lambda x: x["message"].startswith("bundle reload refused"))
        assert isinstance(refused["problems"], list) and refused["problems"]
        assert all("\n" not in problem for problem in refused["problems"])
    finally:
        seen = serve.finish()
    assert {name for name, _ in seen} == {"stdout", "stderr"}
    for name, line in seen:
        parsed = json.loads(line)  # every line, both streams
        assert isinstance(parsed, dict) and {"time", "level", "logger", "message"} <= parsed.keys(), (name, line)
    lines = [line for _, line in seen]
    assert len(lines) == len(set(lines)), "a line written twice (a second handler)"
    # uvicorn's "Started server process" says less than the banner: only its warnings show.
    assert not [line for line in lines if json.loads(line)["logger"].startswith("uvicorn")]


def test_a_refused_start_is_a_json_line_too(tmp_path, bundle_dir):
    (bundle_dir / "broken.cedar").write_text("forbid(")
    proc = subprocess.run([sys.executable, "-m", "toolauthz.cli", "serve", "--bundle", str(bundle_dir),
                           "--data-dir", str(tmp_path), "--listen", "127.0.0.1:0", "--workers", "1",
                           "--log-format", "json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    lines = [json.loads(line) for line in (proc.stdout + proc.stderr).splitlines()]
    assert lines and lines[-1]["level"] == "ERROR" and lines[-1]["problems"]


def test_log_level_hides_what_is_below_it(tmp_path, bundle_dir):
    proc = subprocess.run([sys.executable, "-m", "toolauthz.cli", "serve", "--bundle", str(bundle_dir),
                           "--data-dir", str(tmp_path), "--listen", "127.0.0.1:0", "--workers", "1",
                           "--log-level", "error", "--log-format", "json", "--store", "nonsense://x"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    with pytest.raises(Exception):  # noqa: B017 - an invalid store URL is refused by the config
        Settings(store="nonsense://x")
    # The warning about the generated development key (WARNING) is below `error`.
    assert "development" not in proc.stderr


def _record(name: str, message: str, **fields) -> logging.LogRecord:
    record = logging.LogRecord(name, logging.ERROR, __file__, 1, message, (), None)
    record.__dict__.update(fields)
    return record


def test_a_multi_line_error_is_a_list_field_in_json_and_escaped_items_in_text():
    record = _record("toolauthz.reload", "bundle reload refused", problems=["a.cedar:1: bad\nforged", "b"])
    parsed = json.loads(JsonFormatter(worker=0).format(record))
    assert parsed["problems"] == ["a.cedar:1: bad\nforged", "b"] and parsed["worker"] == 0
    text = TextFormatter("%(message)s").format(record)
    assert text == "bundle reload refused: a.cedar:1: bad\\nforged; b" and "\n" not in text


def test_an_exception_is_a_list_of_lines_in_json():
    try:
        raise ValueError("first\nsecond")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = JsonFormatter().format(record)
    assert "\n" not in line and isinstance(json.loads(line)["exc_info"], list)


def test_the_decision_log_is_off_by_default_and_never_logs_arguments_not_allowed(caplog):
    def one(tool: str) -> None:
        decision_log.record(decision_id="01J", tenant="acme", principal='User::"a"', request_id="r", call_id="c",
                            tool=tool, result="allow", reasons=["p1"], errors=[], policy_version="v",
                            seconds=0.001, caller="", transport="grpc", replayed=False,
                            input_json=b'{"amount_cents": 5, "secret": "s3cret"}')
    logging.getLogger("toolauthz.decision").setLevel(logging.WARNING)
    one("issue_refund")
    assert not [r for r in caplog.records if r.name == "toolauthz.decision"]
    caplog.set_level(logging.INFO, logger="toolauthz.decision")
    decision_log.configure({"issue_refund": ["amount_cents"]})
    try:
        one("issue_refund")
        one("other_tool")
    finally:
        decision_log.configure({})
    first, second = [r for r in caplog.records if r.name == "toolauthz.decision"]
    assert first.arguments == {"amount_cents": 5} and not hasattr(second, "arguments")
    assert "s3cret" not in caplog.text


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://app:hunter2@db.example:5432/toolauthz?sslmode=require&password=x",
     "postgresql://app@db.example:5432/toolauthz"),
    ("postgresql://db/toolauthz", "postgresql://db/toolauthz"),
    ("sqlite:///var/lib/toolauthz/toolauthz.db", "sqlite:///var/lib/toolauthz/toolauthz.db")])
def test_the_banner_names_the_store_never_its_password(url, shown):
    assert Settings(store=url).store_shown == shown


def _cgroup(tmp_path: pathlib.Path, levels: dict[str, str]) -> tuple[pathlib.Path, pathlib.Path]:
    root = tmp_path / "cgroup"
    for relative, cpu_max in levels.items():
        directory = root / relative if relative else root
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cpu.max").write_text(cpu_max + "\n")
    proc = tmp_path / "proc_cgroup"
    proc.write_text("0::/kubepods/pod1/sidecar\n")
    (root / "kubepods/pod1/sidecar").mkdir(parents=True, exist_ok=True)
    return root, proc


def test_workers_default_to_the_cgroup_cpu_quota(tmp_path, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(32)))
    root, proc = _cgroup(tmp_path, {"": "max 100000", "kubepods/pod1": "150000 100000"})
    assert cgroup_quota(root, proc) == 2  # 1.5 CPUs, rounded up
    assert available_cpus(root, proc) == 2
    root, proc = _cgroup(tmp_path / "b", {"kubepods/pod1": "400000 100000", "kubepods/pod1/sidecar": "50000 100000"})
    assert available_cpus(root, proc) == 1  # the tightest level; at least 1
    root, proc = _cgroup(tmp_path / "c", {"": "max 100000"})
    assert cgroup_quota(root, proc) is None and available_cpus(root, proc) == 32


def test_workers_fall_back_to_the_affinity_mask(tmp_path, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 3, 5})
    assert available_cpus(tmp_path / "absent", tmp_path / "absent") == 3


def test_the_otlp_exporter_is_installed_and_tracing_exporter_otlp_records_spans(caplog, monkeypatch):
    """The runtime lock carries the OTLP/gRPC exporter, so `tracing.exporter: otlp` turns
    spans on rather than warning that the exporter is missing."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    from toolauthz.server.config import TracingSettings
    from toolauthz.server.observability import configure_tracing
    from toolauthz.telemetry import tracing

    made: list[OTLPSpanExporter] = []
    real_init = OTLPSpanExporter.__init__

    def recording_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(OTLPSpanExporter, "__init__", recording_init)
    try:
        configure_tracing(TracingSettings(exporter="otlp", endpoint="http://127.0.0.1:1"))
        assert tracing.enabled() and len(made) == 1
        assert "not installed" not in caplog.text
    finally:
        tracing.use_tracer_provider(None)
