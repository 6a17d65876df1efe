"""CPU time of the library levers, in process: JSON Schema validation, the call digest,
one audit record, and the whole `Authorizer.authorize` (bench/inproc.py's calls).

    PYTHONPATH=$PWD .venv/bin/python -m bench.levers [--calls 2000]

Times are `time.process_time` per call (the best of `--repeat` rounds), so other load on
a shared machine changes them less than wall time would. It uses only interfaces that
predate the levers, so it runs unchanged against an older checkout (PYTHONPATH=that
checkout) to give the "before" column."""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench import bundles
from bench.inproc import _calls


def per_call_us(fn: Callable[[], Any], count: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        began = time.process_time()
        for _ in range(count):
            fn()
        best = min(best, time.process_time() - began)
    return best / count * 1e6


def measure(calls: int, repeat: int) -> dict[str, float]:
    from toolauthz.audit.records import AuditEvent, canonical_body, record_hash
    from toolauthz.bundle import load_bundle
    from toolauthz.digest import call_digest
    from toolauthz.engine import prepare
    from toolauthz.server.build import build_sidecar
    from toolauthz.server.config import Settings

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = bundles.generate_bundle(pathlib.Path(tmp) / "bundle", 10)
        bundle = load_bundle(root)
        ctx, call = _calls(0, 1, bundles.tool_count(10), "lever")[0]
        tool = bundle.tools[call.name].tool
        value = json.loads(call.input_json)
        fast = getattr(tool, "fast_validator", None)
        out["validate: is_valid, jsonschema"] = per_call_us(lambda: tool.validator.is_valid(value), 20 * calls, repeat)
        if fast is not None:
            out["validate: is_valid, jsonschema-rs"] = per_call_us(lambda: fast.is_valid(value), 20 * calls, repeat)
        out["validate: tool.accepts (the decision path)"] = per_call_us(
            lambda: getattr(tool, "accepts", tool.validator.is_valid)(value), 20 * calls, repeat)

        fields = {"tool": call.name, "input": value, "principal_type": ctx.principal.type,
                  "principal_id": ctx.principal.id, "tenant": ctx.tenant, "call_id": call.call_id}
        out["digest: call_digest"] = per_call_us(lambda: call_digest(**fields), 10 * calls, repeat)
        out["prepare: parse + validate + digest"] = per_call_us(lambda: prepare(bundle, ctx, call), 5 * calls, repeat)

        def record() -> str:
            event = AuditEvent(kind="authorize", time=time.time(), decision_id="01JDZ6V1Q2W3E4R5T6Y7U8I9O0",
                               request_id=ctx.request_id, call_id=call.call_id, tenant=ctx.tenant,
                               principal=str(ctx.principal), tool=call.name, resource='Item::"item_1"',
                               result="ALLOW", reasons=("p0",), digest="ab" * 32, policy_version="0123456789abcdef",
                               fields={"/item_id": value["item_id"], "/qty": value["qty"]})
            return record_hash("0" * 64, canonical_body(12345, event))

        out["audit record: event + body + hash"] = per_call_us(record, 10 * calls, repeat)

        logging.disable(logging.WARNING)
        car = build_sidecar(Settings(bundle=str(root), data_dir=str(pathlib.Path(tmp) / "data"),
                                     listen="127.0.0.1:0", tokens={"lifetime_seconds": 600}))
        try:
            items = iter(_calls(0, calls * (repeat + 1), bundles.tool_count(10), "az"))
            for _ in range(calls):  # warm: caches, the SQLite pages
                car.authorizer.authorize(*next(items))
            out["authorize: in process, 1 at a time"] = per_call_us(
                lambda: car.authorizer.authorize(*next(items)), calls, repeat)
        finally:
            car.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    figures = measure(args.calls, args.repeat)
    for name, us in figures.items():
        print(f"{name:48s} {us:9.1f} µs")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
