"""The decision without gRPC, in a process of its own: `Authorizer.authorize` called
directly (validation, Cedar, ledger, token, audit commit), and `engine.decide` alone
(validation and Cedar, no storage). Also the cProfile of the full path, the gRPC
handler included (called directly with a stand-in context)."""

from __future__ import annotations

import functools
import io
import json
import logging
import multiprocessing
import os
import pathlib
import pstats
import tempfile
import time
from typing import Any

from bench import bundles

PRINCIPAL = "u1"


def _calls(n0: int, count: int, tools: int, prefix: str):
    from toolauthz.model import Principal, ProposedCall, TrustedContext

    out = []
    for n in range(n0, n0 + count):
        ctx = TrustedContext("acme", Principal("User", PRINCIPAL), f"r{prefix}-{n // 4}",
                             json.dumps(bundles.request_entities(n, PRINCIPAL)).encode())
        call = ProposedCall(f"c{prefix}-{n}", bundles.tool_for(n, tools),
                            json.dumps(bundles.request_args(n)).encode())
        out.append((ctx, call))
    return out


def _timed(fn, items) -> list[int]:
    lat = []
    for item in items:
        started = time.perf_counter_ns()
        fn(item)
        lat.append(time.perf_counter_ns() - started)
    return lat


def _through_pump(car, items, in_flight: int) -> tuple[list[int], float]:
    """`in_flight` coroutines on one event loop share `items`, each handing its call to
    the decision pump and awaiting the answer, as the served handlers do; returns
    latencies and wall seconds."""
    import asyncio

    plan = car.authorizer.plan_authorize
    queue = iter(items)
    lat: list[int] = []

    async def client() -> None:
        for ctx, call in queue:
            started = time.perf_counter_ns()
            await car.pump.answer(functools.partial(plan, ctx, call))
            lat.append(time.perf_counter_ns() - started)

    async def main() -> float:
        began = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(in_flight)))
        return time.perf_counter() - began

    wall = asyncio.run(main())
    return lat, wall


def inproc_main(spec: dict, out_q) -> None:
    """Process target. spec: bundle, data_dir, calls, threads (list), tools, profile (bool)."""
    logging.basicConfig(level=logging.ERROR)
    from bench.load import exit_with_parent
    from toolauthz.engine import decide
    from toolauthz.server.config import Settings

    exit_with_parent(spec["parent"])
    from toolauthz.server.build import build_sidecar

    out: dict[str, Any] = {}
    try:
        car = build_sidecar(Settings(bundle=spec["bundle"], data_dir=spec["data_dir"], listen="127.0.0.1:0",
                                     tokens={"lifetime_seconds": 600}))
        from toolauthz.server.heap import keep_bundles_frozen

        keep_bundles_frozen(car)  # as a serving process does
    except Exception as exc:  # noqa: BLE001 - reported to the orchestrator
        out_q.put({"error": f"{type(exc).__name__}: {exc}"})
        return
    try:
        _measure(car, spec, out, decide)
    except Exception as exc:  # noqa: BLE001 - reported to the orchestrator
        import traceback

        out = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
    finally:
        car.close()
    out_q.put(out)


def _measure(car, spec: dict, out: dict, decide) -> None:
    tools, count = spec["tools"], spec["calls"]
    bundle = car.bundles.current

    def authorize(item):
        return car.authorizer.authorize(*item)

    first = car.authorizer.authorize(*_calls(10**9, 1, tools, "w")[0])
    out["decision"] = first.decision.value
    _timed(authorize, _calls(0, 50, tools, "warm"))
    cpu = time.process_time()
    out["decide"] = {"lat": _timed(lambda item: decide(bundle, *item), _calls(0, count, tools, "d")),
                     "threads": 1}
    out["decide"]["cpu_ms_per_call"] = (time.process_time() - cpu) * 1e3 / count
    out["authorizer"] = {}
    for threads in spec["threads"]:
        items = _calls(0, count if threads == 1 else count * 2, tools, f"a{threads}")
        cpu = time.process_time()  # every thread of this process: the pump's work too
        if threads == 1:
            began = time.perf_counter()
            lat = _timed(authorize, items)
            wall = time.perf_counter() - began
        else:
            lat, wall = _through_pump(car, items, threads)
        out["authorizer"][threads] = {"lat": lat, "seconds": wall,
                                      "cpu_ms_per_call": (time.process_time() - cpu) * 1e3 / len(items)}
    out["audit_rows"] = _count_rows(car)
    out["authorize_calls"] = 1 + 50 + sum(len(v["lat"]) for v in out["authorizer"].values())
    if spec.get("profile"):
        out["profile"] = _profile(car, tools, spec.get("profile_calls", 2000))


