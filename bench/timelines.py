"""Where the slowest calls' time went: the server's per-call timelines
(toolauthz/telemetry/timeline.py) joined with the open-loop client's due and answer
times by call id. Both sides read CLOCK_MONOTONIC, so the segments line up across
processes: from the time a call was due to the handler (the client's send, gRPC, and
the event loop busy elsewhere), through the pump's queue and batch, to the client's
answer.

A batch's calls share the times of its batch-wide marks (`taken`, `planned`, `store`,
`stored`, `answered`: one clock read per batch), so the calls with equal `taken` times
were one batch: its size comes from that, and each decision's span on the pump (from
`taken` or `inline` to `answered`) tells what a queued call arrived during."""

from __future__ import annotations

import bisect
from collections import Counter

from bench import stats

# (segment, from step, to step): a call's time from due to answered, cut at its marks.
SEGMENTS = (
    ("due -> handler (client send, gRPC, loop busy)", "due", "received"),
    ("handler -> pump (admission)", "received", "queued"),
    ("queued, waiting for a batch", "queued", "start"),
    ("plan (validate, inputs)", "start", "planned"),
    ("decide (reads, Cedar, token)", "planned", "store"),
    ("store write + commit (fsync)", "store", "stored"),
    ("after the write (finish)", "stored", "answered"),
    ("pump -> loop (wake-up, GIL)", "answered", "resumed"),
    ("handler -> response", "resumed", "returned"),
    ("response -> client (gRPC, client)", "returned", "done"),
)


def _points(marks: list, due: int, done: int) -> dict[str, int]:
    points: dict[str, int] = {"due": due, "done": done}
    for step, ns in marks:
        if step == "store" and step in points:
            continue  # a decision retried in a second round: its first write's start counts
        points[step] = ns
    for step in ("inline", "taken"):  # the decision's start, on the loop or in a batch
        if step in points:
            points["start"] = points[step]
            break
    return points


def summarize(timelines: list[dict], by_call: dict[str, tuple[int, int]], share: float = 0.01) -> dict:
    """The mean of each segment over the slowest `share` of the calls (by the client's
    latency), beside the same for the median calls (40th-60th percentile), and what the
    slow calls arrived during."""
    calls = []
    batches: dict[int, list[int]] = {}  # taken time -> [answered time, size]
    inline: list[tuple[int, int]] = []  # (inline, answered) spans: the loop was deciding
    for t in timelines:
        if t["key"] not in by_call:
            continue  # a warm-up call, or one the client saw fail
        due, done = by_call[t["key"]]
        points = _points(t["marks"], due, done)
        if not all(step in points for _name, a, b in SEGMENTS for step in (a, b)):
            continue  # answered without a decision (refused, shed): not a decision's timeline
        calls.append(points)
        if "inline" in points:
            inline.append((points["inline"], points["answered"]))
        elif "taken" in points:
            batch = batches.setdefault(points["taken"], [points["answered"], 0])
            batch[1] += 1
    if not calls:
        return {"calls": 0}
    calls.sort(key=lambda p: p["done"] - p["due"])
    slow = calls[-max(1, round(len(calls) * share)):]
    middle = calls[int(len(calls) * 0.4):max(int(len(calls) * 0.6), int(len(calls) * 0.4) + 1)]
    spans = sorted([(start, end, size) for start, (end, size) in batches.items()] +
                   [(start, end, 1) for start, end in inline])
    starts = [s for s, _e, _n in spans]

    def during(ns: int) -> tuple[int, float] | None:
        """The decision span running at `ns` (its size, ms left of it), if any."""
        last = bisect.bisect_right(starts, ns)
        for start, end, size in reversed(spans[max(0, last - 4):last]):  # spans barely overlap: a few back
            if start <= ns < end:
                return size, (end - ns) / 1e6
        return None

    def size_of(p: dict) -> int:
        return 1 if "inline" in p else batches[p["taken"]][1]

    def segments(group: list[dict]) -> dict[str, float]:
        return {name: sum(p[b] - p[a] for p in group) / len(group) / 1e6 for name, a, b in SEGMENTS}

    def p99s() -> dict[str, float]:  # each segment's own tail, over every call
        return {name: stats.percentile(sorted(p[b] - p[a] for p in calls), 99) / 1e6 for name, a, b in SEGMENTS}

    arrived: Counter[str] = Counter()
    waited_ms = []
    for p in slow:
        running = during(p["due"])
        if running is None:
            arrived["the pump idle"] += 1
        else:
            arrived[f"a decision of {'1 call' if running[0] == 1 else 'a batch'}"] += 1
            waited_ms.append(running[1])
    sizes = sorted(size_of(p) for p in calls)
    return {"calls": len(calls), "slow_calls": len(slow),
            "slow_latency_ms": (slow[0]["done"] - slow[0]["due"]) / 1e6,
            "slow": segments(slow), "median": segments(middle), "segment_p99": p99s(),
            "slow_inline": sum("inline" in p for p in slow), "all_inline": sum("inline" in p for p in calls),
            "slow_batch_size": sum(size_of(p) for p in slow) / len(slow),
            "batch_size_p50": stats.percentile(sizes, 50), "batch_size_max": sizes[-1],
            "slow_arrived_during": dict(arrived),
            "slow_running_left_ms": sum(waited_ms) / len(waited_ms) if waited_ms else 0.0}


def lines(summary: dict) -> list[str]:
    """The summary as printed under `--timeline`."""
    if not summary.get("calls"):
        return ["    timeline: no decision timelines recorded"]
    slow, middle = summary["slow"], summary["median"]
    out = [f"    timeline of the slowest {summary['slow_calls']} of {summary['calls']} calls (>= "
           f"{summary['slow_latency_ms']:.1f} ms), mean ms per call; the median calls' (40th-60th percentile); "
           "each segment's own p99 over all calls:"]
    total_slow, total_mid = sum(slow.values()), sum(middle.values())
    for name, _a, _b in SEGMENTS:
        out.append(f"      {name:<44} {slow[name]:8.2f} ({slow[name] / total_slow:4.0%})   median calls "
                   f"{middle[name]:6.2f}   p99 {summary['segment_p99'][name]:6.2f}")
    out.append(f"      {'total':<44} {total_slow:8.2f}          median calls {total_mid:6.2f}")
    arrived = ", ".join(f"{n} during {what}" for what, n in sorted(summary["slow_arrived_during"].items()))
    out.append(f"      slow calls: {summary['slow_inline']} decided inline ({summary['all_inline']} of all); "
               f"mean batch {summary['slow_batch_size']:.1f} calls (all: p50 {summary['batch_size_p50']}, max "
               f"{summary['batch_size_max']}); received {arrived}, "
               f"{summary['slow_running_left_ms']:.2f} ms of it left on average")
    return out
