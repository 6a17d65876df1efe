"""Hostile HTTP bodies (issue: "check first, then read"): what a 4 MB body costs the
event loop the sidecar's transports share, and what Authorize over gRPC sees while such
bodies keep arriving.

    loop cost     in process: the HTTP API's ASGI app given the reproduction's 4.05 MB
                  batch of 44,000 calls, with a loop-side ticker recording the longest
                  stretch the loop was not free (its stall): from an unauthenticated caller
                  (refused before the body is read), and from an admitted caller with the
                  batch's byte cap raised past it (read, scanned off the loop, refused at
                  call 65); beside it, what parsing the whole body on the loop would cost
    under fire    a sidecar with `callers` (the load's mTLS client is the runtime) and a
                  plaintext `http_listen` (its callers are unauthenticated): gRPC Authorize
                  p50/p99 at a few calls in flight, quiet, then while `senders` threads post
                  the hostile body to the HTTP listener in a loop

    .venv/bin/python -m bench.hostile [--duration S] [--senders N]
    .venv/bin/python -m bench --phases hostile
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import socket
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

if __package__ in (None, ""):  # `python bench/hostile.py`
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench import bundles, load, pki, servers, stats

CALLS = 44_000


def hostile_body(calls: int = CALLS) -> bytes:
    """The reproduction's body: a batch of `calls` calls, 4.05 MB."""
    item = '{"call": {"call_id": "call%05d", "name": "issue_refund", "input": {"order_id": "ord_1"}}}'
    context = '{"tenant": "acme", "principal": {"type": "User", "id": "alice"}, "request_id": "run-1"}'
    return f'{{"context": {context}, "calls": [{", ".join(item % k for k in range(calls))}]}}'.encode()


# -- the loop's cost, in process -------------------------------------------------------------

async def _stall_while(work) -> tuple[float, float]:
    """(seconds `work` took, the longest stretch in it that the loop did not run a tick)."""
    longest, running = 0.0, True

    async def ticker() -> None:
        nonlocal longest
        last = time.perf_counter()
        while running:
            await asyncio.sleep(0)
            now = time.perf_counter()
            longest, last = max(longest, now - last), now

    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    began = time.perf_counter()
    await work
    took = time.perf_counter() - began
    running = False
    await ticking
    return took, longest


async def _post(app, path: str, body: bytes, chunk: int = 64 * 1024) -> tuple[int, int]:
    """The body posted to the ASGI app as uvicorn would hand it over: (status, bytes read)."""
    chunks = [body[i:i + chunk] for i in range(0, len(body), chunk)]
    pulled, status, position = 0, 0, 0

    async def receive() -> dict[str, Any]:
        nonlocal pulled, position
        if position == len(chunks):
            await asyncio.Event().wait()
        part = chunks[position]
        position += 1
        pulled += len(part)
        await asyncio.sleep(0)  # a socket read: the loop runs between chunks
        return {"type": "http.request", "body": part, "more_body": position < len(chunks)}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
             "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8080)}
    await app(scope, receive, send)
    return status, pulled


