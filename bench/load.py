"""Load generators: separate client processes (multiprocessing spawn), sync gRPC clients.

Closed loop: `procs` processes x `threads` threads, each thread with its own channel
(its own TCP connection, so that SO_REUSEPORT spreads connections over workers) sends one
call, waits for the answer, sends the next: `procs * threads` calls in flight.

Open loop: a paced sender per process fires calls at fixed times (t0 + i / rate) without
waiting for answers; latency is measured from the time a call was *due*, so a stalled
server cannot hide its queueing delay (no coordinated omission).

Every run is bounded in calls and in time, targets 127.0.0.1 only, and stops by itself.
Requests are built and serialized before each call's clock starts.
"""

from __future__ import annotations

import array
import multiprocessing
import os
import pathlib
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench import bundles

AUTHORIZE = "/toolauthz.v1.ToolAuthorizer/Authorize"
VERIFY = "/toolauthz.v1.ToolAuthorizer/Verify"
CALL_TIMEOUT = 30.0
PRINCIPAL = "u1"


@dataclass
class RunResult:
    """What one load run measured, merged over its client processes."""

    latencies_ns: list[int] = field(default_factory=list)
    ok: Counter = field(default_factory=Counter)  # successful responses by rpc, warm-up and minting included
    timed_ok: int = 0  # successful responses inside the timed phase
    errors: Counter = field(default_factory=Counter)  # status codes and wrong answers
    start: float = 0.0
    end: float = 0.0
    sent: int = 0
    send_end: float = 0.0
    decision_ids: dict = field(default_factory=dict)  # rpc -> decision ids of successful responses
    server_cpu_seconds: float = float("nan")  # server CPU used during the timed phase
    by_call: dict = field(default_factory=dict)  # open loop, `by_call`: call id -> (due, answered) perf_counter_ns
    # open loop: (whole seconds from the schedule's start, outcome) -> calls answered then;
    # outcomes "ok", a status code's name, or THROTTLED (refused by the client itself)
    series: Counter = field(default_factory=Counter)

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 1e-9)


def exit_with_parent(parent: int) -> None:
    """In a child process: exit at once when `parent` (the pid of the process that started
    it, passed along: it may already be gone when the child starts) is not its parent any
    more. A killed benchmark leaves no clients behind."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="bench-exit-with-parent", daemon=True).start()


def _channel(address: str, tls: dict | None = None):
    """`tls`: PEM file paths `ca`, `cert`, `key` (mTLS), or None for plaintext."""
    import grpc

    # A private subchannel pool: without it, channels with equal arguments in one
    # process share a single connection.
    options = [("grpc.use_local_subchannel_pool", 1)]
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    files = {role: pathlib.Path(tls[role]).read_bytes() for role in ("ca", "cert", "key")}
    credentials = grpc.ssl_channel_credentials(root_certificates=files["ca"], private_key=files["key"],
                                               certificate_chain=files["cert"])
    return grpc.secure_channel(address, credentials, options=options)


def _request_maker(spec: dict):
    """n -> serialized AuthorizeRequest for this client's n-th call (unique call ids)."""
    import json

    from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

    tools, prefix, tenants = spec["tools"], spec["prefix"], spec.get("tenants", 1)

    def make(n: int) -> Any:
        return pb.AuthorizeRequest(
            context=pb.TrustedContext(
                tenant="acme" if tenants == 1 else f"acme{(n // 4) % tenants}",  # a run stays in its tenant
                principal=pb.Principal(type="User", id=PRINCIPAL),
                request_id=f"r{prefix}-{n // 4}",  # a model run makes a few calls
                entities_json=json.dumps(bundles.request_entities(n, PRINCIPAL)).encode()),
            call=pb.ToolCall(call_id=f"c{prefix}-{n}", name=bundles.tool_for(n, tools),
                             input_json=json.dumps(bundles.request_args(n)).encode()))

    return make


def _check_authorize(response_bytes: bytes, pb) -> tuple[bool, Any]:
    response = pb.AuthorizeResponse.FromString(response_bytes)
    return response.decision == pb.ALLOW and bool(response.token), response


