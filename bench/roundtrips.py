"""Round trips per ledger batch on PostgreSQL (`python -m bench.roundtrips --store URL`):
a batch of n reservations, and one read, timed through the delay proxy with no delay
and with `--delay` seconds each way; the difference over the round-trip time is how
many round trips the batch waited for. Robust on a loaded machine when the delay is
large against the noise (25 ms each way by default)."""

from __future__ import annotations

import argparse
import time

from bench.delay_proxy import DelayProxy
from bench.stores import fresh_schema


def _ops(n: int, tag: str) -> list:
    from toolauthz.audit import AuditEvent
    from toolauthz.store.ledger import CallEntry, RecordedDecision, ReserveCall

    out = []
    for i in range(n):
        entry = CallEntry("acme", f"{tag}-{i}", f"r{tag}-{i // 4}", "t", "ab" * 32, 'User::"a"', 1.0)
        event = AuditEvent(kind="authorize", time=1.0, call_id=entry.call_id, tenant="acme", result="ALLOW")
        out.append(ReserveCall(entry, RecordedDecision("ALLOW", "d", "v", audit=event), (i % 4, i % 4)))
    return out


def main(argv: list[str] | None = None) -> int:
    from toolauthz.store.open import open_store

    parser = argparse.ArgumentParser(prog="python -m bench.roundtrips", description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--delay", type=float, default=0.025)
    parser.add_argument("--sizes", default="1,8,32")
    args = parser.parse_args(argv)
    url, drop = fresh_schema(args.store)
    sizes = [int(n) for n in args.sizes.split(",")]
    best: dict = {}
    try:
        for delay in (0.0, args.delay):
            proxy = DelayProxy(("127.0.0.1", 5432), delay)
            store = open_store(url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}"), pool_size=1)
            try:
                store.ledger.apply(_ops(4, f"warm{delay}"))
                for n in sizes:
                    times = []
                    for k in range(3):
                        ops = _ops(n, f"n{n}d{delay}k{k}")
                        began = time.perf_counter()
                        store.ledger.apply(ops)
                        times.append(time.perf_counter() - began)
                    best[(delay, n)] = min(times)
                times = []
                for _ in range(3):
                    began = time.perf_counter()
                    store.ledger.get("acme", "none")
                    times.append(time.perf_counter() - began)
                best[(delay, "read")] = min(times)
            finally:
                store.close()
                proxy.close()
    finally:
        drop()
    for key in (*sizes, "read"):
        what = f"a batch of {key} reservations" if key != "read" else "a read"
        print(f"{what}: {(best[(args.delay, key)] - best[(0.0, key)]) / (2 * args.delay):.1f} round trips")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
