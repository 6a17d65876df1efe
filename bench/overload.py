"""Graceful overload (`python -m bench.overload`): one sidecar worker as `serve` runs it
(its decision queue bounded by time, `max_queue_seconds`), 1,000 policies. First its
capacity: the closed-loop Authorize rate at 32 in flight, and the open loop (calls sent
on a fixed schedule, whatever the answers) at half that rate. Then, twice, the open loop
at `--factor` times the capacity measured just before it, and the capacity again just
after (bench/goodput.py, as bench.targets measures it).

Reported, with the targets of issue 31: the goodput at `--factor` x capacity (calls
answered with a decision per second) against the mean of the capacity just before and
just after (at least 0.9), and the p99 of the calls it accepted against their p99 at half
load (at most 5), from clients that throttle themselves as the SDKs do by default
(toolauthz.client.throttle); then the same from raw gRPC clients, which send every call.
Calls refused as RESOURCE_EXHAUSTED (shed, undecided, no token) are counted apart:
shedding them fast is the point. Latency is from each call's scheduled send time to its
answer. Last, the same open loop against the no-op gRPC server: what an RPC costs a
Python gRPC process before any decision, which is also what refusing one costs."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import tempfile
import time

from bench import bundles, goodput, servers, stats

POLICIES = 1000
TARGET_P99_RATIO = 5.0


def measure(root: pathlib.Path, *, duration: float, open_duration: float, factor: float, procs: int,
            queue_seconds: float | None, max_rpcs: int | None = None, max_streams: int | None = None) -> dict:
    bundle = bundles.generate_bundle(root / "bundle", POLICIES)
    loops = goodput.Loops(bundles.tool_count(POLICIES), procs, duration, open_duration)
    settings = {"bundle": str(bundle), "data_dir": str(root / f"data-{time.monotonic_ns()}"),
                "listen": "127.0.0.1:0", "tokens": {"lifetime_seconds": 600}}
    if queue_seconds is not None:
        settings["max_queue_seconds"] = queue_seconds
    if max_streams is not None:
        settings["max_streams_per_connection"] = max_streams
    if max_rpcs is not None:
        settings["max_concurrent_rpcs"] = max_rpcs
        settings["approvals"] = {"max_watches": max(1, max_rpcs // 2)}
    server = servers.start_sidecar(settings)
    try:
        closed = goodput.closed_loop(server, loops)
        capacity = closed.timed_ok / closed.seconds
        print(f"capacity (closed loop, {goodput.CONCURRENCY} in flight): {capacity:.0f}/s, p50 "
              f"{stats.latency_summary(sorted(closed.latencies_ns))['p50_ms']:.1f} ms", flush=True)
        half = goodput.open_loop(server.address, capacity / 2, loops, server.cpu_seconds)
        print(f"half load {half['offered_per_s']:.0f}/s: goodput {half['goodput_per_s']:.0f}/s, p99 "
              f"{half['p99_ms']:.1f} ms, shed {half['shed']}", flush=True)
        runs = {}
        for clients in ("sdk", "raw"):  # throttling themselves as the SDKs do by default, then sending all
            over = runs[clients] = goodput.over_maximum(server, loops, factor, throttle=clients == "sdk")
            print(f"{factor}x load {over['offered_per_s']:.0f}/s from {clients} clients (sent at "
                  f"{over['sent_per_s']:.0f}/s; capacity {over['capacity_before_per_s']:.0f}/s before, "
                  f"{over['capacity_after_per_s']:.0f}/s after): goodput {over['goodput_per_s']:.0f}/s = "
                  f"{over['goodput_ratio']:.2f} of their mean, p50 {over['p50_ms']:.1f} ms, "
                  f"p99 {over['p99_ms']:.1f} ms, shed {over['shed']}, throttled by the clients "
                  f"{over['throttled_by_clients']}, refused by the transport {over['refused_by_transport']}, server "
                  f"cores {over['server_cores']:.2f}, other errors {over['other_errors']}", flush=True)
            print(f"  by second: decided {' '.join(map(str, over['decided_by_second']))}; shed "
                  f"{' '.join(map(str, over['shed_by_second']))}", flush=True)
        over = runs["sdk"]
    finally:
        server.stop()
    noop = servers.start_noop()
    try:  # what any RPC costs this server's kind of process, a refusal included: the floor
        floor = goodput.open_loop(noop.address, over["offered_per_s"], loops, noop.cpu_seconds)
    finally:
        noop.stop()
    floor["server_ms_per_call"] = floor["server_cores"] * 1000 / max(floor["goodput_per_s"], 1e-9)
    print(f"no-op server at the same {floor['offered_per_s']:.0f}/s: p50 {floor['p50_ms']:.1f} ms, p99 "
          f"{floor['p99_ms']:.1f} ms, {floor['server_cores']:.2f} cores, {floor['server_ms_per_call']:.2f} ms of "
          "server CPU per call", flush=True)
    tail = over["p99_ms"] / half["p99_ms"]
    return {"capacity_per_s": capacity, "half": half, "over": over, "over_raw": runs["raw"], "noop": floor,
            "factor": factor, "goodput_ratio": over["goodput_ratio"], "goodput_ratio_raw": runs["raw"]["goodput_ratio"],
            "goodput_pass": over["pass"], "p99_ratio": tail, "p99_pass": tail <= TARGET_P99_RATIO,
            "loadavg": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overload", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of each capacity run")
    parser.add_argument("--open-duration", type=float, default=10.0, help="seconds of each open-loop run")
    parser.add_argument("--factor", type=float, default=2.5, help="the overload, times the capacity")
    parser.add_argument("--procs", type=int, default=2, help="client processes of each loop")
    parser.add_argument("--max-queue-seconds", type=float, default=None,
                        help="the worker's queue bound (default: serve's own)")
    parser.add_argument("--max-concurrent-rpcs", type=int, default=None,
                        help="the worker's max_concurrent_rpcs (default: serve's own)")
    parser.add_argument("--max-streams-per-connection", type=int, default=None,
                        help="the worker's max_streams_per_connection (default: serve's own); the open loop "
                             "uses 8 connections per client process")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    print(f"machine: {json.dumps(stats.machine())}", flush=True)
    with tempfile.TemporaryDirectory(prefix="toolauthz-overload-") as tmp:
        row = measure(pathlib.Path(tmp), duration=args.duration, open_duration=args.open_duration,
                      factor=args.factor, procs=args.procs, queue_seconds=args.max_queue_seconds,
                      max_rpcs=args.max_concurrent_rpcs, max_streams=args.max_streams_per_connection)
    print(f"goodput at {row['factor']}x / capacity: {row['goodput_ratio']:.2f} (>= {goodput.TARGET_GOODPUT}: "
          f"{'PASS' if row['goodput_pass'] else 'FAIL'}); from raw gRPC clients {row['goodput_ratio_raw']:.2f}")
    print(f"accepted p99 at {row['factor']}x / p99 at half load: {row['p99_ratio']:.2f} (<= {TARGET_P99_RATIO}: "
          f"{'PASS' if row['p99_pass'] else 'FAIL'}); load average {row['loadavg']:.1f}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(row, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