def closed_loop_main(spec: dict, sync, out_q) -> None:
    """Process target. spec: address, rpc ("authorize" | "verify"), threads, duration,
    max_calls (per thread), warmup (per thread), tools, prefix."""
    import grpc

    from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

    exit_with_parent(spec["parent"])
    result = RunResult()
    lock = threading.Lock()
    verify = spec["rpc"] == "verify"
    threads = spec["threads"]
    channels = [_channel(spec["address"], spec.get("tls")) for _ in range(threads)]
    prepared: list[list[bytes]] = [[] for _ in range(threads)]
    ready = threading.Barrier(threads + 1)
    go = threading.Event()
    latencies = [array.array("q") for _ in range(threads)]
    spans: list[tuple[float, float]] = [(0.0, 0.0)] * threads

    def worker(t: int) -> None:
        authorize = channels[t].unary_unary(AUTHORIZE)
        verify_call = channels[t].unary_unary(VERIFY)
        make = _request_maker({**spec, "prefix": f"{spec['prefix']}-{t}"})
        local_ok: Counter = Counter()
        local_err: Counter = Counter()
        ids: dict[str, list[str]] = {"authorize": [], "verify": []}
        n = 0

        def authorize_once() -> Any:
            nonlocal n
            request = make(n)
            n += 1
            try:
                good, response = _check_authorize(authorize(request.SerializeToString(), timeout=CALL_TIMEOUT), pb)
            except grpc.RpcError as exc:
                local_err[f"authorize:{exc.code().name}"] += 1
                return None
            local_ok["authorize"] += 1
            ids["authorize"].append(response.decision_id)
            if not good:
                local_err["authorize:not_allowed"] += 1
                return None
            return request, response

        try:
            for _ in range(spec["warmup"]):
                authorize_once()
            if verify:  # mint the tokens before the timed phase
                for _ in range(spec["max_calls"]):
                    minted = authorize_once()
                    if minted:
                        request, response = minted
                        prepared[t].append(pb.VerifyRequest(token=response.token, context=request.context,
                                                            call=request.call).SerializeToString())
            else:  # serialized ahead: the client spends its CPU on the calls, not on building them
                prepared[t] = [make(n + i).SerializeToString() for i in range(spec["max_calls"])]
        finally:
            ready.wait()
        go.wait()
        lat = latencies[t]
        end = result.start + spec["duration"]
        first = time.perf_counter()
        for payload in prepared[t]:
            if time.perf_counter() >= end:
                break
            if verify:
                started = time.perf_counter_ns()
                try:
                    response = pb.VerifyResponse.FromString(verify_call(payload, timeout=CALL_TIMEOUT))
                except grpc.RpcError as exc:
                    local_err[f"verify:{exc.code().name}"] += 1
                    continue
                lat.append(time.perf_counter_ns() - started)
                local_ok["verify"] += 1
                ids["verify"].append(response.decision_id)
                if not (response.valid and response.code == "ok"):
                    local_err[f"verify:{response.code}"] += 1
            else:
                started = time.perf_counter_ns()
                try:
                    good, response = _check_authorize(authorize(payload, timeout=CALL_TIMEOUT), pb)
                except grpc.RpcError as exc:
                    local_err[f"authorize:{exc.code().name}"] += 1
                    continue
                lat.append(time.perf_counter_ns() - started)
                local_ok["authorize"] += 1
                ids["authorize"].append(response.decision_id)
                if not good:
                    local_err["authorize:not_allowed"] += 1
        spans[t] = (first, time.perf_counter())
        with lock:
            result.ok.update(local_ok)
            result.errors.update(local_err)
            for rpc, got in ids.items():
                result.decision_ids.setdefault(rpc, []).extend(got)

    workers = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(threads)]
    for w in workers:
        w.start()
    ready.wait()
    _ready_and_wait(sync)  # every client process is warmed up (and has minted)
    result.start = time.perf_counter()
    go.set()
    for w in workers:
        w.join(spec["duration"] + 2 * CALL_TIMEOUT)
    used = [span for span in spans if span[0]]
    result.start = min((s for s, _ in used), default=result.start)
    result.end = max((e for _, e in used), default=result.start)
    for lat in latencies:
        result.latencies_ns.extend(lat)
    result.timed_ok = sum(len(lat) for lat in latencies)
    for ch in channels:
        ch.close()
    out_q.put(result)


