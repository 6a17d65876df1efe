"""Issue 42's three outside measures as one command (`python -m bench.targets`), each
printed with its target beside the figure:

1. Round trips per lone decision on PostgreSQL: a sidecar (as `serve` runs it) on a fresh
   schema, reached through `DelayProxy` with 10 ms each way; one Authorize at a time and,
   per call, the round trips its database connections waited for (the delta of the
   proxy's `waves` across the call). Target: at most 1.5 at the median.
2. p99 at half the maximum: the closed-loop maximum (32 in flight), then an open loop at
   half that rate; p50, p99 and p99/p50 (target: at most 5), on SQLite and, with
   `--store postgresql://...`, on PostgreSQL (direct, no proxy).
3. Goodput at 2.5x: the open loop at 2.5 times the maximum against the default
   configuration (bench/goodput.py, as bench/overload.py runs it, on the SQLite server of
   2.), goodput over the mean of its maximum measured just before and just after, and
   the accepted calls' p99, twice: with clients that throttle themselves as the SDKs do by default
   (toolauthz.client.throttle; target: at least 0.9), then with raw gRPC clients that
   send every call (no target: refusing in a Python gRPC process costs what a no-op RPC
   costs, docs/performance.md).

`--timeline` records each half-load call's timeline in the server and prints where the
slowest 1% spent their time (bench/timelines.py). Latency is from each call's due time
(open loop) or its send (round trips) to its answer.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from bench import bundles, goodput, load, overload, servers, stats, timelines
from bench.delay_proxy import DelayProxy
from bench.goodput import CONCURRENCY
from bench.stores import fresh_schema

TARGET_ROUND_TRIPS = 1.5
TARGET_TAIL = 5.0
FACTOR = 2.5
DELAY = 0.010  # seconds each way: a database in another zone


@dataclass(frozen=True)
class Plan:
    """How long each part runs (`--quick`: a smoke test's seconds)."""

    policies: int = overload.POLICIES
    closed_seconds: float = 5.0
    open_seconds: float = 10.0
    lone_calls: int = 40
    warmup_calls: int = 10
    procs: int = 2


QUICK = Plan(policies=40, closed_seconds=1.0, open_seconds=1.5, lone_calls=8, warmup_calls=3, procs=1)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _through(url: str, port: int) -> str:
    """`url` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    user = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{user + '@' if user else ''}127.0.0.1:{port}"))


def round_trips(url: str, root: pathlib.Path, plan: Plan) -> dict:
    """Measure 1: per lone Authorize, the round trips the sidecar's connections waited for."""
    import grpc

    from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

    scoped, drop = fresh_schema(url)
    target = urlsplit(url)
    proxy = DelayProxy((target.hostname or "127.0.0.1", target.port or 5432), DELAY)
    bundle = bundles.generate_bundle(root / "bundle-rt", plan.policies)
    settings = {"bundle": str(bundle), "data_dir": str(root / f"data-rt-{time.monotonic_ns()}"),
                "listen": "127.0.0.1:0", "tokens": {"lifetime_seconds": 600}, "store": _through(scoped, proxy.port)}
    waves: list[int] = []
    millis: list[float] = []
    errors = 0
    try:
        server = servers.start_sidecar(settings)
        try:
            make = load._request_maker({"tools": bundles.tool_count(plan.policies),
                                        "prefix": f"rt{time.monotonic_ns() % 10**9}"})
            with grpc.insecure_channel(server.address) as channel:
                authorize = channel.unary_unary(load.AUTHORIZE)
                for n in range(plan.warmup_calls + plan.lone_calls):
                    payload = make(n).SerializeToString()
                    before, began = proxy.waves, time.perf_counter()
                    try:
                        good, _response = load._check_authorize(authorize(payload, timeout=load.CALL_TIMEOUT), pb)
                    except grpc.RpcError:
                        good = False
                    if n < plan.warmup_calls:
                        continue
                    if not good:
                        errors += 1
                        continue
                    millis.append((time.perf_counter() - began) * 1000)
                    waves.append(proxy.waves - before)
        finally:
            server.stop()
    finally:
        proxy.close()
        drop()
    waves.sort()
    millis.sort()
    median = stats.percentile(waves, 50)
    return {"delay_ms_each_way": DELAY * 1000, "calls": len(waves), "errors": errors, "per_call": waves,
            "median": median, "p90": stats.percentile(waves, 90), "p50_ms": stats.percentile(millis, 50),
            "target": TARGET_ROUND_TRIPS, "pass": median <= TARGET_ROUND_TRIPS}


def half_load(store: str, root: pathlib.Path, plan: Plan, *, overloaded: bool, timeline: bool) -> dict:
    """Measures 2 and (`overloaded`) 3 on one sidecar with the default configuration."""
    drop = None
    bundle = bundles.generate_bundle(root / f"bundle-{plan.policies}", plan.policies)
    tools = bundles.tool_count(plan.policies)
    loops = goodput.Loops(tools, plan.procs, plan.closed_seconds, plan.open_seconds)
    settings = {"bundle": str(bundle), "data_dir": str(root / f"data-{time.monotonic_ns()}"),
                "listen": "127.0.0.1:0", "tokens": {"lifetime_seconds": 600}}
    if store != "sqlite":
        settings["store"], drop = fresh_schema(store)
    tag = f"{time.monotonic_ns() % 10**9}"
    # The previous measure's files (a SQLite sidecar's database and WAL) are still being
    # written back by the kernel for up to 30 s; their I/O would land in this measure's fsyncs.
    os.sync()
    try:
        server = servers.start_sidecar(settings, timelines=timeline)
        try:
            closed = goodput.closed_loop(server, loops)
            capacity = closed.timed_ok / closed.seconds
            if timeline:
                server.timelines()  # forget the closed loop's
            half = load.open_loop(server.address, rate=capacity / 2, duration=plan.open_seconds, procs=plan.procs,
                                  tools=tools, prefix=f"half{tag}", by_call=timeline, cpu=server.cpu_seconds)
            row = {"store": "sqlite" if store == "sqlite" else "postgresql", "capacity_per_s": capacity,
                   "offered_per_s": capacity / 2, "completed_per_s": half.timed_ok / plan.open_seconds,
                   "errors": dict(half.errors), **stats.latency_summary(half.latencies_ns),
                   # How busy the server process was (CPU seconds per second, all its threads): a
                   # Python process decides on about one core, so this near 1 at "half" the maximum
                   # means the load generator's share of the machine took the other half.
                   "server_cores": half.server_cpu_seconds / half.seconds,
                   "server_cores_at_max": closed.server_cpu_seconds / closed.seconds}
            row["p99_over_p50"] = row["p99_ms"] / row["p50_ms"]
            row["target"], row["pass"] = TARGET_TAIL, row["p99_over_p50"] <= TARGET_TAIL
            if timeline:
                row["timeline"] = timelines.summarize(server.timelines(), half.by_call)
            if overloaded:  # as bench/overload.py runs it
                row["goodput"] = {clients: goodput.over_maximum(server, loops, FACTOR, throttle=clients == "sdk")
                                  for clients in ("sdk", "raw")}
        finally:
            server.stop()
    finally:
        if drop is not None:
            drop()
    return row


def measure(store: str, root: pathlib.Path, plan: Plan, timeline: bool) -> dict:
    run: dict = {"round_trips": None, "tails": []}
    if store != "sqlite":
        run["round_trips"] = round_trips(store, root, plan)
        print_round_trips(run["round_trips"])
    for each in ["sqlite"] + ([store] if store != "sqlite" else []):
        row = half_load(each, root, plan, overloaded=each == "sqlite", timeline=timeline)
        run["tails"].append(row)
        print_tail(row)
    run["goodput"] = run["tails"][0].pop("goodput")
    print_goodput(run["goodput"])
    return run


def print_round_trips(rt: dict) -> None:
    print(f"round trips per lone decision (PostgreSQL, {rt['delay_ms_each_way']:.0f} ms each way, {rt['calls']} "
          f"calls): median {rt['median']}, p90 {rt['p90']} (target <= {rt['target']} at the median: "
          f"{verdict(rt['pass'])}); p50 {rt['p50_ms']:.1f} ms, {rt['errors']} failed", flush=True)


def print_tail(row: dict) -> None:
    print(f"p99 at half the maximum ({row['store']}): max {row['capacity_per_s']:.0f}/s at {CONCURRENCY} in flight, "
          f"{row['offered_per_s']:.0f}/s offered: p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms, "
          f"p99/p50 {row['p99_over_p50']:.1f}x (target <= {row['target']:.0f}x: {verdict(row['pass'])}); "
          f"{sum(row['errors'].values())} failed; server process at {row['server_cores']:.2f} cores "
          f"({row['server_cores_at_max']:.2f} at the maximum)", flush=True)
    if "timeline" in row:
        for line in timelines.lines(row["timeline"]):
            print(line, flush=True)


def print_goodput(both: dict) -> None:
    for clients, g in both.items():
        who = ("the SDKs' clients (default: they throttle themselves)" if clients == "sdk"
               else "raw gRPC clients (no throttle; no target: see docs/performance.md)")
        verdict_text = f"target >= {g['target']}: {verdict(g['pass'])}" if clients == "sdk" else "informative"
        print(f"goodput at {g['factor']}x (default configuration, sqlite), {who}: {g['offered_per_s']:.0f}/s offered "
              f"(maximum {g['capacity_before_per_s']:.0f}/s before, {g['capacity_after_per_s']:.0f}/s after), "
              f"{g['goodput_per_s']:.0f}/s decided = {g['goodput_ratio']:.2f} of capacity ({verdict_text}); "
              f"accepted p50 {g['p50_ms']:.1f} ms, p99 {g['p99_ms']:.1f} ms; shed {g['shed']}, throttled by the "
              f"clients {g['throttled_by_clients']}, refused by the transport {g['refused_by_transport']}, other "
              f"errors {g['other_errors']}; server process at {g['server_cores']:.2f} cores", flush=True)
        print(f"  by second: decided {' '.join(map(str, g['decided_by_second']))}; shed "
              f"{' '.join(map(str, g['shed_by_second']))}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.targets", description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default="sqlite",
                        help="sqlite, or a PostgreSQL URL: then also the round trips and the tail on PostgreSQL "
                             "(each in a fresh schema, dropped afterwards)")
    parser.add_argument("--runs", type=int, default=1, help="repeat the whole measure, printing each run")
    parser.add_argument("--quick", action="store_true", help="seconds, for a smoke test (figures meaningless)")
    parser.add_argument("--timeline", action="store_true",
                        help="record per-call timelines at half load and print where the slowest 1%% waited")
    parser.add_argument("--switch-interval", type=float, default=None, metavar="SECONDS",
                        help="the sidecars' interpreter switch interval (default: CPython's 0.005, as serve "
                             "runs): an experiment on the GIL hand-offs between gRPC, the loop and the pump")
    parser.add_argument("--json", nargs="?", const="-", metavar="PATH",
                        help="write the results as JSON to PATH (no PATH or -: to stdout, instead of the text)")
    args = parser.parse_args(argv)
    if args.store != "sqlite" and not args.store.startswith(("postgresql://", "postgres://")):
        parser.error("--store: `sqlite` or a postgresql:// URL")
    plan = QUICK if args.quick else Plan()
    if args.switch_interval is not None:  # read by the bench's sidecar processes (bench/servers.py)
        os.environ[servers.SWITCH_INTERVAL_VARIABLE] = str(args.switch_interval)
    to_stdout = args.json == "-"
    real_stdout = sys.stdout
    if to_stdout:
        sys.stdout = sys.stderr  # the text goes to stderr, the JSON alone to stdout
    try:
        print(f"machine: {json.dumps(stats.machine())}", flush=True)
        results: dict = {"machine": stats.machine(), "store": "sqlite" if args.store == "sqlite" else "postgresql",
                         "quick": args.quick, "runs": []}
        with tempfile.TemporaryDirectory(prefix="toolauthz-targets-") as tmp:
            for n in range(args.runs):
                print(f"-- run {n + 1} of {args.runs}", flush=True)
                results["runs"].append(measure(args.store, pathlib.Path(tmp), plan, args.timeline))
    finally:
        sys.stdout = real_stdout
    if to_stdout:
        print(json.dumps(results, indent=2))
    elif args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
