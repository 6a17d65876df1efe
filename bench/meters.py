"""The cost of usage meters (`python -m bench.meters [--store postgresql://...]`): the
example bundle's `issue_refund` decided in process, with two meters (a sum and a count,
each read by a policy) against the same tool and policies with none, in alternating
rounds of one sidecar each, on SQLite (and on PostgreSQL with `--store`, a schema of
its own per round). Reports, per variant, the CPU and wall time per decision at one
call at a time (`Authorizer.authorize`) and at 32 in flight through the decision pump,
and the ratio of the metered to the plain. Only ratios within one run hold on a shared
machine."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import tempfile
import time

import yaml

from bench import stats
from bench.inproc import _through_pump

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "policies"
METERS = {
    "refund_cents_24h": {"sum": "/amount_cents", "per": ["principal"], "window": "24h"},
    "refunds_per_order_1h": {"count": True, "per": ["resource"], "window": "1h"},
}
SECOND_POLICY = """
@id("at-most-three-refunds-an-order-an-hour")
forbid (principal, action == Action::"tool:issue_refund", resource)
when { context.usage.refunds_per_order_1h >= 3 };
"""


def make_bundle(root: pathlib.Path, metered: bool) -> pathlib.Path:
    """The example bundle with two meters, or with none (and no policy reading one)."""
    target = root / ("metered" if metered else "plain")
    shutil.copytree(EXAMPLE, target)
    shutil.rmtree(target / "tests")
    tool_path = target / "tools" / "issue_refund.yaml"
    tool = yaml.safe_load(tool_path.read_text())
    tool["limits"]["max_calls_per_run"] = 1000
    refunds = target / "refunds.cedar"
    text = refunds.read_text()
    if metered:
        tool["usage"] = METERS
        refunds.write_text(text + SECOND_POLICY)
    else:
        tool.pop("usage", None)
        refunds.write_text(text[:text.index('@id("refund-daily-budget")')])
    tool_path.write_text(yaml.safe_dump(tool))
    return target


def calls(prefix: str, count: int) -> list:
    """Refunds of one cent by 256 customers, each of their own order, runs of 8."""
    from toolauthz.model import Principal, ProposedCall, TrustedContext

    out = []
    for n in range(count):
        user, order = f"u{n % 256}", f"ord_{n % 256}"
        entity = {"uid": {"type": "Order", "id": order}, "parents": [],
                  "attrs": {"owner": {"__entity": {"type": "User", "id": user}}, "refundable_cents": 10**6}}
        ctx = TrustedContext("acme", Principal("User", user), f"run-{prefix}-{n // 8}", json.dumps([entity]).encode())
        call = ProposedCall(f"{prefix}-{n}", "issue_refund",
                            json.dumps({"order_id": order, "amount_cents": 1}).encode())
        out.append((ctx, call))
    return out


def one_round(bundle: pathlib.Path, data: pathlib.Path, store: str, count: int) -> dict:
    from toolauthz.server.build import build_sidecar
    from toolauthz.server.config import Settings

    scoped, drop = store, None
    if store:
        from bench.stores import fresh_schema
        from toolauthz.store.postgres import migrate

        scoped, drop = fresh_schema(store)
        migrate(scoped)
    settings = Settings(bundle=bundle, data_dir=data, listen="127.0.0.1:0", store=scoped, reload_poll_seconds=0,
                        max_queue_seconds=0)
    car = build_sidecar(settings)
    try:
        prefix = f"p{time.monotonic_ns() % 10**9}"
        serial = calls(prefix + "s", count // 4)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        decisions = [car.authorizer.authorize(ctx, call).decision.value for ctx, call in serial]
        cpu1, wall1 = time.process_time(), time.perf_counter()
        assert decisions.count("ALLOW") == len(serial), decisions
        _lat, _wall = _through_pump(car, calls(prefix + "b", count), 32)
        cpu2, wall2 = time.process_time(), time.perf_counter()
    finally:
        car.close()
        if drop is not None:
            drop()
    return {"one_cpu_ms": (cpu1 - cpu0) * 1000 / len(serial), "one_wall_ms": (wall1 - wall0) * 1000 / len(serial),
            "batch_cpu_ms": (cpu2 - cpu1) * 1000 / count, "batch_wall_ms": (wall2 - wall1) * 1000 / count}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.meters", description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default="", help="also a PostgreSQL URL (a schema per round)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=800, help="calls at 32 in flight per round (a quarter of "
                                                               "them one at a time)")
    args = parser.parse_args(argv)
    print(f"machine: {json.dumps(stats.machine())}", flush=True)
    with tempfile.TemporaryDirectory(prefix="toolauthz-meters-") as tmp:
        root = pathlib.Path(tmp)
        bundles = {False: make_bundle(root, False), True: make_bundle(root, True)}
        for store in ["", args.store] if args.store else [""]:
            rows: dict[bool, list[dict]] = {False: [], True: []}
            for i in range(args.rounds):
                for metered in (False, True) if i % 2 == 0 else (True, False):
                    data = root / f"data-{int(metered)}-{i}-{bool(store)}"
                    rows[metered].append(one_round(bundles[metered], data, store, args.calls))
            label = "PostgreSQL" if store else "SQLite"
            for key in ("one_cpu_ms", "one_wall_ms", "batch_cpu_ms", "batch_wall_ms"):
                plain = statistics.median(r[key] for r in rows[False])
                metered = statistics.median(r[key] for r in rows[True])
                print(f"{label} {key}: no meters {plain:.3f}, two meters {metered:.3f} "
                      f"({metered / plain:.2f}x, +{metered - plain:.3f} ms)", flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