def open_loop_main(spec: dict, sync, out_q) -> None:
    """Process target: `rate` Authorize calls per second for `duration` seconds."""
    import grpc

    from toolauthz.client.throttle import marked
    from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

    exit_with_parent(spec["parent"])
    rate, count = spec["rate"], int(spec["rate"] * spec["duration"])
    # Several connections, so that SO_REUSEPORT spreads them over the workers.
    channels = [_channel(spec["address"]) for _ in range(spec.get("channels", 8))]
    calls = [ch.unary_unary(AUTHORIZE) for ch in channels]
    # `throttle`: each connection's calls pass its own throttle, as each of as many
    # AuthzClients' would (toolauthz.client.throttle, the SDKs' default).
    throttles = [_throttle(spec["throttle"]) for _ in channels] if spec.get("throttle") else None
    make = _request_maker(spec)
    result = RunResult()
    ids: list[str] = []
    result.decision_ids["authorize"] = ids
    for i in range(spec["warmup"]):
        try:
            _good, response = _check_authorize(
                calls[i % len(calls)](make(count + i).SerializeToString(), timeout=CALL_TIMEOUT), pb)
            result.ok["authorize"] += 1
            ids.append(response.decision_id)
        except grpc.RpcError as exc:
            result.errors[f"authorize:{exc.code().name}"] += 1
    payloads = [make(i).SerializeToString() for i in range(count)]
    lock = threading.Lock()
    finished = threading.Event()
    done_count = 0
    lat = array.array("q")
    last_done = [0.0]

    sent_at: dict[int, float] = {}  # each call's probability in its throttle, as the SDKs keep it

    def on_done(due_ns: int, future, n: int) -> None:
        nonlocal done_count
        now = time.perf_counter_ns()
        second = (now - t0) // 1_000_000_000
        refused_here = isinstance(future, _Refused)  # by the client's throttle, never sent
        if throttles is not None and not refused_here:  # the sidecar's answer, maybe marked congested
            error = future.exception()
            throttles[n % len(throttles)].answered(None if error is None else error.code(),
                                                   congested=error is None and marked(future),
                                                   sent_at=sent_at.pop(n, None))
        with lock:
            try:
                good, response = _check_authorize(future.result(), pb)
                result.series[(second, "ok")] += 1
                result.ok["authorize"] += 1
                ids.append(response.decision_id)
                lat.append(now - due_ns)
                if spec.get("by_call"):  # the call id `_request_maker` gave call n
                    result.by_call[f"c{spec['prefix']}-{n}"] = (due_ns, now)
                if not good:
                    result.errors["authorize:not_allowed"] += 1
            except grpc.RpcError as exc:
                outcome = "THROTTLED" if refused_here else exc.code().name
                result.errors[f"authorize:{outcome}"] += 1
                result.series[(second, outcome)] += 1
            except Exception as exc:  # noqa: BLE001 - counted, never lost
                result.errors[f"authorize:{type(exc).__name__}"] += 1
            done_count += 1
            last_done[0] = now / 1e9
            if done_count == count:
                finished.set()

    _ready_and_wait(sync)
    t0 = time.perf_counter_ns() + 20_000_000
    interval = 1e9 / rate
    for i, payload in enumerate(payloads):
        due = t0 + int(i * interval)
        delay = (due - time.perf_counter_ns()) / 1e9
        if delay > 0:
            time.sleep(delay)
        refused = None if throttles is None else _refusal(throttles[i % len(throttles)], sent_at, i)
        if refused is not None:
            on_done(due, refused, i)
            continue
        future = calls[i % len(calls)].future(payload, timeout=CALL_TIMEOUT)
        future.add_done_callback(lambda f, due=due, n=i: on_done(due, f, n))
    result.sent = count
    result.send_end = time.perf_counter()
    finished.wait(2 * CALL_TIMEOUT)
    with lock:
        result.start = t0 / 1e9
        result.end = last_done[0] or time.perf_counter()
        result.latencies_ns = list(lat)
        result.timed_ok = len(lat)
    for ch in channels:
        ch.close()
    out_q.put(result)


def _throttle(policy):
    """The SDKs' default throttle (`policy` True), or one with these ThrottlePolicy fields."""
    from toolauthz.client.throttle import AdaptiveThrottle, ThrottlePolicy

    return AdaptiveThrottle(ThrottlePolicy(**policy) if isinstance(policy, dict) else None)


def _refusal(throttle, sent_at: dict[int, float], n: int):
    """None if the throttle lets call `n` through (its probability then kept in
    `sent_at`), else its refusal as a finished future."""
    from toolauthz.client.throttle import Throttled

    try:
        sent_at[n] = throttle.admit()
        return None
    except Throttled as refused:
        return _Refused(refused)


class _Refused:
    """A call the client's throttle refused, as a finished future."""

    def __init__(self, error) -> None:
        self.error = error

    def exception(self):
        return self.error

    def result(self):
        raise self.error