def largest_admitted_batch(limits) -> bytes:
    """The most a default-capped batch lets an admitted caller make the scan read: 64 calls
    whose arguments fill `batch.max_bytes` with small numbers, then a member the shape
    refuses at its key (so no decision is made: the body's cost alone)."""
    per_call = (limits.max_bytes - 4096) // limits.max_calls
    numbers = ",".join(["1"] * (per_call // 2 - 8))
    item = '{"call": {"call_id": "c%d", "name": "issue_refund", "input": {"n": [' + numbers + ']}}}'
    context = '{"tenant": "acme", "principal": {"type": "User", "id": "alice"}, "request_id": "run-1"}'
    calls = ", ".join(item % k for k in range(limits.max_calls))
    return f'{{"context": {context}, "calls": [{calls}], "unknown": 1}}'.encode()


def loop_cost(bundle: pathlib.Path, data_dir: pathlib.Path, repeats: int = 5, baseline: bool = True) -> list[dict]:
    from dataclasses import replace

    from toolauthz.batch import DEFAULT_LIMITS
    from toolauthz.server.build import build_sidecar
    from toolauthz.server.config import Settings
    from toolauthz.service.http_api import HttpApi
    from toolauthz.service.http_api.json_body import BodyShape, parse_body
    from toolauthz.service.roles import CallerGrant, RolePolicy

    hostile = hostile_body()
    car = build_sidecar(Settings(bundle=bundle, data_dir=data_dir, listen="127.0.0.1:0"))
    rows = []
    try:
        guarded = replace(car.gate, policy=RolePolicy.of([CallerGrant("spiffe://x/runtime", frozenset({"runtime"}),
                                                                      frozenset({"*"}))]))
        admitted_body = largest_admitted_batch(DEFAULT_LIMITS)
        cases = (("unauthenticated caller, empty body (the refusal alone)", guarded, b"{}"),
                 ("unauthenticated caller, 4.05 MB batch", guarded, hostile),
                 ("admitted caller, 4.05 MB batch (over the cap)", car.gate, hostile),
                 ("admitted caller, the largest batch the cap reads", car.gate, admitted_body))
        for name, gate, body in cases:
            api = HttpApi(car.authorizer, car.pump, car.keyring, gate=gate, desk=car.approvals,
                          watches=car.watches, audit_log=car.audit_log, max_body_bytes=4 << 20, max_concurrent=8)
            asyncio.run(_measure(api.app, body))  # warm: imports, first audit write
            runs = [asyncio.run(_measure(api.app, body)) for _ in range(repeats)]
            stalls = sorted(stall for _answer, (_took, stall) in runs)
            (status, pulled), _ = runs[-1]
            rows.append({"case": name, "status": status, "body_bytes": len(body), "bytes_read": pulled,
                         "answer_ms": statistics.median(took for _a, (took, _s) in runs) * 1e3,
                         "loop_stall_ms": statistics.median(stalls) * 1e3, "loop_stall_max_ms": stalls[-1] * 1e3})
        if not baseline:
            return rows
        raw = frozenset({("calls", -1, "call", "input")})
        began = time.perf_counter()
        parse_body(hostile, BodyShape(raw=raw), max_depth=128)  # what reading it all on the loop costs
        took = (time.perf_counter() - began) * 1e3
        rows.append({"case": "4.05 MB batch parsed whole on the loop (no caller check, no shape)", "status": None,
                     "body_bytes": len(hostile), "bytes_read": len(hostile), "answer_ms": took,
                     "loop_stall_ms": took, "loop_stall_max_ms": took})
    finally:
        car.close()
    return rows


async def _measure(app, body: bytes):
    result: dict[str, Any] = {}

    async def work() -> None:
        result["answer"] = await _post(app, "/v1/authorize-batch", body)

    timing = await _stall_while(work())
    return result["answer"], timing


# -- Authorize p99, quiet and under fire -------------------------------------------------------

def _send_hostile(port: int, body: bytes, stop: threading.Event, sent: list[int]) -> None:
    """Posts `body` in a loop; sent[0] counts the 403 answers, sent[1] the attempts that
    got none (the connection reset while the body was still being sent)."""
    head = (b"POST /v1/authorize-batch HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
                conn.sendall(head)
                try:
                    conn.sendall(body)
                except OSError:
                    pass  # answered and closed while the body was still being sent: the intended answer
                answer = b""
                while chunk := conn.recv(65536):
                    answer += chunk
            sent[0 if answer.startswith(b"HTTP/1.1 403") else 1] += 1
        except OSError:
            sent[1] += 1


def under_fire(bundle: pathlib.Path, root: pathlib.Path, *, duration: float, senders: int,
               concurrency: int = 4) -> list[dict]:
    files = pki.make_pki(root / "pki")
    http_port = servers.free_port()
    settings = {"bundle": str(bundle), "data_dir": str(root / "data-hostile"), "tokens": {"lifetime_seconds": 600},
                "listeners": [{"address": f"{servers.HOST}:0", "services": ["authorizer"],
                               "tls": {"cert": files["server_cert"], "key": files["server_key"],
                                       "client_ca": files["ca"]}}],
                "http_listen": f"127.0.0.1:{http_port}",
                "callers": [{"id": pki.CLIENT_ID, "roles": ["runtime"], "tenants": ["*"]}]}
    tls = {"ca": files["ca"], "cert": files["client_cert"], "key": files["client_key"]}
    body, rows = hostile_body(), []
    server = servers.start_sidecar(settings)
    try:
        for phase in ("quiet", f"{senders} hostile senders"):
            stop, sent, threads = threading.Event(), [0, 0], []
            if phase != "quiet":
                threads = [threading.Thread(target=_send_hostile, args=(http_port, body, stop, sent), daemon=True)
                           for _ in range(senders)]
                for thread in threads:
                    thread.start()
            try:
                result = load.closed_loop(server.address, rpc="authorize", concurrency=concurrency, procs=1,
                                          duration=duration, tools=bundles.tool_count(10),
                                          prefix=f"hostile{len(rows)}{time.monotonic_ns() % 10**6}",
                                          max_calls=20000, cpu=server.cpu_seconds, tls=tls)
            finally:
                stop.set()
                for thread in threads:
                    thread.join(timeout=30)
            rows.append({"phase": phase, "concurrency": concurrency, "calls": result.timed_ok,
                         "hostile_refused_403": sent[0], "hostile_unanswered": sent[1],
                         "errors": dict(result.errors),
                         **stats.latency_summary(result.latencies_ns)})
    finally:
        server.stop()
    return rows


def run_hostile(data_root: str | None = None, *, duration: float = 3.0, senders: int = 3, repeats: int = 5,
                baseline: bool = True) -> dict:
    """Both measurements; `baseline`: also the whole parse on the loop (seconds of it)."""
    with tempfile.TemporaryDirectory(prefix="toolauthz-hostile-", dir=data_root) as tmp:
        root = pathlib.Path(tmp)
        bundle = bundles.generate_bundle(root / "bundle", 10)
        return {"loop_cost": loop_cost(bundle, root / "data-loop", repeats, baseline),
                "under_fire": under_fire(bundle, root, duration=duration, senders=senders)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds of each Authorize run (default 3)")
    parser.add_argument("--senders", type=int, default=3, help="threads posting hostile bodies (default 3)")
    args = parser.parse_args(argv)
    print(json.dumps(run_hostile(duration=args.duration, senders=args.senders), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
