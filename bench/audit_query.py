"""How fast the audit trail answers auditors' questions at a million records.

    .venv/bin/python -m bench.audit_query [--records 1000000] [--json]

Fills a fresh SQLite audit store (the real SqliteAuditLog.append, in batches, hash chain
included) with records spread over tenants, principals, tools, runs, kinds and results,
then times one page (100 records) of each filter QueryDecisions accepts, and the story
of one call. Prints the median and the worst of repeated queries in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from toolauthz.audit import AuditEvent, AuditQuery
from toolauthz.store import SqliteAuditLog

KINDS = ("authorize", "verify", "outcome")
RESULTS = {"authorize": ("ALLOW", "DENY", "APPROVAL_REQUIRED"), "verify": ("ok", "already_used"),
           "outcome": ("completed", "failed")}
T0 = 1_800_000_000.0


def event(i: int) -> AuditEvent:
    kind = KINDS[i % 3]
    return AuditEvent(
        kind=kind, time=T0 + i * 0.01, decision_id=f"d{i // 3:012d}", request_id=f"run-{i // 30}",
        call_id=f"call-{i // 3}", tenant=f"tenant-{i % 50}", principal=f'User::"u{i % 5000}"',
        tool=f"tool_{i % 40}", resource=f'Order::"o{i % 100000}"', result=RESULTS[kind][(i // 3) % len(RESULTS[kind])],
        digest=f"{i:064x}", policy_version="0123456789abcdef", fields={"/order_id": f"o{i % 100000}"})


def fill(log: SqliteAuditLog, records: int, batch: int = 1000) -> float:
    start = time.perf_counter()
    for first in range(0, records, batch):
        log.append([event(i) for i in range(first, min(records, first + batch))])
    return time.perf_counter() - start


def timed(log: SqliteAuditLog, query: AuditQuery, repeat: int = 20) -> tuple[float, float, int]:
    samples, found = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        found = len(log.query(query, limit=100))
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples), max(samples), found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    n = args.records
    middle = n // 2
    queries = {
        "tenant": AuditQuery(tenant="tenant-7"),
        "principal": AuditQuery(principal='User::"u1234"'),
        "tool": AuditQuery(tool="tool_13"),
        "call_id (one call's story)": AuditQuery(call_id=f"call-{middle // 3}"),
        "request_id (one run)": AuditQuery(request_id=f"run-{middle // 30}"),
        "result": AuditQuery(result="APPROVAL_REQUIRED"),
        "kind": AuditQuery(kind="outcome"),
        "tenant + last hour": AuditQuery(tenant="tenant-7", time_from=T0 + n * 0.01 - 3600),
        "tenant + tool + kind": AuditQuery(tenant="tenant-7", tool="tool_17", kind="authorize"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        log = SqliteAuditLog(f"{tmp}/audit.db")
        try:
            seconds = fill(log, n)
            rows = {name: timed(log, q) for name, q in queries.items()}
        finally:
            log.close()
    if args.json:
        print(json.dumps({"records": n, "fill_seconds": seconds,
                          "queries_ms": {k: {"p50": v[0], "max": v[1], "rows": v[2]} for k, v in rows.items()}}))
        return 0
    print(f"audit store with {n:,} records (filled in {seconds:.0f} s, {n / seconds:,.0f} records/s)")
    print(f"{'filter (one page of 100)':32} {'p50 ms':>8} {'max ms':>8} {'rows':>6}")
    for name, (p50, worst, found) in rows.items():
        print(f"{name:32} {p50:8.2f} {worst:8.2f} {found:6}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
