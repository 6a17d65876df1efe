"""The benchmark runs end to end (`python -m bench --quick`) and reports what it promises.
Only shape and correctness are checked here, never timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the workers run needs SO_REUSEPORT")

LATENCY_FIELDS = {"samples", "p50_ms", "p99_ms", "p999_ms", "max_ms", "mean_ms"}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "results.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "bench", "--quick", "--json", str(out),
                           "--data-root", str(out.parent)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout


def test_every_measurement_is_reported(quick_run):
    results, _table = quick_run
    assert {"nproc", "cpu_model", "python"} <= set(results["machine"])
    runs = {(r["server"], r["rpc"], r["workers"], r["concurrency"]) for r in results["runs"]}
    assert {("noop", "authorize", 1, 1), ("noop", "authorize", 1, 4), ("noop", "verify", 1, 4),
            ("sidecar", "authorize", 1, 1), ("sidecar", "authorize", 1, 4), ("sidecar", "verify", 1, 4),
            ("noop", "authorize", 2, 4), ("sidecar", "authorize", 2, 4), ("mtls", "authorize", 1, 4)} <= runs
    assert {r["policies"] for r in results["runs"] if r["server"] == "sidecar"} == {10, 40}
    for row in results["runs"]:
        assert LATENCY_FIELDS | {"throughput_per_s", "calls", "errors", "client_procs", "server_cpu_ms_per_call"} \
            <= set(row)
        assert row["calls"] > 0 and not row["errors"], row
        if (row["server"], row["workers"]) == ("sidecar", 1):  # GetStatus of the one pump
            assert 1 <= row["calls_per_batch"] <= row["concurrency"], row
    assert [(o["server"], o["workers"], o["offered_per_s"], o["target"]) for o in results["open_loop"]] == [
        ("noop", 1, 100, False), ("sidecar", 1, 100, True), ("sidecar", 2, 100, True)]
    for row in results["open_loop"]:
        assert LATENCY_FIELDS | {"achieved_send_per_s", "completed_per_s", "failed_calls"} <= set(row)
    # Each size, then the middle one again with more static entities (a cost that must not grow either).
    assert [(row["policies"], row["static_users"]) for row in results["inproc"]] == [(10, 0), (40, 0), (40, 200)]
    for row in results["inproc"]:
        assert row["decision"] == "ALLOW"
        assert LATENCY_FIELDS | {"cpu_ms_per_call"} <= set(row["decide"])
        assert LATENCY_FIELDS | {"cpu_ms_per_call", "throughput_per_s"} <= set(row["authorizer_4"])
    stages = {s["stage"] for s in results["profile"]["stages"]}
    assert {"authorizer: plan + run", "Cedar evaluate", "token issue (PASETO, Ed25519)"} <= stages


def test_every_audit_record_is_accounted_for(quick_run):
    results, _table = quick_run
    assert [check["server"] for check in results["audit"]] == [
        "sidecar, 10 policies, 1 worker", "sidecar, 40 policies, 1 worker", "mtls, 40 policies, 1 worker",
        "sidecar, 40 policies, 2 workers"]
    for check in results["audit"]:
        assert check["ok"], check
        assert check["authorize"]["responses"] > 0
    assert all(row["audit"]["ok"] for row in results["inproc"])


def test_targets_are_judged_and_printed(quick_run):
    results, table = quick_run
    names = [t["target"] for t in results["targets"]]
    assert len(names) == 6
    assert [n for n in names if n.startswith("Authorize/no-op throughput")] == [
        "Authorize/no-op throughput, 4 in flight, 1 process",
        "Authorize/no-op throughput, 4 in flight, 2 processes each"]
    assert any(n.startswith("Authorize cost at 40 / at 10 policies") for n in names)
    assert sum(n.startswith("Authorize p99 at 100/s offered") for n in names) == 2
    assert any(n.startswith("audit records lost") for n in names)
    assert all(isinstance(t["pass"], bool) for t in results["targets"])
    for section in ("closed loop", "open loop", "in process", "audit check", "where the time goes", "targets"):
        assert section in table
    assert table.count("PASS ") + table.count("FAIL ") == 6


def test_the_script_form_runs_too():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--help"], cwd="/",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--quick" in done.stdout


def test_the_levers_bench_reports_each_figure():
    from bench.levers import measure

    figures = measure(calls=5, repeat=1)
    assert {"validate: is_valid, jsonschema", "validate: is_valid, jsonschema-rs", "digest: call_digest",
            "audit record: event + body + hash", "authorize: in process, 1 at a time"} <= set(figures)
    assert all(us > 0 for us in figures.values()), figures
