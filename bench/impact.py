"""What `toolauthz policy impact` costs over a store of retained calls.

    .venv/bin/python -m bench.impact [--calls 100000] [--json]

Fills a fresh SQLite store with sealed calls of the example bundle's `issue_refund`
(amounts across both refund thresholds, own and others' orders: the rows the sidecar
writes for `audit.retain_input`), then replays them as `policy impact` does (streamed a
page at a time, each unsealed and decided under the example bundle and under one whose
small-refund permit is tightened from 5000 to 3000). Prints the time to fill, the time
to replay (wall and CPU: on a shared machine the CPU time is the figure), the changed
count, and the process's peak resident memory before and after the replay: the replay
holds one page and the counts, so its peak does not grow with the store.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import shutil
import tempfile
import time

from toolauthz.audit.retention import RetainedCall, seal
from toolauthz.bundle import load_bundle
from toolauthz.cli.impact import Report, changes
from toolauthz.store.retained import RetainedInputs, RetainedRow

ROOT = pathlib.Path(__file__).resolve().parent.parent
KEY = bytes(range(32))


def retained_call(i: int) -> RetainedCall:
    owner = "alice" if i % 5 else "carol"
    body = {"order_id": f"ord_{i}", "amount_cents": 500 + (i * 37) % 9000}
    entities = [{"uid": {"type": "Order", "id": f"ord_{i}"},
                 "attrs": {"owner": {"__entity": {"type": "User", "id": owner}}, "refundable_cents": 8000},
                 "parents": []}]
    return RetainedCall("acme", f"call-{i}", "issue_refund", "User", "alice", f"run-{i // 3}",
                        json.dumps(body, separators=(",", ":")).encode(), json.dumps(entities).encode(), i % 3, i % 2)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(calls: int) -> dict[str, float]:
    work = pathlib.Path(tempfile.mkdtemp(prefix="toolauthz-impact-"))
    try:
        new_dir = work / "new"
        shutil.copytree(ROOT / "policies", new_dir)
        refunds = new_dir / "refunds.cedar"
        refunds.write_text(refunds.read_text().replace("amount_cents <= 5000", "amount_cents <= 3000"))
        base, new = load_bundle(ROOT / "policies"), load_bundle(new_dir)
        store = RetainedInputs(f"sqlite:///{work / 'store.db'}")
        now = 2_000_000_000.0
        start = time.perf_counter()
        for first in range(0, calls, 1000):
            store.put_many([RetainedRow("acme", f"call-{i}", "issue_refund", now - calls + i, now + 86400, "v",
                                        seal(KEY, retained_call(i)) or b"")
                            for i in range(first, min(calls, first + 1000))])
        filled = time.perf_counter() - start
        before = peak_rss_mb()
        report = Report()
        start, cpu = time.perf_counter(), time.process_time()
        for row, change in changes(base, new, store.stream(since=0, now=now), KEY, report.unreadable):
            report.add(row, change)
        replayed, replay_cpu = time.perf_counter() - start, time.process_time() - cpu
        store.close()
        return {"calls": calls, "fill_seconds": round(filled, 1), "replay_seconds": round(replayed, 1),
                "replay_cpu_seconds": round(replay_cpu, 1), "calls_per_cpu_second": round(calls / replay_cpu),
                "changed": report.changed,
                "peak_rss_mb_before_replay": round(before, 1), "peak_rss_mb_after_replay": round(peak_rss_mb(), 1)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.impact")
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    figures = run(args.calls)
    print(json.dumps(figures) if args.json else "\n".join(f"{k}: {v}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