def _count_rows(car) -> dict[str, int]:
    import sqlite3

    with sqlite3.connect(str(car.settings.database_path)) as db:
        return dict(db.execute("SELECT kind, count(*) FROM audit_record GROUP BY kind").fetchall())


class _Context:
    """Enough of grpc.aio.ServicerContext for a handler that does not abort: a call with
    no deadline."""

    def time_remaining(self):
        return None

    def peer(self):
        return "bench"  # one connection: the decision queue's turns are all its own

    def invocation_metadata(self):
        return ()

    async def abort(self, code, details):
        raise RuntimeError(f"{code}: {details}")


class _InlinePump:
    """The decision pump's interface, run on the calling thread: the handler's whole path
    then runs where a profiler or a thread-CPU timer sees it."""

    def __init__(self, authorizer):
        self._authorizer = authorizer

    def check_admission(self, **_request):
        """Nothing queues here: every request is admitted."""

    async def answer(self, make_plan, **_request):
        return decide_inline(self._authorizer, make_plan)

    def congestion(self, peer: str = "") -> float:
        """Nothing queues here: no answer is marked congested."""
        return 0.0


def decide_inline(authorizer, make_plan):
    return authorizer.run(make_plan())


def _call(handler, request, context):
    """Runs a coroutine handler that never suspends (its pump is inline), no event loop."""
    coroutine = handler(request, context)
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise RuntimeError("the handler suspended")


def _requests(count: int, tools: int, prefix: str) -> list:
    """The calls of `_calls` as AuthorizeRequest messages, for the handler called directly."""
    from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

    return [pb.AuthorizeRequest(
        context=pb.TrustedContext(tenant=ctx.tenant, principal=pb.Principal(type="User", id=PRINCIPAL),
                                  request_id=ctx.request_id, entities_json=ctx.entities_json),
        call=pb.ToolCall(call_id=call.call_id, name=call.name, input_json=call.input_json))
        for ctx, call in _calls(0, count, tools, prefix)]


def _profile(car, tools: int, count: int) -> dict:
    """cProfile of the gRPC handler called directly (request message in, response out),
    one call at a time; one audit commit is also timed alone."""
    import cProfile

    from toolauthz.server.build import create_server  # noqa: F401 - the same modules the server loads

    service = _service(car)
    requests = _requests(count, tools, "prof")
    context = _Context()
    profiler = cProfile.Profile()
    began = time.perf_counter()
    profiler.enable()
    for request in requests:
        _call(service.Authorize, request, context)
    profiler.disable()
    wall = time.perf_counter() - began
    stats = pstats.Stats(profiler, stream=io.StringIO())
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
    return {"calls": count, "wall_seconds": wall, "stages": _stages(stats, count),
            "top": _top(stats, count), "text": text.getvalue(), "writer": _writer_cost(car),
            "stage_cpu": _stage_cpu(car, tools, count)}


def _service(car):
    from toolauthz.service.authorizer import ToolAuthorizerService

    return ToolAuthorizerService(car.authorizer, _InlinePump(car.authorizer), car.keyring, car.status,
                                 gate=car.gate)


# Stages of the path, by the functions that implement them (matched on file suffix and
# name, so a stage that moves or disappears is simply left out of the summary).
STAGES = [
    ("grpc handler (total)", "service/authorizer.py", "Authorize"),
    ("authorizer: plan + run", "bench/inproc.py", "decide_inline"),
    ("request checks (ctx/call)", "toolauthz/model.py", "check"),
    ("prepare: parse + JSON Schema + digest", "toolauthz/engine.py", "prepare"),
    ("  strict JSON parse", "toolauthz/strict_json.py", "parse_strict_json"),
    ("  JSON Schema (Tool.accepts: jsonschema-rs where proven)", "toolauthz/bundle/catalog.py", "accepts"),
    ("  JSON Schema error message (best_match)", "jsonschema/exceptions.py", "best_match"),
    ("  call digest (RFC 8785 + sha256)", "toolauthz/digest.py", "call_digest"),
    ("trusted entities (cedarpy Entities)", "toolauthz/engine.py", "request_entities"),
    ("  with_added_json_str", "cedarpy/__init__.py", "with_added_json_str"),
    ("  drafts before the write lock (Cedar, token)", "toolauthz/authorizer/writes.py", "_round_ops"),
    ("ledger apply (row + audit record, 1 commit)", "toolauthz/store/rules.py", "apply"),
    ("  audit record: chain + insert", "toolauthz/store/sqlite/unit.py", "append_audit"),
    ("  fsync of the log, after the lock", "toolauthz/store/sqlite/base.py", "sync_log"),
    ("Cedar evaluate", "toolauthz/engine.py", "evaluate"),
    ("  cedarpy.is_authorized", "cedarpy/__init__.py", "is_authorized"),
    ("token issue (PASETO, Ed25519)", "toolauthz/tokens/issue.py", "issue"),
    ("audit event build (AuditEvent)", "toolauthz/audit/records.py", "__post_init__"),
    ("audit write (group commit, this thread)", "toolauthz/store/audit_writer.py", "write"),
    ("ULID", "toolauthz/authorizer/parts.py", "new_id"),
]