def _ready_and_wait(sync) -> None:
    ready, go = sync
    ready.release()
    if not go.wait(600):
        raise TimeoutError("the orchestrator never started the run")


def _merge(parts: list[RunResult]) -> RunResult:
    merged = RunResult(start=min(p.start for p in parts), end=max(p.end for p in parts))
    for p in parts:
        merged.latencies_ns.extend(p.latencies_ns)
        merged.ok.update(p.ok)
        merged.errors.update(p.errors)
        merged.timed_ok += p.timed_ok
        merged.sent += p.sent
        merged.send_end = max(merged.send_end, p.send_end)
        merged.by_call.update(p.by_call)
        merged.series.update(p.series)
        for rpc, got in p.decision_ids.items():
            merged.decision_ids.setdefault(rpc, []).extend(got)
    return merged


def _run(target, specs: list[dict], timeout: float, cpu=None) -> RunResult:
    ctx = multiprocessing.get_context("spawn")
    ready, go = ctx.Semaphore(0), ctx.Event()
    out_q = ctx.Queue()
    procs = [ctx.Process(target=target, args=({**spec, "parent": os.getpid()}, (ready, go), out_q), daemon=True,
                         name=f"bench-client-{i}")
             for i, spec in enumerate(specs)]
    for p in procs:
        p.start()
    parts = []
    try:
        deadline = time.monotonic() + timeout
        waiting = len(procs)
        while waiting:  # every client warmed up (and minted); a client that died fails the run
            if ready.acquire(timeout=0.5):
                waiting -= 1
            else:
                _check_alive(procs, deadline, "started")
        cpu_start = cpu() if cpu else float("nan")
        go.set()
        while len(parts) < len(procs):
            try:
                parts.append(out_q.get(timeout=0.5))
            except queue.Empty:
                _check_alive(procs, deadline, "reported", waiting_for=len(procs) - len(parts))
        cpu_end = cpu() if cpu else float("nan")
    finally:
        go.set()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    merged = _merge(parts)
    merged.server_cpu_seconds = cpu_end - cpu_start
    return merged


def _check_alive(procs, deadline: float, what: str, waiting_for: int = 0) -> None:
    dead = [p for p in procs if p.exitcode not in (None, 0)]
    if dead:
        raise RuntimeError(f"load client {dead[0].name} exited with code {dead[0].exitcode}")
    if waiting_for and sum(p.exitcode is None for p in procs) < waiting_for:
        raise RuntimeError("a load client exited without reporting")
    if time.monotonic() > deadline:
        raise TimeoutError(f"load clients not {what} in time")


def closed_loop(address: str, *, rpc: str, concurrency: int, procs: int, duration: float, tools: int,
                prefix: str, max_calls: int, warmup: int = 3, cpu=None, tls: dict | None = None,
                tenants: int = 1) -> RunResult:
    """`concurrency` calls in flight from `procs` client processes (threads spread evenly),
    until `duration` seconds have passed or `max_calls` calls were made (for Verify: the
    number of tokens minted before the timed phase). `tls`: see `_channel`. `tenants`:
    the calls' runs spread over that many tenants."""
    procs = max(1, min(procs, concurrency))
    per_proc = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
    per_thread = max(1, -(-max_calls // concurrency))
    specs = [{"address": address, "rpc": rpc, "threads": threads, "duration": duration, "max_calls": per_thread,
              "warmup": warmup, "tools": tools, "prefix": f"{prefix}p{i}", "tls": tls, "tenants": tenants}
             for i, threads in enumerate(per_proc)]
    return _run(closed_loop_main, specs, timeout=duration + 600, cpu=cpu)


def open_loop(address: str, *, rate: float, duration: float, procs: int, tools: int, prefix: str,
              warmup: int = 5, cpu=None, by_call: bool = False, throttle: bool | dict = False) -> RunResult:
    """`by_call`: also each successful call's due and answer times, by call id. `throttle`:
    the clients throttle themselves as the SDKs do by default, or (a dict) with these
    ThrottlePolicy fields; a call refused so is counted as `authorize:THROTTLED`, never sent."""
    specs = [{"address": address, "rate": rate / procs, "duration": duration, "warmup": warmup,
              "tools": tools, "prefix": f"{prefix}p{i}", "by_call": by_call, "throttle": throttle}
             for i in range(procs)]
    return _run(open_loop_main, specs, timeout=duration + 300, cpu=cpu)


def cpu_count() -> int:
    return os.cpu_count() or 1
