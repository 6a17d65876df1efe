"""Round trips per ledger batch on PostgreSQL (`python -m bench.roundtrips --store URL`):
batches of n reservations of new calls, each in a new run, and one read, sent through the
delay proxy (`--delay` seconds each way); the proxy counts the round trips its clients
waited for (`DelayProxy.waves`), so the figure does not depend on the machine's speed.
Each batch is first predicted by what the store last read and wrote (one round trip,
store/postgres/foreseen.py); `--moved` also has another writer charge the runs' meter
before each batch, so that every prediction misses (what a fleet whose replicas share a
principal's meter pays)."""

from __future__ import annotations

import argparse
import statistics

from bench.delay_proxy import DelayProxy
from bench.stores import fresh_schema


def _ops(n: int, tag: str, usage: tuple[int, ...] = ()) -> list:
    from toolauthz.audit import AuditEvent
    from toolauthz.store.ledger import CallEntry, RecordedDecision, ReserveCall, Standing
    from toolauthz.usage.charges import Charge

    charges = (Charge("spent", "alice", 1, 3600),) if usage else ()
    out = []
    for i in range(n):
        entry = CallEntry("acme", f"{tag}-{i}", f"r{tag}-{i}", "t", "ab" * 32, 'User::"a"', 1.0, charges=charges)
        event = AuditEvent(kind="authorize", time=1.0, call_id=entry.call_id, tenant="acme", result="ALLOW")
        standing = Standing(0, 0, (usage[0] + i,) if usage else ())
        out.append(ReserveCall(entry, RecordedDecision("ALLOW", "d", "v", audit=event), standing))
    return out


def main(argv: list[str] | None = None) -> int:
    from toolauthz.store.open import open_store

    parser = argparse.ArgumentParser(prog="python -m bench.roundtrips", description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--delay", type=float, default=0.010)
    parser.add_argument("--sizes", default="1,8,32")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--moved", action="store_true", help="another writer moves the meter before each batch")
    args = parser.parse_args(argv)
    url, drop = fresh_schema(args.store)
    proxy = DelayProxy(("127.0.0.1", 5432), args.delay)
    store = open_store(url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}"), pool_size=1)
    other = open_store(url, pool_size=1)
    spent = 0
    try:
        store.ledger.apply(_ops(4, "warm", (0,) if args.moved else ()))
        spent += 4 if args.moved else 0
        for n in [int(s) for s in args.sizes.split(",")]:
            waves = []
            for k in range(args.rounds):
                if args.moved:  # another replica charges the meter these calls read
                    other.ledger.apply(_ops(1, f"o{n}-{k}", (spent,)))
                    spent += 1
                ops = _ops(n, f"n{n}-{k}", (spent,) if args.moved else ())
                before = proxy.waves
                results = store.ledger.apply(ops)
                waves.append(proxy.waves - before)
                moved = [r for r in results if getattr(r, "moved", None) is not None]
                if moved:  # decided again on what stands, as the authorizer does
                    before = proxy.waves
                    store.ledger.apply(_ops(n, f"n{n}-{k}", (moved[0].moved.usage[0],)))
                    waves[-1] += proxy.waves - before
                spent += n if args.moved else 0
            print(f"a batch of {n} reservations: {statistics.median(waves):g} round trips at the median "
                  f"({', '.join(map(str, waves))})")
        before = proxy.waves
        store.ledger.get("acme", "none")
        print(f"a read (Ledger.get): {proxy.waves - before} round trip(s)")
    finally:
        store.close()
        other.close()
        proxy.close()
        drop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