def _stages(stats: pstats.Stats, count: int) -> list[dict]:
    out = []
    for label, suffix, name in STAGES:
        total, calls = 0.0, 0
        for (filename, _line, func), (_cc, nc, _tt, ct, _callers) in stats.stats.items():
            if func == name and filename.replace("\\", "/").endswith(suffix):
                total += ct
                calls += nc
        if calls:
            out.append({"stage": label, "us_per_call": total / count * 1e6, "calls_per_request": calls / count})
    return out


def _top(stats: pstats.Stats, count: int, n: int = 15) -> list[dict]:
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:n]
    return [{"function": f"{pathlib.Path(f).name}:{line}({func})", "self_us_per_call": tt / count * 1e6,
             "calls_per_request": nc / count}
            for (f, line, func), (_cc, nc, tt, _ct, _callers) in rows]


# Stages timed without a profiler: the CPU time of the calling thread (thread_time) spent
# in each step of Authorize, found by name (a step that moves or is renamed is left out).
TIMED_FUNCTIONS = ("prepare", "request_entities", "evaluate")
TIMED_METHODS = (("ledger", "apply"), ("issuer", "issue"), ("audit", "write"))


def _stage_cpu(car, tools: int, count: int) -> dict:
    """Authorize called through the gRPC handler (stand-in context), one call at a time,
    each step wrapped in a thread-CPU timer. A step's time excludes the timed steps it
    calls (Cedar inside the ledger's transaction, when a draft is decided again there).
    Other threads (none take part in a decision) show what the process used beyond the
    calling thread."""
    import functools

    import toolauthz.authorizer.deciding as authorizer_module

    cpu: dict[str, int] = {}
    wall: dict[str, int] = {}
    inner: list[list[int]] = []  # per open step: the time of the steps it called

    def timed(name: str, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            inner.append([0, 0])
            c, w = time.thread_time_ns(), time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                dc, dw = time.thread_time_ns() - c, time.perf_counter_ns() - w
                nested_c, nested_w = inner.pop()
                cpu[name] = cpu.get(name, 0) + dc - nested_c
                wall[name] = wall.get(name, 0) + dw - nested_w
                if inner:
                    inner[-1][0] += dc
                    inner[-1][1] += dw
        return wrapper

    restore = []
    for name in TIMED_FUNCTIONS:
        if callable(getattr(authorizer_module, name, None)):
            restore.append((authorizer_module, name, getattr(authorizer_module, name)))
            setattr(authorizer_module, name, timed(name, getattr(authorizer_module, name)))
    az = car.authorizer
    for holder, method in TIMED_METHODS:
        obj = getattr(az, holder, None)
        if obj is not None and callable(getattr(obj, method, None)):
            restore.append((obj, method, None))
            setattr(obj, method, timed(f"{holder}.{method}", getattr(obj, method)))
    global decide_inline
    service = _service(car)
    handler = timed("grpc handler", lambda request, context: _call(service.Authorize, request, context))
    inline = decide_inline
    decide_inline = timed("authorizer.authorize", inline)
    requests = _requests(count, tools, "stage")
    context = _Context()
    try:
        for request in requests[:20]:
            handler(request, context)
        cpu.clear()
        wall.clear()
        process, thread = time.process_time_ns(), time.thread_time_ns()
        for request in requests[20:]:
            handler(request, context)
        process, thread = time.process_time_ns() - process, time.thread_time_ns() - thread
    finally:
        decide_inline = inline
        for obj, name, original in reversed(restore):
            if original is None:
                delattr(obj, name)  # the instance attribute hid the class's method
            else:
                setattr(obj, name, original)
    n = len(requests) - 20
    us = {name: (cpu[name] / n / 1e3, wall[name] / n / 1e3) for name in cpu}
    # Exclusive times: the handler's own is the conversion; add the nested ones back
    # for the two whole rows.
    conversion_cpu, conversion_wall = us.pop("grpc handler")
    rest_cpu, rest_wall = us.pop("authorizer.authorize")
    total_cpu = rest_cpu + sum(c for c, _ in us.values())
    total_wall = rest_wall + sum(w for _, w in us.values())
    rows = [{"stage": "grpc handler, whole (this thread)", "cpu_us": total_cpu + conversion_cpu,
             "wall_us": total_wall + conversion_wall},
            {"stage": "  request/response conversion", "cpu_us": conversion_cpu, "wall_us": conversion_wall},
            {"stage": "  authorizer.authorize", "cpu_us": total_cpu, "wall_us": total_wall}]
    labels = {"ledger.apply": "ledger.apply: row + audit record + fsync"}
    rows += [{"stage": f"    {labels.get(name, name)}", "cpu_us": c, "wall_us": w} for name, (c, w) in us.items()]
    rows.append({"stage": "    the rest (checks, ids, audit event, glue)", "cpu_us": rest_cpu, "wall_us": rest_wall})
    rows.append({"stage": "other threads", "cpu_us": (process - thread) / n / 1e3,
                 "wall_us": float("nan")})
    return {"calls": n, "process_cpu_us": process / n / 1e3, "stages": rows}


def _writer_cost(car) -> dict:
    """What one audit commit costs: chain + insert + fsync, batch of 1 and 32."""
    from toolauthz.audit.records import AuditEvent

    def event(i: int) -> AuditEvent:
        return AuditEvent(kind="authorize", time=time.time(), decision_id=f"01J{i:023d}", request_id="r",
                          call_id=f"prof-w-{i}", tenant="acme", principal='User::"u1"', tool="t_00001",
                          resource='Item::"item_1"', result="ALLOW", reasons=("t_00001-p0",), digest="0" * 64,
                          policy_version="0" * 16, jti="0" * 32, fields={"/item_id": "item_1", "/qty": 5})

    out = {}
    for batch in (1, 32):
        rounds = 200 if batch == 1 else 20
        began = time.perf_counter()
        for r in range(rounds):
            car.audit_log.append([event(r * batch + i) for i in range(batch)])
        out[f"batch_{batch}_ms_per_commit"] = (time.perf_counter() - began) / rounds * 1e3
    return out


def _get(out_q, process, timeout: float):
    """The child's report; fails at once if the child died without one."""
    import queue

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return out_q.get(timeout=0.5)
        except queue.Empty:
            if not process.is_alive():
                try:
                    return out_q.get(timeout=1)
                except queue.Empty:
                    raise RuntimeError(f"in-process run died (exit code {process.exitcode})") from None
    raise TimeoutError(f"in-process run did not finish within {timeout:.0f}s")


def run_in_child(target, spec: dict, *, name: str, data_root: str | None, timeout: float) -> dict:
    """`target(spec, out_q)` in a spawned process with a temporary `data_dir` of its own
    (added to `spec`); returns what it put on the queue, or raises if it reported an error."""
    ctx = multiprocessing.get_context("spawn")
    out_q = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix=f"{name}-", dir=data_root) as tmp:
        spec = {**spec, "data_dir": str(pathlib.Path(tmp) / "data"), "parent": os.getpid()}
        process = ctx.Process(target=target, args=(spec, out_q), daemon=True, name=name)
        process.start()
        try:
            result = _get(out_q, process, timeout)
        finally:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join()
    if "error" in result:
        raise RuntimeError(f"{name} failed: {result['error']}")
    return result


def run_inproc(bundle: pathlib.Path, *, tools: int, calls: int, threads: list[int], profile: bool = False,
               profile_calls: int = 2000, data_root: str | None = None, timeout: float = 900) -> dict:
    spec = {"bundle": str(bundle), "calls": calls, "threads": threads, "tools": tools, "profile": profile,
            "profile_calls": profile_calls}
    return run_in_child(inproc_main, spec, name="bench-inproc", data_root=data_root, timeout=timeout)
