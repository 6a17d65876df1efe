"""Percentiles, the audit cross-check, and a description of the machine."""

from __future__ import annotations

import collections
import os
import platform
import sqlite3
import subprocess
import sys
from importlib import metadata


def percentile(sorted_values: list, q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of an already sorted list; NaN when empty."""
    if not sorted_values:
        return float("nan")
    rank = max(1, -(-len(sorted_values) * q // 100))  # ceil(n * q / 100)
    return sorted_values[int(min(rank, len(sorted_values))) - 1]


def latency_summary(latencies_ns: list[int]) -> dict:
    values = sorted(latencies_ns)

    def ms(v: float) -> float:
        return v / 1e6 if v == v else v  # v != v only for NaN, which stays NaN

    return {"samples": len(values), "p50_ms": ms(percentile(values, 50)), "p99_ms": ms(percentile(values, 99)),
            "p999_ms": ms(percentile(values, 99.9)), "max_ms": ms(values[-1]) if values else float("nan"),
            "mean_ms": sum(values) / len(values) / 1e6 if values else float("nan")}


def audit_check(audit_db: str, responses: dict[str, list[str]]) -> dict:
    """Compares the decision ids of every successful Authorize/Verify response with the
    audit records: exactly one record per response, none missing, none extra."""
    with sqlite3.connect(f"file:{audit_db}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT kind, decision_id FROM audit_record WHERE kind IN ('authorize', 'verify')").fetchall()
    return compare_records(collections.Counter(rows), responses)


def compare_records(records: collections.Counter, responses: dict[str, list[str]]) -> dict:
    """(kind, decision_id) of the audit records against the responses' decision ids."""
    answered = collections.Counter((kind, did) for kind, ids in responses.items() for did in ids)
    out: dict = {"ok": True}
    for kind in ("authorize", "verify"):
        got = collections.Counter({k: v for k, v in records.items() if k[0] == kind})
        want = collections.Counter({k: v for k, v in answered.items() if k[0] == kind})
        missing = sum((want - got).values())  # a response without its record: lost
        extra = sum((got - want).values())  # a record without a response (e.g. a client timeout)
        out[kind] = {"responses": sum(want.values()), "records": sum(got.values()), "missing": missing,
                     "extra": extra}
        out["ok"] = out["ok"] and missing == 0 and extra == 0
    return out


def machine() -> dict:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    versions = {}
    for dist in ("grpcio", "protobuf", "cedarpy", "cryptography", "pyseto", "jsonschema", "jsonschema-rs", "rfc8785",
                 "orjson"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return {"nproc": os.cpu_count(), "cpu_model": cpu or platform.processor(), "python": sys.version.split()[0],
            "platform": platform.platform(), "versions": versions, "load_avg_at_start": _loadavg()}


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def filesystem(path: str) -> str:
    try:
        out = subprocess.run(["df", "-T", path], capture_output=True, text=True, timeout=5).stdout.splitlines()
        return out[1].split()[1] if len(out) > 1 else ""
    except (OSError, subprocess.SubprocessError, IndexError):
        return ""
