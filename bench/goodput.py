"""Goodput under overload, as bench.overload and bench.targets both measure it.

A sidecar's maximum is its closed-loop Authorize rate at CONCURRENCY calls in flight. An
open loop sends calls on a fixed schedule, whatever the answers, at `factor` times the
maximum measured just before it; its goodput (calls answered with a decision per second)
is divided by the mean of the maximum measured just before and just after it: a 2-core
VM's speed drifts by tens of percent within minutes, and a maximum measured a run earlier
would make that drift the figure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench import load, stats

CONCURRENCY = 32
TARGET_GOODPUT = 0.9


@dataclass(frozen=True)
class Loops:
    """What the loops send (`tools`, from `procs` client processes) and for how long."""

    tools: int
    procs: int
    closed_seconds: float
    open_seconds: float


def closed_loop(server, loops: Loops) -> load.RunResult:
    """The closed loop that measures the maximum: CONCURRENCY Authorize calls in flight."""
    return load.closed_loop(server.address, rpc="authorize", concurrency=CONCURRENCY, procs=loops.procs,
                            duration=loops.closed_seconds, tools=loops.tools,
                            prefix=f"max{time.monotonic_ns() % 10**9}", max_calls=10**6, cpu=server.cpu_seconds)


def maximum(server, loops: Loops) -> float:
    closed = closed_loop(server, loops)
    return closed.timed_ok / closed.seconds


def open_loop(address: str, rate: float, loops: Loops, cpu=None, throttle: bool = False) -> dict:
    """An open loop at `rate` for `loops.open_seconds`, summarized. Calls refused as
    RESOURCE_EXHAUSTED (shed, undecided, no token) are counted apart from the goodput:
    shedding them fast is the point."""
    result = load.open_loop(address, rate=rate, duration=loops.open_seconds, procs=loops.procs, tools=loops.tools,
                            prefix=f"ov{time.monotonic_ns() % 10**9}", cpu=cpu, throttle=throttle)
    shed = sum(n for k, n in result.errors.items() if k.endswith("RESOURCE_EXHAUSTED"))
    throttled = result.errors.get("authorize:THROTTLED", 0)
    # With max_streams_per_connection: what a client sent over its connection's limit is
    # refused by the transport, unprocessed (REFUSED_STREAM, seen as UNAVAILABLE).
    refused = sum(n for k, n in result.errors.items() if k.endswith("UNAVAILABLE"))
    other = {k: n for k, n in result.errors.items()
             if not k.endswith(("RESOURCE_EXHAUSTED", "UNAVAILABLE", "THROTTLED"))}
    seconds = range(max((second for second, _ in result.series), default=-1) + 1)
    return {"offered_per_s": rate, "sent": result.sent, "goodput_per_s": result.timed_ok / loops.open_seconds,
            # by the second of the schedule they were answered in: the start, the balance, the drain
            "decided_by_second": [result.series[(second, "ok")] for second in seconds],
            "shed_by_second": [result.series[(second, "RESOURCE_EXHAUSTED")] for second in seconds],
            "sent_per_s": result.sent / max(result.send_end - result.start, 1e-9),
            "server_cores": result.server_cpu_seconds / max(result.seconds, 1e-9),
            "shed": shed, "throttled_by_clients": throttled, "refused_by_transport": refused, "other_errors": other,
            **stats.latency_summary(sorted(result.latencies_ns))}


def over_maximum(server, loops: Loops, factor: float, *, throttle: bool) -> dict:
    """The open loop at `factor` times the maximum, its goodput over the mean of the
    maximum just before and just after. `throttle`: clients that throttle themselves as
    the SDKs do by default (the target applies to them), else raw gRPC clients."""
    before = maximum(server, loops)
    over = open_loop(server.address, before * factor, loops, server.cpu_seconds, throttle=throttle)
    after = maximum(server, loops)
    capacity = (before + after) / 2
    ratio = over["goodput_per_s"] / capacity
    return {"factor": factor, "capacity_per_s": capacity, "capacity_before_per_s": before,
            "capacity_after_per_s": after, **over, "goodput_ratio": ratio,
            "target": TARGET_GOODPUT, "pass": ratio >= TARGET_GOODPUT}
