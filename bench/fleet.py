"""The fleet (`python -m bench.fleet --store postgresql://...`): 1, 2 and 4 sidecar
replicas on one PostgreSQL database, reached through a TCP proxy on loopback that
delays every chunk by a fixed time each way (`bench/delay_proxy.py`): a database on
another host as far as round trips go. Authorize at `--concurrency` calls in flight
spread over the replicas (one port, SO_REUSEPORT), or that many per replica with
`--per-replica`, their runs spread over `--tenants`
tenants. Reports decisions per second per replica count and delay, the scaling over one
replica, and the lock wait: the mean number of the database's sessions waiting for a
lock (pg_stat_activity sampled every 20 ms), and the share of server time they are.

Each (delay, replicas) point gets a fresh schema; every response's audit record is
checked afterwards. The machine's load is printed: on a shared machine compare the
ratios of one run, not figures across runs."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import tempfile
import threading
import time
from urllib.parse import urlsplit

from bench import bundles, load, servers, stats
from bench.delay_proxy import DelayProxy
from bench.stores import audit_check_postgres, fresh_schema

POLICIES = 100


def _lock_waits(url: str, stop: threading.Event, samples: list[int]) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.wait(0.02):
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                               "AND datname = current_database()").fetchone()
            samples.append(int(row[0]) if row else 0)


def _point(root: pathlib.Path, bundle: pathlib.Path, store_url: str, proxy_port: int, replicas: int, *,
           concurrency: int, tenants: int, duration: float, chains: int) -> dict:
    scoped, drop = fresh_schema(store_url)
    parts = urlsplit(scoped)
    proxied = scoped.replace(parts.netloc, f"{parts.username or 'postgres'}@127.0.0.1:{proxy_port}", 1)
    settings = {"bundle": str(bundle), "data_dir": str(root / f"data-{replicas}-{time.monotonic_ns()}"),
                "listen": "127.0.0.1:0", "tokens": {"lifetime_seconds": 600}, "store": proxied,
                "audit_chains": chains, "max_queue_seconds": 0}  # throughput: no call shed
    group = servers.start_replicas(settings, replicas)
    stop, samples = threading.Event(), []
    sampler = threading.Thread(target=_lock_waits, args=(scoped, stop, samples), daemon=True)
    try:
        sampler.start()
        result = load.closed_loop(group[0].address, rpc="authorize", concurrency=concurrency,
                                  procs=min(4, concurrency), duration=duration, tools=bundles.tool_count(POLICIES),
                                  prefix=f"f{replicas}x{time.monotonic_ns() % 10**6}", max_calls=10**6,
                                  tenants=tenants)
    finally:
        stop.set()
        for server in group:
            server.stop()
        sampler.join(5)
    try:
        check = audit_check_postgres(scoped, {"authorize": result.decision_ids.get("authorize", [])})
    finally:
        drop()
    waiting = sum(samples) / len(samples) if samples else 0.0
    return {"replicas": replicas, "decisions_per_s": result.timed_ok / result.seconds,
            "errors": dict(result.errors), "lock_waiting_sessions": waiting,
            **stats.latency_summary(sorted(result.latencies_ns)), "audit_ok": check["ok"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True, help="a PostgreSQL URL (a schema of its own is made per point)")
    parser.add_argument("--delays", default="0,0.5,1.5", help="one-way delays in ms, comma-separated")
    parser.add_argument("--replicas", default="1,2,4")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--per-replica", action="store_true",
                        help="--concurrency calls in flight per replica (a fleet's load grows with it), "
                             "not in all")
    parser.add_argument("--tenants", type=int, default=16)
    parser.add_argument("--chains", type=int, default=16, help="audit_chains of the replicas")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    target = urlsplit(args.store)
    rows = []
    with tempfile.TemporaryDirectory(prefix="toolauthz-fleet-") as tmp:
        root = pathlib.Path(tmp)
        bundle = bundles.generate_bundle(root / "bundle", POLICIES)
        print(f"machine: {json.dumps(stats.machine())}", flush=True)
        for delay_ms in (float(d) for d in args.delays.split(",")):
            proxy = DelayProxy((target.hostname or "127.0.0.1", target.port or 5432), delay_ms / 1000)
            try:
                base = None
                for replicas in (int(r) for r in args.replicas.split(",")):
                    in_flight = args.concurrency * (replicas if args.per_replica else 1)
                    row = _point(root, bundle, args.store, proxy.port, replicas, concurrency=in_flight,
                                 tenants=args.tenants, duration=args.duration, chains=args.chains)
                    row["delay_ms_each_way"] = delay_ms
                    row["in_flight"] = in_flight
                    base = base or row["decisions_per_s"]
                    row["scaling"] = row["decisions_per_s"] / base if base else float("nan")
                    row["loadavg"] = os.getloadavg()[0]
                    rows.append(row)
                    print(f"delay {delay_ms} ms each way, {replicas} replica(s), {in_flight} in flight: "
                          f"{row['decisions_per_s']:.0f}/s "
                          f"({row['scaling']:.2f}x), p50 {row.get('p50_ms', float('nan')):.1f} ms, lock-waiting "
                          f"sessions {row['lock_waiting_sessions']:.2f}, errors {row['errors']}, audit "
                          f"{'ok' if row['audit_ok'] else 'MISMATCH'}, load {row['loadavg']:.1f}", flush=True)
            finally:
                proxy.close()
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
