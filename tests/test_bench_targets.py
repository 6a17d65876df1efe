"""`python -m bench.targets` (issue 42's three outside measures) runs end to end and
reports each figure beside its target; the round trips are counted through the delay
proxy on PostgreSQL. Only shape is checked here, never timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from bench import timelines
from toolauthz.telemetry import timeline

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the bench reads /proc")


@pytest.fixture(scope="module")
def quick_run(postgres_database):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "bench.targets", "--quick", "--timeline", "--json",
                           "--store", postgres_database], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), done.stderr


def test_round_trips_are_counted_through_the_proxy_per_lone_call(quick_run):
    results, _text = quick_run
    rt = results["runs"][0]["round_trips"]
    assert rt["calls"] == 8 and rt["errors"] == 0
    # Every decision commits through the proxy: at least one round trip each, counted.
    assert len(rt["per_call"]) == 8 and min(rt["per_call"]) >= 1
    assert rt["median"] == sorted(rt["per_call"])[3] and rt["target"] == 1.5
    assert rt["pass"] == (rt["median"] <= 1.5)


def test_the_tail_is_measured_on_both_stores_and_goodput_on_the_default(quick_run):
    results, _text = quick_run
    run = results["runs"][0]
    assert [row["store"] for row in run["tails"]] == ["sqlite", "postgresql"]
    for row in run["tails"]:
        assert row["capacity_per_s"] > 0 and row["offered_per_s"] == pytest.approx(row["capacity_per_s"] / 2)
        assert row["samples"] > 0 and isinstance(row["errors"], dict)  # a loaded machine may shed: no verdict
        assert row["p99_over_p50"] == pytest.approx(row["p99_ms"] / row["p50_ms"])
        assert row["server_cores"] > 0 and row["server_cores_at_max"] > 0
        assert row["pass"] == (row["p99_over_p50"] <= 5)
        # --timeline: the slowest calls' time, cut into segments at the server's marks
        summary = row["timeline"]
        assert summary["calls"] > 0 and summary["slow_calls"] >= 1
        assert set(summary["slow"]) == {name for name, _a, _b in timelines.SEGMENTS}
    assert set(run["goodput"]) == {"sdk", "raw"}  # clients that throttle themselves, then raw ones
    for goodput in run["goodput"].values():
        assert goodput["factor"] == 2.5 and goodput["goodput_ratio"] == pytest.approx(
            goodput["goodput_per_s"] / goodput["capacity_per_s"])
        assert goodput["pass"] == (goodput["goodput_ratio"] >= 0.9) and "p99_ms" in goodput
        assert goodput["sent"] > 0 and goodput["server_cores"] > 0
        assert goodput["capacity_per_s"] == pytest.approx(
            (goodput["capacity_before_per_s"] + goodput["capacity_after_per_s"]) / 2)
        assert goodput["offered_per_s"] == pytest.approx(2.5 * goodput["capacity_before_per_s"])
    assert run["goodput"]["raw"]["throttled_by_clients"] == 0  # raw clients send every call


def test_each_figure_is_printed_beside_its_target(quick_run):
    _results, text = quick_run
    assert "round trips per lone decision (PostgreSQL, 10 ms each way" in text
    assert text.count("p99 at half the maximum (") == 2 and text.count("target <= 5x: ") == 2
    assert "target <= 1.5 at the median: " in text and text.count("target >= 0.9: ") == 1
    assert "raw gRPC clients (no throttle" in text and "the SDKs' clients (default: they throttle" in text
    assert text.count("timeline of the slowest") == 2


def test_timelines_record_nothing_until_a_bench_turns_them_on():
    assert timeline.begin("c1") is None and timeline.drain() == []
    timeline.enable()
    try:
        steps = timeline.begin("c2")
        assert timeline.reached("queued") is steps  # the coroutine's own call
        with timeline.in_batch([steps]):
            timeline.batch_mark("store")
        timeline.batch_mark("stored")  # outside the batch: no call's
        [recorded] = timeline.drain()
        assert recorded["key"] == "c2"
        assert [step for step, _ns in recorded["marks"]] == ["received", "queued", "taken", "store", "answered"]
        assert timeline.drain() == []
    finally:
        timeline.disable()


def _marks(start: int, batch_taken: int, batch_answered: int, inline: bool = False) -> list:
    """A call received at `start` ms, its batch's marks at the given ms (in ns)."""
    ms = 1_000_000
    return [("received", start * ms), ("queued", start * ms + 1), ("inline" if inline else "taken", batch_taken * ms),
            ("planned", batch_taken * ms + 2), ("store", batch_taken * ms + 3), ("stored", batch_answered * ms - 2),
            ("answered", batch_answered * ms), ("resumed", batch_answered * ms + 1),
            ("returned", batch_answered * ms + 2)]


def test_the_summary_cuts_each_call_at_its_marks_and_finds_the_batch_it_waited_behind():
    ms = 1_000_000
    timelines_ = [{"key": "a", "marks": _marks(0, 0, 10)},  # alone in a batch from 0 to 10 ms
                  {"key": "b", "marks": _marks(2, 10, 20)},  # arrived during a's batch, then a batch with c
                  {"key": "c", "marks": _marks(3, 10, 20)},
                  {"key": "warm-up", "marks": _marks(0, 0, 1)}]  # no client record: left out
    by_call = {"a": (0, 11 * ms), "b": (2 * ms, 21 * ms), "c": (3 * ms, 22 * ms)}
    summary = timelines.summarize(timelines_, by_call, share=0.34)
    assert summary["calls"] == 3 and summary["slow_calls"] == 1
    slow = summary["slow"]  # c: the slowest by the client's latency, 19 ms
    assert sum(slow.values()) == pytest.approx(19)
    assert slow["queued, waiting for a batch"] == pytest.approx(7, abs=1e-5)
    assert slow["store write + commit (fsync)"] == pytest.approx(10, abs=1e-5)
    assert summary["slow_batch_size"] == 2 and summary["batch_size_max"] == 2
    # c was due at 3 ms, during a's batch of one (running 0-10 ms): 7 ms of it left
    assert summary["slow_arrived_during"] == {"a decision of 1 call": 1}
    assert summary["slow_running_left_ms"] == pytest.approx(7)
    assert len(timelines.lines(summary)) == len(timelines.SEGMENTS) + 3
