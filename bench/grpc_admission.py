"""Where grpc.aio can refuse a call (`python -m bench.grpc_admission`): three measures
of grpcio itself, with no sidecar, that decide how toolauthz can shed load.

1. `maximum_concurrent_rpcs`: grpc.aio refuses a call over the limit in Python, after
   taking it from the core and finding its handler (RESOURCE_EXHAUSTED, and CANCELLED for
   some, as the status goes out before the request is read). Printed: CPU per refused
   call against CPU per no-op call, client and server in this one process.
2. `grpc.max_concurrent_streams` (toolauthz's `max_streams_per_connection`): a plain
   client with many calls on one connection; the calls it sends as a stream is being
   freed are refused by the server's transport (REFUSED_STREAM, seen as UNAVAILABLE),
   unless a retry policy sends them again.
3. `grpc.server_max_unrequested_time_in_server`: while the event loop does not take
   calls from the core, they wait there; older than that, they are dropped in the core
   (CANCELLED), never seen by Python.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import resource
import threading
import time

import grpc

_RETRY = ("grpc.service_config", json.dumps({"methodConfig": [{"name": [{}], "retryPolicy": {
    "maxAttempts": 5, "initialBackoff": "0.01s", "maxBackoff": "0.2s", "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"]}}]}))


class _Server:
    """A grpc.aio server on a thread: /b.S/Fast answers at once, /b.S/Held waits until
    the server stops, /b.S/Block blocks the event loop for `block` seconds."""

    def __init__(self, options: list, max_rpcs: int | None = None, block: float = 0.0):
        self.handled = 0
        self._ready: list[int] = []
        self._stop = threading.Event()

        async def fast(request, context):
            self.handled += 1
            return b"ok"

        async def held(request, context):
            while not self._stop.is_set():
                await asyncio.sleep(0.02)
            return b"held"

        async def blocking(request, context):
            time.sleep(block)  # on purpose: the loop takes no call from the core meanwhile
            return b"blocked"

        async def serve() -> None:
            server = grpc.aio.server(options=options, maximum_concurrent_rpcs=max_rpcs)
            server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("b.S", {
                "Fast": grpc.unary_unary_rpc_method_handler(fast),
                "Held": grpc.unary_unary_rpc_method_handler(held),
                "Block": grpc.unary_unary_rpc_method_handler(blocking)}),))
            self._ready.append(server.add_insecure_port("127.0.0.1:0"))
            await server.start()
            while not self._stop.is_set():
                await asyncio.sleep(0.02)
            await server.stop(None)

        self._thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
        self._thread.start()
        while not self._ready:
            time.sleep(0.01)
        self.address = f"127.0.0.1:{self._ready[0]}"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _codes(futures) -> collections.Counter:
    codes: collections.Counter = collections.Counter()
    for future in futures:
        try:
            future.result()
            codes["OK"] += 1
        except grpc.RpcError as exc:
            codes[exc.code().name] += 1
    return codes


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def refusal_cost(calls: int) -> dict:
    out = {}
    for label, max_rpcs in (("no-op", None), ("refused", 1)):
        server = _Server([], max_rpcs)
        with grpc.insecure_channel(server.address) as channel:
            holder = channel.unary_unary("/b.S/Held").future(b"x", timeout=60) if max_rpcs else None
            time.sleep(0.5)  # the one place taken for the whole run (a future dropped would cancel its call)
            began = _cpu()
            codes = _codes([channel.unary_unary("/b.S/Fast").future(b"x", timeout=60) for _ in range(calls)])
            out[label] = {"ms_cpu_per_call": (_cpu() - began) * 1000 / calls, "codes": dict(codes)}
        server.stop()
        del holder
    return out


def refused_streams(calls: int, streams: int) -> dict:
    out = {}
    for label, options in (("plain client", []), ("client retrying UNAVAILABLE", [_RETRY])):
        server = _Server([("grpc.max_concurrent_streams", streams)])
        with grpc.insecure_channel(server.address, options=options) as channel:
            channel.unary_unary("/b.S/Fast")(b"w", timeout=10)  # connected, the limit known
            futures = []
            for i in range(calls):
                futures.append(channel.unary_unary("/b.S/Fast").future(b"x", timeout=60))
                if i % 10 == 0:
                    time.sleep(0.001)
            out[label] = dict(_codes(futures))
        server.stop()
    return out


def unrequested(calls: int, block: float, max_age: int) -> dict:
    out = {}
    for label, options in (("no age limit", []), (f"max {max_age} s unrequested",
                                                   [("grpc.server_max_unrequested_time_in_server", max_age)])):
        server = _Server(options, block=block)
        with grpc.insecure_channel(server.address) as channel:
            channel.unary_unary("/b.S/Fast")(b"w", timeout=10)
            server.handled = 0
            blocked = channel.unary_unary("/b.S/Block").future(b"x", timeout=60)
            time.sleep(0.3)
            codes = _codes([channel.unary_unary("/b.S/Fast").future(b"x", timeout=60) for _ in range(calls)])
            blocked.result()
            out[label] = {"codes": dict(codes), "seen_by_python": server.handled}
        server.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.grpc_admission", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--streams", type=int, default=8, help="max_concurrent_streams of measure 2")
    args = parser.parse_args(argv)
    print(f"grpcio {grpc.__version__}")
    print("1. maximum_concurrent_rpcs:", json.dumps(refusal_cost(args.calls)), flush=True)
    print(f"2. max_concurrent_streams {args.streams}:", json.dumps(refused_streams(args.calls, args.streams)),
          flush=True)
    print("3. calls while the loop is blocked 3 s:", json.dumps(unrequested(300, 3.0, 1)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
