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
    assert {("noop", "authorize", 1, 1), ("noop", "authorize", 1, 4), ("noop", "verify", 1, 1),
            ("noop", "verify", 1, 4), ("sidecar", "authorize", 1, 1), ("sidecar", "authorize", 1, 4),
            ("sidecar", "verify", 1, 4),
            ("noop", "authorize", 2, 4), ("sidecar", "authorize", 2, 4), ("mtls", "authorize", 1, 4)} <= runs
    assert {r["policies"] for r in results["runs"] if r["server"] == "sidecar"} == {10, 40}
    for row in results["runs"]:
        assert LATENCY_FIELDS | {"throughput_per_s", "calls", "errors", "client_procs", "server_cpu_ms_per_call"} \
            <= set(row)
        assert row["calls"] > 0 and not row["errors"], row
        if (row["server"], row["workers"]) == ("sidecar", 1):  # GetStatus of the one pump
            assert 1 <= row["calls_per_batch"] <= row["concurrency"], row
    # The fixed rate, then half of each sidecar's own closed-loop maximum (measured just before).
    assert [(o["server"], o["workers"], o["half_max"]) for o in results["open_loop"]] == [
        ("noop", 1, False), ("sidecar", 1, False), ("sidecar", 1, True), ("sidecar", 2, False), ("sidecar", 2, True)]
    for row in results["open_loop"]:
        top = next((r for r in results["runs"] if (r["server"], r["rpc"], r["workers"], r["concurrency"])
                    == ("sidecar", "authorize", row["workers"], 4) and r["policies"] == 40), None)
        assert row["offered_per_s"] == (round(top["throughput_per_s"] / 2, 1) if row["half_max"] else 100)
    for row in results["open_loop"]:
        assert LATENCY_FIELDS | {"achieved_send_per_s", "completed_per_s", "failed_calls"} <= set(row)
    # Each size, then the middle one again with more static entities (a cost that must not grow either).
    assert [(row["policies"], row["static_users"]) for row in results["inproc"]] == [(10, 0), (40, 0), (40, 200)]
    for row in results["inproc"]:
        assert row["decision"] == "ALLOW"
        assert LATENCY_FIELDS | {"cpu_ms_per_call"} <= set(row["decide"])
        assert LATENCY_FIELDS | {"cpu_ms_per_call", "throughput_per_s"} <= set(row["authorizer_4"])
    modes = results["batch"]["modes"]
    assert list(modes) == ["singles, one after another", "singles, 4 at once", "batch"]
    for row in modes.values():
        assert row["decisions"] == row["allowed"] > 0 and row["cpu_us_per_decision"] > 0
    assert modes["batch"]["commits_per_turn"] == 1
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
    assert names == [
        "Authorize/no-op throughput, 4 in flight, 2 workers vs 2 no-op processes",
        "Authorize/no-op throughput, 4 in flight, 2 workers vs 2 no-op processes (standing goal)",
        "Authorize p50 minus the no-op's, 1 in flight, 1 process (ms)",
        "Verify p50 minus the no-op's, 1 in flight, 1 process (ms)",
        "Authorize p99 at half the maximum rate / p50 at 1 in flight, 1 worker(s)",
        "Authorize p99 at half the maximum rate / p50 at 1 in flight, 2 worker(s)",
        "Authorize cost at 40 / at 10 policies",
        "audit records lost (one record per response)"]
    assert all(isinstance(t["pass"], bool) and "value" in t for t in results["targets"])
    for section in ("closed loop", "open loop", "in process", "audit check", "where the time goes", "targets"):
        assert section in table
    assert table.count("PASS ") + table.count("FAIL ") == len(names)


def bench_cli(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "bench", *map(str, args)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_compare_prints_each_figure_beside_the_saved_runs_and_their_ratio(quick_run, tmp_path):
    results, _table = quick_run
    base = json.loads(json.dumps(results))
    for row in base["runs"]:
        row["throughput_per_s"] *= 2  # the saved run was twice as fast: every ratio of now to it is 0.50
    (tmp_path / "base.json").write_text(json.dumps(base))
    (tmp_path / "now.json").write_text(json.dumps(results))
    out = bench_cli("--results", tmp_path / "now.json", "--compare", tmp_path / "base.json")
    compared = out[out.index("compared with the run of"):].splitlines()[2:]
    per_s = [line.split() for line in compared if ": per s" in line]
    assert len(per_s) == len(results["runs"]) and all(cells[-1] == "0.50" for cells in per_s)
    p50 = [line.split() for line in compared if "in flight: p50 ms" in line]
    assert len(p50) == len(results["runs"]) and all(cells[-1] == "1.00" for cells in p50)
    assert sum(line.lstrip().startswith("target: ") for line in compared) == len(results["targets"])


def test_markdown_prints_one_table_per_question_and_the_targets(quick_run, tmp_path):
    results, _table = quick_run
    (tmp_path / "now.json").write_text(json.dumps(results))
    out = bench_cli("--results", tmp_path / "now.json", "--markdown")
    for title in ("**Targets**", "**Throughput at 4 in flight**", "**Latency at one call in flight**",
                  "**Latency at a fixed offered rate**", "**In process**"):
        assert title in out
    assert out.count("| **PASS** |") + out.count("| **FAIL** |") == len(results["targets"])


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


def test_the_hostile_bench_reports_each_figure(tmp_path):
    from bench.hostile import run_hostile

    results = run_hostile(str(tmp_path), duration=0.3, senders=1, repeats=1, baseline=False)
    loop_cost = {row["case"]: row for row in results["loop_cost"]}
    assert (loop_cost["unauthenticated caller, 4.05 MB batch"]["status"],
            loop_cost["unauthenticated caller, 4.05 MB batch"]["bytes_read"]) == (403, 0)
    assert loop_cost["admitted caller, 4.05 MB batch (over the cap)"]["status"] == 413
    assert loop_cost["admitted caller, the largest batch the cap reads"]["status"] == 400
    assert all(row["loop_stall_ms"] > 0 for row in loop_cost.values())
    assert [row["phase"] for row in results["under_fire"]] == ["quiet", "1 hostile senders"]
    assert all(row["samples"] > 0 and not row["errors"] for row in results["under_fire"])
    assert results["under_fire"][1]["hostile_refused_403"] > 0


def test_the_memory_bench_reports_each_worker_ready_and_after_load(tmp_path):
    from bench.memory import measure

    out = measure(tmp_path, policies=10, workers=1, seconds=0.5)
    assert out["calls"] > 0 and not out["errors"], out
    assert len(out["ready"]) == len(out["after_load"]) == 1
    for figures in (*out["ready"], *out["after_load"]):
        assert 0 < figures["pss_mib"] <= figures["rss_mib"] <= figures["peak_rss_mib"], figures
