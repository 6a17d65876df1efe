"""The fleet's storage alone (`python -m bench.fleet_store --store postgresql://...`):
1, 2 and 4 processes, each a replica's store (`open_store`), writing batches of
reservations (each with its audit record; runs of 4 calls over 16 tenants) through the
delaying proxy for `--duration` seconds. No Cedar, no signing, no gRPC: what is left is
the round trips and the locks, the part of a decision that replicas share, so the ratio
holds on a machine whose cores are busy. `--one-lock` adds one key every transaction
locks, as the database-wide lock before the partitioned design did: the same code,
serialized, for comparison."""

from __future__ import annotations

import argparse
import multiprocessing
import time
from urllib.parse import urlsplit

from bench.delay_proxy import DelayProxy
from bench.stores import fresh_schema


def _writer(url: str, batch: int, duration: float, one_lock: bool, tag: str, out) -> None:
    from toolauthz.audit import AuditEvent
    from toolauthz.store import rules
    from toolauthz.store.ledger import CallEntry, RecordedDecision, ReserveCall
    from toolauthz.store.open import open_store

    if one_lock:
        keys_of = rules.lock_keys
        rules.lock_keys = lambda ops: ["the database", *keys_of(ops)]  # type: ignore[assignment]
    store = open_store(url, pool_size=2)
    n, done, began = 0, 0, time.monotonic()
    while time.monotonic() - began < duration:
        ops = []
        for _ in range(batch):
            tenant, run = f"t{(n // 4) % 16}", f"r{tag}-{n // 4}"
            entry = CallEntry(tenant, f"c{tag}-{n}", run, "tool", "ab" * 32, 'User::"u"', 1.0)
            event = AuditEvent(kind="authorize", time=1.0, call_id=entry.call_id, tenant=tenant, result="ALLOW")
            ops.append(ReserveCall(entry, RecordedDecision("ALLOW", f"d{n}", "v1", audit=event), (n % 4, n % 4)))
            n += 1
        answers = store.ledger.apply(ops)
        done += sum(1 for a in answers if not isinstance(a, BaseException) and a.moved is None)
    out.put((done, time.monotonic() - began))
    store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_store", description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--delay", type=float, default=1.5, help="ms each way")
    parser.add_argument("--replicas", default="1,2,4")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--duration", type=float, default=6.0)
    args = parser.parse_args(argv)
    target = urlsplit(args.store)
    proxy = DelayProxy((target.hostname or "127.0.0.1", target.port or 5432), args.delay / 1000)
    ctx = multiprocessing.get_context("spawn")
    try:
        for one_lock in (False, True):
            base = 0.0
            for count in (int(r) for r in args.replicas.split(",")):
                url, drop = fresh_schema(args.store)
                proxied = url.replace(target.netloc, f"{target.username or 'postgres'}@127.0.0.1:{proxy.port}", 1)
                out = ctx.Queue()
                procs = [ctx.Process(target=_writer, args=(proxied, args.batch, args.duration, one_lock,
                                                           f"{count}{i}", out)) for i in range(count)]
                for proc in procs:
                    proc.start()
                results = [out.get(timeout=args.duration + 120) for _ in procs]
                for proc in procs:
                    proc.join(30)
                drop()
                rate = sum(done / seconds for done, seconds in results)
                base = base or rate
                print(f"{'one lock' if one_lock else 'partitioned'}: {count} replica(s), batches of {args.batch}, "
                      f"{args.delay} ms each way: {rate:.0f} reservations/s ({rate / base:.2f}x)", flush=True)
    finally:
        proxy.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
